"""The trading job files use only the stock_trading settings the env knows (TradingOptions), and
load once the config has them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from podracer_hpc.config import load_config
from podracer_hpc.envs.registry import option_rows
from podracer_hpc.trading.task import TradingOptions

REPO = Path(__file__).resolve().parents[2]
JOBS = ["jobs/trading_quickstart.yaml", "jobs/trading_paper.yaml", "jobs/trading_edge.yaml"]
ROWS = option_rows(TradingOptions)
KNOWN = {k for k, *_ in ROWS}


@pytest.mark.parametrize("job", JOBS)
def test_job_uses_known_env_keys_with_the_right_types(job):
    data = yaml.safe_load((REPO / job).read_text())
    assert data["env"]["name"] == "stock_trading"
    assert set(data["env"]) <= {"name", "num_envs", "max_episode_steps", "trading"}
    env = data["env"]["trading"]
    assert set(env) <= KNOWN, sorted(set(env) - KNOWN)
    types = {k: t for k, t, *_ in ROWS}
    for k, v in env.items():
        if k in types:
            want = (int, float) if types[k] is float else types[k]
            assert isinstance(v, want) and not (types[k] is not bool and isinstance(v, bool)), (k, v)


@pytest.mark.parametrize("job", JOBS)
def test_job_loads_once_the_config_has_the_keys(job):
    cfg = load_config(REPO / job)
    assert cfg.env.name == "stock_trading"
