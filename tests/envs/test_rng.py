"""BatchRNG: counter-based SplitMix64 streams, one per environment (podracer_hpc/envs/rng.py)."""

from __future__ import annotations

import random

import pytest
import torch

from podracer_hpc.envs import rng as rng_mod
from podracer_hpc.envs.rng import BatchRNG, mix64

MASK64 = (1 << 64) - 1
PHI = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB


# --------------------------------------------------------------------------------------
# Plain-Python reference (unsigned 64-bit arithmetic with explicit masking)
# --------------------------------------------------------------------------------------
def ref_mix64(z: int) -> int:
    """SplitMix64 finalizer on an unsigned 64-bit integer."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def to_signed(v: int) -> int:
    v &= MASK64
    return v - (1 << 64) if v >= (1 << 63) else v


def ref_key(seed: int, env: int) -> int:
    """The per-env key as the module docstring describes it: mix64(env * phi + mix64(seed + phi))."""
    seed_key = ref_mix64((seed & MASK64) + PHI)
    return ref_mix64(env * PHI + seed_key)


def ref_uniform(seed: int, env: int, counter: int) -> float:
    """Draw number ``counter`` of env ``env``: the top 53 bits of mix64(key + counter * phi)."""
    x = ref_mix64(ref_key(seed, env) + counter * PHI)
    return (x >> 11) * 2.0**-53


# --------------------------------------------------------------------------------------
# mix64
# --------------------------------------------------------------------------------------
def test_constants_are_the_splitmix64_constants_as_signed_int64():
    assert rng_mod._PHI & MASK64 == PHI
    assert rng_mod._M1 & MASK64 == M1
    assert rng_mod._M2 & MASK64 == M2


def test_mix64_matches_python_reference_on_many_values():
    r = random.Random(1234)
    vals = [0, 1, -1, 2, 42, (1 << 63) - 1, -(1 << 63), -(1 << 62), 1 << 62, PHI - (1 << 64)]
    vals += [r.randrange(-(1 << 63), 1 << 63) for _ in range(2000)]
    vals += [r.randrange(-1000, 1000) for _ in range(200)]  # small negatives: sign bits everywhere
    x = torch.tensor(vals, dtype=torch.int64)
    got = mix64(x).tolist()
    want = [to_signed(ref_mix64(v)) for v in vals]
    assert got == want
    assert any(v < 0 for v in vals) and any(g < 0 for g in got)


def test_mix64_known_value():
    # SplitMix64 with state 0: the first output is mix64(0 + phi) = 0xE220A8397B1DCDAF
    assert to_signed(0xE220A8397B1DCDAF) == mix64(torch.tensor([PHI - (1 << 64)])).item()


def test_mix64_is_elementwise_and_keeps_shape():
    x = torch.arange(-12, 12, dtype=torch.int64).reshape(4, 6)
    y = mix64(x)
    assert y.shape == x.shape and y.dtype == torch.int64
    assert torch.equal(y.reshape(-1), mix64(x.reshape(-1)))
    assert torch.equal(y[2:3], mix64(x[2:3]))


# --------------------------------------------------------------------------------------
# uniform(): values and distribution
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 7, 123456789, 2**40 + 3])
def test_uniform_matches_reference_stream(seed):
    g = BatchRNG(seed, 5)
    a = g.uniform(3, dtype=torch.float64)
    b = g.uniform(2, dtype=torch.float64)
    got = torch.cat([a, b], dim=1)
    want = torch.tensor([[ref_uniform(seed, i, c) for c in range(5)] for i in range(5)], dtype=torch.float64)
    assert torch.equal(got, want)


def test_uniform_offset_selects_stream_indices():
    full = BatchRNG(3, 10).uniform(4, dtype=torch.float64)
    part = BatchRNG(3, 4, offset=6).uniform(4, dtype=torch.float64)
    assert torch.equal(part, full[6:])


def test_uniform_range_and_moments():
    g = BatchRNG(11, 100)
    u = g.uniform(1000, dtype=torch.float64)  # 1e5 draws
    assert u.shape == (100, 1000) and u.dtype == torch.float64
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # mean 1/2 (std of the estimate ~9e-4), variance 1/12 (std ~2.7e-4)
    assert abs(float(u.mean()) - 0.5) < 5e-3
    assert abs(float(u.var()) - 1.0 / 12.0) < 2e-3
    # roughly flat histogram over 10 bins: each ~1e4 counts, std ~95
    hist = torch.histc(u.flatten(), bins=10, min=0.0, max=1.0)
    assert float((hist - 1e4).abs().max()) < 600
    # consecutive draws are not correlated, nor are neighbouring envs
    f = u.flatten()
    assert abs(float(torch.corrcoef(torch.stack([f[:-1], f[1:]]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1])) < 0.02


def test_uniform_float32_default_dtype_and_range():
    u = BatchRNG(0, 64).uniform(512)
    assert u.dtype == torch.float32 and u.shape == (64, 512)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0


def test_uniform_float32_never_returns_one():
    # A stream found by search: BatchRNG(2, 59).uniform(31820, dtype=float32)[58, 31819] == 1.0
    g = BatchRNG(2, 1, offset=58)
    g.counter += 31819
    u64 = g.uniform(1, dtype=torch.float64)
    assert float(u64) < 1.0  # the exact value is in [0, 1) ...
    g.counter -= 1
    u32 = g.uniform(1, dtype=torch.float32)
    assert float(u32) < 1.0  # ... but its float32 rounding must be too


# --------------------------------------------------------------------------------------
# Per-environment independence and masking
# --------------------------------------------------------------------------------------
def test_env_stream_does_not_depend_on_batch_size():
    small = BatchRNG(5, 4)
    big = BatchRNG(5, 64)
    for k in (1, 3, 2):
        a = small.uniform(k, dtype=torch.float64)
        b = big.uniform(k, dtype=torch.float64)
        assert torch.equal(a, b[:4])


def test_env_stream_does_not_depend_on_other_envs_masks():
    gen = torch.Generator().manual_seed(0)
    n = 16
    a, b = BatchRNG(9, n), BatchRNG(9, n)
    seq_a, seq_b = [], []
    for _ in range(20):
        ma = torch.rand(n, generator=gen) < 0.5
        mb = torch.rand(n, generator=gen) < 0.5
        ma[3] = mb[3] = True  # env 3 always draws, everybody else at random, differently in a and b
        seq_a.append(a.uniform(2, mask=ma, dtype=torch.float64)[3])
        seq_b.append(b.uniform(2, mask=mb, dtype=torch.float64)[3])
    assert torch.equal(torch.stack(seq_a), torch.stack(seq_b))
    # and env 3's sequence is simply its stream drawn 40 times in a row
    assert torch.equal(torch.stack(seq_a).flatten(), BatchRNG(9, n).uniform(40, dtype=torch.float64)[3])


def test_masked_draw_advances_only_masked_envs():
    g = BatchRNG(1, 6)
    ref = BatchRNG(1, 6).uniform(7, dtype=torch.float64)  # each env's first 7 numbers
    mask = torch.tensor([True, False, True, False, False, True])
    first = g.uniform(3, mask=mask, dtype=torch.float64)
    # every env sees the next numbers of its own stream, masked or not
    assert torch.equal(first, ref[:, :3])
    assert g.counter.tolist() == [3, 0, 3, 0, 0, 3]
    second = g.uniform(3, dtype=torch.float64)
    for i in range(6):
        start = 3 if mask[i] else 0
        assert torch.equal(second[i], ref[i, start : start + 3])
    assert g.counter.tolist() == [6, 3, 6, 3, 3, 6]


def test_all_false_mask_advances_nothing():
    g = BatchRNG(1, 3)
    a = g.uniform(2, mask=torch.zeros(3, dtype=torch.bool), dtype=torch.float64)
    b = g.uniform(2, dtype=torch.float64)
    assert torch.equal(a, b)


# --------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------
def test_same_seed_same_numbers_different_seeds_differ():
    a = BatchRNG(42, 8).uniform(16, dtype=torch.float64)
    b = BatchRNG(42, 8).uniform(16, dtype=torch.float64)
    c = BatchRNG(43, 8).uniform(16, dtype=torch.float64)
    assert torch.equal(a, b)
    assert not torch.isclose(a, c).any()  # all 128 numbers change, not just some


def test_envs_of_one_batch_have_distinct_streams():
    u = BatchRNG(0, 256).uniform(4, dtype=torch.float64)
    assert torch.unique(u[:, 0]).numel() == 256
    assert torch.unique(u, dim=0).shape[0] == 256


def test_seed_and_env_index_are_not_interchangeable():
    # stream (seed s, env i) must differ from (seed s+1, env i-1) etc.
    a = BatchRNG(0, 4).uniform(4, dtype=torch.float64)
    b = BatchRNG(1, 4).uniform(4, dtype=torch.float64)
    assert not torch.isin(a, b).any()


@pytest.mark.parametrize("seed", [0, 1, 2**31, 2**63 - 1, 2**64 - 1, -1])
def test_any_64bit_seed_is_accepted(seed):
    u = BatchRNG(seed, 3).uniform(2, dtype=torch.float64)
    want = torch.tensor([[ref_uniform(seed, i, c) for c in range(2)] for i in range(3)], dtype=torch.float64)
    assert torch.equal(u, want)


@pytest.mark.parametrize("seed", [2**63, -(2**63)])
def test_seeds_near_int64_min_are_accepted(seed):
    u = BatchRNG(seed, 3).uniform(2, dtype=torch.float64)
    want = torch.tensor([[ref_uniform(seed, i, c) for c in range(2)] for i in range(3)], dtype=torch.float64)
    assert torch.equal(u, want)


# --------------------------------------------------------------------------------------
# Checkpointing
# --------------------------------------------------------------------------------------
def test_state_dict_round_trip_continues_the_stream():
    a = BatchRNG(77, 8)
    a.uniform(5, mask=torch.arange(8) % 2 == 0)
    sd = a.state_dict()
    expected = a.uniform(4, dtype=torch.float64)
    b = BatchRNG(999, 8)  # different seed: everything must come from the state dict
    b.load_state_dict(sd)
    assert torch.equal(b.uniform(4, dtype=torch.float64), expected)


def test_state_dict_is_a_copy():
    a = BatchRNG(0, 4)
    sd = a.state_dict()
    before = sd["counter"].clone()
    a.uniform(3)
    assert torch.equal(sd["counter"], before)
    b = BatchRNG(1, 4)
    b.load_state_dict(sd)
    sd["counter"] += 100  # mutating the dict after loading must not touch b
    assert b.counter.tolist() == [0, 0, 0, 0]


def test_load_state_dict_rejects_wrong_num_envs():
    sd = BatchRNG(0, 4).state_dict()
    with pytest.raises(ValueError, match="4 envs"):
        BatchRNG(0, 5).load_state_dict(sd)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_draw_rows_is_the_masked_draw_of_those_rows(dtype):
    """draw_rows (the CPU step's restarts) = draw with a mask, bit for bit, rows and counters."""
    r = BatchRNG(5, 300)
    r.counter = torch.randint(0, 1000, (300,)) * 4
    mask = torch.rand(300, generator=torch.Generator().manual_seed(0)) < 0.3
    idx = mask.nonzero().view(-1)
    u, counter = rng_mod.draw(r.key, r.counter, 4, mask, dtype)
    for rows in (rng_mod.draw_rows, rng_mod._draw_rows_torch):  # numpy on the CPU; torch elsewhere
        c2 = r.counter.clone()
        u2 = rows(r.key, c2, idx, 4, dtype)
        assert u2.dtype == dtype and u2.shape == (len(idx), 4)
        assert torch.equal(u[idx], u2) and torch.equal(counter, c2), rows
        assert int((c2 != r.counter).sum()) == len(idx)  # only those rows advanced
