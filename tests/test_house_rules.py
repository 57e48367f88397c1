"""The house rules the code keeps (DESIGN.md, "Rules of the house"), checked on the source: one
owner per concern, floors that only import downwards, and parts small enough to read.

Imports are read from the AST (module- and function-level), as tests/test_tasks.py's circle check
does, so a lazy import counts like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from test_tasks import import_graph

PKG = Path(__file__).resolve().parents[1] / "podracer_hpc"
GRAPH = import_graph(PKG)


def _external(path: Path) -> set[str]:
    """Top-level names of the libraries a module imports (``import h5py``, ``from submitit.x import y``)."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            out.add(n.module.split(".")[0])
    return out


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _in(prefix: str) -> list[str]:
    return [m for m in GRAPH if m == prefix or m.startswith(prefix + ".")]


@pytest.mark.parametrize("library, owners", [
    ("mpi4py", {"podracer_hpc.comm"}),
    ("submitit", {"podracer_hpc.launch.slurm"}),
    ("h5py", {"podracer_hpc.h5log", "podracer_hpc.h5recover", "podracer_hpc.h5arrays"}),
])
def test_one_owner_per_library(library, owners):
    users = {_module(p) for p in PKG.rglob("*.py") if library in _external(p)}
    assert users <= owners, f"{library} is imported by {sorted(users - owners)}; only {sorted(owners)} may"


@pytest.mark.parametrize("floor, forbidden, why", [
    ("podracer_hpc.trading", ("podracer_hpc.config", "podracer_hpc.agents", "podracer_hpc.leaderboard",
                              "podracer_hpc.backtest", "podracer_hpc.data"),
     "the trading task is on the envs floor: tools that read job files or agents sit above it"),
    ("podracer_hpc.report", ("podracer_hpc.status", "podracer_hpc.launch", "podracer_hpc.study"),
     "the analysis reads run directories (rundir.py), not the status command"),
    ("podracer_hpc.launch", ("podracer_hpc.comm",), "the launcher starts ranks; MPI is the rank program's"),
    ("podracer_hpc.envs", ("podracer_hpc.config", "podracer_hpc.agents", "podracer_hpc.pod"),
     "config.py reads the registry, not the other way round"),
])
def test_floors_import_only_downwards(floor, forbidden, why):
    bad = sorted((m, t) for m in _in(floor) for t in GRAPH[m] if any(t == f or t.startswith(f + ".") for f in forbidden))
    assert not bad, f"{why}: {bad}"


def test_no_module_over_600_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"modules over 600 lines: {long}"


@pytest.mark.parametrize("package", ["launch", "study"])
def test_no_function_over_60_lines_in_the_launcher_and_study(package):
    long = {}
    for p in (PKG / package).rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60:
                long[f"{p.name}:{n.name}"] = n.end_lineno - n.lineno + 1
    assert not long, f"functions over 60 lines: {long}"
