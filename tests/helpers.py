"""Small helpers shared by test modules (import as ``from helpers import ...``)."""

import pytest

from podracer_hpc.launch import LaunchError, find_mpiexec


def mpiexec_or_skip() -> str:
    """The mpiexec the launcher would use; skip (saying why) where there is none."""
    try:
        return find_mpiexec()
    except LaunchError as e:
        pytest.skip(str(e))
