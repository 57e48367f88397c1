"""The fast off-policy update: the twin critics as one batched ensemble, the backward passes
written out, the lean fused Adam, and checkpoints of the two-module critics still loading
(podracer_hpc/agents/offpolicy.py TwinQ, mlp_backward; sac.py saved_sample/_actor_grads, td3.py _actor_loss;
optimizer.py FusedAdam). Each is checked against the plain autograd / torch.optim reference."""

from __future__ import annotations

import pytest
import torch

from podracer_hpc.agents.mlp_math import mlp
from podracer_hpc.agents.offpolicy import (
    TwinQ,
    clipped_double_q_target,
    critic_loss,
    ensemble_target,
    upgrade_twin_q_state,
)
from podracer_hpc.agents.optimizer import FusedAdam
from podracer_hpc.agents.sac import SACAgent, sac_actor_loss, squashed_gaussian_log_prob
from podracer_hpc.agents.settings import SACConfig, TD3Config
from podracer_hpc.agents.td3 import TD3Agent, td3_actor_loss

ACTS = ["relu", "tanh", "elu", "silu"]
TOL = dict(rtol=1e-6, atol=1e-6)


def separate_pair(obs_dim: int, act_dim: int, hidden: list[int], activation: str, seed: int):
    """(the batched critics, the two nn.Sequential critics it must equal), from one seed each."""
    torch.manual_seed(seed)
    q = TwinQ(obs_dim, act_dim, hidden, activation)
    torch.manual_seed(seed)
    sizes = [obs_dim + act_dim, *hidden, 1]
    return q, [mlp(sizes, activation) for _ in range(2)]


def stacked(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Two MLPs' gradients (q1's then q2's) in the ensemble's layout (weights [2, in, out], biases [2, 1, out])."""
    n = len(grads) // 2
    out = []
    for i in range(n):
        a, b = grads[i], grads[i + n]
        out.append(torch.stack([a.t(), b.t()]) if a.dim() == 2 else torch.stack([a, b]).unsqueeze(1))
    return out


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("hidden", [[8], [16, 16], [64, 64]], ids=["8", "16x16", "64x64"])
def test_the_batched_critics_equal_two_separate_ones(activation, hidden, one_torch_thread):
    """Values, autograd's gradients and the written-out ones (loss_and_grads) of the ensemble
    equal those of two separate nn.Sequential critics within 1e-6; so do the input gradients
    (what the actor loss uses) and member(k)."""
    q, pair = separate_pair(3, 2, hidden, activation, seed=len(hidden) + len(activation))
    g = torch.Generator().manual_seed(1)
    obs, act, y = torch.randn(37, 3, generator=g), torch.randn(37, 2, generator=g), torch.randn(37, generator=g)
    x = torch.cat([obs, act], -1)
    ref = torch.stack([m(x).squeeze(-1) for m in pair])
    out = q(obs, act)
    torch.testing.assert_close(out, ref, **TOL)
    assert not torch.allclose(out[0], out[1])  # two networks, not one twice
    for k in (0, 1):
        torch.testing.assert_close(q.member(k, obs, act), ref[k], **TOL)
    ref_params = [p for m in pair for p in m.parameters()]
    ref_loss = critic_loss(ref[0], ref[1], y)
    want = stacked(list(torch.autograd.grad(ref_loss, ref_params)))
    auto = torch.autograd.grad(critic_loss(out[0], out[1], y), list(q.parameters()))
    loss, q_mean, manual = q.loss_and_grads(obs, act, y)
    torch.testing.assert_close(loss, ref_loss.detach(), **TOL)
    torch.testing.assert_close(q_mean, ref.mean().detach(), **TOL)
    assert len(manual) == len(want) == len(auto)
    for w, a, m in zip(want, auto, manual):
        assert a.shape == m.shape == w.shape
        torch.testing.assert_close(a, w, **TOL)
        torch.testing.assert_close(m, w, **TOL)
        assert w.abs().max() > 0
    # gradients at the inputs (the actor loss's path), the weights detached
    a_in = act.clone().requires_grad_(True)
    want_in = torch.autograd.grad(
        (torch.stack([m(torch.cat([obs, a_in], -1)).squeeze(-1) for m in pair]) * torch.tensor([[1.0], [-0.5]])).sum(),
        a_in,
    )[0]
    qv, inputs, pre = q.saved_forward(x)
    _, g_x = q.backward(torch.tensor([[1.0], [-0.5]]).expand(2, 37), inputs, pre, params=False, to_input=True)
    torch.testing.assert_close(g_x.sum(0)[:, 3:], want_in, **TOL)
    # Q1 alone (TD3's actor loss): the first member's values and input gradients, Q2 untouched
    want_q1 = torch.autograd.grad(pair[0](torch.cat([obs, a_in], -1)).sum(), a_in)[0]
    q1, in1, pre1 = q.saved_forward(x, first_only=True)
    assert q1.shape == (1, 37)
    torch.testing.assert_close(q1[0], ref[0].detach(), **TOL)
    _, g1 = q.backward(torch.ones(1, 37), in1, pre1, params=False, to_input=True)
    assert g1.shape == (1, 37, 5)
    torch.testing.assert_close(g1[0, :, 3:], want_q1, **TOL)
    det = q(obs, a_in, detach=True)
    det.sum().backward()
    assert a_in.grad is not None and all(p.grad is None for p in q.parameters())


@pytest.mark.parametrize("with_entropy", [False, True])
def test_the_ensemble_target_is_the_clipped_double_q_target(with_entropy):
    g = torch.Generator().manual_seed(2)
    r, q, logp = torch.randn(9, generator=g), torch.randn(2, 9, generator=g), torch.randn(9, generator=g)
    term = torch.rand(9, generator=g) < 0.3
    disc = 0.99 ** torch.randint(1, 4, (9,), generator=g).float()
    want = clipped_double_q_target(r, term, disc, q[0], q[1], logp if with_entropy else None, 0.2)
    got = ensemble_target(r, disc * ~term, q, logp if with_entropy else None, 0.2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    assert term.any() and not term.all()


def reference_sac_actor_grads(agent: SACAgent, obs: torch.Tensor, eps: torch.Tensor, alpha: float):
    """SAC's actor loss and gradients by autograd, the pre-ensemble way: the log-density from
    (u - mean) / std, two separate critics (copies of the ensemble's members), torch.min."""
    actor = agent.net.actor
    pair = []
    for k in range(2):
        sizes = [agent.obs_dim + agent.act_dim, *agent.cfg.hidden_sizes, 1]
        m = mlp(sizes, agent.cfg.activation)
        lin = [x for x in m if isinstance(x, torch.nn.Linear)]
        for i, layer in enumerate(lin):
            layer.weight.data.copy_(getattr(agent.net.critic, f"w{i}")[k].t())
            layer.bias.data.copy_(getattr(agent.net.critic, f"b{i}")[k, 0])
        pair.append(m)
    mean, log_std = actor(obs)
    u = mean + log_std.exp() * eps
    logp = squashed_gaussian_log_prob(u, mean, log_std)
    x = torch.cat([obs, torch.tanh(u)], -1)
    loss = sac_actor_loss(logp, pair[0](x).squeeze(-1), pair[1](x).squeeze(-1), alpha)
    return loss, logp, torch.autograd.grad(loss, list(actor.parameters()))


@pytest.mark.parametrize("activation", ACTS)
def test_sac_actor_gradients_written_out_equal_autograds(activation, one_torch_thread):
    torch.manual_seed(3)
    agent = SACAgent(3, 2, SACConfig(hidden_sizes=[32, 32], activation=activation))
    g = torch.Generator().manual_seed(4)
    obs, eps = torch.randn(50, 3, generator=g), torch.randn(50, 2, generator=g)
    want_loss, want_logp, want = reference_sac_actor_grads(agent, obs, eps, 0.3)
    a, pi_logp, record = agent.net.actor.saved_sample(obs, eps)
    loss, logp, grads = agent._actor_grads(obs, eps, torch.tensor(0.3), a, pi_logp, record)
    torch.testing.assert_close(loss, want_loss.detach(), **TOL)
    torch.testing.assert_close(logp, want_logp.detach(), rtol=1e-5, atol=1e-5)
    for w, m in zip(want, grads):
        assert w.shape == m.shape and w.abs().max() > 0
        torch.testing.assert_close(m, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ACTS)
def test_td3_actor_gradients_written_out_equal_autograds(activation, one_torch_thread):
    torch.manual_seed(5)
    agent = TD3Agent(3, 2, TD3Config(hidden_sizes=[32, 32], activation=activation))
    obs = torch.randn(50, 3, generator=torch.Generator().manual_seed(6))
    actor = agent.net.actor
    want_loss = td3_actor_loss(agent.net.critic(obs, actor(obs))[0])
    want = torch.autograd.grad(want_loss, list(actor.parameters()))
    loss, grads = agent._actor_loss(obs)
    torch.testing.assert_close(loss, want_loss.detach(), **TOL)
    for w, m in zip(want, grads):
        assert w.shape == m.shape and w.abs().max() > 0
        torch.testing.assert_close(m, w, **TOL)


def test_fused_adam_equals_torchs_step_bit_for_bit_and_survives_a_load():
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.Adam(n.parameters(), lr=1e-3, fused=True) for n in nets]
    lean = FusedAdam(opts[1])
    x = torch.randn(64, 5)
    for step in range(5):
        if step == 3:  # a checkpoint round trip: the state tensors are replaced
            opts[1].load_state_dict(opts[1].state_dict())
            lean.reset()
        opts[0].param_groups[0]["lr"] = opts[1].param_groups[0]["lr"] = 1e-3 * (step + 1)  # PBT changes lr
        opts[0].zero_grad(set_to_none=True)
        (nets[0](x) ** 2).sum().backward()
        opts[0].step()
        params = list(nets[1].parameters())
        lean.step(torch.autograd.grad((nets[1](x) ** 2).sum(), params))
        assert all(p.grad is None for p in params)
    assert all(torch.equal(a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters()))
    s0, s1 = (o.state_dict()["state"] for o in opts)
    assert all(torch.equal(s0[i][k], s1[i][k]) for i in s0 for k in ("step", "exp_avg", "exp_avg_sq"))
    assert float(s1[0]["step"]) == 5


def test_fused_adam_takes_a_transposed_gradient_as_its_parameter_lays_out():
    """A gradient laid out as another view (autograd.grad of a transposed weight) gives the
    step a contiguous one would; torch's fused kernel alone walks it in the wrong order."""
    w = [torch.randn(4, 6) for _ in range(2)]
    opts = [torch.optim.Adam([torch.nn.Parameter(x.clone())], lr=0.1, fused=True) for x in w[:1] * 2]
    g = torch.randn(6, 4).t()  # non-contiguous
    lean = FusedAdam(opts[1])
    for _ in range(2):
        p0 = opts[0].param_groups[0]["params"][0]
        p0.grad = g.contiguous()
        opts[0].step()
        lean.step([g])
    torch.testing.assert_close(
        opts[1].param_groups[0]["params"][0], opts[0].param_groups[0]["params"][0], rtol=0, atol=0
    )


def test_a_state_of_the_two_module_critics_loads_into_the_ensemble(one_torch_thread):
    """An old layout (net.critic.q1.0.weight, ...; the critic optimizer's 12 parameter ids) is
    converted on load: the same Q values, and Adam continues from the same moments (one more
    step from the same gradients gives the same weights)."""
    obs_dim, act_dim, hidden = 3, 1, [8, 8]
    torch.manual_seed(0)
    sizes = [obs_dim + act_dim, *hidden, 1]
    old = torch.nn.ModuleDict({"q1": mlp(sizes, "relu"), "q2": mlp(sizes, "relu")})
    opt = torch.optim.Adam(old.parameters(), lr=1e-2, fused=True)
    x, y = torch.randn(20, obs_dim + act_dim), torch.randn(20)

    def old_step() -> None:
        opt.zero_grad()
        critic_loss(old["q1"](x).squeeze(-1), old["q2"](x).squeeze(-1), y).backward()
        opt.step()

    for _ in range(3):
        old_step()
    tensors = {f"net.critic.{k}": v.clone() for k, v in old.state_dict().items()}
    tensors.update({f"net.critic_target.{k}": v.clone() * 0.5 for k, v in old.state_dict().items()})
    sd = opt.state_dict()
    tensors.update({f"optim.critic.{pid}.{k}": v.clone() for pid, st in sd["state"].items() for k, v in st.items()})
    tensors["obs_rms.mean"] = torch.zeros(obs_dim)
    meta = {"optim_param_groups": {"critic": sd["param_groups"]}}
    new_t, new_meta = upgrade_twin_q_state(tensors, meta)
    assert "net.critic.q1.0.weight" in tensors and meta["optim_param_groups"]["critic"][0]["params"] == list(range(12))
    assert not any(".q1." in k or ".q2." in k for k in new_t) and "obs_rms.mean" in new_t
    q, target = TwinQ(obs_dim, act_dim, hidden, "relu"), TwinQ(obs_dim, act_dim, hidden, "relu")
    q.load_state_dict({k[11:]: v for k, v in new_t.items() if k.startswith("net.critic.")})
    target.load_state_dict({k[18:]: v for k, v in new_t.items() if k.startswith("net.critic_target.")})
    want = torch.stack([old["q1"](x).squeeze(-1), old["q2"](x).squeeze(-1)])
    torch.testing.assert_close(q(x[:, :obs_dim], x[:, obs_dim:]), want, **TOL)
    torch.testing.assert_close(target.w0, 0.5 * torch.stack([old["q1"][0].weight.t(), old["q2"][0].weight.t()]))
    new_opt = torch.optim.Adam(q.parameters(), lr=1e-2, fused=True)
    states = {}
    for k, v in new_t.items():
        if k.startswith("optim.critic."):
            pid, key = k[13:].split(".")
            states.setdefault(int(pid), {})[key] = v
    new_opt.load_state_dict({"state": states, "param_groups": new_meta["optim_param_groups"]["critic"]})
    old_step()
    _, _, grads = q.loss_and_grads(x[:, :obs_dim], x[:, obs_dim:], y)
    FusedAdam(new_opt).step(grads)
    want = torch.stack([old["q1"](x).squeeze(-1), old["q2"](x).squeeze(-1)])
    torch.testing.assert_close(q(x[:, :obs_dim], x[:, obs_dim:]), want, **TOL)
    assert float(new_opt.state_dict()["state"][0]["step"]) == 4


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_an_agent_state_of_the_old_layout_loads_through_agent_load(algo, one_torch_thread):
    """agent.load takes a state whose critics are in the two-module layout (converted as above)."""
    cls, cfg_cls = (SACAgent, SACConfig) if algo == "sac" else (TD3Agent, TD3Config)
    agent = cls(3, 1, cfg_cls(hidden_sizes=[8, 8]))
    t, meta = agent.state()
    old = {k: v for k, v in t.items() if not k.startswith(("net.critic.", "net.critic_target."))}
    for prefix in ("net.critic.", "net.critic_target."):
        for i in range(3):
            w, b = t[f"{prefix}w{i}"], t[f"{prefix}b{i}"]
            for k in (0, 1):
                old[f"{prefix}q{k + 1}.{2 * i}.weight"] = w[k].t().contiguous()
                old[f"{prefix}q{k + 1}.{2 * i}.bias"] = b[k, 0].clone()
    other = cls(3, 1, cfg_cls(hidden_sizes=[8, 8]))
    other.load(old, meta)
    obs, act = torch.randn(6, 3), torch.rand(6, 1)
    torch.testing.assert_close(other.net.critic(obs, act), agent.net.critic(obs, act), rtol=0, atol=0)
    torch.testing.assert_close(other.net.critic_target(obs, act), agent.net.critic_target(obs, act), rtol=0, atol=0)
