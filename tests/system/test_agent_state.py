"""One contract for agent state: the agent owns its keys and its hyperparameters;
pods, leaderboard entries, checkpoints and the backtest go through it; the three load paths
keep or take hyperparameters as documented; files written before the change still load."""

import json
from pathlib import Path

import pytest
import torch

from podracer_hpc.agents.ppo import PPOAgent
from podracer_hpc.agents.settings import MUTABLE_HPARAMS
from podracer_hpc.config import load_config
from podracer_hpc.files import safeio
from podracer_hpc.pod import Pod

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SMALL = [
    "env.num_envs=8",
    "agent.rollout_steps=8",
    "agent.num_minibatches=2",
    "agent.update_epochs=1",
    "agent.hidden_sizes=[8, 8]",
    "eval.episodes=2",
    "total_env_steps=640",
]


def pod(*sets: str, rank: int = 0) -> Pod:
    torch.set_num_threads(1)
    return Pod(load_config(None, [*SMALL, *sets]), rank=rank)


def nets_equal(a: Pod, b: Pod) -> bool:
    sa, sb = a.agent.net.state_dict(), b.agent.net.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_agent_owns_its_keys_and_a_state_round_trips():
    a = pod()
    a.train_iteration()
    t, meta = a.agent.state()
    assert t and all(PPOAgent.is_state_key(k) for k in t)
    assert set(meta["hparams"]) == set(MUTABLE_HPARAMS)
    b = pod(rank=1)
    b.agent.load(t, meta)
    t2, meta2 = b.agent.state()
    assert set(t2) == set(t) and all(torch.equal(t[k], t2[k]) for k in t) and meta2["hparams"] == meta["hparams"]
    # the environments' running returns are the pod's, not the agent's (an entry never carries them)
    entry, _ = a.agent_tensors()
    assert not any(k.startswith(("reward_ret", "env.", "reward_scaler")) for k in entry)
    assert "reward_ret" in a.state_tensors()[0]


def test_learning_rate_lives_in_one_place_and_the_schedule_derives_from_it():
    a = pod("agent.learning_rate=0.01", "agent.anneal_lr=true")
    a.set_hparams({"learning_rate": 0.004})
    m = a.train_iteration()  # progress 0 at the first update
    assert float(m["learning_rate"]) == pytest.approx(0.004)
    assert a.agent.optimizer.param_groups[0]["lr"] == pytest.approx(0.004)
    m = a.train_iteration()
    assert float(m["learning_rate"]) == pytest.approx(0.004 * (1 - 64 / 640))
    assert a.cfg.agent.learning_rate == 0.01  # the run's config is never changed


def test_elegantrl_copy_keeps_the_pods_hyperparameters():
    """The defect: Pod._load_agent_tensors always took the source's learning rate."""
    a = pod("agent.learning_rate=0.001", "agent.anneal_lr=false")
    b = pod("agent.learning_rate=0.0005", "agent.anneal_lr=false", "agent.ent_coef=0.01", rank=1)
    b.train_iteration()
    t, meta = b.agent_tensors()
    a.load_agent(t, meta, source="b", load_hparams=False)
    assert nets_equal(a, b)
    assert a.hparams() == {**b.hparams(), "learning_rate": 0.001, "ent_coef": 0.0}
    assert float(a.train_iteration()["learning_rate"]) == pytest.approx(0.001)


def test_pbt_copy_takes_the_sources_hyperparameters_then_explores():
    a = pod("agent.learning_rate=0.001", "agent.anneal_lr=false")
    b = pod("agent.learning_rate=0.0005", "agent.anneal_lr=false", "agent.ent_coef=0.01", rank=1)
    b.train_iteration()
    t, meta = b.agent_tensors()
    a.load_agent(t, meta, source="b", load_hparams=True)
    assert nets_equal(a, b) and a.hparams() == b.hparams()
    a.set_hparams({"learning_rate": 0.0006})  # explore: x1.2
    assert float(a.train_iteration()["learning_rate"]) == pytest.approx(0.0006)
    assert b.hparams()["learning_rate"] == 0.0005  # the source is untouched


def test_reset_restores_a_fresh_agent_with_the_pods_own_hyperparameters():
    a = pod("agent.learning_rate=0.001")
    fresh = pod("agent.learning_rate=0.001")
    a.train_iteration()
    a.set_hparams({"learning_rate": 0.002, "clip_coef": 0.3})
    assert not nets_equal(a, fresh)
    a.reset_agent()
    assert nets_equal(a, fresh)
    assert a.hparams()["learning_rate"] == 0.002 and a.hparams()["clip_coef"] == 0.3
    assert not a.agent.optimizer.state  # no optimizer history
    a.train_iteration()  # and it trains


def test_unknown_hyperparameters_are_refused():
    with pytest.raises(KeyError, match="not a mutable hyperparameter"):
        pod().set_hparams({"gamma": 0.9})


def test_a_checkpoint_written_before_the_contract_still_resumes():
    ref = json.loads((FIX / "before-agent-contract.json").read_text())
    p = pod("seed=7", "agent.learning_rate=0.002")
    meta = p.load(FIX / "pod-state-before-agent-contract.safetensors")
    assert p.updates == ref["updates"] == 2
    assert float(p.agent.net.actor[0].weight.detach().sum()) == pytest.approx(ref["actor.0.weight_sum"], abs=1e-6)
    assert p.agent.obs_rms.mean.tolist() == pytest.approx(ref["obs_rms.mean"])
    assert float(p.agent.reward_rms.var) == pytest.approx(ref["reward_rms.var"])  # was reward_scaler.rms
    assert float(p.reward_ret.sum()) == pytest.approx(ref["reward_ret_sum"])  # was reward_scaler.ret
    assert p.hparams()["learning_rate"] == ref["learning_rate"]
    assert meta["updates"] == 2
    p.train_iteration()  # and it goes on


def test_a_leaderboard_entry_written_before_the_contract_still_loads():
    ref = json.loads((FIX / "before-agent-contract.json").read_text())
    t, file_meta, _ = safeio.load(FIX / "leaderboard-entry-before-agent-contract.safetensors", "leaderboard-entry")
    p = pod("agent.learning_rate=0.0001")
    p.load_agent(t, file_meta["meta"], source="old entry", load_hparams=False)
    assert float(p.agent.net.actor[0].weight.detach().sum()) == pytest.approx(ref["actor.0.weight_sum"], abs=1e-6)
    assert float(p.agent.reward_rms.var) == pytest.approx(ref["reward_rms.var"])
    assert p.hparams()["learning_rate"] == 0.0001
