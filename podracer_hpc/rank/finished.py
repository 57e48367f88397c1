"""Whether a run directory already holds this very run, complete: then ``podracer train`` leaves it
as it is (it says so and prints the summary) instead of resuming it to redo its final evaluation.

Complete means: the run's ``config.yaml`` equals the config asked for (a larger ``total_env_steps``
is a request to train on), every pod of this part left a ``done`` record (its budget trained, or
the run ended at its ``eval.stop_at_return``) with its final evaluation, its checkpoint is there,
no checkpoint of a larger pool is, and the summary is readable (and complete, for a run of one
part). Reads files only: nothing is created or changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import yaml

from podracer_hpc.config import Config, to_dict
from podracer_hpc.files import summary as poolsummary
from podracer_hpc.files.rundir import PoolPart, RunDir

__all__ = ["complete_summary", "finished_summary", "fmt_steps"]


def _config_there(path: Path) -> dict[str, Any] | None:
    try:
        d = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return d if isinstance(d, dict) else None


def complete_summary(rundir: RunDir, cfg: Config, part: PoolPart, world: int) -> tuple[dict[str, Any], int] | None:
    """``(summary, env steps of this part's pods)`` when ``rundir`` holds the run of ``cfg`` complete
    for this part (``world`` ranks); None when there is anything to train or evaluate."""
    if _config_there(rundir.config) != to_dict(cfg):
        return None
    pods = part.pods(world)
    records = poolsummary.read_records(rundir, pods)
    if len(records) != len(pods) or any(
        r.get("state") != "done"
        or not isinstance(r.get("env_steps"), int)
        or (r["env_steps"] < cfg.total_env_steps and not r.get("target_end"))
        or (cfg.eval.final_episodes > 0 and not isinstance(r.get("verdict"), list))
        for r in records.values()
    ):
        return None
    if not all(rundir.checkpoint_path(i).exists() for i in pods) or max(rundir.checkpoint_pods(), default=0) >= (
        part.count * world
    ):
        return None
    try:
        summary = json.loads(rundir.summary.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or (part.count == 1 and summary.get("complete", True) is not True):
        return None
    return summary, sum(r["env_steps"] for r in records.values())


def finished_summary(rundir: RunDir, cfg: Config, part: PoolPart, comm: Any, say: Callable[[str], None]) -> dict | None:
    """:func:`complete_summary`'s summary, said on stderr by rank 0 (what was found, that nothing
    changed, and how to redo, extend or start anew); None when there is anything to do."""
    found = complete_summary(rundir, cfg, part, comm.size)
    if found is not None and comm.rank == 0:
        n = len(part.pods(comm.size))
        if found[0].get("ended_at_target"):
            budget = f"a pod reached eval.stop_at_return {cfg.eval.stop_at_return:g}"
            more = "--set eval.stop_at_return=<higher> (or null)"
        else:
            budget, more = f"total_env_steps {fmt_steps(cfg.total_env_steps)} each", "--set total_env_steps=<more>"
        say(
            f"{rundir.root} is complete: {n} pod{'s' * (n != 1)} trained {fmt_steps(found[1])} env steps "
            f"({budget}) and were evaluated; nothing to do, no file changed. Its summary follows. To redo the "
            f"final evaluation: --force-final-eval; to train on: {more}; a new run: a new --run-dir"
        )
    return None if found is None else found[0]


def fmt_steps(n: float) -> str:
    """Env steps for a message: ``6k``, ``1.25M``."""
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"
