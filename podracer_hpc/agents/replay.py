"""A replay buffer for thousands of batched environments: a ring of tensors on the pod's device.

Layout: ``T = capacity // num_envs`` time slots, each holding one row per environment, so a
pod's env step writes one slot with one tensor op per field (no loop over environments) and the
rows of one environment at consecutive slots are consecutive steps of its stream (what n-step
returns need). Per row (transition):

=============  =========================  =====================
field          shape                      bytes
=============  =========================  =====================
obs            ``[obs_dim]`` float32      4 obs_dim
next_obs       ``[obs_dim]`` float32      4 obs_dim
action         ``[act_dim]`` float32      4 act_dim
reward         float32                    4
terminated     bool                       1
done           bool                       1
=============  =========================  =====================

i.e. ``8 obs_dim + 4 act_dim + 6`` bytes (:meth:`ReplayBuffer.bytes_per_row`): Pendulum 42 B,
HalfCheetah (17, 6) 166 B, Humanoid (376, 17) 3082 B (one million rows: 3.1 GB). ``next_obs``
is stored rather than read from the next slot because at an episode end the next slot holds
the first observation of the next episode, while the target needs the last one of this episode
(the env's ``info["final_obs"]``, which equals the observation reached for every row that did
not finish, so a pod passes it as ``next_obs`` for the whole batch).

Episode ends: ``terminated`` (a true end: no bootstrap) and ``done`` (terminated or truncated by
a time limit: the n-step window stops there, and the target bootstraps from the stored
``next_obs``, the final observation, unless terminated).

n-step returns are computed at sampling time, on the device. The window of a row sampled at
slot ``t`` of env ``i`` covers that env's slots ``t, t+1, ..., t+n-1`` and stops at the first of

1. a step with ``done`` (included): the reward of that step is the last one summed; it is the
   bootstrap step, with ``terminated`` of that step (a truncation bootstraps from the final
   observation, a termination does not bootstrap);
2. the newest stored slot (included): its successor is not yet known, so the window is cut
   there and bootstraps from its ``next_obs`` (a shorter return, never one that reads rows of
   the future or overwritten ones);
3. the ``n``-th step.

For a window of ``k`` steps ending at step ``t+k-1`` the sample is ``reward = sum_{j<k} gamma^j
r_{t+j}``, ``next_obs = next_obs_{t+k-1}``, ``terminated = terminated_{t+k-1}``, ``discount =
gamma^k``. With ``n = 1`` this is the usual one-step transition with ``discount = gamma``.
Computing n-step at sampling time keeps the stored rows one-step (``n_step`` and ``gamma``
may differ between a run and its resume).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class Batch(NamedTuple):
    """A sampled minibatch: raw observations, actions in [-1, 1], the (n-step) return, the
    bootstrap observation and whether it is a true end, and ``gamma^k`` of each row's window."""

    obs: torch.Tensor  # [B, obs_dim]
    action: torch.Tensor  # [B, act_dim]
    reward: torch.Tensor  # [B]
    next_obs: torch.Tensor  # [B, obs_dim]
    terminated: torch.Tensor  # [B] bool
    discount: torch.Tensor  # [B]


class ReplayBuffer:
    """A ring of ``capacity // num_envs`` slots of ``num_envs`` transitions on ``device``."""

    FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "done")

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_dim: int,
        act_dim: int,
        device: str | torch.device = "cpu",
        n_step: int = 1,
        gamma: float = 0.99,
    ):
        """``capacity`` in transitions (rows), rounded down to a multiple of ``num_envs``;
        at least one slot. All tensors are allocated here (zeros), nothing later."""
        if num_envs < 1 or capacity < num_envs:
            raise ValueError(
                f"a replay buffer needs capacity >= num_envs >= 1, got capacity {capacity}, num_envs {num_envs}"
            )
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.num_envs, self.obs_dim, self.act_dim = int(num_envs), int(obs_dim), int(act_dim)
        self.slots = int(capacity) // self.num_envs
        self.capacity = self.slots * self.num_envs
        self.device = torch.device(device)
        self.n_step, self.gamma = int(n_step), float(gamma)
        T, N, dev = self.slots, self.num_envs, self.device
        self.obs = torch.zeros(T, N, obs_dim, device=dev)
        self.next_obs = torch.zeros(T, N, obs_dim, device=dev)
        self.action = torch.zeros(T, N, act_dim, device=dev)
        self.reward = torch.zeros(T, N, device=dev)
        self.terminated = torch.zeros(T, N, dtype=torch.bool, device=dev)
        self.done = torch.zeros(T, N, dtype=torch.bool, device=dev)
        self.pos = 0  # the slot the next add writes
        self.filled = 0  # slots holding data (<= slots)

    # --- sizes ---------------------------------------------------------------------------
    @staticmethod
    def bytes_per_row(obs_dim: int, act_dim: int) -> int:
        """Bytes of one stored transition: ``8 obs_dim + 4 act_dim + 6`` (see the module doc)."""
        return 4 * (2 * obs_dim + act_dim + 1) + 2

    @property
    def nbytes(self) -> int:
        """Bytes allocated by the buffer's tensors."""
        return sum(getattr(self, f).nbytes for f in self.FIELDS)

    def __len__(self) -> int:
        """Transitions stored (``filled * num_envs``)."""
        return self.filled * self.num_envs

    # --- writing -------------------------------------------------------------------------
    @torch.no_grad()
    def add(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor | None = None,
    ) -> None:
        """Store one env step of every environment (``[num_envs, ...]`` each) in the next slot.

        ``obs`` is the observation acted on (raw, not normalized), ``action`` the policy's action
        in [-1, 1], ``next_obs`` the observation reached, which for an environment whose episode
        just ended is the *final* observation (``info["final_obs"]``, not the reset one).
        ``truncated`` (a time-limit cut) is needed for n-step returns only: without it an
        episode cut by the time limit would run on into the next one, so ``n_step > 1`` refuses
        ``None``; with ``n_step = 1`` a truncation needs nothing beyond ``next_obs``.
        """
        if truncated is None and self.n_step > 1:
            raise ValueError("ReplayBuffer.add: n_step > 1 needs `truncated` to stop the returns at time-limit cuts")
        p = self.pos
        self.obs[p] = obs
        self.action[p] = action.reshape(self.num_envs, self.act_dim)
        self.reward[p] = reward
        self.next_obs[p] = next_obs
        self.terminated[p] = terminated
        self.done[p] = terminated if truncated is None else (terminated | truncated)
        self.pos = (p + 1) % self.slots
        self.filled = min(self.filled + 1, self.slots)

    # --- sampling ------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """``batch_size`` rows drawn uniformly (with replacement) from the stored ones, on the
        device with ``generator`` (the same generator state gives the same batch)."""
        if self.filled == 0:
            raise RuntimeError("ReplayBuffer.sample: the buffer is empty")
        N, dev = self.num_envs, self.device
        flat = torch.randint(0, self.filled * N, (batch_size,), generator=generator, device=dev)
        t, env = flat // N, flat % N  # filled slots are 0..filled-1 until full, then all of them
        if self.n_step == 1:
            return Batch(
                self.obs[t, env],
                self.action[t, env],
                self.reward[t, env],
                self.next_obs[t, env],
                self.terminated[t, env],
                torch.full((batch_size,), self.gamma, device=dev),
            )
        reward, last, k = self.n_step_returns(t, env)
        return Batch(
            self.obs[t, env],
            self.action[t, env],
            reward,
            self.next_obs[last, env],
            self.terminated[last, env],
            self.gamma ** (k + 1).to(reward.dtype),
        )

    def n_step_returns(self, t: torch.Tensor, env: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For rows ``(t, env)`` (slot and env indices ``[B]``): the n-step return, the slot of
        the window's last step and ``k`` = the window's length - 1 (see the module doc)."""
        n, dev = self.n_step, self.device
        j = torch.arange(n, device=dev)
        slots = (t[:, None] + j) % self.slots  # [B, n]
        e = env[:, None]
        newest = (self.pos - 1) % self.slots
        stop = self.done[slots, e] | (slots == newest)
        stop[:, -1] = True
        k = stop.to(torch.uint8).argmax(1)  # the first stop (argmax returns the first maximum)
        inside = j[None, :] <= k[:, None]
        weights = self.gamma ** j.to(self.reward.dtype)
        reward = torch.where(inside, self.reward[slots, e] * weights, 0.0).sum(1)
        return reward, slots.gather(1, k[:, None]).squeeze(1), k

    # --- state ---------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The stored rows (the filled slots only) and the ring's position, as tensors + JSON meta.

        With the generator and the agent, what makes a resumed pod continue bit-exactly on CPU.
        Slots beyond ``filled`` are never read before they are written, so they are not saved.
        """
        f = self.filled
        t = {name: getattr(self, name)[:f] for name in self.FIELDS}
        meta = {
            "pos": self.pos,
            "filled": self.filled,
            "slots": self.slots,
            "num_envs": self.num_envs,
            "obs_dim": self.obs_dim,
            "act_dim": self.act_dim,
            "n_step": self.n_step,
            "gamma": self.gamma,
        }
        return t, meta

    def load(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        """Restore :meth:`state` output (keys without a prefix); refuses another layout (slots,
        envs, dims) with a ValueError. ``n_step``/``gamma`` stay this buffer's own."""
        want = {"slots": self.slots, "num_envs": self.num_envs, "obs_dim": self.obs_dim, "act_dim": self.act_dim}
        got = {k: int(meta.get(k, -1)) for k in want}
        if got != want:
            raise ValueError(
                f"replay buffer layout {got} does not fit this one {want} (were num_envs or buffer_size changed?)"
            )
        f, pos = int(meta["filled"]), int(meta["pos"])
        if not (0 <= f <= self.slots and 0 <= pos < self.slots and (f == self.slots or pos == f)):
            raise ValueError(f"replay buffer meta: filled {f}, pos {pos} inconsistent with {self.slots} slots")
        for name in self.FIELDS:
            src = tensors[name]
            dst = getattr(self, name)
            if tuple(src.shape) != (f, *dst.shape[1:]):
                raise ValueError(f"replay tensor {name!r} has shape {tuple(src.shape)}, expected {(f, *dst.shape[1:])}")
            dst.zero_()
            dst[:f] = src.to(self.device, dst.dtype)
        self.pos, self.filled = pos, f
