"""Start-up is not training: one-off costs of a training process are paid before its clock starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

from podracer_hpc.config import load_config
from podracer_hpc.pod import Pod

SMALL = ["env.num_envs=16", "eval.episodes=2", "log.progress_interval_s=0", "threads=1"]
PPO = ["agent.rollout_steps=8", "agent.num_minibatches=2", "agent.update_epochs=1"]

# In a fresh process (torch._dynamo not yet imported): train a few updates and record which
# modules each step of the loop imports once the training clock runs (RankRun.start's end).
PROBE = r"""
import json, sys, time
from podracer_hpc.rank import program as R
from podracer_hpc.config import load_config
assert "torch._dynamo" not in sys.modules
imported_at = {}
class Watch:  # notes when torch._dynamo is first looked up (imported), finds nothing itself
    def find_spec(self, name, path=None, target=None):
        if name == "torch._dynamo":
            imported_at.setdefault(name, time.perf_counter())
        return None
sys.meta_path.insert(0, Watch())
after_start, during = {}, []
start, update, evaluate = R.RankRun.start, R.RankRun.update, R.RankRun.evaluate
def started(self):
    start(self)
    after_start["dynamo_before_clock"] = imported_at["torch._dynamo"] < self.t_start
    after_start["optimizer"] = self.pod.agent._optimizer is not None
def timed(f):
    def g(self, *a, **k):
        before = set(sys.modules)
        out = f(self, *a, **k)
        during.extend(sorted(set(sys.modules) - before))
        return out
    return g
R.RankRun.start, R.RankRun.update, R.RankRun.evaluate = started, timed(update), timed(evaluate)
R.train(load_config(None, sys.argv[2:]), sys.argv[1], quiet=True)
print(json.dumps({"after_start": after_start, "during": during}))
"""


def test_the_first_update_imports_nothing_heavy(tmp_path):
    """torch._dynamo (the first torch optimizer's import, 1-3 s) is in before the clock starts,
    and the updates and evaluations in the clock import no torch/scipy module."""
    sets = SMALL + PPO + ["total_env_steps=384", "eval.interval_env_steps=128"]
    r = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "run"), *sets],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["after_start"] == {"dynamo_before_clock": True, "optimizer": True}
    heavy = [m for m in out["during"] if m.startswith(("torch._dynamo", "torch._inductor", "scipy", "sympy"))]
    assert heavy == [], heavy


JOBS = {"ppo": "jobs/pendulum_fast.yaml", "sac": "jobs/pendulum_sac.yaml"}


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_prepare_training_builds_the_agents_optimizers(algo):
    pod = Pod(load_config(JOBS[algo], SMALL))
    built = (lambda: pod.agent._optimizers) if algo == "sac" else (lambda: pod.agent._optimizer)
    assert built() is None  # an agent that only acts never builds one
    pod.prepare_training()
    assert built() is not None
    before = {k: v.clone() for k, v in pod.agent.state()[0].items() if not k.startswith("optim.")}
    pod.prepare_training()  # idempotent, and it changes no weights
    after = pod.agent.state()[0]
    assert all(bool((after[k] == v).all()) for k, v in before.items())
