"""Whether a run directory already holds this very run, complete: then ``podracer train`` leaves it
as it is (it says so and prints the summary) instead of resuming it to redo its final evaluation.

Complete means: the run's ``config.yaml`` equals the config asked for (a larger
``total_env_steps`` is a request to train on), every pod of this part left a ``done`` record with
its final evaluation, its checkpoint is there, no checkpoint of a larger pool is, and the summary
is readable (and complete, for a run of one part). Reads files only: nothing is created or changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from podracer_hpc.config import Config, to_dict
from podracer_hpc.files import summary as poolsummary
from podracer_hpc.files.rundir import PoolPart, RunDir

__all__ = ["complete_summary"]


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
        or r["env_steps"] < cfg.total_env_steps
        or (cfg.eval.final_episodes > 0 and not isinstance(r.get("verdict"), list))
        for r in records.values()
    ):
        return None
    if not all(rundir.checkpoint(i).exists() for i in pods) or max(rundir.checkpoint_ranks(), default=0) >= (
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
