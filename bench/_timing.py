"""Timing several variants of one step side by side on a shared, noisy machine: the variants run
in alternating blocks (a, b, a, b, ...) so that a change in the machine's load hits all of them,
and each variant's median block is what a table reports (bench/compile.py, bench/offpolicy_update.py)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def alternate_blocks(runs: dict[str, tuple[Callable[[], None], int]], blocks: int,
                     seconds: float) -> dict[str, list[float]]:
    """Milliseconds per unit of each variant in each of ``blocks`` rounds of about ``seconds`` each.

    ``runs`` maps a name to ``(run, per)``: ``run()`` does ``per`` units of work (updates, steps).
    Warm the variants up before calling (first calls build optimizer state or compile).
    """
    ms: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(blocks):
        for name, (run, per) in runs.items():
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                run()
                n += per
            ms[name].append((time.perf_counter() - t0) / n * 1e3)
    return ms


def medians(ms: dict[str, list[float]]) -> dict[str, float]:
    """Each variant's median block."""
    return {k: statistics.median(v) for k, v in ms.items()}
