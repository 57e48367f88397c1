"""The house rules the code keeps (DESIGN.md, "Rules of the house"), checked on the source: one
owner per concern, floors that only import downwards, and parts small enough to read.

Imports are read from the AST (module- and function-level), as tests/envs/test_registry.py's circle check
does, so a lazy import counts like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest



# --------------------------------------------------------------------------------------
# No import circle (the AST walk of /work/shared/tools/import_cycles.py)
# --------------------------------------------------------------------------------------
def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: package modules it imports}``: module-level and function-level imports, and
    ``__import__`` of a literal name. ``from . import x`` counts as importing the package too."""
    mods = {}
    for p in root.rglob("*.py"):
        name = ".".join(p.relative_to(root.parent).with_suffix("").parts)
        mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = p

    def targets(cur: str, node: ast.Import | ast.ImportFrom) -> set[str]:
        pkg = cur if mods[cur].name == "__init__.py" else cur.rsplit(".", 1)[0]
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        return {m for m in names if m in mods and m != cur}

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                graph[m] |= targets(m, n)
            elif isinstance(n, ast.Call) and getattr(n.func, "id", "") == "__import__" and n.args \
                    and isinstance(n.args[0], ast.Constant):
                t = str(n.args[0].value)
                graph[m] |= {c for c in (t, f"{root.name}.{t.lstrip('.')}") if c in mods}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_circle():
    graph = import_graph(PKG)
    assert len(graph) > 30 and "podracer_hpc.envs.registry" in graph
    assert circles(graph) == []
    # the two circles this replaced: config -> envs -> trading.env -> config, mujoco <-> mujoco_warp
    assert "podracer_hpc.config" not in graph["podracer_hpc.trading.env"]
    assert "podracer_hpc.envs.mujoco" not in graph["podracer_hpc.envs.mujoco_warp"]
    # the registry stands on nothing of the package: the task modules point at it
    assert graph["podracer_hpc.envs.registry"] == set()


def test_the_circle_check_finds_circles(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("x = 1\n\ndef f():\n    from .b import y  # a function-level import counts\n")
    (pkg / "b.py").write_text("y = __import__('pkg.a')\n")
    (pkg / "c.py").write_text("from . import a\n")  # c -> pkg -> a: no circle through c
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]


PKG = Path(__file__).resolve().parents[2] / "podracer_hpc"
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
    ("mpi4py", {"podracer_hpc.cluster.mpi"}),
    ("submitit", {"podracer_hpc.launch.slurm"}),
    ("h5py", {"podracer_hpc.files.h5log", "podracer_hpc.files.h5recover", "podracer_hpc.files.h5arrays"}),
])
def test_one_owner_per_library(library, owners):
    users = {_module(p) for p in PKG.rglob("*.py") if library in _external(p)}
    assert users <= owners, f"{library} is imported by {sorted(users - owners)}; only {sorted(owners)} may"


@pytest.mark.parametrize("floor, forbidden, why", [
    ("podracer_hpc.trading", ("podracer_hpc.config", "podracer_hpc.agents", "podracer_hpc.pool.leaderboard",
                              "podracer_hpc.tools.backtest", "podracer_hpc.tools.data"),
     "the trading task is on the envs floor: tools that read job files or agents sit above it"),
    ("podracer_hpc.report", ("podracer_hpc.tools.status", "podracer_hpc.launch", "podracer_hpc.tools.study"),
     "the analysis reads run directories (rundir.py), not the status command"),
    ("podracer_hpc.launch", ("podracer_hpc.cluster.mpi",), "the launcher starts ranks; MPI is the rank program's"),
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
