"""Fault injection for tests and benches: a rank's faults, named in ``PODRACER_INJECT_<NAME>``.

Each variable holds ``RANK:VALUE[,RANK:VALUE...]``; the rank program (run.py) asks once at its
start. Nothing here acts: it only reads what a test asked for.
"""

from __future__ import annotations

import os

__all__ = ["hang_update", "injection", "nan_update", "signal_update", "slow_factor"]


def injection(name: str, rank: int) -> str | None:
    """The value for ``rank`` in ``PODRACER_INJECT_<NAME>=RANK:VALUE[,RANK:VALUE...]`` (None if none)."""
    for item in filter(None, os.environ.get(f"PODRACER_INJECT_{name}", "").split(",")):
        r, v = item.split(":")
        if int(r) == rank:
            return v
    return None


def nan_update(rank: int) -> int:
    """``PODRACER_INJECT_NAN=RANK:UPDATE`` poisons that rank's weights at that update (0: never)."""
    return int(injection("NAN", rank) or 0)


def slow_factor(rank: int) -> float:
    """``PODRACER_INJECT_SLOW=RANK:FACTOR[,...]`` makes those ranks' updates take FACTOR times as
    long (a straggler: a throttled GPU, a busy node)."""
    return float(injection("SLOW", rank) or 1.0)


def signal_update(rank: int) -> int:
    """``PODRACER_INJECT_SIGNAL=RANK:UPDATE[,...]``: that rank sends itself a real SIGUSR2 right
    after that update (a warning signal at an exact point of the schedule, through the real handler)."""
    return int(injection("SIGNAL", rank) or 0)


def hang_update(rank: int) -> int:
    """``PODRACER_INJECT_HANG=RANK:UPDATE[,...]``: that rank stops itself with a real SIGSTOP right
    after that update (a hung rank: it neither ends nor answers, until a SIGCONT or a SIGKILL)."""
    return int(injection("HANG", rank) or 0)
