"""Fixtures every test may use, and the ``mpi`` marker put on every test that starts ``mpiexec``
(so ``-m "not mpi"`` runs no MPI at all, whatever a test file remembered to mark)."""

import inspect
from pathlib import Path

import pytest
from helpers import run_cli

REPO = Path(__file__).resolve().parent.parent
MPI_WORDS = ("mpiexec", "mpirun", "mpi_world")


def starts_mpi(*functions) -> bool:
    """Whether a test (or one of the fixtures it uses) starts ranks under mpiexec: its source names
    the launcher (``mpiexec_or_skip``, ``podracer mpirun``, ...)."""
    for f in functions:
        try:
            src = inspect.getsource(f)
        except (OSError, TypeError):
            continue
        if any(w in src for w in MPI_WORDS):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("mpi") or not hasattr(item, "function"):
            continue
        fixtures = [
            d.func
            for defs in getattr(item, "_fixtureinfo", None).name2fixturedefs.values()
            for d in defs
            if getattr(d, "baseid", None) is not None and d.baseid.startswith(item.nodeid.split("::")[0])
        ]
        if starts_mpi(item.function, *fixtures):
            item.add_marker(pytest.mark.mpi)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def one_torch_thread():
    """Run a test with torch on one CPU thread, then restore the thread count."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
