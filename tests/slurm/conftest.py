"""A real Slurm cluster for the `slurm` test tier (scripts/local_slurm.sh; docs/local-slurm.md).

The session fixtures `slurm_cluster` (with accounting) and `slurm_cluster_noacct` (without):
  1. use the cluster in $PODRACER_SLURM_DIR (resp. $PODRACER_SLURM_NOACCT_DIR) when
     `local_slurm.sh status` says it runs;
  2. else, as root with the Slurm binaries installed (or apt-get present and
     PODRACER_SLURM_INSTALL=1, which installs them), start one in a temporary folder and
     stop it when the session ends;
  3. else skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local_slurm.sh"
BINARIES = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sbatch", "sacct")
# Terminal states as sacct prints them ("CANCELLED by 0" starts with CANCELLED).
TERMINAL = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
)
START_TIMEOUT_S = 180
# Launcher variables inherited from an outer job would confuse srun/sbatch and MPI.
_DROP_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMI_", "PMIX_", "OMPI_", "MPI_")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: needs a real Slurm cluster (scripts/local_slurm.sh; skipped without root/Slurm)"
    )


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (make test) every test of this tier runs in one worker:
    the cluster fixtures are per session, and a second worker would start a second munged/slurmctld
    on the same machine."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.xdist_group("slurm"))


def _script(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@dataclass
class SlurmCluster:
    dir: Path
    conf: Path
    env: dict[str, str]
    started_here: bool
    log: list[str] = field(default_factory=list)

    def run(
        self, *cmd: str, timeout: float = 30, check: bool = True, cwd: Path | None = None
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=self.env, cwd=cwd)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def sbatch(self, *args: str, cwd: Path) -> str:
        """Submit; returns the job id."""
        out = self.run("sbatch", "--parsable", *args, cwd=cwd).stdout.strip()
        return out.split(";")[0]

    def sacct_state(self, job_id: str) -> tuple[str, str] | None:
        """(State, ExitCode) of the job allocation as slurmdbd has it, or None if not there yet."""
        out = self.run("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode", check=False).stdout
        for line in out.splitlines():
            state, _, code = line.strip().partition("|")
            if state:
                return state, code
        return None

    def wait_terminal(self, job_id: str, timeout: float = 90) -> tuple[str, str]:
        """Poll sacct until the job is in a terminal state; fail after `timeout` seconds."""
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            last = self.sacct_state(job_id)
            if last and last[0].startswith(TERMINAL):
                return last
            time.sleep(0.3)
        squeue = self.run("squeue", "-j", job_id, check=False)
        raise AssertionError(
            f"job {job_id} not finished after {timeout}s; sacct says {last}; "
            f"squeue:\n{squeue.stdout}{squeue.stderr}\nlogs: {self.dir / 'log'}"
        )

    def job_report(self, job_id: str) -> str:
        """Everything Slurm says about a job (sacct's steps, scontrol, slurmctld's lines): for messages."""
        sacct = self.run(
            "sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,Reason,NodeList", check=False
        ).stdout
        scontrol = self.run("scontrol", "show", "job", job_id, check=False).stdout
        ctld = self.dir / "log" / "slurmctld.log"
        lines = (
            [
                ln
                for ln in ctld.read_text(errors="replace").splitlines()
                if f"JobId={job_id} " in ln or f"job_id={job_id} " in ln or f"StepId={job_id}." in ln
            ]
            if ctld.exists()
            else []
        )
        return f"sacct:\n{sacct}scontrol:\n{scontrol}slurmctld.log:\n" + "\n".join(lines[-20:])

    def squeue_state(self, job_id: str) -> str:
        """The job's state as squeue shows it; "" once slurmctld has let it go."""
        return self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.strip()

    def wait_squeue_state(self, job_id: str, state: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        seen = ""
        while time.monotonic() < end:
            seen = self.squeue_state(job_id)
            if seen == state:
                return
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not {state} after {timeout}s (last seen: {seen!r})")


def _client_env(conf: Path, cluster_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES)}
    env.update(SLURM_CONF=str(conf), PODRACER_SLURM_DIR=str(cluster_dir), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    env["PODRACER_SLURM_POLL_S"] = "2"  # a private cluster: ask it every 2 s, not a shared one's 30
    return env


def _cluster(tmp_path_factory: pytest.TempPathFactory, given_var: str, *mode: str):
    """Yield a SlurmCluster: the running one in $given_var, else one started here (see the docstring)."""
    if not SCRIPT.exists():
        pytest.skip(f"{SCRIPT} is missing")

    given = os.environ.get(given_var)
    if given and shutil.which("sinfo"):
        st = _script("status", given)
        if st.returncode == 0:
            d = Path(given).resolve()
            yield SlurmCluster(d, d / "slurm.conf", _client_env(d / "slurm.conf", d), started_here=False)
            return

    if os.geteuid() != 0:
        pytest.skip(f"no running cluster in ${given_var}, and starting one needs root (scripts/local_slurm.sh start)")
    binaries = BINARIES if not mode else tuple(b for b in BINARIES if b not in ("slurmdbd", "mariadbd", "sacct"))
    if not all(shutil.which(b) or Path("/usr/sbin", b).exists() for b in binaries):
        if os.environ.get("PODRACER_SLURM_INSTALL") == "1" and shutil.which("apt-get"):
            inst = _script("install", timeout=900)
            if inst.returncode != 0:
                pytest.fail(f"local_slurm.sh install failed:\n{inst.stdout}\n{inst.stderr}")
        else:
            pytest.skip(
                "Slurm is not installed: run `scripts/local_slurm.sh install` as root, "
                "or set PODRACER_SLURM_INSTALL=1 to let the tests install it with apt"
            )

    d = tmp_path_factory.mktemp("slurm-noacct" if mode else "slurm")
    started = _script("start", *mode, str(d), timeout=START_TIMEOUT_S)
    if started.returncode != 0:
        stop = _script("stop", str(d), timeout=120)
        pytest.fail(
            f"local_slurm.sh start {' '.join(mode)} {d} failed (exit {started.returncode}):\n"
            f"{started.stdout}\n{started.stderr}\nstop: {stop.stdout}{stop.stderr}"
        )
    cluster = SlurmCluster(
        d, d / "slurm.conf", _client_env(d / "slurm.conf", d), started_here=True, log=[started.stdout]
    )
    try:
        yield cluster
    finally:
        stop = _script("stop", str(d), timeout=120)
        if stop.returncode != 0:
            raise RuntimeError(f"local_slurm.sh stop {d} failed:\n{stop.stdout}\n{stop.stderr}")
        shutil.rmtree(d / "db", ignore_errors=True)  # ~100 MB of MariaDB files; logs stay


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The cluster with accounting (slurmdbd): $PODRACER_SLURM_DIR, or one started here."""
    yield from _cluster(tmp_path_factory, "PODRACER_SLURM_DIR")


@pytest.fixture(scope="session")
def slurm_cluster_noacct(tmp_path_factory: pytest.TempPathFactory):
    """A cluster without accounting (no slurmdbd: sacct knows nothing; an ended job is known to
    scontrol for MinJobAge seconds), as on many small sites: $PODRACER_SLURM_NOACCT_DIR, or one
    started here with `local_slurm.sh start --no-accounting` (its own folder, ports and job ids)."""
    yield from _cluster(tmp_path_factory, "PODRACER_SLURM_NOACCT_DIR", "--no-accounting")
