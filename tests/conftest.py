import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the `podracer` console entry point in a fresh process (as a user would)."""
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    e.pop("PODRACER_COMM", None)
    return subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO, env=e,
    )


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
