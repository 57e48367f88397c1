"""Counter-based random streams, one per environment, as batched int64 tensor ops.

Each environment ``i`` owns a SplitMix64 stream: a 64-bit key derived from (seed, i) and a
counter. Drawing ``k`` numbers for a set of environments hashes ``key + (counter + j) * phi``
for ``j < k`` and advances only those environments' counters. So an environment's random
numbers depend on the pod seed, its own index and its own history, never on how many other
environments share the batch or when they reset. The whole state is two tensors, which makes
it trivial to checkpoint. No Python loop over environments, no host round trip.
"""

from __future__ import annotations

import numpy as np
import torch

# 64-bit constants as signed int64 (torch has no uint64 arithmetic on every device).
_PHI = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15
_M1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_M2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB


def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 values."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finalizer on int64 tensors (wrapping arithmetic)."""
    x = (x ^ _srl(x, 30)) * _M1
    x = (x ^ _srl(x, 27)) * _M2
    return x ^ _srl(x, 31)


def _to_i64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= (1 << 63) else v


def draw(
    key: torch.Tensor, counter: torch.Tensor, k: int, mask: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure form of :meth:`BatchRNG.uniform`: returns (uniforms ``[N, k]``, the new counters)."""
    j = torch.arange(k, dtype=torch.int64, device=key.device)
    x = mix64(key[:, None] + (counter[:, None] + j) * _PHI)
    # As many random bits as the dtype's mantissa holds, so that u < 1 exactly (no rounding up).
    bits = 24 if dtype in (torch.float32, torch.float16, torch.bfloat16) else 53
    u = _srl(x, 64 - bits).to(torch.float64 if bits == 53 else torch.float32) * (2.0**-bits)
    step = k if mask is None else k * mask.to(torch.int64)
    return u.to(dtype), counter + step


class BatchRNG:
    """One independent uniform random stream per environment."""

    def __init__(self, seed: int, num_envs: int, device: str | torch.device = "cpu", offset: int = 0):
        self.device = torch.device(device)
        idx = torch.arange(offset, offset + num_envs, dtype=torch.int64, device=self.device)
        seed_key = mix64(torch.tensor(_to_i64(_to_i64(seed) + _PHI), dtype=torch.int64))
        self.key = mix64(idx * _PHI + seed_key.to(self.device))
        self.counter = torch.zeros(num_envs, dtype=torch.int64, device=self.device)

    def uniform(self, k: int, mask: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Draw ``[num_envs, k]`` uniforms in [0, 1); only envs in ``mask`` advance their stream."""
        u, self.counter = draw(self.key, self.counter, k, mask, dtype)
        return u

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"key": self.key.clone(), "counter": self.counter.clone()}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        if sd["key"].shape != self.key.shape:
            raise ValueError(f"RNG state is for {sd['key'].shape[0]} envs, this env has {self.key.shape[0]}")
        self.key = sd["key"].to(self.device, torch.int64).clone()
        self.counter = sd["counter"].to(self.device, torch.int64).clone()


_PHI_STEPS: dict[tuple[int, torch.device], torch.Tensor] = {}
_U64 = {name: np.uint64(v & ((1 << 64) - 1)) for name, v in (("phi", _PHI), ("m1", _M1), ("m2", _M2))}


def draw_rows(key: torch.Tensor, counter: torch.Tensor, idx: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``[len(idx), k]`` uniforms that ``draw(key, counter, k, mask, dtype)`` gives the rows
    ``idx`` of ``mask``, bit for bit, computed on those rows only; advances ``counter[idx]`` by
    ``k`` in place. For a CPU step that restarts a few of many envs: on the CPU it runs in numpy
    on views of the same memory (unsigned 64-bit arithmetic, a third of the ops of int64 torch
    ops that need a mask per logical shift, each with less overhead); elsewhere in torch.
    """
    if key.device.type != "cpu":
        return _draw_rows_torch(key, counter, idx, k, dtype)
    keys, counters, rows = key.numpy().view(np.uint64), counter.numpy().view(np.uint64), idx.numpy()
    c = counters[rows]
    with np.errstate(over="ignore"):  # wrapping 64-bit arithmetic, as in mix64
        x = (keys[rows] + c * _U64["phi"])[:, None] + np.arange(k, dtype=np.uint64) * _U64["phi"]
        counters[rows] = c + np.uint64(k)
        x ^= x >> np.uint64(30)
        x *= _U64["m1"]
        x ^= x >> np.uint64(27)
        x *= _U64["m2"]
        x ^= x >> np.uint64(31)
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        u = (x >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
    else:
        u = (x >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return torch.from_numpy(u).to(dtype)


def _draw_rows_torch(
    key: torch.Tensor, counter: torch.Tensor, idx: torch.Tensor, k: int, dtype: torch.dtype
) -> torch.Tensor:
    """``draw_rows`` in int64 torch ops (any device)."""
    steps = _PHI_STEPS.get((k, key.device))
    if steps is None:
        steps = _PHI_STEPS[(k, key.device)] = torch.arange(k, dtype=torch.int64, device=key.device) * _PHI
    c = counter.index_select(0, idx)
    x = torch.add(key.index_select(0, idx), c, alpha=_PHI)[:, None] + steps  # key + (counter + j) * phi
    counter.index_copy_(0, idx, c.add_(k))
    y = x >> 30  # mix64, in place
    x ^= y.bitwise_and_((1 << 34) - 1)
    x *= _M1
    torch.bitwise_right_shift(x, 27, out=y)
    x ^= y.bitwise_and_((1 << 37) - 1)
    x *= _M2
    torch.bitwise_right_shift(x, 31, out=y)
    x ^= y.bitwise_and_((1 << 33) - 1)
    bits = 24 if dtype in (torch.float32, torch.float16, torch.bfloat16) else 53
    torch.bitwise_right_shift(x, 64 - bits, out=y)
    y &= (1 << bits) - 1
    u = y.to(torch.float64 if bits == 53 else torch.float32).mul_(2.0**-bits)
    return u.to(dtype)
