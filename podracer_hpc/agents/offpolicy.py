"""What SAC and TD3 share: twin critics, targets, polyak averaging and the agent contract.

Reads top to bottom: networks (settings: :mod:`.settings`) -> the math (clipped double-Q
target, polyak update, update schedule) -> :class:`OffPolicyAgent`, the part of the agent
contract that does not depend on the algorithm (hyperparameters, normalizer, lazy optimizers,
``state()``/``load()``). :mod:`.sac` and :mod:`.td3` add their actor, ``act`` and ``update``.

Nothing here loops over environments or reads a value back to the host: metrics come back as
tensors. The update is cheap on a CPU, where small networks cost per op, not per flop: the twin
critics are one batched ensemble (:class:`TwinQ`), the critic's and actor's backward passes are
written out (:meth:`TwinQ.backward`, :func:`.mlp_math.mlp_backward`: autograd's kernels without a graph),
Adam is one fused kernel per optimizer (:class:`.optimizer.FusedAdam`) and the targets follow in
one ``_foreach_lerp_`` (bench/offpolicy_update.py measures it against the autograd version). The replay buffer
(:mod:`.replay`) stores raw observations; the agent normalizes the
sampled batch with its current statistics at update time, so changing statistics never leave
stale normalized data in the buffer.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn as nn

from podracer_hpc.agents.compiled import Compiled, compiled
from podracer_hpc.agents.mlp_math import ACTIVATION_FNS, ACTIVATION_GRADS, mlp
from podracer_hpc.agents.optimizer import FusedAdam
from podracer_hpc.agents.ppo import RunningMeanStd
from podracer_hpc.agents.settings import OffPolicyConfig


# ----------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------
class TwinQ(nn.Module):
    """Two independent critics ``Q1(s, a), Q2(s, a)`` (the clipped double-Q pair) as one batched
    ensemble: layer ``l`` of both is one ``torch.baddbmm`` on stacked weights ``w{l}``
    ``[2, in, out]`` (``nn.Linear``'s transposed) and biases ``b{l}`` ``[2, 1, out]`` (one forward and one backward
    for the pair,
    not two: on a CPU the small networks' cost is the per-op overhead). Initialized as two
    ``nn.Linear`` MLPs would be (PyTorch's default, the same draws), so member ``k`` is exactly the
    MLP whose layer ``l`` has weight ``w{l}[k].T`` and bias ``b{l}[k, 0]``; the state keys are
    ``w0, b0, w1, ...`` (checkpoints of the two-module layout, ``q1.*``/``q2.*``, are converted on
    load: :func:`upgrade_twin_q_state`)."""

    MEMBERS = 2

    def __init__(self, obs_dim: int, act_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        sizes = [obs_dim + act_dim, *hidden_sizes, 1]
        pair = [[m for m in mlp(sizes, activation) if isinstance(m, nn.Linear)] for _ in range(self.MEMBERS)]
        self.num_layers = len(sizes) - 1
        self.activation = ACTIVATION_FNS[activation]
        self.activation_grad = ACTIVATION_GRADS[activation]
        for i in range(self.num_layers):
            w = torch.stack([layers[i].weight.detach().t() for layers in pair]).contiguous()
            b = torch.stack([layers[i].bias.detach() for layers in pair]).unsqueeze(1)
            self.register_parameter(f"w{i}", nn.Parameter(w))
            self.register_parameter(f"b{i}", nn.Parameter(b))

    def forward(self, obs: torch.Tensor, action: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``[2, B]``: row ``k`` is ``Q_k(obs, action)`` (unpacks as ``q1, q2 = critic(obs, action)``).
        ``detach``: with the weights detached (gradients reach the inputs only: the actor loss)."""
        x = torch.cat([obs, action], -1)
        ps = [p.detach() for p in self._parameters.values()] if detach else list(self._parameters.values())
        h = x.expand(self.MEMBERS, *x.shape)
        last = self.num_layers - 1
        for i in range(last):
            h = self.activation(torch.baddbmm(ps[2 * i + 1], h, ps[2 * i]))
        return self._head(ps[2 * last + 1], h, ps[2 * last])

    @staticmethod
    def _head(b: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The output layer ``[K, B]``: ``baddbmm(b, h, w)`` (``w`` ``[K, in, 1]``) as the row vector
        ``w^T`` times ``h^T``: the same sums in about half the time on a CPU (MKL's batched product
        with one output column is slow here; bench/RESULTS.md)."""
        return torch.baddbmm(b, w.transpose(1, 2), h.transpose(1, 2)).squeeze(1)

    def _members(self, first_only: bool) -> list[torch.Tensor]:
        """The stacked parameters, or views of member 0's alone (``[1, ...]``)."""
        ps = list(self._parameters.values())
        return [p[:1] for p in ps] if first_only else ps

    def saved_forward(
        self, x: torch.Tensor, first_only: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """``forward`` of the inputs ``x = cat(obs, action)`` ``[B, in]``, keeping what
        :meth:`backward` needs (call it under ``torch.no_grad()``, as the agents' update does): (``q`` ``[2, B]``,
        each layer's input, each pre-activation).
        ``first_only``: ``Q1`` alone (``q`` ``[1, B]``; TD3's actor ascends ``Q1``: half the arithmetic)."""
        ps = self._members(first_only)
        inputs, pre, h = [], [], x.expand(ps[0].shape[0], *x.shape)
        last = self.num_layers - 1
        for i in range(last):
            inputs.append(h)
            z = torch.baddbmm(ps[2 * i + 1], h, ps[2 * i])
            pre.append(z)
            h = self.activation(z)
        inputs.append(h)
        q = self._head(ps[2 * last + 1], h, ps[2 * last])
        pre.append(q)
        return q, inputs, pre

    def backward(
        self,
        g: torch.Tensor,
        inputs: list[torch.Tensor],
        pre: list[torch.Tensor],
        params: bool = True,
        to_input: bool = False,
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The backward pass of :meth:`saved_forward` written out (the chain rule through the
        layers with autograd's own kernels: the numbers ``torch.autograd.grad`` gives, without
        building and walking a graph; on a CPU the small networks' cost is per op). ``g``: the
        gradient at ``q`` ``[2, B]``. Returns (the parameters' gradients in their order if
        ``params``, else ``[]``; the gradient at the members' inputs ``[2, B, in]`` if ``to_input``).
        After a ``first_only`` :meth:`saved_forward` (its record holds one member): ``g`` ``[1, B]``."""
        ps = self._members(first_only=inputs[0].shape[0] < self.MEMBERS)
        last = self.num_layers - 1
        grads: list[torch.Tensor] = [g] * (2 * self.num_layers) if params else []
        # the output layer (one unit): its products as a row vector's and an outer product's,
        # the fast forms on a CPU (see _head); [K, 1, in] has [K, in, 1]'s memory layout
        if params:
            gr = g.unsqueeze(1)
            grads[2 * last] = torch.bmm(gr, inputs[last]).transpose(1, 2)
            grads[2 * last + 1] = gr.sum(-1, keepdim=True)
        g = g.unsqueeze(-1) * ps[2 * last].transpose(1, 2) if last or to_input else g
        for i in range(last - 1, -1, -1):
            g = self.activation_grad(g, pre[i], inputs[i + 1])  # g: the gradient at inputs[i + 1]
            if params:
                grads[2 * i] = torch.bmm(inputs[i].transpose(1, 2), g)
                grads[2 * i + 1] = g.sum(1, keepdim=True)
            if i or to_input:
                g = torch.bmm(g, ps[2 * i].transpose(1, 2))
        return grads, (g if to_input else None)

    @torch.no_grad()
    def loss_and_grads(
        self, obs: torch.Tensor, action: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(:func:`critic_loss` of ``target``, ``sum_k mean (Q_k - y)^2``; mean Q; the loss's gradients by parameter),
        the backward pass written out (:meth:`backward`)."""
        q, inputs, pre = self.saved_forward(torch.cat([obs, action], -1))
        d = q - target
        grads, _ = self.backward(d * (2.0 / q.shape[1]), inputs, pre)
        return d.square().mean(-1).sum(), q.mean(), tuple(grads)

    def member(self, k: int, obs: torch.Tensor, action: torch.Tensor, detach: bool = False) -> torch.Tensor:
        """``[B]``: ``Q_k(obs, action)`` alone (TD3's actor ascends ``Q1`` only); ``detach`` as in forward."""
        h = torch.cat([obs, action], -1)
        ps = list(self._parameters.values())
        last = self.num_layers - 1
        for i in range(self.num_layers):
            w, b = ps[2 * i][k], ps[2 * i + 1][k, 0]
            if detach:
                w, b = w.detach(), b.detach()
            h = torch.addmm(b, h, w)
            if i < last:
                h = self.activation(h)
        return h.squeeze(-1)


def upgrade_twin_q_state(
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    modules: tuple[str, ...] = ("net.critic.", "net.critic_target."),
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A state of the two-module twin critics (``q1.{2l}.weight``, ..., written before the
    batched :class:`TwinQ`) in the stacked layout, its ``critic`` optimizer's moments and
    parameter ids included (Adam's are elementwise: stacking them is exact); any other state as
    it is. Returns new dicts (the arguments are not changed)."""
    if not any(k.startswith(modules[0] + "q1.") for k in tensors):
        return tensors, meta
    out = {k: v for k, v in tensors.items() if not any(k.startswith(m + "q") for m in modules)}
    layers = sorted({int(k[len(modules[0]) + 3 :].split(".")[0]) for k in tensors if k.startswith(modules[0] + "q1.")})
    for m in modules:
        for i, idx in enumerate(layers):
            pair = [(tensors[f"{m}q{j}.{idx}.weight"], tensors[f"{m}q{j}.{idx}.bias"]) for j in (1, 2)]
            out[f"{m}w{i}"] = torch.stack([w.t() for w, _ in pair]).contiguous()
            out[f"{m}b{i}"] = torch.stack([b for _, b in pair]).unsqueeze(1)
    n = 2 * len(layers)  # parameters per critic: old ids 0..n-1 (q1) and n..2n-1 (q2), new ids 0..n-1
    prefix = "optim.critic."
    old = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    for k in old:
        del out[prefix + k]
    for pid in range(n):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            a, b = old.get(f"{pid}.{key}"), old.get(f"{pid + n}.{key}")
            if a is None or b is None:
                continue
            out[f"{prefix}{pid}.{key}"] = (
                a.clone()
                if key == "step"
                else (torch.stack([a, b]).unsqueeze(1) if pid % 2 else torch.stack([a.t(), b.t()]).contiguous())
            )
    meta = dict(meta)
    groups = dict(meta.get("optim_param_groups") or {})
    if "critic" in groups:
        groups["critic"] = [{**g, "params": list(range(n))} for g in groups["critic"]]
        meta["optim_param_groups"] = groups
    return out, meta


def frozen_copy(module: nn.Module) -> nn.Module:
    """A target network: a deep copy that takes no gradients."""
    target = copy.deepcopy(module)
    target.requires_grad_(False)
    return target


# ----------------------------------------------------------------------------------------
# The math
# ----------------------------------------------------------------------------------------
def clipped_double_q_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    discount: torch.Tensor | float,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_logp: torch.Tensor | None = None,
    alpha: torch.Tensor | float = 0.0,
) -> torch.Tensor:
    """``y = r + discount * (1 - terminated) * (min(Q1', Q2') - alpha * logp')``.

    ``reward`` is the (n-step) return of the sampled transitions, ``discount`` ``gamma^k`` for a
    window of ``k`` steps, ``terminated`` whether the window ended in a true end (no bootstrap;
    a time-limit cut is not one: its ``next_q`` are the values of the final observation).
    ``next_logp``/``alpha``: SAC's entropy term (TD3 passes none).
    """
    next_v = torch.min(next_q1, next_q2)
    if next_logp is not None:
        next_v = next_v - alpha * next_logp
    return reward + discount * (1.0 - terminated.to(reward.dtype)) * next_v


def critic_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``mean (Q1 - y)^2 + mean (Q2 - y)^2`` (the target carries no gradient)."""
    return (q1 - target).square().mean() + (q2 - target).square().mean()


def ensemble_target(
    reward: torch.Tensor,
    bootstrap: torch.Tensor,
    next_q: torch.Tensor,
    next_logp: torch.Tensor | None = None,
    alpha: torch.Tensor | float = 0.0,
) -> torch.Tensor:
    """:func:`clipped_double_q_target` of the ensemble's ``next_q`` ``[2, B]``, with
    ``bootstrap = discount * (1 - terminated)`` computed beforehand (once for all the updates of a call)."""
    next_v = next_q.amin(0)
    if next_logp is not None:
        next_v = next_v - alpha * next_logp
    return reward + bootstrap * next_v


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) * target + tau * online``, parameter for parameter (one foreach op)."""
    tp, op = list(target.parameters()), list(online.parameters())
    torch._foreach_lerp_(tp, op, tau)


def updates_due(batch_step: int, updates_per_step: float) -> int:
    """Gradient updates owed after the ``batch_step``-th (1-based) env step of the whole batch,
    counted from the first step that may update: ``floor(k r) - floor((k - 1) r)``, so that
    ``r = 0.25`` updates once every 4th step, ``r = 2.5`` alternates 2 and 3, and the total after
    ``k`` steps is always ``floor(k r)``. Stateless: a resumed pod needs only its step count."""
    if batch_step < 1:
        return 0
    eps = 1e-9  # 0.29 * 100 is 28.999999999999996 in floating point
    return math.floor(batch_step * updates_per_step + eps) - math.floor((batch_step - 1) * updates_per_step + eps)


# ----------------------------------------------------------------------------------------
# The agent contract, without the algorithm
# ----------------------------------------------------------------------------------------
class OffPolicyAgent(nn.Module):
    """Networks (``self.net``: online and target), optimizers, normalizer and hyperparameters.

    Subclasses set :attr:`MUTABLE`, build ``self.net`` and implement ``_build_optimizers``,
    ``act``, ``act_deterministic`` and ``update``. As :class:`~.ppo.PPOAgent`: :meth:`state`
    returns tensors under :attr:`STATE_PREFIXES` and JSON meta, :meth:`load` takes them back with
    or without the source's hyperparameters and optimizers, the optimizers are built on first
    use (the first torch optimizer of a process imports torch._dynamo, 1-2 s: an agent that
    only acts never pays it). The replay buffer is not the agent's (a leaderboard entry would
    carry gigabytes): the pod keeps it and saves it next to the agent (:meth:`.ReplayBuffer.state`).
    """

    STATE_PREFIXES = ("net.", "obs_rms.", "optim.")
    MUTABLE: tuple[str, ...] = ()
    CPU_EAGER = ("policy step", "actor loss")  # hot paths that agent.compile leaves eager on a CPU (see hot)

    def __init__(self, obs_dim: int, act_dim: int, cfg: OffPolicyConfig, device: str | torch.device = "cpu"):
        super().__init__()
        cfg.validate()
        self.cfg = cfg  # static settings; never changed while training
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.device = torch.device(device)
        self.obs_rms = RunningMeanStd((obs_dim,), device=device)
        self._optimizers: dict[str, torch.optim.Optimizer] | None = None  # built on first use
        self._steppers: dict[str, FusedAdam] = {}  # their lean steps (FusedAdam), built with them
        self._polyak: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None  # (targets, online), flat
        self.num_updates = 0  # gradient updates so far (TD3's actor delay counts them); in the meta
        self.mutable: tuple[str, ...] = self.MUTABLE
        self.hparams: dict[str, float] = {}
        self._hot: dict[str, Any] | None = None  # the hot paths, compiled or not (agent.compile), on first use

    # --- the hot paths -------------------------------------------------------------------
    def _hot_functions(self) -> dict[str, Any]:
        """``{name: pure tensor function}`` of the rollout and the update (the subclass's)."""
        raise NotImplementedError

    def hot(self) -> dict[str, Any]:
        """The hot paths (:meth:`_hot_functions`) through torch.compile when ``cfg.compile`` asks
        and it can work here (agents/compiled.py), else eager; ``"on"``: whether compiled. Built on
        first use (importing torch._dynamo costs seconds: an agent that only acts skips it)."""
        if self._hot is None:
            algo = type(self).__name__.removesuffix("Agent")
            mode = self.cfg.compile
            # measured on a CPU (bench/compile.py, bench/RESULTS.md): the compiled actor loss and
            # policy step ran slower than eager ones (their graphs are small: the call's overhead
            # outweighs the fused ops), the critic loss faster; on a GPU all three compile
            eager_here = self.CPU_EAGER if self.device.type == "cpu" else ()
            hot: dict[str, Any] = {
                name: fn if name in eager_here else compiled(fn, mode, self.device, f"the {algo} {name}")
                for name, fn in self._hot_functions().items()
            }
            hot["on"] = any(isinstance(f, Compiled) for f in hot.values())
            self._hot = hot
        return self._hot

    def _scalar(self, value: float) -> torch.Tensor | float:
        """A hyperparameter as the hot paths take it: a tensor when compiled (PBT changes it: a
        float would recompile), else the float itself."""
        return torch.tensor(value, device=self.device) if self.hot()["on"] else value

    def _randn(self, rows: int, gen: torch.Generator) -> torch.Tensor:
        """Standard normal noise ``[rows, act_dim]`` from ``gen`` (drawn outside the hot paths)."""
        return torch.randn((rows, self.act_dim), generator=gen, device=self.device)

    def _draw_batches(self, buffer: Any, n: int, gen: torch.Generator) -> list[tuple[torch.Tensor, ...]]:
        """One replay draw for ``n`` updates, split per update: (obs, action, reward, bootstrap
        weight, next obs), each a tuple of ``n`` batches; observations normalized."""
        B = self.cfg.batch_size
        b = buffer.sample(n * B, gen)
        with torch.no_grad():
            obs, next_obs = self._norm(b.obs), self._norm(b.next_obs)
            boot = b.discount * ~b.terminated  # discount * (1 - terminated): the targets' bootstrap weight
        return [x.view(n, B, *x.shape[1:]).unbind(0) for x in (obs, b.action, b.reward, boot, next_obs)]

    def _init_hparams(self) -> None:
        self.hparams = {k: float(getattr(self.cfg, k)) for k in self.mutable}

    # --- optimizers ----------------------------------------------------------------------
    def _build_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        raise NotImplementedError

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """``{name: Adam}``, built on first use (see the class doc)."""
        if self._optimizers is None:
            self._optimizers = self._build_optimizers()
            self._steppers = {name: FusedAdam(opt) for name, opt in self._optimizers.items()}
        return self._optimizers

    def _adam(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr, fused=True)

    def _polyak_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        """``[(target, online), ...]``: the networks :meth:`_polyak_step` averages (the subclass's)."""
        raise NotImplementedError

    @torch.no_grad()
    def _polyak_step(self, tau: float) -> None:
        """:func:`polyak_update` of every pair of :meth:`_polyak_pairs` in one ``_foreach_lerp_``."""
        if self._polyak is None:
            pairs = self._polyak_pairs()
            self._polyak = (
                [p for t, _ in pairs for p in t.parameters()],
                [p for _, o in pairs for p in o.parameters()],
            )
        torch._foreach_lerp_(self._polyak[0], self._polyak[1], tau)

    def _set_lr(self, name: str, lr: float) -> None:
        for group in self.optimizers[name].param_groups:
            group["lr"] = lr

    # --- hyperparameters -----------------------------------------------------------------
    def set_hparams(self, values: dict[str, float]) -> None:
        """Change mutable hyperparameters (PBT); unknown names are refused."""
        for k, v in values.items():
            if k not in self.mutable:
                raise KeyError(f"{k!r} is not a mutable hyperparameter of this agent ({', '.join(self.mutable)})")
            self.hparams[k] = float(v)

    def updates_due(self, batch_step: int) -> int:
        """Gradient updates owed after the ``batch_step``-th env step since learning started."""
        return updates_due(batch_step, self.cfg.updates_per_step)

    # --- state ---------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The agent as tensors (keys under :attr:`STATE_PREFIXES`) and JSON meta."""
        t: dict[str, torch.Tensor] = {}
        for prefix, module in (("net.", self.net), ("obs_rms.", self.obs_rms)):
            for k, v in module.state_dict().items():
                t[prefix + k] = v
        groups: dict[str, Any] = {}
        for name, opt in self.optimizers.items():
            sd = opt.state_dict()
            for pid, st in sd["state"].items():
                for k, v in st.items():
                    # a step is a view of its optimizer's one step tensor (FusedAdam): saved apart
                    t[f"optim.{name}.{pid}.{k}"] = (
                        (v.clone() if k == "step" else v) if torch.is_tensor(v) else torch.tensor(v)
                    )
            groups[name] = sd["param_groups"]
        return t, {"hparams": dict(self.hparams), "optim_param_groups": groups, "agent_updates": self.num_updates}

    @classmethod
    def is_state_key(cls, key: str) -> bool:
        return key.startswith(cls.STATE_PREFIXES)

    def load(
        self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], hparams: bool = True, optimizer: bool = True
    ) -> None:
        """Take over an agent's networks (online and target), statistics and, if ``optimizer``,
        its optimizers and update count (an agent that will only act skips them); its
        hyperparameters only if ``hparams``. Raises KeyError/RuntimeError/ValueError on a state
        that does not fit; an agent that never updated has no optimizer tensors (fine). A state
        of the two-module twin critics (written before :class:`TwinQ` was one ensemble) is
        converted first (:func:`upgrade_twin_q_state`)."""
        dev = self.device
        tensors, meta = upgrade_twin_q_state(tensors, meta)

        def sub(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v.to(dev) for k, v in tensors.items() if k.startswith(prefix)}

        self.net.load_state_dict(sub("net."))
        self.obs_rms.load_state_dict(sub("obs_rms."))
        if optimizer:
            states: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
            for k, v in sub("optim.").items():
                name, pid, key = k.split(".", 2)
                states.setdefault(name, {}).setdefault(int(pid), {})[key] = v
            groups = meta.get("optim_param_groups") or {}
            for name, opt in self.optimizers.items():
                opt.load_state_dict(
                    {
                        "state": states.get(name, {}),
                        "param_groups": groups.get(name) or opt.state_dict()["param_groups"],
                    }
                )
                self._steppers[name].reset()
            self.num_updates = int(meta.get("agent_updates", 0))
        if hparams:
            src = meta.get("hparams") or {}
            self.set_hparams({k: v for k, v in src.items() if k in self.mutable})

    # --- acting --------------------------------------------------------------------------
    @torch.no_grad()
    def normalize_obs(self, obs: torch.Tensor, update: bool) -> torch.Tensor:
        """Normalized observations (identity unless ``cfg.norm_obs``); ``update`` folds them into
        the statistics first (acting in the training envs; never at evaluation)."""
        if not self.cfg.norm_obs:
            return obs
        if update:
            self.obs_rms.update(obs)
        return self.obs_rms.normalize(obs, self.cfg.clip_obs)

    def _norm(self, obs: torch.Tensor) -> torch.Tensor:
        """Normalize a sampled batch with the current statistics (no update)."""
        return self.obs_rms.normalize(obs, self.cfg.clip_obs) if self.cfg.norm_obs else obs

    @torch.no_grad()
    def scale_reward(self, reward: torch.Tensor, done: torch.Tensor, ret: torch.Tensor) -> torch.Tensor:
        """Rewards to store: times the constant ``cfg.reward_scale`` (``done``/``ret``, PPO's
        running-return scaling, are unused: a changing scale would leave stale rewards in the buffer)."""
        return reward * self.cfg.reward_scale if self.cfg.reward_scale != 1.0 else reward

    @torch.no_grad()
    def random_action(self, num: int, gen: torch.Generator) -> torch.Tensor:
        """Uniform actions in [-1, 1], ``[num, act_dim]`` (before ``learning_starts``)."""
        u = torch.rand((num, self.act_dim), generator=gen, device=self.device)
        return 2.0 * u - 1.0
