"""A short MuJoCo learning check in CI: a threshold that a broken adapter cannot pass.

Hopper-v5 on the CPU backend that ``auto`` picks (envpool, else gymnasium), one pod, 60k env
steps (about a minute here). Measured here (2026-11-29, deterministic evaluation of 10 episodes
from fixed start states): after one update the policy scores 55 (seed 0) and 139 (seed 1), the
untrained level that a broken adapter (stale or zeroed observations, actions not applied, resets
that do not restart) stays at; after 60k steps 342 and 293 (100k: 373 and 358). The threshold
sits between. The 1M-step targets are in bench/learning.py (bench/RESULTS.md).
"""

import pytest

pytest.importorskip("mujoco")

from podracer_hpc.config import load_config  # noqa: E402
from podracer_hpc.run import train  # noqa: E402

SETTINGS = [
    "seed=0", "total_env_steps=61440", "threads=1", "env.mujoco.num_threads=1",
    "tournament.mode=none", "env.num_envs=32", "agent.rollout_steps=64", "agent.num_minibatches=8",
    "agent.update_epochs=5", "agent.learning_rate=0.001", "agent.init_log_std=-0.5",
    "eval.interval_env_steps=1000000", "log.progress_interval_s=0",
]


def test_hopper_learns_to_hop_in_60k_steps(tmp_path):
    cfg = load_config("jobs/hopper.yaml", SETTINGS)  # the jobs' MuJoCo PPO recipe, faster settings
    res = train(cfg, tmp_path, quiet=True)
    assert res.complete
    assert res.summary["final_return"] >= 220.0, res.summary
