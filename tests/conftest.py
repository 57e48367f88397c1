from pathlib import Path

import pytest

from helpers import run_cli  # noqa: F401  (the cli fixture's; tests import it from helpers)

REPO = Path(__file__).resolve().parent.parent


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
