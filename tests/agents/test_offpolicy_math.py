"""Off-policy math: clipped double-Q targets, the replay ring and its n-step returns, SAC's
squashed Gaussian and temperature, TD3's smoothing noise, polyak averaging, the update schedule
(podracer_hpc/agents/offpolicy.py, replay.py, sac.py, td3.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from podracer_hpc.agents.offpolicy import TwinQ, clipped_double_q_target, critic_loss, polyak_update, updates_due
from podracer_hpc.agents.replay import ReplayBuffer
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
# The replay ring and n-step returns
# --------------------------------------------------------------------------------------
def fill(buf: ReplayBuffer, steps: int, seed: int = 0, p_term: float = 0.1, p_trunc: float = 0.1):
    """Add ``steps`` env steps of random data; obs encode (logical step, env) in columns 0, 1.

    Returns the history as numpy arrays ``[steps, N, ...]`` in logical (time) order.
    """
    g = np.random.default_rng(seed)
    N, D, A = buf.num_envs, buf.obs_dim, buf.act_dim
    hist = {k: [] for k in ("obs", "action", "reward", "next_obs", "term", "trunc")}
    for s in range(steps):
        obs = g.normal(size=(N, D)).astype(np.float32)
        obs[:, 0], obs[:, 1] = s, np.arange(N)
        nxt = g.normal(size=(N, D)).astype(np.float32)
        term = g.random(N) < p_term
        trunc = (g.random(N) < p_trunc) & ~term
        act = g.uniform(-1, 1, size=(N, A)).astype(np.float32)
        rew = g.normal(size=N).astype(np.float32)
        buf.add(
            torch.from_numpy(obs),
            torch.from_numpy(act),
            torch.from_numpy(rew),
            torch.from_numpy(nxt),
            torch.from_numpy(term),
            torch.from_numpy(trunc),
        )
        for k, v in zip(hist, (obs, act, rew, nxt, term, trunc)):
            hist[k].append(v)
    return {k: np.stack(v) for k, v in hist.items()}


def ref_n_step(hist, s: int, i: int, n: int, gamma: float, newest: int):
    """The n-step sample of the row at logical step ``s`` of env ``i``, hand-unrolled: sum the
    discounted rewards forward, stopping after an episode end or the newest stored step or n steps;
    returns (return, next_obs, terminated, discount)."""
    g, w, u = 0.0, 1.0, s
    while True:
        g += w * float(hist["reward"][u, i])
        w *= gamma
        ended = hist["term"][u, i] or hist["trunc"][u, i]
        if ended or u == newest or u - s + 1 == n:
            return g, hist["next_obs"][u, i], bool(hist["term"][u, i]), w
        u += 1


@pytest.mark.parametrize("n_step", [1, 2, 3, 5])
@pytest.mark.parametrize("gamma", [0.9, 0.99])
@pytest.mark.parametrize("steps", [4, 7, 23], ids=["partly-filled", "just-full", "wrapped"])
def test_sampled_rows_match_a_hand_unrolled_n_step_reference(n_step, gamma, steps):
    N, slots = 5, 7
    buf = ReplayBuffer(slots * N + 3, N, 4, 2, n_step=n_step, gamma=gamma)  # +3: rounded down
    assert buf.slots == slots and buf.capacity == slots * N
    hist = fill(buf, steps, seed=steps)
    assert len(buf) == min(steps, slots) * N
    b = buf.sample(1500, gen(1))
    oldest = max(0, steps - slots)
    s_idx, e_idx = b.obs[:, 0].long().numpy(), b.obs[:, 1].long().numpy()
    assert s_idx.min() >= oldest and s_idx.max() <= steps - 1  # never an overwritten or empty row
    assert len(set(zip(s_idx.tolist(), e_idx.tolist()))) == min(steps, slots) * N  # every stored row drawn
    for r in range(len(s_idx)):
        s, i = int(s_idx[r]), int(e_idx[r])
        ret, nxt, term, disc = ref_n_step(hist, s, i, n_step, gamma, newest=steps - 1)
        np.testing.assert_array_equal(b.obs[r].numpy(), hist["obs"][s, i])
        np.testing.assert_array_equal(b.action[r].numpy(), hist["action"][s, i])
        assert b.reward[r].item() == pytest.approx(ret, rel=1e-5, abs=1e-5)
        np.testing.assert_array_equal(b.next_obs[r].numpy(), nxt)
        assert bool(b.terminated[r]) == term
        assert b.discount[r].item() == pytest.approx(disc, rel=1e-6)


def test_n_step_window_explicit_numbers():
    """One env, gamma 0.5, n 3; rewards 1, 2, 4, 8, 16, 32; a termination at step 1, a truncation at step 4."""
    buf = ReplayBuffer(10, 1, 1, 1, n_step=3, gamma=0.5)
    term = [False, True, False, False, False, False]
    trunc = [False, False, False, False, True, False]
    for s, r in enumerate([1.0, 2.0, 4.0, 8.0, 16.0, 32.0]):
        buf.add(
            torch.tensor([[float(s)]]),
            torch.zeros(1, 1),
            torch.tensor([r]),
            torch.tensor([[100.0 + s]]),
            torch.tensor([term[s]]),
            torch.tensor([trunc[s]]),
        )
    ret, last, k = buf.n_step_returns(torch.arange(6), torch.zeros(6, dtype=torch.long))
    # step 0: 1 + 0.5*2, stops at the termination (no bootstrap)
    # step 1: 2 (the terminal step itself)
    # step 2: 4 + 0.5*8 + 0.25*16, stops at the truncation at step 4 (bootstraps from its final obs)
    # step 3: 8 + 0.5*16, stops at the truncation
    # step 4: 16 (truncated step)
    # step 5: 32, the newest step: cut there, bootstraps from its next_obs
    np.testing.assert_allclose(ret.numpy(), [2.0, 2.0, 12.0, 16.0, 16.0, 32.0])
    np.testing.assert_array_equal(last.numpy(), [1, 1, 4, 4, 4, 5])
    np.testing.assert_array_equal(k.numpy(), [1, 0, 2, 1, 0, 0])
    b = buf.sample(200, gen())
    for r in range(200):
        s = int(b.obs[r, 0])
        assert b.next_obs[r, 0].item() == 100.0 + [1, 1, 4, 4, 4, 5][s]
        assert bool(b.terminated[r]) == (s in (0, 1))
        assert b.discount[r].item() == pytest.approx(0.5 ** ([1, 0, 2, 1, 0, 0][s] + 1))


def test_one_step_truncation_bootstraps_from_the_final_obs():
    """A time-limit cut: next_obs is the final observation and terminated is False, so the target
    bootstraps from Q(final obs); a termination does not bootstrap."""
    buf = ReplayBuffer(2, 2, 1, 1, gamma=0.9)
    final_obs = torch.tensor([[7.0], [9.0]])
    buf.add(
        torch.tensor([[0.0], [1.0]]),
        torch.zeros(2, 1),
        torch.tensor([1.0, 1.0]),
        final_obs,
        torch.tensor([False, True]),
        torch.tensor([True, False]),
    )
    b = buf.sample(64, gen())
    q_of = lambda o: 10.0 * o[:, 0]  # noqa: E731  a stand-in critic
    y = clipped_double_q_target(b.reward, b.terminated, b.discount, q_of(b.next_obs), q_of(b.next_obs) + 1)
    for r in range(64):
        env = int(b.obs[r, 0])
        assert y[r].item() == pytest.approx(1.0 + 0.9 * 70.0 if env == 0 else 1.0)


def test_add_is_one_slot_per_env_step_and_refuses_n_step_without_truncation():
    buf = ReplayBuffer(12, 4, 3, 2, n_step=3)
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="truncated"):
        buf.add(x, torch.zeros(4, 2), torch.zeros(4), x, torch.zeros(4, dtype=torch.bool))
    one = ReplayBuffer(12, 4, 3, 2)
    one.add(x, torch.zeros(4, 2), torch.zeros(4), x, torch.zeros(4, dtype=torch.bool))  # fine with n = 1
    assert (one.pos, one.filled, len(one)) == (1, 1, 4)
    with pytest.raises(ValueError):
        ReplayBuffer(3, 4, 3, 2)  # fewer rows than envs
    with pytest.raises(RuntimeError, match="empty"):
        buf.sample(1, gen())


@pytest.mark.parametrize("obs_dim,act_dim", [(3, 1), (17, 6), (376, 17)])
def test_bytes_per_row_is_what_the_buffer_allocates(obs_dim, act_dim):
    buf = ReplayBuffer(64, 16, obs_dim, act_dim)
    assert buf.nbytes == buf.capacity * ReplayBuffer.bytes_per_row(obs_dim, act_dim)
    assert ReplayBuffer.bytes_per_row(obs_dim, act_dim) == 8 * obs_dim + 4 * act_dim + 6


@pytest.mark.parametrize("steps", [3, 9], ids=["partly-filled", "wrapped"])
def test_replay_state_round_trip_continues_bit_exactly(steps):
    a = ReplayBuffer(20, 4, 3, 2, n_step=2)
    fill(a, steps)
    t, meta = a.state()
    assert all(v.shape[0] == a.filled for v in t.values())  # only the filled slots are saved
    b = ReplayBuffer(20, 4, 3, 2, n_step=2)
    fill(b, 2, seed=99)  # different contents first: load replaces everything
    b.load({k: v.clone() for k, v in t.items()}, meta)
    ga, gb = gen(5), gen(5)
    for _ in range(3):
        sa, sb = a.sample(32, ga), b.sample(32, gb)
        assert all(torch.equal(x, y) for x, y in zip(sa, sb))
    fill(a, 4, seed=7)
    fill(b, 4, seed=7)
    ta, tb = a.state()[0], b.state()[0]
    assert all(torch.equal(ta[k], tb[k]) for k in ta) and (a.pos, a.filled) == (b.pos, b.filled)


def test_replay_load_refuses_another_layout():
    a = ReplayBuffer(20, 4, 3, 2)
    fill(a, 2)
    t, meta = a.state()
    with pytest.raises(ValueError, match="num_envs"):
        ReplayBuffer(20, 5, 3, 2).load(t, meta)
    with pytest.raises(ValueError):
        ReplayBuffer(40, 4, 3, 2).load(t, meta)


def test_sampling_is_reproducible_and_uniform():
    buf = ReplayBuffer(40, 4, 2, 1)
    fill(buf, 10)
    b1, b2 = buf.sample(20000, gen(3)), buf.sample(20000, gen(3))
    assert torch.equal(b1.obs, b2.obs)
    rows = (b1.obs[:, 0] * 4 + b1.obs[:, 1]).long()
    counts = torch.bincount(rows, minlength=40).double()
    assert counts.min() > 0.8 * 500 and counts.max() < 1.2 * 500  # 40 rows, 500 draws each expected


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
