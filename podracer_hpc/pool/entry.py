"""One leaderboard entry, the one record every part of the pool passes around.

The leaderboard reads it from an entry's sidecar (:meth:`podracer_hpc.pool.leaderboard.Leaderboard.list`),
a collective round keeps the listing it decided on in ``rounds/<i>.json`` (:meth:`Entry.to_listing`
and :meth:`Entry.from_listing`, rows ``[id, score, env_steps, eval, kind]``), and the pure rules
(:mod:`podracer_hpc.pool.rules`) draw from a list of them, with ``returns`` filled in when the
entry's episodes were on the round's start states. A plain tuple ``(id, score[, env_steps[,
returns[, kind]]])`` is read as an entry too (:meth:`Entry.of`), so the rules can be tried from a
table.

Pure: no I/O, no torch (the rules import it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["Entry", "entries_of"]


@dataclass(frozen=True)
class Entry:
    """One leaderboard entry: what its sidecar says, and what a round knows of it."""

    id: str  # entry id (file stem)
    score: float  # fitness of the published agent (always finite in a listing; NaN if the file's is not)
    env_steps: int | None = None  # env steps the agent was trained on (None: unknown, fresh for every pod)
    pod: int | None = None  # pool index of the publishing pod
    job: str | None = None  # job id of the publisher
    round: int | None = None  # tournament round of the publication
    hparams: dict[str, float] = field(default_factory=dict)  # hyperparameters of the publisher
    created: float = 0.0  # unix time of publication
    sha256: str = ""  # digest of the .safetensors file
    meta: dict[str, Any] = field(default_factory=dict)  # everything the publisher passed
    kind: str | None = None  # the agent's kind (agents.settings.agent_kind); None: unknown, any pod may try it
    # its episodes when they were on this round's start states (None: scored elsewhere, not
    # comparable episode by episode); set by the round that compares, never stored
    returns: tuple[float, ...] | None = None

    @property
    def eval(self) -> dict[str, Any] | None:
        """The evaluation it was scored on (``fitness.Fitness.to_json``; None for an older entry)."""
        return self.meta.get("eval")

    def to_listing(self) -> list[Any]:
        """Its row in a collective round's kept listing (``rounds/<i>.json``)."""
        return [self.id, self.score, self.env_steps, self.eval, self.kind]

    @classmethod
    def from_listing(cls, row: list[Any]) -> Entry:
        """An entry from a row of a kept listing (rows of 2 to 5 items: older listings are shorter)."""
        ev = row[3] if len(row) > 3 else None
        return cls(
            str(row[0]),
            float(row[1]),
            row[2] if len(row) > 2 else None,
            meta={} if ev is None else {"eval": ev},
            kind=row[4] if len(row) > 4 else None,
        )

    @classmethod
    def of(cls, item: Entry | tuple | list) -> Entry:
        """``item`` itself, or an entry from a tuple ``(id, score[, env_steps[, returns[, kind]]])``."""
        if isinstance(item, Entry):
            return item
        return cls(
            str(item[0]),
            float(item[1]),
            item[2] if len(item) > 2 else None,
            kind=item[4] if len(item) > 4 else None,
            returns=item[3] if len(item) > 3 else None,
        )


def entries_of(items: Iterable[Entry | tuple | list]) -> list[Entry]:
    """:meth:`Entry.of` of each item."""
    return [Entry.of(x) for x in items]
