"""Entries that collective rounds loaded stay on the leaderboard until the pool checkpoints.

With ``log.round_checkpoints: due`` a resume can redo several rounds, and each redone round loads
the entries its kept listing names again: no prune in between may have taken them. One real
:class:`pool.Pool` in a world of one (the real ``Comm`` without MPI) and the real
:class:`leaderboard.Leaderboard`; the pod is a stand-in (its agent is one number, its episode
returns that number plus noise common to all agents on the same start states), because the
point is which files the rounds keep, not training.
"""

from __future__ import annotations

from pathlib import Path

import torch

from podracer_hpc.cluster.mpi import Comm
from podracer_hpc.config import Config, from_dict
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.pool.fitness import Fitness, eval_seed
from podracer_hpc.pool.rounds import Pool


class StandInPod:
    """What Pool uses of pod.Pod; the agent is ``quality`` (a stand-in: no training is needed here)."""

    def __init__(self) -> None:
        self.quality, self.env_steps, self.kind, self.device, self.lr = 0.0, 0, "ppo", "cpu", 3e-4

    def hparams(self, names=None) -> dict[str, float]:
        return {"learning_rate": self.lr}

    def set_hparams(self, hp: dict[str, float]) -> None:
        self.lr = hp.get("learning_rate", self.lr)

    def agent_tensors(self) -> tuple[dict, dict]:
        return {"actor.w": torch.full((4,), self.quality)}, {"kind": "ppo", "env_steps": self.env_steps}

    def evaluate(self, seed: int, agent=None, episodes: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed % 2**31)
        return torch.randn(8, generator=g, dtype=torch.float64) * 10 + (self.quality if agent is None else agent)

    def agent_from(self, tensors: dict, meta: dict, source: str = "") -> float:
        return float(tensors["actor.w"][0])

    def load_agent(self, tensors: dict, meta: dict, source: str = "", load_hparams: bool = True) -> None:
        self.quality = float(tensors["actor.w"][0])

    def reset_agent(self) -> None:
        self.quality = 0.0


def other_job_entry(pool: Pool, quality: float, rnd: int) -> str:
    """An entry another job published (better than everything so far, trained longer)."""
    return pool.board.publish(
        {"actor.w": torch.full((4,), quality)},
        quality,
        {"kind": "ppo", "env_steps": 10**9, "job": "other", "pod": 0, "round": rnd},
    )


def hold_round(pool: Pool, pod: StandInPod, i: int) -> str:
    pod.env_steps += 1000
    seed = eval_seed(0, "round", i)
    fit = Fitness(tuple(pod.evaluate(seed).tolist()), seed)
    return pool.collective_round(i, fit, 0.0, [pool.report(fit)]).action


def make_pool(tmp_path: Path) -> tuple[Pool, StandInPod]:
    cfg = from_dict(
        Config, {"name": "keep", "tournament": {"mode": "elegantrl", "top_k": 1, "interval_env_steps": 1000}}
    )
    rundir = RunDir(tmp_path / "run", "keep")
    (rundir.root / "rounds").mkdir(parents=True)
    pod = StandInPod()
    return Pool(cfg, Comm(), pod, rundir, "1", lambda m: None), pod


def test_an_entry_a_round_loaded_outlives_better_entries_until_the_pool_checkpoints(tmp_path):
    pool, pod = make_pool(tmp_path)
    assert hold_round(pool, pod, 0) == "keep"
    b = other_job_entry(pool, 500.0, 1)
    assert hold_round(pool, pod, 1) == "load_entry" and pod.quality == 500.0
    c = other_job_entry(pool, 900.0, 2)  # better than b: with top_k 1 a prune would take b
    assert hold_round(pool, pod, 2) == "load_entry" and pod.quality == 900.0
    present = {e.id for e in pool.board.list()}
    assert {b, c} <= present  # a resume from before round 1 redoes it and loads b again
    pool.loaded_since_checkpoint.clear()  # what the rank program does when the pool checkpoints
    other_job_entry(pool, 950.0, 3)
    hold_round(pool, pod, 3)
    assert b not in {e.id for e in pool.board.list()}  # no resume can go back before it now
