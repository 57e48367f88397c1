"""Off-policy math: clipped double-Q targets, SAC's squashed Gaussian and temperature, TD3's
smoothing noise, polyak averaging, the update schedule (podracer_hpc/agents/offpolicy.py, sac.py,
td3.py; the replay ring: tests/agents/test_replay.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from podracer_hpc.agents.offpolicy import TwinQ, clipped_double_q_target, critic_loss, polyak_update, updates_due
from podracer_hpc.agents.sac import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    SquashedGaussianActor,
    sac_actor_loss,
    squashed_gaussian_log_prob,
    temperature_loss,
)
from podracer_hpc.agents.td3 import exploration_action, smoothed_target_action, td3_actor_loss


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------
# Clipped double-Q targets
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma", [0.9, 0.99, 1.0])
@pytest.mark.parametrize("with_entropy", [False, True], ids=["td3", "sac"])
def test_clipped_double_q_target_hand_computed(gamma, with_entropy):
    r = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    q1 = torch.tensor([10.0, 4.0, -1.0, 7.0], dtype=torch.float64)
    q2 = torch.tensor([8.0, 5.0, -3.0, 7.5], dtype=torch.float64)
    term = torch.tensor([False, True, False, False])  # row 3: a truncation (bootstrapped: q of the final obs)
    logp = torch.tensor([0.3, -1.0, 2.0, 0.0], dtype=torch.float64)
    alpha = 0.2
    y = clipped_double_q_target(r, term, gamma, q1, q2, logp if with_entropy else None, alpha)
    ent = [alpha * x for x in (0.3, -1.0, 2.0, 0.0)] if with_entropy else [0.0] * 4
    expected = [
        1.0 + gamma * (8.0 - ent[0]),  # min(10, 8)
        -2.0,  # terminated: no bootstrap, whatever the next values
        0.5 + gamma * (-3.0 - ent[2]),  # min(-1, -3)
        3.0 + gamma * (7.0 - ent[3]),  # truncated: bootstrapped like any other step
    ]
    np.testing.assert_allclose(y.numpy(), expected, rtol=0, atol=1e-12)


def test_clipped_double_q_target_per_row_discount_and_no_gradient_needed():
    r = torch.tensor([1.0, 1.0])
    disc = torch.tensor([0.9, 0.9**3])  # one-step and a three-step window
    q = torch.tensor([2.0, 2.0])
    y = clipped_double_q_target(r, torch.zeros(2, dtype=torch.bool), disc, q, q + 1)
    np.testing.assert_allclose(y.numpy(), [1 + 0.9 * 2, 1 + 0.9**3 * 2], rtol=1e-6)


def test_critic_loss_and_actor_losses_hand_computed():
    q1, q2, y = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), torch.tensor([1.0, 1.0])
    assert critic_loss(q1, q2, y).item() == pytest.approx((0 + 1) / 2 + (1 + 9) / 2)
    logp = torch.tensor([0.5, -0.5])
    # SAC: mean(alpha logp - min(q1, q2)) = mean(0.1 - 0, -0.1 - 2)
    assert sac_actor_loss(logp, q1, q2, 0.2).item() == pytest.approx((0.1 - 0.0 + -0.1 - 2.0) / 2)
    assert td3_actor_loss(q1).item() == pytest.approx(-1.5)


def test_twin_critics_are_independent_networks():
    torch.manual_seed(0)
    q = TwinQ(3, 2, [8], "relu")
    o, a = torch.randn(5, 3), torch.randn(5, 2)
    q1, q2 = q(o, a)
    assert q1.shape == q2.shape == (5,) and not torch.allclose(q1, q2)
    q1.sum().backward()
    assert all(p.grad[1].abs().max() == 0 for p in q.parameters())  # member 2's weights get nothing
    assert all(p.grad[0].abs().max() > 0 for p in q.parameters())


# --------------------------------------------------------------------------------------
# SAC: the squashed Gaussian and the temperature
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mean,std", [(0.0, 0.3), (0.5, 1.0), (-1.2, 0.6), (2.0, 0.5)])
def test_tanh_log_prob_integrates_to_one(mean, std):
    """The density of a = tanh(u) on (-1, 1), numerically integrated in a, is 1."""
    a = torch.linspace(-1 + 1e-9, 1 - 1e-9, 400_001, dtype=torch.float64)
    u = torch.atanh(a)
    m, ls = torch.full_like(u, mean), torch.full_like(u, math.log(std))
    p = squashed_gaussian_log_prob(u[:, None], m[:, None], ls[:, None]).exp()
    assert torch.trapezoid(p, a).item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("act_dim", [1, 3])
def test_tanh_log_prob_matches_the_closed_form_and_torch(act_dim):
    torch.manual_seed(0)
    mean = torch.randn(50, act_dim, dtype=torch.float64)
    log_std = torch.randn(50, act_dim, dtype=torch.float64) * 0.5
    u = mean + log_std.exp() * torch.randn(50, act_dim, dtype=torch.float64)
    ours = squashed_gaussian_log_prob(u, mean, log_std)
    closed = (Normal(mean, log_std.exp()).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    np.testing.assert_allclose(ours.numpy(), closed.numpy(), rtol=1e-10, atol=1e-10)
    torch_d = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
    np.testing.assert_allclose(ours.numpy(), torch_d.log_prob(torch.tanh(u)).sum(-1).numpy(), atol=1e-6)


def test_tanh_log_prob_is_finite_far_in_the_tails():
    """Where 1 - tanh(u)^2 underflows in float32 (|u| > 9), the stable form stays exact."""
    u = torch.tensor([[12.0], [-15.0], [30.0]])
    lp = squashed_gaussian_log_prob(u, torch.zeros_like(u), torch.zeros_like(u))
    exact = -0.5 * u.double() ** 2 - 0.5 * math.log(2 * math.pi) - 2 * (math.log(2) - u.double().abs())
    assert torch.isfinite(lp).all()
    np.testing.assert_allclose(lp.numpy(), exact.squeeze(-1).numpy(), rtol=1e-5)


def test_actor_samples_in_range_and_log_std_bounded():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, [16], "relu")
    obs = torch.randn(1000, 3) * 100  # extreme inputs
    a, logp = actor.sample(obs, gen())
    assert a.shape == (1000, 2) and logp.shape == (1000,)
    assert (a.abs() <= 1).all() and torch.isfinite(logp).all()
    _, log_std = actor(obs)
    assert (log_std >= LOG_STD_MIN).all() and (log_std <= LOG_STD_MAX).all()
    a2, _ = actor.sample(obs, gen())
    assert torch.equal(a, a2)  # the generator decides


def test_reparameterized_sample_carries_gradient_to_the_actor():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 1, [8], "relu")
    a, logp = actor.sample(torch.randn(16, 3), gen())
    (a.sum() + logp.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in actor.parameters())


@pytest.mark.parametrize(
    "entropy,target,alpha_rises", [(-3.0, -1.0, True), (0.5, -1.0, False), (-2.5, -2.0, True), (1.0, 0.0, False)]
)
def test_temperature_loss_gradient_sign(entropy, target, alpha_rises):
    """Entropy (-log pi) below the target: the loss's gradient in log alpha is negative, so a
    descent step raises alpha; above the target it lowers it."""
    log_alpha = torch.tensor(math.log(0.2), requires_grad=True)
    logp = torch.full((32,), -entropy)
    temperature_loss(log_alpha, logp, target).backward()
    assert (log_alpha.grad.item() < 0) == alpha_rises
    # d/dlog_alpha of -alpha (logp + target) is -alpha (logp + target)
    assert log_alpha.grad.item() == pytest.approx(-0.2 * (-entropy + target), rel=1e-5)


def test_temperature_loss_does_not_reach_the_policy():
    logp = torch.zeros(4, requires_grad=True)
    log_alpha = torch.tensor(0.0, requires_grad=True)
    temperature_loss(log_alpha, logp, -1.0).backward()
    assert logp.grad is None


# --------------------------------------------------------------------------------------
# TD3: smoothing and exploration noise
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy_noise,noise_clip", [(10.0, 0.5), (0.2, 0.5), (1.0, 0.1)])
def test_td3_target_smoothing_noise_is_clipped(policy_noise, noise_clip):
    mu = torch.zeros(20000, 2)
    a = smoothed_target_action(mu, policy_noise, noise_clip, gen())
    assert a.abs().max().item() <= noise_clip + 1e-7
    if policy_noise > 3 * noise_clip:  # most draws beyond the clip: they sit on it
        assert (a.abs() == noise_clip).float().mean() > 0.9
    if policy_noise * 3 < noise_clip:  # almost never clipped: a Gaussian of std policy_noise
        assert a.std().item() == pytest.approx(policy_noise, rel=0.03)


def test_td3_target_action_and_exploration_stay_in_the_action_range():
    mu = torch.full((5000, 1), 0.9)
    a = smoothed_target_action(mu, 0.5, 0.5, gen())
    assert a.max().item() == 1.0 and a.min().item() >= 0.4 - 1e-6
    e = exploration_action(mu, 0.3, gen())
    assert e.max().item() == 1.0 and e.min().item() >= -1.0
    assert torch.equal(e, exploration_action(mu, 0.3, gen()))


# --------------------------------------------------------------------------------------
# Polyak averaging and the update schedule
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("tau", [0.005, 0.3, 0.5, 0.9, 1.0])
def test_polyak_update_math(tau):
    torch.manual_seed(0)
    online, target = TwinQ(3, 1, [8], "relu"), TwinQ(3, 1, [8], "relu")
    before = [p.clone() for p in target.parameters()]
    polyak_update(target, online, tau)
    for b, t, o in zip(before, target.parameters(), online.parameters()):
        torch.testing.assert_close(t, (1 - tau) * b + tau * o, rtol=1e-6, atol=1e-7)
        if tau == 1.0:
            assert torch.equal(t, o)
    assert all(not p.requires_grad or p.grad is None for p in target.parameters())


@pytest.mark.parametrize("ratio", [0.25, 0.29, 1.0, 2.5, 0.1, 3.0, 1 / 3])
def test_updates_due_totals_floor_of_steps_times_ratio(ratio):
    due = [updates_due(k, ratio) for k in range(1, 301)]
    assert all(d >= 0 for d in due)
    totals = np.cumsum(due)
    expected = [math.floor(k * ratio + 1e-9) for k in range(1, 301)]
    assert list(totals) == expected
    assert updates_due(0, ratio) == 0
    if ratio == 0.25:
        assert due[:8] == [0, 0, 0, 1, 0, 0, 0, 1]
    if ratio == 2.5:
        assert due[:4] == [2, 3, 2, 3]
