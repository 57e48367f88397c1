"""Typed tournament-log records: what a pod did at a round, and where its agent came from.

Written by the rank program (one row of a rank log's ``/tournament`` group per round) and read
by ``podracer status`` and ``analysis/`` through :func:`read_records`, never by parsing strings.
Logs written before these columns existed (schema version 1: one ``source`` string such as
``pod3``, ``<entry id>`` or ``rejected:<entry id>``) are read through the same function; that
parsing lives here and nowhere else. Also here: the shape of leaderboard entry ids
(``<job>-<pod>-<round>-<12 hex>``), which :mod:`podracer_hpc.pool.leaderboard` writes.

No heavy imports (analysis and status read logs without torch).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["Comparison", "EntryName", "RoundRecord", "Source", "parse_entry_id", "read_records"]

SOURCE_KINDS = ("", "pod", "entry", "fresh")  # none | another pod of this round | a leaderboard entry | a new agent
_ENTRY_RE = re.compile(r"^(?P<job>.+)-(?P<pod>\d+)-(?P<round>\d+)-(?P<hex>[0-9a-f]{12})$")


@dataclass(frozen=True)
class EntryName:
    """The parts of a leaderboard entry id made by ``leaderboard.make_entry_id``."""

    job: str
    pod: int
    round: int


def parse_entry_id(entry_id: str) -> EntryName | None:
    """``job-pod-round-hex`` -> its parts; any other id -> None."""
    m = _ENTRY_RE.match(entry_id)
    return EntryName(m["job"], int(m["pod"]), int(m["round"])) if m else None


@dataclass(frozen=True)
class Source:
    """Where a pod's agent came from at a round."""

    kind: str = ""  # one of SOURCE_KINDS
    id: str = ""  # "pod": the rank as text; "entry": the entry id
    rejected: bool = False  # the source could not be loaded; the pod kept its own agent

    @property
    def pod(self) -> int | None:
        """The rank of the pod the agent came from (a pod of this round, or an entry's publisher)."""
        if self.kind == "pod":
            return int(self.id)
        name = parse_entry_id(self.id) if self.kind == "entry" else None
        return name.pod if name else None

    @property
    def entry(self) -> EntryName | None:
        return parse_entry_id(self.id) if self.kind == "entry" else None

    def legacy(self) -> str:
        """The schema-1 ``source`` string (still written, for older readers)."""
        s = f"pod{self.id}" if self.kind == "pod" else self.id if self.kind == "entry" else ""
        return f"rejected:{s}" if self.rejected else s

    @classmethod
    def from_legacy(cls, s: str) -> "Source":
        """Parse a schema-1 ``source`` string (the one place that does)."""
        rejected = s.startswith("rejected:")
        body = s.split(":", 1)[1] if rejected else s
        m = re.fullmatch(r"pod(\d+)", body)
        if m:
            return cls("pod", m[1], rejected)
        return cls("entry" if body else "", body, rejected)


@dataclass(frozen=True)
class Comparison:
    """What a round's decision was based on: the pod's fitness on the round's start states, and
    the paired comparison with the candidate (NaN / -1 where there was none)."""

    fitness_se: float = math.nan  # standard error of the pod's fitness
    eval_seed: int = -1  # the round's start states
    episodes: int = -1  # episodes behind the fitness
    source_score: float = math.nan  # the candidate's score as the rule saw it
    diff_mean: float = math.nan  # paired mean difference candidate - own, on common start states
    diff_se: float = math.nan  # its standard error
    margin_se: float = math.nan  # the margin asked for (standard errors)
    verified: bool = False  # the candidate was evaluated on this round's start states before being taken


@dataclass(frozen=True)
class RoundRecord:
    """One row of a rank's ``/tournament`` log: a round's decision and what came of it."""

    round: int  # tournament round; -1 for the elastic join at the start
    env_steps: int  # the pod's env steps at the round
    wall_s: float  # the run's wall time at the round
    fitness: float  # the pod's evaluation return (NaN if it failed)
    action: str  # keep | load_entry | copy_pod | reset | join | draw (round -1: the first hparams)
    source: Source = field(default_factory=Source)
    old_hparams: dict[str, float] = field(default_factory=dict)
    new_hparams: dict[str, float] = field(default_factory=dict)
    tournament_s: float = math.nan  # seconds spent in the round's collectives and file I/O
    fs_ops: int = -1  # leaderboard filesystem operations of this pod in the round (-1: not counted)
    compared: Comparison = field(default_factory=lambda: Comparison())  # the numbers the decision used
    algo: str = ""  # the pod's learner (agent.algo); "" in a log of an older schema
    publish_failed: bool = False  # this pod was to publish and could not (a full disk): not skipped silently

    def to_row(self) -> dict[str, Any]:
        """The HDF5 columns (h5log.TOURNAMENT_COLUMNS)."""
        c = self.compared
        return {
            "round": self.round,
            "env_steps": self.env_steps,
            "wall_s": self.wall_s,
            "fitness": self.fitness,
            "action": self.action,
            "source": self.source.legacy(),
            "source_kind": self.source.kind,
            "source_id": self.source.id,
            "source_rejected": int(self.source.rejected),
            "old_hparams": json.dumps(self.old_hparams),
            "new_hparams": json.dumps(self.new_hparams),
            "tournament_s": self.tournament_s,
            "fs_ops": self.fs_ops,
            "fitness_se": c.fitness_se,
            "eval_seed": c.eval_seed,
            "episodes": c.episodes,
            "source_score": c.source_score,
            "diff_mean": c.diff_mean,
            "diff_se": c.diff_se,
            "margin_se": c.margin_se,
            "verified": int(c.verified),
            "algo": self.algo,
            "publish_failed": int(self.publish_failed),
        }


def _hparams(s: Any) -> dict[str, float]:
    try:
        d = json.loads(s) if s else {}
    except (TypeError, json.JSONDecodeError):
        return {}
    return (
        {str(k): float(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if isinstance(d, dict)
        else {}
    )


def read_records(columns: Mapping[str, Sequence[Any]]) -> list[RoundRecord]:
    """The records of a ``/tournament`` group read by ``h5log.read_log`` (any schema version)."""
    n = len(columns.get("round", ()))
    typed = "source_kind" in columns and len(columns["source_kind"]) == n
    out = []
    for i in range(n):
        kind = str(columns["source_kind"][i]) if typed else ""
        if typed and (kind or not str(columns.get("source", [""] * n)[i])):
            src = Source(kind, str(columns["source_id"][i]), bool(int(columns["source_rejected"][i])))
        else:  # a schema-1 row (or a row appended to an upgraded schema-1 file before the upgrade)
            src = Source.from_legacy(str(columns.get("source", [""] * n)[i]))
        out.append(
            RoundRecord(
                round=int(columns["round"][i]),
                env_steps=int(columns["env_steps"][i]),
                wall_s=float(columns["wall_s"][i]),
                fitness=float(columns["fitness"][i]),
                action=str(columns["action"][i]),
                source=src,
                old_hparams=_hparams(columns["old_hparams"][i]),
                new_hparams=_hparams(columns["new_hparams"][i]),
                tournament_s=float(columns["tournament_s"][i]) if "tournament_s" in columns else math.nan,
                fs_ops=int(columns["fs_ops"][i]) if "fs_ops" in columns and len(columns["fs_ops"]) == n else -1,
                compared=_comparison(columns, i, n),
                algo=str(columns["algo"][i]) if "algo" in columns and len(columns["algo"]) == n else "",
                publish_failed=bool(
                    "publish_failed" in columns
                    and len(columns["publish_failed"]) == n
                    and int(columns["publish_failed"][i]) == 1
                ),
            )
        )
    return out


def _comparison(columns: Mapping[str, Sequence[Any]], i: int, n: int) -> Comparison:
    """Row ``i``'s comparison columns (schema 3); the defaults for a log written before them."""

    def col(name: str, default: Any, kind: type) -> Any:
        c = columns.get(name)
        return kind(c[i]) if c is not None and len(c) == n else default

    return Comparison(
        col("fitness_se", math.nan, float),
        col("eval_seed", -1, int),
        col("episodes", -1, int),
        col("source_score", math.nan, float),
        col("diff_mean", math.nan, float),
        col("diff_se", math.nan, float),
        col("margin_se", math.nan, float),
        bool(col("verified", 0, int)),
    )
