"""podracer_hpc.cluster.mpi under a real mpiexec, and its world-of-one fallback."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tree_distances

from podracer_hpc.cluster import mpi as comm_mod
from podracer_hpc.cluster.mpi import Comm, get_comm, launcher_env, stop_tree_fanout, stop_tree_neighbours

SCRIPTS = Path(__file__).resolve().parents[1] / "mpi_scripts"
MPI_VARS = (
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "MV2_COMM_WORLD_RANK",
    "PALS_RANKID",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
    "SLURM_STEP_NUM_TASKS",
    "PODRACER_COMM",
)


def find_mpiexec() -> str | None:
    """The mpiexec next to this interpreter (the venv's mpich wheel), else one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in MPI_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def mpiexec_cmd(mpiexec: str, n: int) -> list[str]:
    cmd = [mpiexec, "-n", str(n)]
    out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    if "open mpi" in (out.stdout + out.stderr).lower():  # more ranks than cores; root in containers
        cmd += ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return cmd


def parse_results(stdout: str) -> list[dict]:
    rows = [json.loads(line[len("RESULT ") :]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda d: d["rank"])


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_real_mpiexec_collectives(n: int, tmp_path: Path) -> None:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec next to sys.executable or on PATH (pip install mpich)")
    proc = subprocess.run(
        mpiexec_cmd(mpiexec, n) + [sys.executable, str(SCRIPTS / "comm_check.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=SCRIPTS.parent.parent,
    )
    assert proc.returncode == 0, f"mpiexec failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    rows = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(n)]
    assert [r["rank"] for r in rows] == list(range(n))

    expected_gather = [{"rank": i, "fitness": 1.5 * i, "steps": 1000 + i} for i in range(n)]
    check = load_script("comm_check")
    expected_digests = check.tournament_digests([check.report(i, n) for i in range(n)], check.ENTRIES)
    for r in rows:
        assert r["is_mpi"] and r["size"] == n, r["note"]
        assert r["gathered"] == expected_gather
        assert r["bcast"] == {"from": n - 1, "x": [1.0, 2.0]}
        assert r["sum"] == n * (n + 1) // 2
        assert r["max"] == 10.0 * (n - 1)
        # one host: the shared-memory split puts every rank on the same node
        assert r["num_nodes"] == 1 and r["local_size"] == n and r["local_rank"] == r["rank"]
        assert "MPI" in r["note"]
        # every rank computes the same decisions, and the same as a process without MPI
        assert r["digests"] == expected_digests


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 100, 1000, 4096])
def test_the_stop_tree_connects_every_rank_with_few_neighbours_and_short_paths(n: int) -> None:
    """The tree's promises without MPI, up to 4,096 ranks: symmetric, connected, a rank's degree
    within ceil(log2 N) + 1 and its diameter within 2 ceil(log2 N) hops."""
    log = math.ceil(math.log2(n)) if n > 1 else 0
    nbrs = [stop_tree_neighbours(r, n) for r in range(n)]
    assert all(r in nbrs[q] for r in range(n) for q in nbrs[r])  # undirected
    assert sum(len(x) for x in nbrs) == 2 * (n - 1)  # a tree: N - 1 edges
    assert max(len(x) for x in nbrs) <= log + 1  # a rank sends at most this many notices
    from_0 = tree_distances(0, n)
    far = max(range(n), key=from_0.__getitem__)  # a rank at the tree's far end
    d = tree_distances(far, n)
    assert min(d) == 0 and max(d) <= 2 * log  # connected (no -1), and the diameter
    if n == 4096:
        assert stop_tree_fanout(n) == 12 and max(d) == 8  # depth 4: 8 hops from leaf to leaf at most
    with pytest.raises(ValueError):
        stop_tree_neighbours(n, n)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [3, 64])
def test_stop_notices_flood_a_tree_and_settle_exactly(n: int, tmp_path: Path) -> None:
    """One rank's notice reaches every rank in N - 1 messages, no rank sending more than
    ceil(log2 N) + 1, over at most 2 ceil(log2 N) hops, with the value it carries; every rank
    announcing at once (Slurm's warning) costs at most 2(N - 1) messages, not N(N - 1); ranks
    already waiting at the meeting pass notices on; after the last meeting every notice is
    received and MPI finalizes (exit 0)."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec next to sys.executable or on PATH (pip install mpich)")
    proc = subprocess.run(
        mpiexec_cmd(mpiexec, n) + [sys.executable, str(SCRIPTS / "stop_tree.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=clean_env(),
        cwd=SCRIPTS.parent.parent,
    )
    assert proc.returncode == 0, f"mpiexec failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    out = json.loads((tmp_path / "stop_tree.json").read_text())
    assert out["size"] == n
    log, origin = math.ceil(math.log2(n)), n - 1
    dist = tree_distances(origin, n)
    for name in ("one", "all", "waiting"):
        parts, after = out[name]["parts"], out[name]["after"]
        assert [p["rank"] for p in parts] == list(range(n))
        sent = [p["sent"] for p in parts]
        assert max(sent) <= log + 1, (name, sent)
        assert all(set(p["notified"]) <= set(stop_tree_neighbours(p["rank"], n)) for p in parts), name
        assert all(len(p["notified"]) == p["sent"] for p in parts), name
        if name == "all":
            assert all(p["announced"] for p in parts)
            assert n - 1 <= sum(sent) <= 2 * (n - 1), sum(sent)  # all-to-all was n(n-1)
            assert {p["hops"] for p in parts} <= {None, 1}  # nobody had anything to pass on
        else:
            assert [p["announced"] for p in parts] == [r == origin for r in range(n)]
            assert sum(sent) == n - 1, (name, sent)  # each edge of the tree once
            # every other rank heard, over the tree's path from the announcer: its hops
            assert [p["hops"] for p in parts] == [None if r == origin else dist[r] for r in range(n)], name
            assert max(dist) <= 2 * log
            # the announcer's value reached every rank, however many hops away ("waiting": a plain stop)
            value = 123_456 if name == "one" else 0
            assert [p["value"] for p in parts] == [None if r == origin else value for r in range(n)], name
        # settled: each rank received exactly what was sent to it, nothing is left over
        to = [sum(r in p["notified"] for p in parts) for r in range(n)]
        assert [a["received"] for a in after] == to, name
        assert sum(a["received"] for a in after) == sum(sent)
        assert not any(a["left"] for a in after), name
        assert all(a["collectives"]["ibarrier"] == 1 for a in after)  # the meeting's wait
    leaves = [r for r in range(n) if r and len(stop_tree_neighbours(r, n)) == 1 and r != origin]
    heard = [out["one"]["parts"][r]["heard_s"] for r in range(n) if r != origin]
    assert all(h is not None for h in heard)  # ("one": every rank heard while polling)
    assert all(out["waiting"]["parts"][r]["heard_s"] is not None for r in leaves)  # through waiting ranks


def test_world_of_one_in_plain_process() -> None:
    """Outside a launcher: a world of one, and mpi4py.MPI is never imported (MPI not initialized)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "world_of_one.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    (r,) = parse_results(proc.stdout)
    assert not r["mpi_imported_by_module_import"] and not r["mpi_imported"]
    assert (r["rank"], r["size"], r["local_rank"], r["is_mpi"]) == (0, 1, 0, False)
    assert "no MPI launcher" in r["note"]
    assert r["gathered"] == [{"a": 1.5, "b": [1, 2]}] and r["gathered_is_copy"]
    assert r["bcast"] == {"a": 1.5, "b": [1, 2]} and r["sum"] == 3 and r["max"] == 2.5


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in MPI_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_fallback_when_mpi4py_missing(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("PMI_RANK", "0")
    no_launcher.setenv("PMI_SIZE", "4")
    no_launcher.setitem(sys.modules, "mpi4py", None)  # makes `from mpi4py import MPI` fail
    no_launcher.delitem(sys.modules, "mpi4py.MPI", raising=False)
    with pytest.warns(RuntimeWarning, match="4 processes"):
        c = get_comm()
    assert (c.rank, c.size, c.is_mpi, c.launcher_size) == (0, 1, False, 4)
    assert "PMI_RANK" in c.note and "mpi4py" in c.note
    assert c.allgather(2.0) == [2.0]
    with pytest.raises(RuntimeError, match="MPI requested"):
        get_comm("mpi")


def test_fallback_when_mpi_library_fails(no_launcher: pytest.MonkeyPatch) -> None:
    def broken():
        raise RuntimeError("cannot load MPI library libmpi.so.12")

    no_launcher.setattr(comm_mod, "_import_mpi", broken)
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "1")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "1")
    c = get_comm()  # claimed size 1: a note, no warning needed
    assert c.size == 1 and not c.is_mpi and "libmpi.so.12" in c.note


def test_mode_none_and_env_override(no_launcher: pytest.MonkeyPatch) -> None:
    def must_not_import():
        raise AssertionError("MPI must not be imported")

    no_launcher.setattr(comm_mod, "_import_mpi", must_not_import)
    no_launcher.setenv("PMI_RANK", "0")
    assert "mode 'none'" in get_comm("none").note
    no_launcher.setenv("PODRACER_COMM", "none")
    assert get_comm().size == 1
    with pytest.raises(ValueError):
        get_comm("sometimes")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (None, None)),
        ({"PMI_RANK": "1", "PMI_SIZE": "8"}, ("PMI_RANK", 8)),
        ({"PMIX_RANK": "0"}, ("PMIX_RANK", None)),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, ("OMPI_COMM_WORLD_RANK", 4)),
        # an sbatch script itself is not a launch; a multi-task srun step is
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "16"}, (None, None)),
        ({"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "16"}, ("SLURM_STEP_NUM_TASKS", 16)),
        ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}, (None, None)),
    ],
)
def test_launcher_detection(env: dict, expected: tuple) -> None:
    assert launcher_env(env) == expected


def test_world_of_one_bcast_root() -> None:
    c = Comm(note="test")
    assert c.bcast([1], root=0) == [1]
    with pytest.raises(ValueError):
        c.bcast(1, root=1)
    assert "world-of-one" in repr(c)


def test_world_of_one_stop_notices_and_meeting() -> None:
    """Alone, a stop needs no notice: nothing is sent or heard, and a meeting is one's own part."""
    c = Comm(note="test")
    c.announce_stop()
    assert not c.stop_announced() and (c.notices_sent, c.notices_received, c.notice_hops, c.notified) == (
        0,
        0,
        None,
        (),
    )
    assert c.meet(lambda: {"rank": c.rank, "notified": c.notified}) == [{"rank": 0, "notified": ()}]
    c.settle_notices([()])
    assert c.calls == {"allgather": 1}
