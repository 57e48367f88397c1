"""podracer_hpc.cluster.mpich: the OFI netmod under Slurm's pmi2 with the PyPI wheel, and stale
MPICH shared memory removed at start while nothing live is touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from podracer_hpc.cluster import mpich as mpich_mod


@pytest.mark.parametrize(
    "env, wheel, expected, netmod",
    [
        ({"SLURM_MPI_TYPE": "pmi2"}, True, "ofi", "ofi"),  # srun --mpi=pmi2, the PyPI wheel: short OFI addresses
        ({"SLURM_MPI_TYPE": "pmi2"}, False, None, None),  # a site's MPICH/MVAPICH under pmi2: its own netmod
        ({"SLURM_MPI_TYPE": "pmi2", "MPIR_CVAR_CH4_NETMOD": "ucx"}, True, None, "ucx"),  # the user's choice stays
        ({"SLURM_MPI_TYPE": "pmix"}, True, None, None),  # PMIx reads whole messages
        ({"PMI_RANK": "0", "PMI_FD": "5"}, True, None, None),  # mpiexec (hydra) outside Slurm
    ],
)
def test_slurm_pmi2_netmod(env: dict, wheel: bool, expected: str | None, netmod: str | None, capsys) -> None:
    from podracer_hpc.cluster.mpich import slurm_pmi2_netmod

    env = dict(env)
    assert slurm_pmi2_netmod(env, wheel=wheel) == expected
    assert env.get("MPIR_CVAR_CH4_NETMOD") == netmod
    assert ("MPIR_CVAR_CH4_NETMOD=ofi" in capsys.readouterr().err) == (expected is not None)  # never silent


def test_the_venvs_mpi_is_the_pypi_wheel() -> None:
    """This repo's .venv runs the mpich wheel (pyproject's test extra), so pmi2 gets the OFI netmod."""
    from podracer_hpc.cluster.mpich import pypi_mpich

    lib = pypi_mpich()
    assert lib is None or lib.endswith("libmpi.so.12")


# ------------------------------------------------------------------------------------------
# Stale MPICH shared memory: what a killed start leaves must not poison the
# next start of the same job step, and nothing live may be removed. The Slurm tier shows it
# with real requeues (tests/slurm/test_requeue.py); here the rules, on real files and locks.
# ------------------------------------------------------------------------------------------
HOLDER = """
import fcntl, mmap, os, sys
lock, offset, mapped = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
fcntl.lockf(fd, fcntl.LOCK_SH, 1, offset)  # a live rank of that job step
f = open(mapped, "r+b")
m = mmap.mmap(f.fileno(), 4096)  # a live MPI job's segment
print("ready", flush=True)
sys.stdin.read()
"""


def _segment(shm: Path, name: str) -> Path:
    p = shm / name
    p.write_bytes(b"\0" * 4096)
    return p


def test_stale_mpich_segments_removed_live_ones_kept(tmp_path: Path) -> None:
    from podracer_hpc.cluster.mpich import clean_stale_mpich_segments, mpich_world_id

    assert mpich_world_id("1.0") == "eb421bf2"  # seen on the local cluster: job 1 step 0
    shm = tmp_path
    own, dead, locked, mapped = (mpich_world_id(f"{j}.0") for j in (41, 40, 39, 38))
    names = [
        f"mpich_shm_{own}_0",
        f"mpich_vci_{own}_1",
        f"mpich_shm_{dead}_0",
        f"mpich_shm_{locked}_0",
        f"mpich_shm_{mapped}_0",
        "mpich_shm_notahash_0",
        "notes.txt",
    ]
    for n in names:
        _segment(shm, n)
    lock = shm / f"podracer-mpich-{os.geteuid()}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(int(locked, 16)), str(shm / f"mpich_shm_{mapped}_0")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        # young segments of other job steps may belong to a job between shm_open and mmap: kept
        assert clean_stale_mpich_segments({}, shm_dir=str(shm), orphan_age_s=3600) == []
        removed = clean_stale_mpich_segments({"PMI_JOBID": "41.0"}, shm_dir=str(shm), orphan_age_s=0)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        fd, mpich_mod._shm_lock_fd = mpich_mod._shm_lock_fd, None
    try:
        # this job step's segments go at once (an earlier start's); a dead run's old one too
        assert sorted(removed) == sorted([f"mpich_shm_{own}_0", f"mpich_vci_{own}_1", f"mpich_shm_{dead}_0"])
        left = sorted(p.name for p in shm.iterdir())
        assert left == sorted(
            [f"mpich_shm_{locked}_0", f"mpich_shm_{mapped}_0", "mpich_shm_notahash_0", "notes.txt", lock.name]
        )
        # while this process (a rank of the start) holds its shared lock, another rank of the same
        # start must not remove what the first one has created
        _segment(shm, f"mpich_shm_{own}_0")
        other_rank = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from podracer_hpc.cluster.mpich import clean_stale_mpich_segments as c; "
                f"print(c({{'PMI_JOBID': '41.0'}}, shm_dir={str(shm)!r}, orphan_age_s=3600))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other_rank.returncode == 0 and other_rank.stdout.strip() == "[]", other_rank.stderr
        assert (shm / f"mpich_shm_{own}_0").exists()
    finally:
        os.close(fd)  # the rank exits: its lock goes with it
    # the next start (every rank of the earlier one is gone) removes it, and says so
    nxt = subprocess.run(
        [
            sys.executable,
            "-c",
            "from podracer_hpc.cluster.mpich import clean_stale_mpich_segments as c; "
            f"print(c({{'PMI_JOBID': '41.0'}}, shm_dir={str(shm)!r}, orphan_age_s=3600))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nxt.stdout.strip() == f"['mpich_shm_{own}_0']", nxt.stderr
    assert "removed 1 MPICH shared-memory segment" in nxt.stderr
    # the locked and the mapped segment's owners have exited: now they are orphans too
    assert sorted(clean_stale_mpich_segments({}, shm_dir=str(shm), orphan_age_s=0)) == sorted(
        [f"mpich_shm_{locked}_0", f"mpich_shm_{mapped}_0"]
    )


def test_stale_mpich_cleanup_leaves_other_users_and_missing_dirs_alone(tmp_path: Path) -> None:
    from podracer_hpc.cluster.mpich import clean_stale_mpich_segments, mpich_world_id

    assert clean_stale_mpich_segments({"PMI_JOBID": "1.0"}, shm_dir=str(tmp_path / "none")) == []
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another user")
    p = _segment(tmp_path, f"mpich_shm_{mpich_world_id('5.0')}_0")
    os.chown(p, 65534, 65534)
    assert clean_stale_mpich_segments({"PMI_JOBID": "5.0"}, shm_dir=str(tmp_path), orphan_age_s=0) == []
    assert p.exists()
    os.close(mpich_mod._shm_lock_fd)
    mpich_mod._shm_lock_fd = None
