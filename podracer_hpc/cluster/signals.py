"""Warning signals: what Slurm (or a user) sends before a time limit or a preemption.

SIGUSR1, SIGUSR2 and SIGTERM set a flag that the rank program reads between updates: it then
finishes the update, checkpoints and exits with the requeue code. The console script installs
the flag first thing, before torch and MPI are imported (seconds), so a signal that arrives
while a rank starts is kept, not fatal. Once the work is saved (the run is done or stopped),
:func:`ignore_from_now_on` makes later warnings harmless: a signal during interpreter or MPI
shutdown would otherwise hit Python's default disposition (Python restores it while it shuts
down) and turn a finished run into a crash code.

``podracer mpirun`` can only stop the ranks through mpiexec's SIGTERM (Hydra forwards no other
signal to them), so it writes the signal it got (SIGINT for a Ctrl-C, USR1, ...) to the file that
``$PODRACER_RELAYED_SIGNAL`` names before it sends SIGTERM: a rank then names that signal, not
SIGTERM (:attr:`StopFlag.name`).

No heavy imports here: this module is imported before everything else.
"""

from __future__ import annotations

import os
import signal
from typing import Any

WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
RELAYED_SIGNAL_ENV = "PODRACER_RELAYED_SIGNAL"  # a file: the signal podracer mpirun relayed as SIGTERM

__all__ = [
    "RELAYED_SIGNAL_ENV",
    "StopFlag",
    "WARNING_SIGNALS",
    "ignore_from_now_on",
    "interrupt_on_term",
    "process_flag",
    "relayed_signal",
]


def relayed_signal() -> str:
    """The name of the signal ``podracer mpirun`` relayed to this rank as SIGTERM ("" if none)."""
    path = os.environ.get(RELAYED_SIGNAL_ENV)
    if not path:
        return ""
    try:
        with open(path) as f:
            name = f.read(16).strip()
    except OSError:
        return ""
    return name if name in signal.Signals.__members__ else ""


class StopFlag:
    """Set by a warning signal (``signal`` holds its number); checked between updates."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signal is None:
            self.signal = signum

    @property
    def name(self) -> str:
        """The signal's name; for a SIGTERM from ``podracer mpirun``, the one the user sent it."""
        if not self.signal:
            return ""
        return (self.signal == signal.SIGTERM and relayed_signal()) or signal.Signals(self.signal).name

    def install(self) -> "StopFlag":
        """Make this flag the handler of the warning signals (main thread only; else a no-op)."""
        for s in WARNING_SIGNALS:
            try:
                signal.signal(s, self)
            except ValueError:  # not the main thread (tests calling train() from a thread)
                pass
        return self


_PROCESS_FLAG: StopFlag | None = None


def process_flag() -> StopFlag:
    """The process-wide flag, installed on first use (the console script calls this first)."""
    global _PROCESS_FLAG
    if _PROCESS_FLAG is None:
        _PROCESS_FLAG = StopFlag().install()
    return _PROCESS_FLAG


def interrupt_on_term() -> None:
    """SIGTERM (``kill``, a batch system's stop) raises KeyboardInterrupt in the main thread, as a
    Ctrl-C does, so a command that watches runs it started in their own sessions stops them on its
    way out instead of leaving them running without it (main thread only; else a no-op)."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, _raise)
    except ValueError:
        pass


def ignore_from_now_on() -> None:
    """Ignore warning signals from here to the process's end (its work is saved).

    ``SIG_IGN`` survives Python's shutdown, unlike a Python handler, so a late warning cannot
    kill the process while MPI finalizes.
    """
    for s in WARNING_SIGNALS:
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:
            pass
