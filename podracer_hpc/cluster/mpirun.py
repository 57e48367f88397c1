"""``podracer mpirun [--mpiexec PATH] ARGS...`` (also ``python -m podracer_hpc.cluster.mpirun``): mpiexec
behind a signal relay. Every multi-rank command the README and docs show runs through it.

Why: MPICH's mpiexec (Hydra) starts its proxies, and they the ranks, each in a new session
(setsid), so a signal sent to "the job" of ``make quickstart`` or ``podracer submit --executor
local`` reaches only mpiexec. Hydra forwards SIGTERM to every rank (which then finishes its
update, checkpoints and exits 75), but it has no handler for SIGUSR2 (nor a useful one for
USR1): the default action killed mpiexec and, with it, every rank without a checkpoint (exit
140). Slurm's warning signal is USR2 (submitit) or USR1 (templates), so the same habit
that is right on a cluster lost the work here.

So this process sits in front of mpiexec:

- it starts ``mpiexec ARGS...`` (the venv's, from the ``mpich`` wheel, unless ``--mpiexec``
  names another) in its own session, with SIGUSR1 and SIGUSR2 *ignored*: an ignored
  disposition survives exec, so mpiexec, its proxies and the ranks start with it; the Python
  ranks install their own handlers (podracer_hpc/cluster/signals.py) and still react, while a stray
  USR1/USR2 sent to mpiexec itself can no longer kill the job;
- on SIGUSR1, SIGUSR2, SIGTERM, SIGINT (Ctrl-C; mpiexec's own session keeps the terminal's
  SIGINT away from it) or SIGHUP, it sends SIGTERM to mpiexec, which Hydra forwards to every
  rank: each rank checkpoints and exits 75 (and names the signal this process got: it writes it
  to the file of ``$PODRACER_RELAYED_SIGNAL`` first, cluster/signals.py). A second Ctrl-C sends
  SIGINT to mpiexec instead: Hydra passes it to the ranks (KeyboardInterrupt), which end at once without checkpoints; a
  third makes Hydra abort them;
- if this process dies (even by SIGKILL), the kernel sends mpiexec SIGTERM (Linux
  ``PR_SET_PDEATHSIG``): the ranks still checkpoint;
- its exit code is mpiexec's: 0 when the training is done, 75 when it was stopped with
  checkpoints (run the same command again to resume), 128+N when mpiexec died of signal N.

No heavy imports here: this runs before, and beside, the ranks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from podracer_hpc.cluster.signals import RELAYED_SIGNAL_ENV

__all__ = ["MpiexecNotFound", "RELAYED", "find_mpiexec", "main", "run"]

RELAYED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
IGNORED_IN_MPIEXEC = (signal.SIGUSR1, signal.SIGUSR2)
PR_SET_PDEATHSIG = 1


class MpiexecNotFound(RuntimeError):
    """No mpiexec next to this interpreter nor on PATH."""


def find_mpiexec() -> str:
    """The mpiexec next to this interpreter (the venv's mpich wheel), else the one on PATH."""
    exe = Path(sys.executable).parent / "mpiexec"
    found = str(exe) if exe.exists() else shutil.which("mpiexec")
    if not found:
        raise MpiexecNotFound("no mpiexec next to this Python nor on PATH: pip install mpich (or load your MPI module)")
    return found


def _prctl() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):
        return None


def _child_setup(prctl: Any) -> None:
    """Runs in the child between fork and exec: what mpiexec starts with."""
    for s in IGNORED_IN_MPIEXEC:
        signal.signal(s, signal.SIG_IGN)  # inherited across exec by mpiexec, its proxies and the ranks
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)  # mpiexec installs its own (it forwards TERM to the ranks)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # this relay died: stop with checkpoints


def run(args: list[str], mpiexec: str | None = None, out: Any = None) -> int:
    """Run ``mpiexec args...`` behind the relay; returns the exit code to exit with."""
    out = out or sys.stderr
    cmd = [mpiexec or find_mpiexec(), *args]
    state: dict[str, Any] = {"proc": None, "pending": [], "ints": 0, "told": False}
    tmp = tempfile.mkdtemp(prefix="podracer-mpirun-")
    named = os.path.join(tmp, "signal")  # what the ranks name when our SIGTERM reaches them

    def forward(signum: int) -> None:
        proc = state["proc"]
        if signum == signal.SIGINT:
            state["ints"] += 1
        if state["ints"] >= 2:
            print("podracer mpirun: second Ctrl-C: ending the ranks now, without checkpoints", file=out, flush=True)
            proc.send_signal(signal.SIGINT)
            return
        if not state["told"]:
            state["told"] = True
            try:
                with open(named, "w") as f:
                    f.write(signal.Signals(signum).name)
            except OSError:
                pass  # the ranks then say SIGTERM
            print(
                f"podracer mpirun: {signal.Signals(signum).name}: asking every rank to finish its update, "
                "checkpoint and exit (75; run the same command again to resume)"
                + ("; Ctrl-C again ends them without checkpoints" if signum == signal.SIGINT else ""),
                file=out,
                flush=True,
            )
        proc.send_signal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        if state["proc"] is None or state["proc"].poll() is not None:
            state["pending"].append(signum)
            return
        forward(signum)

    previous = {}
    for s in RELAYED:
        if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
            continue  # started under nohup: keep ignoring hang-ups
        previous[s] = signal.signal(s, handler)
    try:
        prctl = _prctl()
        try:
            state["proc"] = subprocess.Popen(
                cmd,
                preexec_fn=lambda: _child_setup(prctl),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                env={**os.environ, RELAYED_SIGNAL_ENV: named},
            )
        except OSError as e:
            print(f"podracer mpirun: cannot start {cmd[0]}: {e}", file=out, flush=True)
            return 127
        for s in state["pending"]:  # a signal that came while mpiexec was being started
            forward(s)
        rc = state["proc"].wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        shutil.rmtree(tmp, ignore_errors=True)
    return 128 - rc if rc < 0 else rc


USAGE = """usage: podracer mpirun [--mpiexec PATH] MPIEXEC_ARGS...
  e.g. podracer mpirun -n 4 podracer train jobs/quickstart.yaml
Runs mpiexec behind a signal relay: USR1, USR2, TERM, INT or HUP to this process stop every rank
with a checkpoint (exit 75); its exit code is mpiexec's."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    mpiexec = None
    if argv[:1] == ["--mpiexec"]:
        if len(argv) < 2:
            print(f"podracer mpirun: error: --mpiexec needs a path\n{USAGE}", file=sys.stderr)
            return 2
        mpiexec, argv = argv[1], argv[2:]
        if not (os.path.isfile(mpiexec) and os.access(mpiexec, os.X_OK)):
            print(f"podracer mpirun: error: --mpiexec {mpiexec!r} is not an executable file", file=sys.stderr)
            return 2
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    try:
        return run(argv, mpiexec)
    except MpiexecNotFound as e:
        print(f"podracer mpirun: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
