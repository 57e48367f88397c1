"""PPO math: GAE, normalizers, clipped loss, distributions, a tiny update (podracer_hpc/agents/ppo.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from podracer_hpc.agents.ppo import ActorCritic, PPOAgent, RewardScaler, RunningMeanStd, compute_gae, ppo_loss
from podracer_hpc.agents.settings import PPOConfig


# --------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------
def ref_gae(r, v, nv, term, done, gamma, lam):
    """GAE from its definition, per env, as a forward sum (not the backward recursion).

    delta_t = r_t + gamma * (1 - term_t) * nv_t - v_t
    A_t = sum_{l >= 0} (gamma * lam)^l delta_{t+l}, up to and including the step that ends
    the episode (or the end of the rollout).
    """
    T, N = r.shape
    adv = np.zeros((T, N))
    for i in range(N):
        for t in range(T):
            total, w = 0.0, 1.0
            for u in range(t, T):
                delta = r[u, i] + gamma * (0.0 if term[u, i] else nv[u, i]) - v[u, i]
                total += w * delta
                w *= gamma * lam
                if done[u, i]:
                    break
            adv[t, i] = total
    return adv, adv + v


def make_rollout(T=12, N=5, seed=0):
    """Random rollout data with episodes ending by termination and by truncation.

    Within an episode next_values[t] == values[t + 1] (as in a real rollout); at a truncation
    next_values is the value of the final observation (a separate number); at a termination
    it is some number that must be ignored; the last step bootstraps from next_values.
    """
    g = np.random.default_rng(seed)
    r = g.normal(size=(T, N))
    v = g.normal(size=(T, N))
    term = np.zeros((T, N), dtype=bool)
    trunc = np.zeros((T, N), dtype=bool)
    term[3, 0] = term[7, 1] = term[T - 1, 2] = True
    trunc[5, 0] = trunc[2, 3] = trunc[T - 1, 4] = trunc[8, 2] = True
    done = term | trunc
    nv = np.empty((T, N))
    nv[:-1] = v[1:]
    nv[-1] = g.normal(size=N)
    nv[done] = g.normal(size=int(done.sum())) * 3.0  # final-obs values (or garbage at terminations)
    return r, v, nv, term, done


def run_gae(r, v, nv, term, done, gamma, lam):
    t = lambda x: torch.as_tensor(x)  # noqa: E731
    adv, ret = compute_gae(t(r), t(v), t(nv), t(term), t(done), gamma, lam)
    return adv.numpy(), ret.numpy()


@pytest.mark.parametrize("gamma", [0.9, 0.99, 1.0])
@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_gae_matches_reference(gamma, lam, seed):
    data = make_rollout(seed=seed)
    adv, ret = run_gae(*data, gamma, lam)
    ref_adv, ref_ret = ref_gae(*data, gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-10, atol=1e-10)


def test_gae_float32_and_shapes():
    r, v, nv, term, done = (torch.as_tensor(x) for x in make_rollout())
    adv, ret = compute_gae(r.float(), v.float(), nv.float(), term, done, 0.99, 0.95)
    assert adv.shape == ret.shape == r.shape
    assert adv.dtype == ret.dtype == torch.float32
    ref_adv, _ = ref_gae(*make_rollout(), 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), ref_adv, atol=1e-5)


@pytest.mark.parametrize("gamma", [0.9, 0.99])
def test_gae_lambda_one_is_bootstrapped_monte_carlo_return(gamma):
    r, v, nv, term, done = make_rollout(seed=3)
    _, ret = run_gae(r, v, nv, term, done, gamma, 1.0)
    T, N = r.shape
    for i in range(N):
        for t in range(T):
            g, w, u = 0.0, 1.0, t
            while True:
                g += w * r[u, i]
                w *= gamma
                if done[u, i] or u == T - 1:
                    g += 0.0 if term[u, i] else w * nv[u, i]  # bootstrap unless a true end
                    break
                u += 1
            assert ret[t, i] == pytest.approx(g, abs=1e-9), (t, i)


@pytest.mark.parametrize("gamma", [0.9, 0.99])
def test_gae_lambda_zero_is_one_step_td_error(gamma):
    r, v, nv, term, done = make_rollout(seed=4)
    adv, _ = run_gae(r, v, nv, term, done, gamma, 0.0)
    td = r + gamma * np.where(term, 0.0, nv) - v
    np.testing.assert_allclose(adv, td, atol=1e-12)


def test_gae_termination_zeroes_the_bootstrap():
    r, v, nv, term, done = make_rollout(seed=5)
    adv, _ = run_gae(r, v, nv, term, done, 0.99, 0.95)
    nv2 = nv.copy()
    nv2[term] += 100.0  # values at true ends are ignored
    adv2, _ = run_gae(r, v, nv2, term, done, 0.99, 0.95)
    np.testing.assert_allclose(adv, adv2, atol=1e-12)


def test_gae_truncation_bootstraps_from_next_values():
    r, v, nv, term, done = make_rollout(seed=6)
    gamma, lam = 0.99, 0.95
    adv, _ = run_gae(r, v, nv, term, done, gamma, lam)
    t0, i0 = 5, 0  # a truncation step of env 0 (its previous episode ended at t=3)
    assert done[t0, i0] and not term[t0, i0]
    nv2 = nv.copy()
    nv2[t0, i0] += 1.0
    adv2, _ = run_gae(r, v, nv2, term, done, gamma, lam)
    diff = adv2 - adv
    # the step itself gains gamma, the earlier step of the same episode gamma * (gamma * lam)
    assert diff[t0, i0] == pytest.approx(gamma)
    assert diff[t0 - 1, i0] == pytest.approx(gamma * gamma * lam)
    # nothing leaks into the previous episode, later steps or other envs
    diff[t0, i0] = diff[t0 - 1, i0] = 0.0
    np.testing.assert_allclose(diff, 0.0, atol=1e-12)


@pytest.mark.parametrize("env,end", [(0, 3), (3, 2)], ids=["after-termination", "after-truncation"])
def test_gae_does_not_leak_across_episode_boundaries(env, end):
    r, v, nv, term, done = make_rollout(seed=7)
    assert done[end, env] and not done[:end, env].any()
    adv, _ = run_gae(r, v, nv, term, done, 0.99, 0.95)
    r2 = r.copy()
    r2[end + 1 :, env] += 10.0  # the episode ending at `end` must not see later rewards
    adv2, _ = run_gae(r2, v, nv, term, done, 0.99, 0.95)
    np.testing.assert_allclose(adv[: end + 1, env], adv2[: end + 1, env], atol=1e-12)
    assert not np.allclose(adv[end + 1 :, env], adv2[end + 1 :, env])


# --------------------------------------------------------------------------------------
# RunningMeanStd and RewardScaler
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [[1, 5, 17, 100, 3], [64] * 6, [2, 1, 1, 250]])
def test_running_mean_std_matches_numpy_over_concatenation(sizes):
    g = np.random.default_rng(len(sizes))
    batches = [g.normal(loc=i * 3.0 - 2.0, scale=1.0 + i, size=(b, 3)) for i, b in enumerate(sizes)]
    # float32 input is accumulated in float64: the reference sees the same float32 values
    batches = [b.astype(np.float32) if i % 2 else b for i, b in enumerate(batches)]
    rms = RunningMeanStd((3,), epsilon=0.0)
    for b in batches:
        rms.update(torch.as_tensor(b))
    allx = np.concatenate([b.astype(np.float64) for b in batches])
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-10, atol=1e-12)
    assert float(rms.count) == len(allx)
    assert rms.mean.dtype == rms.var.dtype == torch.float64


def test_running_mean_std_default_prior_is_negligible():
    g = np.random.default_rng(0)
    batches = [g.normal(loc=3.0, scale=0.5, size=(n, 2)) for n in (10, 300, 7, 50)]
    rms = RunningMeanStd((2,))  # epsilon = 1e-4 pseudo-count of mean 0, var 1 (as SB3)
    for b in batches:
        rms.update(torch.as_tensor(b))
    allx = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-5)
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-3)
    assert float(rms.count) == pytest.approx(len(allx) + 1e-4)


def test_running_mean_std_stable_at_large_offset():
    g = np.random.default_rng(1)
    batches = [g.normal(loc=1e6, scale=0.5, size=(n, 2)) for n in (10, 300, 7, 50, 1)]
    rms = RunningMeanStd((2,), epsilon=0.0)
    for b in batches:
        rms.update(torch.as_tensor(b))
    allx = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-6)


def test_running_mean_std_normalize_and_clip():
    rms = RunningMeanStd((2,))
    rms.mean.copy_(torch.tensor([1.0, -2.0], dtype=torch.float64))
    rms.var.copy_(torch.tensor([4.0, 0.25], dtype=torch.float64))
    x = torch.tensor([[1.0, -2.0], [3.0, -1.5], [1e6, -1e6]], dtype=torch.float32)
    y = rms.normalize(x, clip=5.0)
    assert y.dtype == torch.float32
    s = math.sqrt(4.0 + 1e-8), math.sqrt(0.25 + 1e-8)
    expected = torch.tensor([[0.0, 0.0], [2.0 / s[0], 0.5 / s[1]], [5.0, -5.0]])
    assert torch.allclose(y, expected, atol=1e-6)
    assert float(rms.normalize(x, clip=0.5).abs().max()) == pytest.approx(0.5)


def test_running_mean_std_is_module_state():
    rms = RunningMeanStd((3,))
    rms.update(torch.randn(10, 3))
    sd = rms.state_dict()
    assert set(sd) == {"mean", "var", "count"}
    other = RunningMeanStd((3,))
    other.load_state_dict(sd)
    assert torch.equal(other.mean, rms.mean) and torch.equal(other.var, rms.var)


def test_reward_scaler_matches_reference():
    gamma, N, T = 0.9, 6, 40
    g = np.random.default_rng(1)
    rewards = g.normal(loc=1.0, scale=2.0, size=(T, N))
    dones = g.random((T, N)) < 0.15
    sc = RewardScaler(N, gamma)
    ret = np.zeros(N)
    history = []
    for t in range(T):
        ret = ret * gamma + rewards[t]
        history.append(ret.copy())
        var = np.concatenate(history).var()
        expected = rewards[t] / np.sqrt(var + 1e-8)
        out = sc(torch.as_tensor(rewards[t]), torch.as_tensor(dones[t]))
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-3)
        ret[dones[t]] = 0.0
        # the running return resets exactly where an episode ended, and only there
        np.testing.assert_allclose(sc.ret.numpy(), ret, atol=1e-12)
        assert (sc.ret.numpy()[dones[t]] == 0).all()
    assert dones.any() and (~dones).any()


def test_reward_scaler_keeps_dtype_and_does_not_shift_sign():
    sc = RewardScaler(4, 0.99)
    r = torch.tensor([1.0, -2.0, 0.0, 3.0])
    out = sc(r, torch.zeros(4, dtype=torch.bool))
    assert out.dtype == torch.float32
    assert torch.equal(torch.sign(out), torch.sign(r))
    assert out[2] == 0


# --------------------------------------------------------------------------------------
# The clipped PPO loss
# --------------------------------------------------------------------------------------
RATIOS = [0.5, 0.9, 1.0, 1.1, 1.5, 2.0, 0.5]
ADVS = [1.0, -1.0, 2.0, -2.0, 1.0, -1.0, -1.0]
# -min(r * A, clip(r, 0.8, 1.2) * A), by hand:
#   r=0.5 A=+1: min(0.5, 0.8)   = 0.5  (below the range with A>0: not clipped)
#   r=0.9 A=-1: min(-0.9, -0.9) = -0.9
#   r=1.0 A=+2: 2.0
#   r=1.1 A=-2: -2.2
#   r=1.5 A=+1: min(1.5, 1.2)   = 1.2  (clipped)
#   r=2.0 A=-1: min(-2.0, -1.2) = -2.0 (above the range with A<0: not clipped)
#   r=0.5 A=-1: min(-0.5, -0.8) = -0.8 (clipped)
PG_TERMS = [-0.5, 0.9, -2.0, 2.2, -1.2, 2.0, 0.8]
CLIPPED = [False, False, False, False, True, False, True]  # where the gradient is zero


def loss_inputs(requires_grad=False):
    old = torch.tensor([-1.0, -0.5, -2.0, 0.3, -0.7, -1.2, 0.1], dtype=torch.float64)
    new = (old + torch.log(torch.tensor(RATIOS, dtype=torch.float64))).requires_grad_(requires_grad)
    adv = torch.tensor(ADVS, dtype=torch.float64)
    z = torch.zeros(7, dtype=torch.float64)
    return new, old, adv, z


def test_ppo_policy_loss_clipping_hand_computed():
    new, old, adv, z = loss_inputs(requires_grad=True)
    out = ppo_loss(new, old, adv, z, z, z, z, clip_coef=0.2, vf_coef=0.0, ent_coef=0.0, norm_adv=False)
    assert float(out.policy_loss.detach()) == pytest.approx(sum(PG_TERMS) / 7, abs=1e-12)
    assert float(out.loss.detach()) == pytest.approx(sum(PG_TERMS) / 7, abs=1e-12)
    out.loss.backward()
    # d/d logp of -r*A/n = -r*A/n where the unclipped term is active, 0 where clipping bites
    expected_grad = [0.0 if c else -r * a / 7 for r, a, c in zip(RATIOS, ADVS, CLIPPED)]
    assert torch.allclose(new.grad, torch.tensor(expected_grad, dtype=torch.float64), atol=1e-12)


def test_ppo_approx_kl_and_clipfrac_hand_computed():
    new, old, adv, z = loss_inputs()
    out = ppo_loss(new, old, adv, z, z, z, z, clip_coef=0.2, vf_coef=0.0, ent_coef=0.0, norm_adv=False)
    kl = sum((r - 1) - math.log(r) for r in RATIOS) / 7
    assert float(out.approx_kl) == pytest.approx(kl, abs=1e-12)
    assert float(out.approx_kl) >= 0
    # |r - 1| > 0.2 for r in {0.5, 1.5, 2.0, 0.5}
    assert float(out.clipfrac) == pytest.approx(4 / 7)
    out2 = ppo_loss(new, old, adv, z, z, z, z, clip_coef=0.6, vf_coef=0.0, ent_coef=0.0, norm_adv=False)
    assert float(out2.clipfrac) == pytest.approx(1 / 7)  # only r = 2.0


def test_ppo_loss_identity_ratio_is_minus_mean_advantage():
    adv = torch.tensor([0.3, -1.0, 2.5])
    lp = torch.tensor([-1.0, -2.0, -0.5])
    z = torch.zeros(3)
    out = ppo_loss(lp, lp, adv, z, z, z, z, 0.2, 0.0, 0.0, norm_adv=False)
    assert float(out.policy_loss) == pytest.approx(-float(adv.mean()))
    assert float(out.approx_kl) == 0.0 and float(out.clipfrac) == 0.0


def test_ppo_loss_normalizes_advantages():
    new, old, adv, z = loss_inputs()
    a = np.array(ADVS)
    na = (a - a.mean()) / (a.std(ddof=1) + 1e-8)
    r = np.array(RATIOS)
    expected = np.mean(-np.minimum(r * na, np.clip(r, 0.8, 1.2) * na))
    out = ppo_loss(new, old, adv, z, z, z, z, 0.2, 0.0, 0.0, norm_adv=True)
    assert float(out.policy_loss) == pytest.approx(expected, abs=1e-9)
    # scaling and shifting the advantages does not change the normalized loss
    out2 = ppo_loss(new, old, adv * 7.0 + 3.0, z, z, z, z, 0.2, 0.0, 0.0, norm_adv=True)
    assert float(out2.policy_loss) == pytest.approx(expected, abs=1e-9)


def test_ppo_loss_single_sample_advantage_is_not_normalized():
    one = torch.tensor([0.0])
    out = ppo_loss(one, one, torch.tensor([2.0]), one, one, one, one, 0.2, 0.0, 0.0, norm_adv=True)
    assert float(out.policy_loss) == pytest.approx(-2.0)


def test_ppo_value_loss_unclipped_and_clipped_hand_computed():
    old_v = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    new_v = torch.tensor([0.5, -0.1, 1.3], dtype=torch.float64)
    ret = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    z = torch.zeros(3, dtype=torch.float64)
    plain = ppo_loss(z, z, z, new_v, old_v, ret, z, 0.2, 1.0, 0.0, clip_vloss=False, norm_adv=False)
    # 0.5 * mean((new - ret)^2) = 0.5 * (0.25 + 0.01 + 1.69) / 3
    assert float(plain.value_loss) == pytest.approx(0.5 * 1.95 / 3, abs=1e-12)
    clipped = ppo_loss(z, z, z, new_v, old_v, ret, z, 0.2, 1.0, 0.0, clip_vloss=True, norm_adv=False)
    # v_clip = old + clamp(new - old, -0.2, 0.2) = [0.2, -0.1, 1.2]
    # max((new-ret)^2, (v_clip-ret)^2) = [max(.25, .64), .01, max(1.69, 1.44)] = [.64, .01, 1.69]
    assert float(clipped.value_loss) == pytest.approx(0.5 * 2.34 / 3, abs=1e-12)
    assert float(clipped.loss) == pytest.approx(0.5 * 2.34 / 3, abs=1e-12)  # vf_coef = 1


def test_ppo_loss_combines_terms_with_entropy_bonus_sign():
    new, old, adv, _ = loss_inputs()
    g = torch.Generator().manual_seed(0)
    new_v, old_v, ret = (torch.randn(7, generator=g, dtype=torch.float64) for _ in range(3))
    ent = torch.rand(7, generator=g, dtype=torch.float64) + 0.5
    base = ppo_loss(new, old, adv, new_v, old_v, ret, ent, 0.2, 0.0, 0.0, norm_adv=False)
    out = ppo_loss(new, old, adv, new_v, old_v, ret, ent, 0.2, 0.7, 0.05, norm_adv=False)
    assert float(out.entropy) == pytest.approx(float(ent.mean()))
    expected = float(base.policy_loss) - 0.05 * float(ent.mean()) + 0.7 * float(base.value_loss)
    assert float(out.loss) == pytest.approx(expected, abs=1e-12)
    # more entropy -> lower loss (a bonus, not a penalty)
    more = ppo_loss(new, old, adv, new_v, old_v, ret, ent + 1.0, 0.2, 0.7, 0.05, norm_adv=False)
    assert float(more.loss) == pytest.approx(float(out.loss) - 0.05, abs=1e-12)


def test_ppo_loss_metrics_carry_no_gradient():
    new, old, adv, z = loss_inputs(requires_grad=True)
    out = ppo_loss(new, old, adv, z, z, z, z, 0.2, 0.5, 0.01, norm_adv=False)
    assert out.loss.requires_grad
    assert not out.approx_kl.requires_grad and not out.clipfrac.requires_grad


# --------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------
def small_cfg(**kw) -> PPOConfig:
    base = dict(hidden_sizes=[16], activation="tanh", learning_rate=1e-2, num_minibatches=2, update_epochs=4)
    base.update(kw)
    return PPOConfig(**base)


@pytest.mark.parametrize("act_dim", [1, 3])
def test_gaussian_log_prob_entropy_match_torch_normal(act_dim):
    torch.manual_seed(0)
    net = ActorCritic(4, act_dim, False, 0, small_cfg(init_log_std=-0.3)).double()
    with torch.no_grad():
        net.log_std.copy_(torch.linspace(-1.0, 0.5, act_dim, dtype=torch.float64))
    params = torch.randn(9, act_dim, dtype=torch.float64)
    action = torch.randn(9, act_dim, dtype=torch.float64) * 2
    logp, ent = net.log_prob_entropy(params, action)
    d = Normal(params, net.log_std.exp().expand_as(params))
    assert logp.shape == ent.shape == (9,)
    assert torch.allclose(logp, d.log_prob(action).sum(-1), atol=1e-12)
    assert torch.allclose(ent, d.entropy().sum(-1), atol=1e-12)


def test_gaussian_init_log_std_from_config():
    net = ActorCritic(4, 2, False, 0, small_cfg(init_log_std=-0.7))
    assert torch.allclose(net.log_std, torch.full((2,), -0.7))


@pytest.mark.parametrize("num_actions", [2, 5])
def test_categorical_log_prob_entropy_match_torch_categorical(num_actions):
    torch.manual_seed(1)
    net = ActorCritic(4, 1, True, num_actions, small_cfg())
    params = torch.randn(11, num_actions, dtype=torch.float64) * 3
    action = torch.randint(0, num_actions, (11,))
    logp, ent = net.log_prob_entropy(params, action)
    d = Categorical(logits=params)
    assert logp.shape == ent.shape == (11,)
    assert torch.allclose(logp, d.log_prob(action), atol=1e-12)
    assert torch.allclose(ent, d.entropy(), atol=1e-12)


def test_sampling_follows_the_distributions():
    gen = torch.Generator().manual_seed(0)
    cont = ActorCritic(2, 2, False, 0, small_cfg(init_log_std=math.log(0.5)))
    params = torch.tensor([[1.0, -3.0]]).expand(20000, 2)
    a = cont.sample(params, gen)
    assert torch.allclose(a.mean(0), torch.tensor([1.0, -3.0]), atol=0.02)
    assert torch.allclose(a.std(0), torch.tensor([0.5, 0.5]), atol=0.02)
    assert torch.equal(cont.mode(params), params)
    disc = ActorCritic(2, 1, True, 3, small_cfg())
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]])).expand(20000, 3)
    s = disc.sample(logits, gen)
    freq = torch.bincount(s, minlength=3).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.2, 0.5, 0.3]), atol=0.02)
    assert (disc.mode(logits) == 1).all()


def test_network_init_small_policy_output():
    net = ActorCritic(4, 2, False, 0, small_cfg())
    obs = torch.randn(100, 4)
    # the actor's last layer has gain 0.01: near-zero means at init; zero biases
    with torch.no_grad():
        assert float(net.dist_params(obs).abs().max()) < 0.1
        assert all(float(m.bias.abs().max()) == 0 for m in net.modules() if isinstance(m, torch.nn.Linear))
    assert net.value(obs).shape == (100,)


# --------------------------------------------------------------------------------------
# A tiny update
# --------------------------------------------------------------------------------------
def synthetic_batch(agent: PPOAgent, discrete: bool, B=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, 3, generator=g)
    with torch.no_grad():
        actions, logp = agent.act(obs, g)
        values = agent.value(obs)
    if discrete:
        adv = torch.where(actions == 0, 1.0, -1.0)
    else:
        params = agent.net.dist_params(obs).detach()
        adv = torch.sign(actions[:, 0] - params[:, 0])  # reward pushing the mean up
    returns = torch.full((B,), 2.0)
    return obs, actions, logp, adv, returns, values


@pytest.mark.parametrize("discrete", [True, False])
def test_update_moves_policy_toward_positive_advantages_and_fits_values(discrete):
    torch.manual_seed(0)
    cfg = small_cfg(anneal_lr=False)
    agent = PPOAgent(3, 1, discrete, 2 if discrete else 0, 8, cfg)
    obs, actions, logp, adv, returns, values = synthetic_batch(agent, discrete)
    pos = adv > 0
    assert pos.any() and (~pos).any()
    metrics = agent.update(obs, actions, logp, adv, returns, values, torch.Generator().manual_seed(1), 0.0)
    with torch.no_grad():
        new_logp, _ = agent.net.log_prob_entropy(agent.net.dist_params(obs), actions)
        new_values = agent.net.value(obs)
    assert float((new_logp - logp)[pos].mean()) > 0.01
    assert float((new_logp - logp)[~pos].mean()) < -0.01
    assert float((new_values - returns).square().mean()) < float((values - returns).square().mean())
    expected = {
        "loss",
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clipfrac",
        "explained_variance",
        "learning_rate",
    }
    assert set(metrics) == expected
    for k, v in metrics.items():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and torch.isfinite(v), k
    assert float(metrics["approx_kl"]) > 0


def test_update_anneals_learning_rate():
    cfg = small_cfg(anneal_lr=True, update_epochs=1)
    agent = PPOAgent(3, 1, True, 2, 8, cfg)
    batch = synthetic_batch(agent, True, B=16)
    m = agent.update(*batch, torch.Generator().manual_seed(0), 0.25)
    assert float(m["learning_rate"]) == pytest.approx(0.75 * cfg.learning_rate)
    assert agent.optimizer.param_groups[0]["lr"] == pytest.approx(0.75 * cfg.learning_rate)
    cfg2 = small_cfg(anneal_lr=False, update_epochs=1)
    agent2 = PPOAgent(3, 1, True, 2, 8, cfg2)
    m2 = agent2.update(*batch, torch.Generator().manual_seed(0), 0.25)
    assert float(m2["learning_rate"]) == pytest.approx(cfg2.learning_rate)


def _adam_steps(agent: PPOAgent) -> int:
    st = agent.optimizer.state[next(iter(agent.net.parameters()))]
    return int(st["step"])


def test_update_runs_epochs_times_minibatches_steps_and_target_kl_stops_early():
    cfg = small_cfg(update_epochs=3, num_minibatches=4, target_kl=0.0)
    agent = PPOAgent(3, 1, True, 2, 8, cfg)
    batch = synthetic_batch(agent, True, B=32)
    agent.update(*batch, torch.Generator().manual_seed(0), 0.0)
    assert _adam_steps(agent) == 12
    cfg_kl = small_cfg(update_epochs=3, num_minibatches=4, target_kl=1e-12, learning_rate=0.05)
    agent_kl = PPOAgent(3, 1, True, 2, 8, cfg_kl)
    agent_kl.update(*batch, torch.Generator().manual_seed(0), 0.0)
    assert _adam_steps(agent_kl) == 4  # one epoch, then the KL check stops the update


def test_update_is_deterministic_given_generator():
    def run():
        torch.manual_seed(3)
        agent = PPOAgent(3, 1, False, 0, 8, small_cfg())
        batch = synthetic_batch(agent, False, B=32)
        m = agent.update(*batch, torch.Generator().manual_seed(5), 0.1)
        return agent, m

    (a1, m1), (a2, m2) = run(), run()
    for p1, p2 in zip(a1.net.parameters(), a2.net.parameters()):
        assert torch.equal(p1, p2)
    for k in m1:
        assert torch.equal(m1[k], m2[k]), k


def test_explained_variance_metric():
    agent = PPOAgent(3, 1, True, 2, 8, small_cfg(update_epochs=1))
    obs, actions, logp, adv, _, _ = synthetic_batch(agent, True, B=16)
    returns = torch.linspace(-1, 1, 16)
    m = agent.update(obs, actions, logp, adv, returns, returns.clone(), torch.Generator().manual_seed(0), 0.0)
    assert float(m["explained_variance"]) == pytest.approx(1.0)
    m = agent.update(obs, actions, logp, adv, returns, torch.zeros(16), torch.Generator().manual_seed(0), 0.0)
    assert float(m["explained_variance"]) == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------------------
# The written-out gradients (agents/ppo_grads.py) against autograd
# --------------------------------------------------------------------------------------
def _minibatch(agent: PPOAgent, B: int, seed: int, ties: bool = False):
    g = torch.Generator().manual_seed(seed)
    obs, actions = torch.randn(B, 5, generator=g), 0.5 * torch.randn(B, 2, generator=g)
    with torch.no_grad():
        logp, _ = agent.net.log_prob_entropy(agent.net.dist_params(obs), actions)
    old_logp = logp + 0.3 * torch.randn(B, generator=g)  # ratios on both sides of the clip range
    if ties:
        old_logp[:4] = logp[:4]  # ratio 1: the two surrogate terms tie
    adv, old_v, ret = (torch.randn(B, generator=g) for _ in range(3))
    if ties:
        adv[4:6] = 0.0  # a zero advantage: the terms tie too
    return obs, actions, old_logp, adv, old_v, ret


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu", "silu"])
@pytest.mark.parametrize("clip_vloss", [False, True])
@pytest.mark.parametrize("norm_adv", [True, False])
def test_written_out_gradients_equal_autograds(activation, clip_vloss, norm_adv):
    torch.manual_seed(0)
    cfg = PPOConfig(
        hidden_sizes=[8, 8], activation=activation, clip_vloss=clip_vloss, norm_adv=norm_adv, init_log_std=-0.5
    )
    agent = PPOAgent(5, 2, False, 0, 4, cfg)
    assert agent.written_out()
    rows = (*_minibatch(agent, 32, seed=1, ties=True), 0.2, 0.5, 0.01)
    loss, stats = agent._minibatch_loss(*rows)
    params = list(agent.net.parameters())
    ref = torch.autograd.grad(loss, params)
    grads, stats2 = agent._minibatch_grads(*rows)
    assert [tuple(g.shape) for g in grads] == [tuple(p.shape) for p in params]  # net.parameters()' order
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(stats2, stats, rtol=1e-6, atol=1e-7)
    assert float(stats[5]) > 0 and float(stats[5]) < 1  # some ratios clipped, some not


def test_an_update_with_written_out_gradients_follows_autograds():
    """Five epochs of minibatch steps: the written-out update and an autograd one (the same agent
    through the autograd path) end within float rounding of each other."""
    torch.manual_seed(0)
    cfg = PPOConfig(hidden_sizes=[16, 16], num_minibatches=4, update_epochs=5)
    agents = [PPOAgent(5, 2, False, 0, 4, cfg) for _ in range(2)]
    agents[1].load_state_dict(agents[0].state_dict())
    agents[1].written_out = lambda: False  # the autograd path: the loss, backward, clipping, Adam
    batch = _minibatch(agents[0], 64, seed=3)
    start = [p.detach().clone() for p in agents[0].net.parameters()]
    gens = [torch.Generator().manual_seed(7) for _ in agents]
    out = [a.update(*batch, g, 0.0) for a, g in zip(agents, gens)]
    assert "grads" in agents[0].hot() and "loss" in agents[1].hot()
    assert max(float((p - q).abs().max()) for p, q in zip(agents[0].net.parameters(), start)) > 1e-3  # it learnt
    for p, q in zip(agents[0].net.parameters(), agents[1].net.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    for k in out[1]:
        torch.testing.assert_close(out[0][k], out[1][k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("discrete", [True, False])
def test_categorical_and_per_asset_networks_go_through_autograd(discrete):
    torch.manual_seed(0)
    if discrete:
        agent = PPOAgent(4, 1, True, 3, 4, PPOConfig(hidden_sizes=[8, 8]))
    else:
        agent = PPOAgent(
            7,
            2,
            False,
            0,
            4,
            PPOConfig(hidden_sizes=[8, 8], network="per_asset"),
            asset_layout=([6], [[0, 1, 2], [3, 4, 5]]),
        )
    assert not agent.written_out() and "loss" in agent.hot() and "grads" not in agent.hot()
