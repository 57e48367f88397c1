"""The replay ring: one slot per env step, n-step returns against a hand-unrolled reference,
truncations that bootstrap from the final observation, its state round trip, uniform sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from podracer_hpc.agents.offpolicy import clipped_double_q_target
from podracer_hpc.agents.replay import ReplayBuffer


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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
