"""Short learning checks: thresholds a broken learner cannot pass (full runs: bench/learning.sh).

A random Pendulum policy scores about -1200 to -1500 and a random CartPole policy about 20;
these runs take seconds and must reach far beyond that.
"""

import pytest

from podracer_hpc.config import load_config
from podracer_hpc.rank.program import train


@pytest.mark.parametrize(
    "job,steps,threshold",
    [("jobs/pendulum.yaml", 600_000, -300.0), ("jobs/cartpole.yaml", 250_000, 400.0)],
)
def test_short_run_learns(tmp_path, job, steps, threshold):
    cfg = load_config(job, [f"total_env_steps={steps}", "log.progress_interval_s=0", "eval.interval_env_steps=100000"])
    res = train(cfg, tmp_path, quiet=True)
    assert res.complete
    assert res.summary["best_return"] >= threshold, res.summary
