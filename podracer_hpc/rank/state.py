"""The run loop's own state in a pod checkpoint: one typed record beside the pod's.

A checkpoint's meta holds the pod's state (pod.py: counters, seeds, its config) and this rank's
progress through the run (:class:`RankState`: the best and last evaluation, the next evaluation and
round, the round it is in, a round's evaluation whose meeting ended the run, where it first reached
the run's target return, the rows its log held). ``RankRun.save_checkpoint`` writes it with
:meth:`RankState.to_meta`; a resume reads it back with :meth:`RankState.from_meta`, which knows
every key's default, so a checkpoint written before a key existed still resumes (the defaults are
what that older code did). Nothing here imports torch, h5py or MPI.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["RankState"]


@dataclass
class RankState:
    """One rank's progress through the run, as its checkpoint keeps it."""

    best_return: float = -math.inf  # the best evaluation so far
    last_eval_return: float = math.nan  # the last evaluation
    next_eval: int = 0  # env steps of the next evaluation (0: not recorded: the first interval)
    wall_s: float = 0.0  # training seconds before this start
    round: int = 0  # the round the pod is in (its epoch: resume.py)
    world_size: int | None = None  # ranks of the MPI world that wrote it (None: not recorded)
    next_round: int = 0  # env steps of the next round (0: not recorded: the round's own point)
    last_copy_round: int = -1  # the last round this pod took another agent or mutated its own values (PBT's "ready")
    pending_round: list | None = None  # [round, fitness]: evaluated for a round whose meeting ended the run
    reached: int = 0  # env steps of the pod's first evaluation at or above eval.stop_at_return (0: none)
    reached_target: float | None = None  # the eval.stop_at_return ``reached`` is for
    collectives: dict[str, int] = field(default_factory=dict)  # this process's collective calls (tests count them)
    log_rows: dict[str, int] | None = None  # what the (flushed) log held: a resume cuts it back to this

    def to_meta(self) -> dict[str, Any]:
        """The keys it adds to the checkpoint's meta."""
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "RankState":
        """Read back from a checkpoint's meta: a missing or null key takes its default (an older
        checkpoint), a malformed one too (never a crash at resume)."""
        out = cls()
        for f in fields(cls):
            v = meta.get(f.name)
            if v is None:
                continue
            want = type(getattr(out, f.name)) if getattr(out, f.name) is not None else None
            try:
                if want is float:
                    v = float(v)
                elif want is int or f.name == "world_size":
                    v = int(v)
                elif want is dict and not isinstance(v, dict):
                    continue
                elif f.name == "pending_round" and not (isinstance(v, list) and len(v) == 2):
                    continue
                elif f.name == "log_rows" and not isinstance(v, dict):
                    continue
                elif f.name == "reached_target":
                    v = float(v)
            except (TypeError, ValueError):
                continue
            setattr(out, f.name, v)
        return out

    def pending_for(self, round_index: int) -> Any:
        """The fitness (checkpoint form) a stopped round ``round_index`` had evaluated, else None."""
        if self.pending_round is not None and self.pending_round[0] == round_index:
            return self.pending_round[1]
        return None
