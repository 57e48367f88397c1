"""The house rules the code keeps (docs/architecture.md), checked on the source: no import circle,
each folder imports only the folders below it, one owner per library, no private name imported
across modules, no re-export shims, parts small enough to read, and tests that mirror the code.

Imports are read from the AST (module- and function-level), so a lazy import counts like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tokenize
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
            elif (
                isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "__import__"
                and n.args
                and isinstance(n.args[0], ast.Constant)
            ):
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


def _part(module: str) -> str:
    """The part a module belongs to: its folder under the package, or its own name at the top."""
    return module.split(".")[1] if "." in module else "__init__"


@pytest.mark.parametrize(
    "library, owners",
    [
        ("mpi4py", {"podracer_hpc.cluster.mpi"}),
        ("submitit", {"podracer_hpc.launch.slurm"}),
        ("h5py", {"podracer_hpc.files.h5log", "podracer_hpc.files.h5recover", "podracer_hpc.files.h5arrays"}),
    ],
)
def test_one_owner_per_library(library, owners):
    users = {_module(p) for p in PKG.rglob("*.py") if library in _external(p)}
    assert users <= owners, f"{library} is imported by {sorted(users - owners)}; only {sorted(owners)} may"


# Which parts each part may import (besides itself), lowest floor first. A part not listed here
# is refused until it is given a row: a new folder says where it stands.
MAY_IMPORT = {
    "files": set(),  # what a run leaves on disk: stands on nothing of the package
    "docfield": set(),
    "cluster": {"files"},  # MPI, devices, signals, Slurm's word: may name run-directory paths
    "report": {"files"},  # tables and figures read run directories, never a tool or the launcher
    "envs": {"docfield"},  # the registry and the tasks: config reads them, not the other way round
    "trading": {"docfield", "envs", "files"},
    "agents": {"docfield", "cluster"},  # an agent owns its settings; it never reads the job config
    "config": {"docfield", "envs", "agents", "files"},
    "gym_envs": {"envs"},
    "pod": {"agents", "cluster", "config", "envs", "files"},
    "pool": {"cluster", "config", "files", "pod"},
    "rank": {"__init__", "cluster", "config", "docfield", "files", "pod", "pool"},
    "launch": {"cluster", "config", "docfield", "files", "rank"},  # a tool never: the launcher stands below them
    "tools": {"__init__", "agents", "cluster", "config", "docfield", "envs", "files", "launch", "pod", "pool"}
    | {"rank", "report", "trading"},
    "cli": {"__init__", "cluster", "config", "docfield", "envs", "files", "launch", "rank", "tools"},
    "__init__": set(),
}


def test_every_part_has_a_floor():
    parts = {_part(m) for m in GRAPH}
    assert parts <= set(MAY_IMPORT), f"parts without a row in MAY_IMPORT: {sorted(parts - set(MAY_IMPORT))}"


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_a_part_imports_only_the_parts_below_it(part):
    bad = sorted(
        (m, t)
        for m, targets in GRAPH.items()
        if _part(m) == part
        for t in targets
        if _part(t) != part and _part(t) not in MAY_IMPORT[part]
    )
    assert not bad, f"{part} may import only {sorted(MAY_IMPORT[part])}: {bad}"


PURE = ["podracer_hpc.pool.rules", "podracer_hpc.pool.fitness", "podracer_hpc.pool.hparams", "podracer_hpc.pool.entry"]
PURE_LIBRARIES = {
    "__future__",
    "math",
    "dataclasses",
    "typing",
    "numpy",
    "scipy",
    "itertools",
    "functools",
    "collections",
}


@pytest.mark.parametrize("module", PURE)
def test_the_rules_are_pure(module):
    """The tournament's rules decide from a table: no I/O, no MPI, no torch, no clock."""
    path = PKG.parent / (module.replace(".", "/") + ".py")
    assert _external(path) - {"podracer_hpc"} <= PURE_LIBRARIES, _external(path)
    assert {_part(t) for t in GRAPH[module]} <= {"config", "pool"}
    assert {t for t in GRAPH[module] if _part(t) == "pool"} <= set(PURE)


def test_no_private_name_is_imported_across_modules():
    """A name with a leading underscore is its module's own: a caller that needs it means it is
    part of the module's interface, and it gets a public name."""
    bad = []
    for p in PKG.rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("podracer_hpc")):
                bad += [
                    f"{_module(p)}: {n.module}.{a.name}"
                    for a in n.names
                    if a.name.startswith("_") and not a.name.endswith("__")
                ]
    assert not bad, bad


def test_no_re_export_shims():
    """A module imports what it uses; a package face lists what it offers in ``__all__``. An import
    kept only for others to take from here (``# noqa: F401``) is a shim: callers import the owner.
    The one exception is an availability probe (``import envpool  # noqa: F401``)."""
    bad = []
    for p in PKG.rglob("*.py"):
        with p.open("rb") as f:
            comments = [t for t in tokenize.tokenize(f.readline) if t.type == tokenize.COMMENT]
        for c in comments:
            code = c.line.split("#")[0].strip()
            if "noqa: F401" in c.string and not (code.startswith("import ") and "podracer_hpc" not in code):
                bad.append(f"{p.relative_to(PKG)}:{c.start[0]}: {c.line.strip()}")
    assert not bad, bad


# A module holds one job, which its docstring states in its first sentence. Its size is counted
# in statements, which no packing of lines changes (the formatter sets the lines): past this many a
# module is read as two jobs unless a split would cut one interface in half (the budget is raised
# here with that reason, never the lines squeezed).
STATEMENT_BUDGET = 450


def _statements(tree: ast.AST) -> int:
    return sum(isinstance(n, ast.stmt) for n in ast.walk(tree))


def test_every_module_states_its_job():
    missing = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring saying what they are for: {missing}"


def test_every_module_within_the_statement_budget():
    big = {
        str(p.relative_to(PKG)): n
        for p in PKG.rglob("*.py")
        if (n := _statements(ast.parse(p.read_text()))) > STATEMENT_BUDGET
    }
    assert not big, f"modules over {STATEMENT_BUDGET} statements: {big}"


@pytest.mark.parametrize("package", ["launch", "tools/study"])
def test_no_function_over_40_statements_in_the_launcher_and_study(package):
    long = {}
    for p in (PKG / package).rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _statements(n) > 40:
                long[f"{p.name}:{n.name}"] = _statements(n)
    assert not long, f"functions over 40 statements: {long}"


# --------------------------------------------------------------------------------------
# Tests mirror the code
# --------------------------------------------------------------------------------------
TESTS = PKG.parent / "tests"
# Folders of tests/ that mirror no package folder: behaviour suites, the Slurm tier, the
# benchmarks' own tests, and the files tests share.
NOT_MIRRORS = {"system", "slurm", "bench", "fixtures", "golden", "mpi_scripts", "__pycache__"}
# Modules of 100 statements or more whose tests live in a file not named after them, and where.
ELSEWHERE = {
    "files/summary.py": "tests/launch/test_pooljobs.py (pod records and the summary of a pool of several jobs)",
    "rank/finished.py": "tests/test_cli.py (a finished run stays finished), tests/launch/test_watch.py",
    "trading/readers.py": "tests/trading/test_data.py, tests/trading/test_cache.py (reading market files)",
    "report/plots.py": "tests/report/test_aggregate.py (figures from real runs)",
    "report/lineage.py": "tests/report/test_aggregate.py (the lineage figure)",
    "report/tables.py": "tests/report/test_aggregate.py",
    "launch/slurm.py": "tests/launch/test_launch.py (sbatch text), tests/slurm/",
    "launch/request.py": "tests/launch/test_launch.py (requests refused before queueing)",
    "tools/study/schema.py": "tests/tools/test_study.py",
    "tools/study/execute.py": "tests/tools/test_study.py",
    "agents/sac.py": "tests/agents/test_offpolicy*.py",
    "agents/td3.py": "tests/agents/test_offpolicy*.py",
    "agents/settings.py": "tests/test_config.py, tests/agents/test_offpolicy.py",
    "envs/jax_adapter.py": "tests/envs/test_jax_task.py",
    "envs/gym_adapter.py": "tests/envs/test_gym_task.py",
    "envs/cartpole.py": "tests/envs/test_base.py",
    "files/live.py": "tests/tools/test_status.py (status reads the pods through it)",
}


def _mirror_folders() -> list[Path]:
    return [d for d in TESTS.iterdir() if d.is_dir() and d.name not in NOT_MIRRORS]


def test_every_test_folder_mirrors_a_package_folder():
    stray = [d.name for d in _mirror_folders() if not (PKG / d.name).is_dir()]
    assert not stray, f"tests/ folders with no podracer_hpc/ folder to mirror: {stray}"


def test_every_mirrored_test_file_names_a_module():
    """``tests/pool/test_leaderboard_faults.py`` tests ``pool/leaderboard.py``: a test file in a
    mirror folder starts with the name of a module of that folder (or of the folder itself)."""
    bad = []
    for d in _mirror_folders():
        names = (
            {p.stem for p in (PKG / d.name).rglob("*.py")}
            | {d.name}
            | {s.name for s in (PKG / d.name).iterdir() if s.is_dir()}
        )
        for t in d.glob("test_*.py"):
            stem = t.stem.removeprefix("test_")
            if not any(stem == n or stem.startswith(n + "_") for n in names):
                bad.append(str(t.relative_to(TESTS)))
    top = {p.stem for p in PKG.glob("*.py")}
    for t in TESTS.glob("test_*.py"):
        stem = t.stem.removeprefix("test_")
        if not any(stem == n or stem.startswith(n + "_") for n in top):
            bad.append(t.name)
    assert not bad, f"test files that name no module of their folder (behaviour suites go to tests/system/): {bad}"


def test_a_modules_tests_are_found_from_its_path():
    missing = []
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG)
        if p.name == "__init__.py" or _statements(ast.parse(p.read_text())) < 100:
            continue
        mirror = TESTS / rel.parent
        named = list(mirror.glob(f"test_{p.stem}.py")) + list(mirror.glob(f"test_{p.stem}_*.py"))
        if not named and str(rel) not in ELSEWHERE:
            missing.append(str(rel))
    assert not missing, f"modules with no tests/<folder>/test_<module>.py and no ELSEWHERE entry: {missing}"
    stale = [
        m
        for m in ELSEWHERE
        if not (PKG / m).exists() or list((TESTS / Path(m).parent).glob(f"test_{Path(m).stem}*.py"))
    ]
    assert not stale, f"ELSEWHERE entries for modules that are gone or now have their own test file: {stale}"


def test_tests_that_start_mpiexec_carry_the_mpi_marker():
    """``-m "not mpi"`` collects no test whose own code starts mpiexec (conftest marks them)."""
    # only a file that names mpiexec can hold such a test: collecting the others (torch, gymnasium,
    # ray imports) would only cost time
    files = sorted(str(p.relative_to(PKG.parent)) for p in TESTS.rglob("test_*.py") if "mpiexec" in p.read_text())
    assert files, "no test file names mpiexec: the MPI tests moved, or this check's search is wrong"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not mpi", "-p", "no:cacheprovider", *files],
        cwd=PKG.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    kept = [line.split("[")[0] for line in r.stdout.splitlines() if "::" in line]
    assert kept, r.stdout[-2000:]
    sources: dict[str, dict[str, str]] = {}
    unmarked = []
    for node in kept:
        path, name = node.split("::", 1)
        if path not in sources:
            text = (PKG.parent / path).read_text()
            sources[path] = {
                f.name: ast.get_source_segment(text, f) or ""
                for f in ast.walk(ast.parse(text))
                if isinstance(f, ast.FunctionDef)
            }
        if "mpiexec" in sources[path].get(name.split("::")[-1], ""):
            unmarked.append(node)
    assert not unmarked, f"tests that start mpiexec but are not marked mpi: {sorted(set(unmarked))}"
