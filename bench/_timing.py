"""Timing several variants of one step side by side on a shared, noisy machine: the variants run
in alternating blocks (a, b, a, b, ...) so that a change in the machine's load hits all of them,
and each variant's median block is what a table reports (bench/compile.py, bench/offpolicy_update.py).
An older revision's module can be loaded beside this checkout's to be one of them (:func:`module_at`)."""

from __future__ import annotations

import importlib
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent


def module_at(ref: str, name: str, replace: dict[str, str] | None = None) -> types.ModuleType:
    """``podracer_hpc/agents/<name>.py`` of git revision ``ref``, as the module
    ``podracer_hpc.agents._old_<name>`` beside this checkout's (its relative imports resolve to the
    checkout's package; ``replace`` rewrites its source first, e.g. to import another old module)."""
    path = f"podracer_hpc/agents/{name}.py"
    src = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=REPO, check=True, capture_output=True, text=True).stdout
    for old, new in (replace or {}).items():
        src = src.replace(old, new)
    full = f"podracer_hpc.agents._old_{name}"
    mod = types.ModuleType(full)
    mod.__package__ = "podracer_hpc.agents"
    mod.__file__ = f"<{ref}:{path}>"
    sys.modules[full] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    importlib.invalidate_caches()
    return mod


def alternate_blocks(
    runs: dict[str, tuple[Callable[[], None], int]], blocks: int, seconds: float
) -> dict[str, list[float]]:
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
