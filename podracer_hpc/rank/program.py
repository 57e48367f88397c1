"""The rank program: one pod per rank, a short loop of named steps.

    start (resume or fresh, join) -> repeat: stop? -> round if one is due, else update -> evaluate?
    -> checkpoint? -> finish (the ranks' last meeting, the summary)

A due round comes before any further training, also when it is due at the start: a rank that
reached round i and was stopped at its meeting (someone else stopped) resumes *at* that round,
and must hold it before it trains on, or its pod would enter round i with extra updates that the
uninterrupted run never had.

The pieces it stands on: :mod:`pod` (one device's env and learner), :mod:`pool` (the rank's side
of the tournament), :mod:`resume` (which checkpoint every rank resumes from), :mod:`rundir` (the
run directory, the job's identity, exit codes), :mod:`h5log` (the rank's log), :mod:`comm` (MPI).

**No collective on the per-update path.** Pods train between rounds without waiting for each
other. Ranks meet only at a round (``tournament.sync: collective``) and at the end; with
``async`` rounds only at the end. A pod that reaches the run's target return
(``eval.stop_at_return``) tells the others with a stop notice carrying its env steps; each
trains on to those env steps, then leaves, and the run is complete (:mod:`target`).
Everything else is decided by each rank alone:

- a time-based checkpoint is each rank's own (ranks resume from different updates of the same
  round: their training between rounds is independent, so that is consistent and exact);
- a stop (Slurm's warning signal, which srun delivers to every task, a user's ``kill -USR2`` of
  one rank, ``--stop-after-updates``) makes the rank that wants it send a stop notice that
  floods a tree of the ranks (non-blocking point-to-point, polled without blocking after every
  update and while waiting at a meeting, passed on by each rank once: see :class:`comm.Comm`),
  checkpoint, and go to the next meeting saying ``stop``. A rank that gets a notice does the
  same. A meeting where anyone says ``stop`` ends the run for everyone (exit 75), so no rank is
  ever left waiting in a round for one that left: every rank reaches the same next meeting,
  early when stopping.

Any kill, at any moment, leaves a run directory that the same command resumes: a fresh pod
checkpoints before its first update; the log is flushed before every checkpoint and cut back to
the checkpoint on resume; a log left open by a killed writer is rebuilt; a collective round
redone after a kill decides on the same listing and publishes the same entries (pool.py).
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from podracer_hpc import __version__
from podracer_hpc.cluster.caches import node_name
from podracer_hpc.cluster.device import DeviceError, resolve_device, set_cpu_threads, start_line
from podracer_hpc.cluster.mpi import Comm, MeetingTimeout, get_comm
from podracer_hpc.cluster.signals import StopFlag
from podracer_hpc.config import EXPLORING_MODES, Config, for_rank, to_dict
from podracer_hpc.docfield import ConfigError
from podracer_hpc.files import safeio
from podracer_hpc.files import summary as poolsummary
from podracer_hpc.files.h5log import H5Writer
from podracer_hpc.files.h5recover import open_log
from podracer_hpc.files.rundir import (
    EXIT_REQUEUE,
    PoolPart,
    RunDir,
    RunLock,
    git_revision,
    job_id,
    make_dirs,
    slurm_ids,
)
from podracer_hpc.pod import Pod, entry_kind
from podracer_hpc.pool.fitness import Fitness, eval_seed
from podracer_hpc.pool.hparams import describe_space, effective_space
from podracer_hpc.pool.rounds import Meeting, Pool, pool_line
from podracer_hpc.pool.rules import intervals_to_next_round, round_env_steps
from podracer_hpc.rank import faults, resume
from podracer_hpc.rank.finished import finished_summary, fmt_steps
from podracer_hpc.rank.lock import take_world_lock
from podracer_hpc.rank.state import RankState
from podracer_hpc.rank.target import Target
from podracer_hpc.rank.vigil import Vigil

__all__ = ["EXIT_REQUEUE", "RunResult", "TrainingError", "train"]

# Keys that may differ between a run and its resumption; anything else must match.


class TrainingError(RuntimeError):
    """Training cannot go on (NaN loss, ...); the last good checkpoint is kept."""


@dataclass
class RunResult:
    """What one rank reports at the end."""

    complete: bool
    summary: dict[str, Any] = field(default_factory=dict)
    rank: int = 0  # this process's rank
    # every rank waits here until all have called it (a job's rank 0 requeues it first); MPI stays in comm.py
    wait_for_all: Callable[[], None] = field(default=lambda: None, repr=False)


def train(
    cfg: Config,
    run_dir: str | os.PathLike | None = None,
    comm: Comm | None = None,
    stop_after_updates: int = 0,
    quiet: bool = False,
    stop: StopFlag | None = None,
    part: PoolPart = PoolPart(),
    force_final_eval: bool = False,
) -> RunResult:
    """Train one pod per rank until ``cfg.total_env_steps``; resume from ``run_dir`` if it has checkpoints.

    ``stop``: the warning-signal flag (the console script installs the process's own before
    anything else); by default a new one is installed here. ``part``: which pods of the pool this
    MPI world runs (a pool of several jobs; default: the whole pool). A run that is already
    complete with this very config is left as it is (its summary is returned, no file is touched)
    unless ``force_final_eval`` asks to redo its final evaluation.
    """
    rank = RankRun(cfg, run_dir, comm or get_comm(), stop or StopFlag().install(), stop_after_updates, quiet, part)
    finished = None if force_final_eval else rank.finished_summary()
    if finished is not None:
        return RunResult(complete=True, summary=finished, rank=rank.comm.rank)
    try:
        try:
            return _loop(rank)
        except MeetingTimeout as e:  # a rank did not come: name it, then end this world (never a hang)
            rank.vigil.hung(e)
            raise
    finally:
        rank.close()


def _loop(rank: "RankRun") -> RunResult:
    """The loop of named steps (see the module docstring)."""
    rank.start()
    while not rank.stopping():
        if rank.round_due():  # before any more training: also a round resumed from a stopped meeting
            rank.round()
        elif rank.trained():
            break
        else:
            rank.update()
            if rank.eval_due() and not rank.round_due():  # a round evaluates for itself
                rank.evaluate()
        if rank.checkpoint_due() and not rank.round_due():  # a round checkpoints when it is held
            rank.save_checkpoint()
        rank.progress()
        rank.vigil.aggregate(rank.pool_size)
    return rank.finish()


class RankRun:
    """The state of one rank's run and the steps of its loop (each a method, called by :func:`train`)."""

    def __init__(
        self,
        cfg: Config,
        run_dir: str | os.PathLike | None,
        comm: Comm,
        stop: StopFlag,
        stop_after_updates: int,
        quiet: bool,
        part: PoolPart = PoolPart(),
    ):
        # the pod's index in the pool: its MPI rank, offset by its part when the pool runs as several
        # jobs (each its own MPI world); it names the pod's files, seeds and population member
        self.part, self.index, self.pool_size = part, part.pod(comm.rank, comm.size), part.count * comm.size
        self.run_cfg = cfg  # the job's (config.yaml); self.cfg is this rank's pod (its population entry applied)
        self.cfg, self.comm, self.stop, self.quiet = for_rank(cfg, self.index), comm, stop, quiet
        self.stop_after_updates = stop_after_updates
        self.rundir = RunDir(run_dir or Path("runs") / cfg.name, cfg.name)
        self.checkpoint_path = self.rundir.checkpoint_path(self.index)
        self.pod: Pod | None = None
        self.pool: Pool | None = None
        self.log: H5Writer | None = None
        self.lock: RunLock | None = None  # rank 0: this world's writer lock of the run directory
        self.state: RankState | None = None  # the run loop's state in the checkpoint it resumed from
        self.stopped_by = ""  # why this rank stops early ("" while it trains)
        self.poisoned = False  # NaN loss: frozen until a round replaces the agent
        self.updates_here = 0
        self.prev_record: dict[str, Any] = {}  # this pod's record from the start before (read at start)
        self.last_train = math.nan
        self.ckpt_epochs: tuple[int | None, int | None] = (None, None)  # rounds of the checkpoint and its .prev
        self.round_index = 0
        self.pool_line = ""  # rank 0: the pool at its last collective round, for the progress line
        self.met: list[Meeting] | None = None  # the ranks' last meeting, once it ended the run
        self.target = Target(cfg.eval.stop_at_return)  # the return that ends the run (None: its budget does)
        self.target_end = False  # the ranks' last meeting: a pod reached the target, nobody stopped
        self.pending_fitness: Fitness | None = None  # a round's evaluation whose meeting ended the run
        self.verdict: Fitness | None = None  # the run's final evaluation (eval.final_episodes), when trained
        self.inject_nan, self.slow = faults.nan_update(self.index), faults.slow_factor(self.index)
        self.inject_signal = faults.signal_update(self.index)
        self.inject_hang = faults.hang_update(self.index)
        # the code that runs (a job's snapshot revision; -dirty if modified): asked once (it may run
        # git on the shared filesystem), then named by the start line, the log and the summary
        self.revision = git_revision()
        # this pod's heartbeat and the deadline on its waits for every rank (start() opens it)
        self.vigil = Vigil(self.cfg, comm, self.rundir, part, self.index, self.say)
        self.vigil.flush = lambda: self.log.flush() if self.log is not None else None

    def say(self, msg: str, progress: bool = False) -> None:
        """Events always go to stderr; ``quiet`` silences only the periodic progress lines."""
        if not (self.quiet and progress):
            print(f"[{self.cfg.name} r{self.index}] {msg}", file=sys.stderr, flush=True)

    @property
    def independent(self) -> bool:
        """The pods never meet before the end (no tournament, or asynchronous rounds)."""
        t = self.cfg.tournament
        return t.mode == "none" or t.sync == "async"

    def finished_summary(self) -> dict[str, Any] | None:
        """The run's summary when this run directory already holds this run complete (finished.py),
        said on stderr by rank 0; None when there is anything to train or evaluate."""
        return finished_summary(self.rundir, self.run_cfg, self.part, self.comm, self.say)

    # --- start ----------------------------------------------------------------------------
    def start(self) -> None:
        """Device, pod, the run directory's lock (before anything is written there), the checkpoint
        every rank resumes from (or a fresh start), log, pool."""
        cfg, comm = self.cfg, self.comm
        try:  # every rank calls it: the ranks of a node compare GPUs, and one rank's error stops all
            device = resolve_device(cfg.device, comm.local_rank, comm.local_size, allgather=comm.allgather)
        except DeviceError as e:
            raise TrainingError(str(e)) from None
        threads = set_cpu_threads(cfg.threads, comm.local_size) if device.type == "cpu" else torch.get_num_threads()
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        if comm.launcher_size and comm.launcher_size > 1 and comm.size == 1:
            raise TrainingError(
                f"the launcher started {comm.launcher_size} processes but they do not form one MPI world "
                f"({comm.note}). Refusing to run {comm.launcher_size} copies of rank 0 into one run directory: "
                "match srun's --mpi plugin to the MPI of mpi4py (pmi2 for the mpich wheel, pmix for Open MPI)."
            )
        try:
            self.pod = Pod(cfg, rank=self.index, device=device)
        except MemoryError as e:
            raise TrainingError(f"pod {self.index}: {e}") from None
        backend = self.pod.backend + (
            "" if self.pod.env_exact else " (not checkpointed exactly: a resume restarts episodes)"
        )
        self.say(
            start_line(
                self.index,
                node_name(),
                device,
                threads,
                backend,
                world_size=self.pool_size,
                local_rank=comm.local_rank,
                revision=self.revision,
            )
            + (f" (part {self.part} of a pool of {self.pool_size} pods)" if self.part.count > 1 else "")
        )
        self.take_lock()  # nothing above wrote into the run directory (a pod refused for its memory makes none)
        self.hb = self.vigil.open(str(device))  # the heartbeat: a refused second writer leaves none
        # a record says how this start ended; one that trains nothing (a redone final evaluation)
        # keeps the throughput of the start that trained
        self.prev_record = poolsummary.read_records(self.rundir, [self.index]).get(self.index, {})
        poolsummary.clear_record(self.rundir, self.index)
        choice = resume.agree(
            comm.allgather,
            comm.rank,
            comm.size,
            self.checkpoint_path,
            self.say,
            self.part_checkpoints() if comm.rank == 0 else [],
            independent=self.independent,
        )
        fresh = choice.fresh or choice.use[comm.rank] == "fresh"
        if fresh:
            self.prepare_fresh()
        else:
            self.resume(choice.epochs)
        self.open_log(device)
        if cfg.tournament.mode != "none":
            self.pool = Pool(
                cfg,
                comm,
                self.pod,
                self.rundir,
                self.part.identity(self.rundir.root, job_id()),
                self.say,
                self.log,
                index=self.index,
                pool_size=self.pool_size,
                part=self.part.index if self.part.count > 1 else None,
            )
            if self.state is None and self.pool.join() is None:
                self.pool.draw_first_hparams()
            else:
                self.pool.last_copy_round = self.state.last_copy_round
            if comm.rank == 0 and cfg.tournament.mode in EXPLORING_MODES:
                t = cfg.tournament
                what = (
                    "tournament.hparam_space"
                    if t.hparam_space
                    else "the default space (tournament.hparam_space is empty)"
                )
                rule = (
                    f"a pod that copied another, or started, is not replaced for {t.ready_rounds} rounds"
                    if t.mode == "pbt"
                    else f"only pods beyond the pool's mean +- {t.threshold_std:g} std act (dexpbt)"
                )
                if t.reserve:
                    rule += f"; pods of rank below {t.reserve} are never replaced (tournament.reserve)"
                self.say(f"PBT explores {describe_space(effective_space(t, cfg.agent.algo))}: {what}; {rule}")
        st = self.state if self.state is not None else RankState()
        self.round_index = st.round
        if st.pending_for(self.round_index) is not None:
            self.pending_fitness = Fitness.from_checkpoint(st.pending_for(self.round_index))
        # rounds: at exact env-step points, or spaced by a time floor (a GPU pod); the point of the
        # next round is state (kept in the checkpoint: a resume holds the same rounds)
        t = cfg.tournament
        self.min_interval_s = t.min_interval_s if t.min_interval_s >= 0 else (60.0 if device.type == "cuda" else 0.0)
        self.round_checkpoints = (
            cfg.log.round_checkpoints
            if cfg.log.round_checkpoints != "auto"
            else ("every" if self.min_interval_s == 0 else "due")
        )
        self.next_round = st.next_round or round_env_steps(t, self.round_index)
        self.round_clock = (time.perf_counter(), self.pod.env_steps)  # when and where the last round was
        self.eval_every = cfg.eval.interval_env_steps or cfg.total_env_steps
        self.best, self.last_eval = st.best_return, st.last_eval_return
        self.target.resume(st.reached, st.reached_target, self.comm)
        self.next_eval, self.wall_before = st.next_eval or self.eval_every, st.wall_s
        self.pod.prepare_training()  # start-up, not training: the optimizer's one-off import (pod.py)
        self.t_start, self.steps_at_start = time.perf_counter(), self.pod.env_steps
        self.last_ckpt = self.last_progress = time.monotonic()
        if self.state is None:
            self.save_checkpoint()  # a kill from here on resumes; it never starts over (nor joins again)

    def take_lock(self) -> None:
        """The run directory's writer lock for this world (:func:`podracer_hpc.rank.lock.take_world_lock`;
        an OSError of rank 0's, a read-only or full run directory, reaches the command's advice)."""
        self.lock = take_world_lock(self.comm, self.rundir, self.part, self.say)

    def part_checkpoints(self) -> list[int]:
        """The world ranks whose pods have checkpoint files here (resume.agree), pods of other parts
        left out; a pod beyond the pool counts as a rank beyond this world (a bigger run was here)."""
        mine = self.part.pods(self.comm.size)
        return [r - mine.start for r in self.rundir.checkpoint_pods() if r in mine or r >= self.pool_size]

    def resume(self, epochs: tuple[int | None, int | None]) -> None:
        """Load the checkpoint (read once: verified, config compared, restored) of the epochs that
        ``resume.agree`` found it and its .prev in."""
        tensors, meta, version = safeio.load(self.checkpoint_path, "pod-state")  # verifies before anything is touched
        diffs = resume.config_changes(self.rundir.config, meta.get("config", {}), to_dict(self.run_cfg))
        if diffs:
            raise ConfigError(
                f"{self.rundir.root} holds a run with another config; it cannot be resumed with this one:\n  "
                + "\n  ".join(diffs)
                + f"\nUse a new --run-dir, or the original settings (see {self.rundir.config})."
            )
        self.pod.restore(tensors, meta, version, source=str(self.checkpoint_path))
        self.state = RankState.from_meta(meta)
        self.ckpt_epochs = (self.state.round if epochs[0] is None else epochs[0], epochs[1])
        self.say(
            f"resuming from {self.checkpoint_path} at {fmt_steps(self.pod.env_steps)} env steps, "
            f"update {self.pod.updates}"
        )
        if not meta.get("env_exact", True):  # the pod's own key (pod.py)
            self.say(
                "this task's environment backend cannot be checkpointed: the agent resumes exactly, "
                "its environments start new episodes"
            )

    def prepare_fresh(self) -> None:
        if self.index == 0 or (self.comm.rank == 0 and not self.rundir.config.exists()):
            make_dirs(self.rundir.root)
            safeio.atomic_write_bytes(
                self.rundir.config, yaml.safe_dump(to_dict(self.run_cfg), sort_keys=False).encode(), mode=0o644
            )

    def open_log(self, device: torch.device) -> None:
        """Open (or continue) the rank's log, cut back to the checkpoint (to nothing when fresh)."""
        comm, pod = self.comm, self.pod
        attrs = {
            "config": to_dict(self.cfg),
            "git_revision": self.revision,
            "host": socket.gethostname(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "device_type": device.type,
            "versions": {"podracer_hpc": __version__, "torch": torch.__version__, "python": platform.python_version()},
            "seed": pod.seed,
            "rank": self.index,
            "world_size": comm.size,
            "slurm": slurm_ids(),
            "pool_size": self.pool_size,
            "pool_part": str(self.part),
            "mpi_rank": comm.rank,
            "comm": comm.note or ("mpi" if comm.is_mpi else "single"),
            "created": time.time(),
            # what a data-parallel all-reduce would sum per gradient step (report/aggregate.py's model)
            "param_count": sum(p.numel() for p in pod.agent.net.parameters() if p.requires_grad),
        }
        self.log = open_log(self.rundir.log(self.index), attrs, say=self.say)
        rows = self.state.log_rows if self.state is not None else None
        if rows is not None:  # the rows the checkpoint's log held (exact)
            dropped = self.log.truncate_to(rows)
        else:  # a checkpoint of an older version, or a fresh start
            dropped = self.log.truncate_after(pod.env_steps if self.state is not None else -1)
        if dropped:
            self.say(f"dropped {dropped} log rows written after the checkpoint it resumes from (their work is redone)")

    # --- the loop's steps -----------------------------------------------------------------
    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.t_start

    def trained(self) -> bool:
        return self.pod.env_steps >= self.cfg.total_env_steps

    def update(self) -> None:
        """One rollout and PPO update (a frozen NaN pod only advances its clock), and its log row."""
        pod, t0 = self.pod, time.perf_counter()
        if self.poisoned:
            pod.env_steps += pod.batch_size
            pod.updates += 1
            vals = {"loss": math.nan, "episodes": 0.0, "return_sum": 0.0, "return_sqsum": 0.0}
        else:
            m = pod.train_iteration()
            if self.inject_nan and pod.updates == self.inject_nan:
                m["loss"] = torch.tensor(math.nan)
                with torch.no_grad():
                    for prm in pod.agent.net.parameters():
                        prm.fill_(math.nan)
            vals = {k: float(v) for k, v in zip(m, torch.stack([v.double().cpu() for v in m.values()]).tolist())}
        dt = time.perf_counter() - t0
        if self.slow > 1:  # fault testing: a straggler (PODRACER_INJECT_SLOW)
            time.sleep((self.slow - 1) * dt)
            dt *= self.slow
        if not math.isfinite(vals["loss"]) and vals.get("grad_steps", 1) and not self.poisoned:  # NaN: no update yet
            self.freeze(vals["loss"])
        if self.inject_signal and pod.updates == self.inject_signal:
            os.kill(os.getpid(), signal.SIGUSR2)
        if self.inject_hang and pod.updates == self.inject_hang:
            self.log.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
        self.updates_here += 1
        self.log_update(vals, dt)
        self.hb.beat(
            "training",
            update=pod.updates,
            env_steps=pod.env_steps,
            wall_s=self.wall(),
            steps_per_s=pod.batch_size / dt,
        )

    def freeze(self, loss: float) -> None:
        pod = self.pod
        if self.pool is None:
            raise TrainingError(
                f"pod {self.index}: loss is {loss} at update {pod.updates} ({pod.env_steps} env steps). "
                f"Nothing after the last checkpoint ({self.checkpoint_path}) was saved. Lower agent.learning_rate, "
                "keep agent.norm_obs/norm_reward on, or check the environment for NaN observations."
            )
        self.poisoned = True
        self.say(
            f"loss is {loss} at update {pod.updates}: this pod is frozen until round "
            f"{self.round_index} replaces it from the leaderboard"
        )

    def log_update(self, vals: dict[str, float], dt: float) -> None:
        pod = self.pod
        n_ep = int(vals["episodes"])
        mean = vals["return_sum"] / n_ep if n_ep else math.nan
        if n_ep:
            self.last_train = mean
        std = math.sqrt(max(0.0, vals["return_sqsum"] / n_ep - mean * mean)) if n_ep else math.nan
        row = {
            "update": pod.updates,
            "env_steps": pod.env_steps,
            "wall_s": self.wall(),
            "steps_per_s": pod.batch_size / dt,
            "loss": vals["loss"],
        }
        if not self.poisoned:
            row.update(
                return_mean=mean,
                return_std=std,
                episodes=n_ep,
                **{
                    k: vals[k]
                    for k in (
                        "policy_loss",
                        "value_loss",
                        "entropy",
                        "approx_kl",
                        "clipfrac",
                        "explained_variance",
                        "learning_rate",
                    )
                },
                **{k: vals[k] for k in ("q_mean", "alpha", "grad_steps") if k in vals},
            )  # SAC/TD3
        self.log.append("train", row)

    def eval_due(self) -> bool:
        return self.pod.env_steps >= self.next_eval or self.trained()

    def evaluate(self, seed: int | None = None) -> Fitness:
        """Deterministic episodes from the start states of ``seed`` (default: the run's set for this
        env-step point, common to every pod); one log row; NaN for a frozen pod."""
        pod = self.pod
        seed = eval_seed(self.cfg.seed, "eval", pod.env_steps) if seed is None else seed
        self.hb.beat("evaluating")
        r = pod.evaluate(seed).cpu().numpy()
        if self.poisoned:
            r = r * math.nan
        fit = Fitness(tuple(r.tolist()), seed)
        self.last_eval = fit.mean
        self.best = max(self.best, self.last_eval)
        self.target.evaluated(fit.mean, pod.env_steps, self.comm)
        self.hb.record.update(last_eval=fit.mean, best_eval=self.best)
        self.log.append(
            "eval",
            {
                "update": pod.updates,
                "env_steps": pod.env_steps,
                "wall_s": self.wall(),
                "return_mean": self.last_eval,
                "return_std": float(r.std()),
                "return_min": float(r.min()),
                "return_max": float(r.max()),
                "episodes": len(r),
                "return_se": fit.se,
                "eval_seed": seed,
            },
            flush=True,
        )
        while self.next_eval <= pod.env_steps:
            self.next_eval += self.eval_every
        return fit

    def round_due(self) -> bool:
        """A round is due once the pod has passed its env-step point; points beyond the training
        budget are not held (every pod passes each point up to the budget whatever its batch, so
        the pods of a mixed pool, with batches of their own, meet at the same rounds)."""
        return (
            self.pool is not None
            and self.pod.env_steps >= self.next_round
            and self.next_round <= self.cfg.total_env_steps
        )

    def round(self) -> None:
        """Tournament round: evaluate, then decide with the others (collective) or alone (async)."""
        trained_until = time.perf_counter()  # the pod's speed is its training's, not this round's evaluation
        if self.pending_fitness is not None:  # evaluated before a stop: the same value, not a second row
            fitness, self.pending_fitness = self.pending_fitness, None
        else:  # every pod of the round on the same start states (common random numbers; fitness.py):
            # those of the periodic evaluation at the round's env-step point, which every pod of the
            # round shares whatever its batch, and which an independent pod meets at that point too
            fitness = self.evaluate(
                eval_seed(self.cfg.seed, "eval", self.next_round)
                if self.pool.collective
                else eval_seed(self.cfg.seed, "async")
            )
        wish = self.schedule_wish(trained_until)
        if self.pool.collective:
            met_at = time.perf_counter()
            everyone = self.meet("round", self.pool.report(fitness), schedule=wish)
            if self.met is not None:  # someone stopped: no round; the run ends here for everyone
                self.pending_fitness = fitness
                return
            # the same schedule on every rank: the fastest pod's spacing, a checkpoint if anyone's is due
            wish = (max(m.schedule[0] for m in everyone), any(m.schedule[1] for m in everyone))
            reports = [m.report for m in everyone]
            record = self.pool.collective_round(self.round_index, fitness, self.wall(), reports, met_at=met_at)
            if self.comm.rank == 0:
                self.pool_line = pool_line(self.round_index, reports)
        else:
            record = self.pool.async_round(self.round_index, fitness, self.wall())
        if self.poisoned and record.action != "keep":
            self.poisoned = False
            self.say(
                f"round {self.round_index}: restored from {record.source.id or 'a fresh agent'} after NaN; "
                "training goes on"
            )
        self.round_index += 1
        self.vigil.round_s = max(self.vigil.round_s, time.perf_counter() - self.round_clock[0])
        self.hb.record.update(rounds=self.round_index, last_action=f"r{record.round}: {record.action}")
        self.next_round += wish[0] * self.cfg.tournament.interval_env_steps
        if wish[1]:
            self.save_checkpoint()
            if self.pool.collective:  # the whole pool checkpointed at this round: a resume starts here or later
                self.pool.loaded_since_checkpoint.clear()
        # the next wish measures the pod's speed from here (a round's checkpoint is not training)
        self.round_clock = (time.perf_counter(), self.pod.env_steps)

    def schedule_wish(self, trained_until: float) -> tuple[int, bool]:
        """At a round: whole intervals this pod wants before the next round (its speed from the end
        of the last round to ``trained_until``, the start of this one, against
        ``tournament.min_interval_s``: the rounds' own evaluations and checkpoints are not training,
        and counted in they made a short interval look slow and the next round come too soon), and
        whether this round should checkpoint (``log.round_checkpoints``: every round, or once
        ``log.checkpoint_interval_s`` has passed)."""
        t0, steps0 = self.round_clock
        rate = (self.pod.env_steps - steps0) / max(trained_until - t0, 1e-9)
        intervals = intervals_to_next_round(self.cfg.tournament, rate, self.min_interval_s)
        return intervals, self.round_checkpoints == "every" or self.checkpoint_interval_passed()

    def checkpoint_interval_passed(self) -> bool:
        """Whether ``log.checkpoint_interval_s`` (0: never) has passed since this rank's last checkpoint."""
        interval = self.cfg.log.checkpoint_interval_s
        return bool(interval) and time.monotonic() - self.last_ckpt >= interval

    def checkpoint_due(self) -> bool:
        """A checkpoint of this rank's own between rounds (``log.checkpoint_interval_s``). Collective
        pods take one only in an epoch whose round checkpointed: their files stay within one
        round of each other's, as :func:`resume.choose` needs (``.prev`` keeps the previous epoch)."""
        if self.pool is not None and self.pool.collective and self.ckpt_epochs[0] != self.round_index:
            return False
        return self.checkpoint_interval_passed()

    def save_checkpoint(self) -> None:
        """Save the pod (its log flushed first, so the log holds every row the checkpoint holds)."""
        self.log.flush()
        epoch = self.round_index
        ckpt_epoch, prev_epoch = self.ckpt_epochs
        if self.checkpoint_path.exists() and resume.rotate_prev(ckpt_epoch, prev_epoch, epoch, self.independent):
            tmp = self.checkpoint_path.with_suffix(".prev.tmp")  # keep the last one as .prev; the path is always whole
            tmp.unlink(missing_ok=True)
            os.link(self.checkpoint_path, tmp)
            os.replace(tmp, resume.prev_of(self.checkpoint_path))
            prev_epoch = ckpt_epoch
        extra = RankState(
            best_return=self.best,
            last_eval_return=self.last_eval,
            next_eval=self.next_eval,
            wall_s=self.wall(),
            round=epoch,
            world_size=self.comm.size,
            next_round=self.next_round,
            last_copy_round=self.pool.last_copy_round if self.pool is not None else -1,
            pending_round=[self.round_index, self.pending_fitness.to_checkpoint()]
            if self.pending_fitness is not None
            else None,
            reached=self.target.reached,
            reached_target=self.target.value,
            collectives=dict(self.comm.calls),
            log_rows=self.log.rows(),
        )
        self.pod.save(self.checkpoint_path, extra.to_meta())
        self.ckpt_epochs = (epoch, prev_epoch)
        self.last_ckpt = time.monotonic()

    def progress(self) -> None:
        """A progress line every log.progress_interval_s: from rank 0 only (with the pool's last
        collective round, what every rank reported there), unless log.progress_all_ranks."""
        now, interval = time.monotonic(), self.cfg.log.progress_interval_s
        if not interval or now - self.last_progress < interval:
            return
        if self.comm.rank != 0 and not self.cfg.log.progress_all_ranks:
            return
        self.last_progress = now
        total, pod = self.cfg.total_env_steps, self.pod
        sps = (pod.env_steps - self.steps_at_start) / max(1e-9, time.perf_counter() - self.t_start)
        eta = (total - pod.env_steps) / max(sps, 1e-9)
        self.say(
            f"{100 * pod.env_steps / total:5.1f}% {fmt_steps(pod.env_steps)}/{fmt_steps(total)} steps | "
            f"{sps / 1e3:.0f}k steps/s | train {self.last_train:.1f} | eval {self.last_eval:.1f} "
            f"(best {self.best:.1f}) | ETA {eta:.0f}s" + self.pool_line,
            progress=True,
        )

    def stopping(self) -> bool:
        """Whether this rank stops now: its own signal or --stop-after-updates (then it tells the
        others), another rank's notice, a meeting where someone stopped, or the target: reached
        here or by another pod, once this pod has trained as far (:class:`Target`)."""
        if self.stopped_by or self.met is not None or self.target.stopped:
            return True
        if self.stop.signal is not None:
            self.stopped_by = f"signal {self.stop.name}"
        elif self.stop_after_updates and self.updates_here >= self.stop_after_updates:
            self.stopped_by = f"--stop-after-updates {self.stop_after_updates}"
        else:
            why = self.target.poll(self.comm, self.pod.env_steps, self.round_due())
            if why == "stop":
                self.stopped_by = "another rank's stop"
            return bool(why)
        self.comm.announce_stop()
        return True

    # --- the end --------------------------------------------------------------------------
    def meet(self, kind: str, report: Any = None, schedule: tuple[int, bool] = (1, True)) -> list[Meeting]:
        """Meet every rank: a collective, only at rounds and at the end. Unless everyone came for a
        round, this meeting is the last one (anyone's ``stop`` stops everyone; a ``target`` and no
        ``stop`` ends the run complete) and :attr:`met` keeps it."""
        # made once every rank has come (comm.meet passes stop notices on while this rank waits):
        # then it says every notice this rank will ever send, and the last meeting settles them
        everyone = self.comm.meet(lambda: Meeting(kind, report, self.comm.announced, {}, self.comm.notified, schedule))
        kinds = {m.kind for m in everyone}
        if kinds == {"round", "done"}:
            raise TrainingError(
                f"ranks reached different points of the schedule ({sorted(kinds)}); "
                "every pod of a collective pool needs the same env.num_envs and agent.rollout_steps"
            )
        if kinds != {"round"}:
            self.met = everyone
            if "stop" in kinds and not self.stopped_by:
                self.stopped_by = "another rank's stop"
            self.target_end = "target" in kinds and "stop" not in kinds
        return everyone

    def record(self) -> dict[str, Any]:
        """This pod's part of the run summary (poolsummary.py), written to the run directory when it ends."""
        return {
            "state": "done" if self.ended_well() else "stopped",
            "reached": self.target.reached or None,  # env steps of its first evaluation at or above the target
            "target_end": self.target.stopped or self.target_end,  # it ended because a pod reached the target
            "algo": self.cfg.agent.algo,
            "env_steps": self.pod.env_steps,
            "best": self.best,
            "final": self.last_eval,
            "wall_s": self.wall(),
            **(
                {k: self.prev_record[k] for k in ("run_steps", "run_wall") if k in self.prev_record}
                if self.updates_here == 0 and self.prev_record.get("run_steps")
                else {
                    "run_steps": self.pod.env_steps - self.steps_at_start,
                    "run_wall": time.perf_counter() - self.t_start,
                }
            ),
            "rounds": self.round_index,
            "job": job_id(),
            "part": str(self.part),
            "updates": self.pod.updates,
            "verdict": (self.verdict.mean, self.verdict.se, self.verdict.ci95()) if self.verdict else None,
            "publish_failed": self.publish_failures(),
        }

    def ended_well(self) -> bool:
        """Nothing is left to train for this pod: its budget is done, or a pod of the run reached
        the target (not a stop, which a resume continues)."""
        if self.stopped_by:
            return False
        return self.target.stopped or self.target_end or (self.trained() and self.met is None)

    def publish_failures(self) -> int:
        """Rounds of this pod (resumed ones too: its log's rows) whose publication failed."""
        if self.log is None:
            return 0
        try:
            return int((self.log.column("tournament", "publish_failed") == 1).sum())
        except (OSError, RuntimeError, KeyError):
            return 0

    def finish(self) -> RunResult:
        """The final verdict (a trained pod on the run's common final set), checkpoint, this pod's
        record in the run directory, the ranks' last meeting (who stopped), and rank 0 writes
        summary.json from every pod's record (the whole pool's, when it runs as several jobs)."""
        n = self.cfg.eval.final_episodes
        if n and self.ended_well():
            seed = eval_seed(self.cfg.seed, "final")
            r = self.pod.evaluate(seed, episodes=n).cpu().numpy() * (math.nan if self.poisoned else 1.0)
            self.verdict = Fitness(tuple(r.tolist()), seed)
        if self.stopped_by or self.updates_here or not self.checkpoint_path.exists():
            self.save_checkpoint()
        record = self.record()
        poolsummary.write_record(self.rundir, self.index, record)  # before the meeting: rank 0 reads it after
        self.hb.beat("ended", force=True, state=record["state"], update=self.pod.updates, env_steps=self.pod.env_steps)
        if self.met is None:
            self.meet("stop" if self.stopped_by else "target" if self.target.stopped else "done")
        self.comm.settle_notices([m.notified for m in self.met])
        complete = self.target_end or all(m.kind == "done" for m in self.met)
        self.vigil.aggregate(self.pool_size, "done" if complete else "stopped", force=True)
        if not complete:
            hops = self.comm.notice_hops  # the first notice this rank got, over the ranks' tree (comm.py)
            via = f" (its notice came over {hops} hop{'s' * (hops != 1)})" if hops and not self.comm.announced else ""
            self.say(
                f"stopped by {self.stopped_by or 'another rank'}{via} at {fmt_steps(self.pod.env_steps)} env steps; "
                "checkpoint saved, run again to resume"
            )
        summary = self.summarize() if self.comm.rank == 0 else {}
        if summary.get("ended_at_target"):
            at = summary["ended_at_target"]
            self.say(
                f"eval.stop_at_return {self.target.value:g} reached by pod {', '.join(map(str, at['pods']))} at "
                f"{fmt_steps(at['env_steps'])} env steps: every pod stopped there or soon after; the run is complete"
            )
        return RunResult(complete=complete, summary=summary, rank=self.comm.rank, wait_for_all=self.comm.barrier)

    def summarize(self) -> dict[str, Any]:
        """Rank 0 of a job: summary.json from every pod's record (poolsummary.assemble); once the
        whole pool is done, the last round's sources may go from the leaderboard."""
        records = poolsummary.read_records(self.rundir, range(self.pool_size))
        for _ in range(3):  # another job of the pool may have ended meanwhile: the last writer must see it
            summary = poolsummary.assemble(
                records,
                self.pool_size,
                task=self.cfg.env.name,
                revision=self.revision,
                tournament=self.pool is not None,
                final_episodes=self.cfg.eval.final_episodes,
                final_eval_seed=eval_seed(self.cfg.seed, "final"),
            )
            safeio.atomic_write_bytes(self.rundir.summary, (json.dumps(summary, indent=2) + "\n").encode(), mode=0o644)
            again = poolsummary.read_records(self.rundir, range(self.pool_size)) if self.part.count > 1 else records
            if again == records:
                break
            records = again
        complete = summary.get("complete", True)
        if not complete and self.part.count > 1:
            self.say(
                f"summary of the pool so far ({summary.get('pods_done', 0)} of {self.pool_size} pods done): "
                + poolsummary.describe_missing(summary)
            )
        if self.pool is not None and complete:  # every pod checkpointed: the last round's sources may go
            self.pool.board.prune(self.cfg.tournament.top_k, group=lambda e: entry_kind(e.meta))
        if self.pool is not None and not self.quiet:
            print(self.pool.table(), file=sys.stderr, flush=True)
        return summary

    def close(self) -> None:
        try:
            if self.log is not None:
                self.log.close()
        finally:
            if self.lock is not None:
                self.lock.release()


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
