"""PPO for continuous (Gaussian) and discrete (categorical) actions, on one device.

Reads top to bottom: normalizers -> networks -> GAE -> loss -> the agent (act, update, state).
Rollout tensors have fixed shapes ``(steps, envs, ...)``. Nothing here loops over
environments, and nothing reads a value back to the host except the logged metrics, which are
returned as tensors and synchronized by the caller when it logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from podracer_hpc.agents.compiled import Compiled, compiled
from podracer_hpc.agents.mlp_math import ACTIVATIONS, mlp
from podracer_hpc.agents.optimizer import FusedAdam, clip_grads
from podracer_hpc.agents.ppo_grads import LOG_2PI, gaussian_mlp_grads
from podracer_hpc.agents.settings import MUTABLE_HPARAMS, PPOConfig


# ----------------------------------------------------------------------------------------
# Normalizers: running statistics that are part of the pod state
# ----------------------------------------------------------------------------------------
class RunningMeanStd(nn.Module):
    """Running mean and variance over a stream of batches (Chan et al.'s parallel update), float64."""

    def __init__(
        self,
        shape: tuple[int, ...] = (),
        device: str | torch.device = "cpu",
        epsilon: float = 1e-4,
        tied: torch.Tensor | None = None,
    ):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64, device=device))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64, device=device))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64, device=device))
        # columns [A, F] whose statistics are shared: feature f of every asset a (not state: the layout's)
        self.tied = None if tied is None else tied.to(device)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``[B, *shape]`` into the statistics (tied columns as one pooled column)."""
        x = x.to(torch.float64)
        b_mean = x.mean(0)
        b_var = x.var(0, unbiased=False)
        b_count = x.shape[0]
        if self.tied is not None:  # pooled over the assets (equal counts): mean of means, law of total variance
            m, v = b_mean[self.tied], b_var[self.tied]
            pm = m.mean(0, keepdim=True)
            b_mean[self.tied] = pm.expand_as(m)
            b_var[self.tied] = (v + (m - pm).square()).mean(0, keepdim=True).expand_as(m)
        delta = b_mean - self.mean
        tot = self.count + b_count
        self.mean += delta * b_count / tot
        m2 = self.var * self.count + b_var * b_count + delta.square() * self.count * b_count / tot
        self.var.copy_(m2 / tot)
        self.count.copy_(tot)

    def normalize(self, x: torch.Tensor, clip: float = 10.0) -> torch.Tensor:
        y = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + 1e-8)
        return y.clamp(-clip, clip)


@torch.no_grad()
def scale_by_return_std(
    reward: torch.Tensor, done: torch.Tensor, ret: torch.Tensor, rms: RunningMeanStd, gamma: float
) -> torch.Tensor:
    """Divide rewards by the running std of each env's discounted return (as SB3's VecNormalize).

    ``ret`` (float64, one per env) is the environments' running discounted return, updated in
    place; ``rms`` the statistics of all returns seen (agent state).
    """
    ret.mul_(gamma).add_(reward.to(torch.float64))
    rms.update(ret)
    ret.masked_fill_(done, 0.0)
    return reward / torch.sqrt(rms.var.to(reward.dtype) + 1e-8)


class RewardScaler(nn.Module):
    """The return statistics and the per-env returns together (for a stand-alone use of the math;
    a pod keeps the returns itself and the agent the statistics)."""

    def __init__(self, num_envs: int, gamma: float, device: str | torch.device = "cpu"):
        super().__init__()
        self.gamma = gamma
        self.rms = RunningMeanStd((), device=device)
        self.register_buffer("ret", torch.zeros(num_envs, dtype=torch.float64, device=device))

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        return scale_by_return_std(reward, done, self.ret, self.rms, self.gamma)


# ----------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs; Gaussian (state-independent log std) or categorical head."""

    def __init__(self, obs_dim: int, act_dim: int, discrete: bool, num_actions: int, cfg: PPOConfig):
        super().__init__()
        self.discrete = discrete
        hs = list(cfg.hidden_sizes)
        out = num_actions if discrete else act_dim
        self.actor = mlp([obs_dim, *hs, out], cfg.activation, 0.01)
        self.critic = mlp([obs_dim, *hs, 1], cfg.activation, 1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(cfg.init_log_std)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor(obs)

    def log_prob_entropy(self, params: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of ``action`` and the entropy, under the distribution ``params``."""
        if self.discrete:
            logp_all = torch.log_softmax(params, -1)
            logp = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            ent = -(logp_all.exp() * logp_all).sum(-1)
            return logp, ent
        log_std = self.log_std.expand_as(params)
        z = (action - params) * torch.exp(-log_std)
        logp = (-0.5 * z.square() - log_std - 0.5 * LOG_2PI).sum(-1)
        ent = (log_std + 0.5 + 0.5 * LOG_2PI).sum(-1)
        return logp, ent

    def sample(self, params: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        if self.discrete:
            return torch.multinomial(torch.softmax(params, -1), 1, generator=gen).squeeze(-1)
        noise = torch.randn(params.shape, generator=gen, device=params.device, dtype=params.dtype)
        return self.shift(params, noise)

    def shift(self, params: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """A Gaussian action from standard normal ``noise`` (continuous actions)."""
        return params + self.log_std.exp() * noise

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        """The deterministic action (mean or argmax)."""
        return params.argmax(-1) if self.discrete else params


class PerAssetActorCritic(ActorCritic):
    """Actor and critic that share their weights across assets (``agent.network: per_asset``).

    The observation holds, for each of ``A`` assets, the same ``F`` features (``asset_columns``
    ``[A, F]``: the column of feature f of asset a) plus ``G`` columns about the whole account or
    market (``global_columns``). Each network encodes every asset with one MLP over its own
    features and the global ones, pools the codes by their mean (the market context), and then:
    the actor maps each asset's code and the context to that asset's action mean, the critic maps
    the context to the value. Permuting the assets permutes the actions and leaves the value
    unchanged (permutation equivariance), and the same weights serve any number of assets: a rule
    learnt on one stock serves them all. The log std is one number shared by every asset.
    """

    def __init__(self, act_dim: int, cfg: PPOConfig, asset_columns: torch.Tensor, global_columns: torch.Tensor):
        nn.Module.__init__(self)
        self.discrete = False
        A, F = asset_columns.shape
        if act_dim != A:
            raise ValueError(f"agent.network=per_asset needs one action per asset: {act_dim} actions, {A} assets")
        G = int(global_columns.numel())
        hs = list(cfg.hidden_sizes)
        h = hs[-1]
        self.register_buffer("asset_columns", asset_columns.long().clone())
        self.register_buffer("global_columns", global_columns.long().clone())
        act = ACTIVATIONS[cfg.activation]
        self.actor_enc = nn.Sequential(mlp([F + G, *hs], cfg.activation, math.sqrt(2)), act())
        self.actor_head = mlp([2 * h, h, 1], cfg.activation, 0.01)
        self.critic_enc = nn.Sequential(mlp([F + G, *hs], cfg.activation, math.sqrt(2)), act())
        self.critic_head = mlp([h + G, h, 1], cfg.activation, 1.0)
        self.log_std = nn.Parameter(torch.full((1,), float(cfg.init_log_std)))

    def _encode(self, enc: nn.Module, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-asset codes ``[N, A, h]``, global columns ``[N, G]``)."""
        g = obs[..., self.global_columns]
        x = obs[..., self.asset_columns]  # [N, A, F]
        gx = g.unsqueeze(-2).expand(*x.shape[:-1], g.shape[-1])
        return enc(torch.cat([x, gx], -1)), g

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        e, g = self._encode(self.critic_enc, obs)
        return self.critic_head(torch.cat([e.mean(-2), g], -1)).squeeze(-1)

    def dist_params(self, obs: torch.Tensor) -> torch.Tensor:
        e, _ = self._encode(self.actor_enc, obs)
        ctx = e.mean(-2, keepdim=True).expand_as(e)
        return self.actor_head(torch.cat([e, ctx], -1)).squeeze(-1)


# ----------------------------------------------------------------------------------------
# Generalized advantage estimation with truncation bootstrapping
# ----------------------------------------------------------------------------------------
def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over a rollout of shape ``(T, N)``; returns (advantages, returns).

    ``next_values[t]`` is the value of the state reached by step ``t``: for an episode cut by
    the time limit it is the value of the final observation (bootstrapped); ``terminated[t]``
    zeroes it for a true end; ``dones[t]`` (terminated or truncated) stops the recursion from
    leaking into the next episode.
    """
    T = rewards.shape[0]
    not_term = 1.0 - terminated.to(rewards.dtype)
    not_done = 1.0 - dones.to(rewards.dtype)
    deltas = rewards + gamma * not_term * next_values - values
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(T)):
        last = deltas[t] + gamma * lam * not_done[t] * last
        adv[t] = last
    return adv, adv + values


# ----------------------------------------------------------------------------------------
# The clipped PPO loss
# ----------------------------------------------------------------------------------------
@dataclass
class LossOut:
    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor


def ppo_loss(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    clip_coef: torch.Tensor | float,
    vf_coef: torch.Tensor | float,
    ent_coef: torch.Tensor | float,
    clip_vloss: bool = False,
    norm_adv: bool = True,
) -> LossOut:
    """Clipped surrogate + (optionally clipped) value loss - entropy bonus, on one minibatch."""
    if norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    logratio = new_logp - old_logp
    ratio = logratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)
    policy_loss = torch.max(pg1, pg2).mean()
    if clip_vloss:
        v_clipped = old_values + (new_values - old_values).clamp(-clip_coef, clip_coef)
        value_loss = 0.5 * torch.max((new_values - returns).square(), (v_clipped - returns).square()).mean()
    else:
        value_loss = 0.5 * (new_values - returns).square().mean()
    ent = entropy.mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    loss = policy_loss - ent_coef * ent + vf_coef * value_loss
    return LossOut(loss, policy_loss, value_loss, ent, approx_kl, clipfrac)


# ----------------------------------------------------------------------------------------
# The agent
# ----------------------------------------------------------------------------------------
class PPOAgent(nn.Module):
    """Networks, optimizer, normalizer statistics and mutable hyperparameters of one agent.

    The agent owns its state: :meth:`state` returns it as tensors under the prefixes of
    :data:`STATE_PREFIXES` plus JSON meta, and :meth:`load` takes it back (from a checkpoint, a
    leaderboard entry or another pod), with or without the source's hyperparameters. The
    mutable hyperparameters (:data:`MUTABLE_HPARAMS`) live in :attr:`hparams` only; the
    learning rate of each update is derived from it (:meth:`learning_rate_at`). What belongs to
    the environments (the running returns of the reward scaler) is the pod's.
    """

    STATE_PREFIXES = ("net.", "obs_rms.", "reward_rms.", "optim.")
    CPU_EAGER = ("act", "value")  # hot paths that agent.compile leaves eager on a CPU (see hot)

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        num_actions: int,
        num_envs: int,
        cfg: PPOConfig,
        device: str | torch.device = "cpu",
        asset_layout: tuple[list[int], list[list[int]]] | None = None,
    ):
        """``asset_layout`` (global columns, per-asset columns ``[A][F]``) of the observation is
        needed by ``cfg.network == "per_asset"`` (an env's ``asset_layout()``)."""
        super().__init__()
        self.cfg = cfg  # static settings; never changed while training
        self.discrete = discrete
        self.act_dim = act_dim
        tied = None
        if cfg.network == "per_asset":
            if asset_layout is None or discrete:
                raise ValueError(
                    "agent.network=per_asset needs continuous actions, one per asset, and an env "
                    "whose observation has an asset layout (stock_trading); use agent.network=mlp"
                )
            glob = torch.as_tensor(asset_layout[0], dtype=torch.long).reshape(-1)
            tied = torch.as_tensor(asset_layout[1], dtype=torch.long)
            self.net = PerAssetActorCritic(act_dim, cfg, tied, glob).to(device)
        else:
            self.net = ActorCritic(obs_dim, act_dim, discrete, num_actions, cfg).to(device)
        self.obs_rms = RunningMeanStd((obs_dim,), device=device, tied=tied)
        self.reward_rms = RunningMeanStd((), device=device)
        self._optimizer: torch.optim.Optimizer | None = None  # built on first use (see optimizer)
        self._stepper: FusedAdam | None = None  # its lean step on gradients handed in, built with it
        self.hparams: dict[str, float] = {k: float(getattr(cfg, k)) for k in MUTABLE_HPARAMS}
        self._hot: dict[str, Any] | None = None  # the hot paths, compiled or not (agent.compile), on first use

    def hot(self) -> dict[str, Any]:
        """The rollout's and the update's pure tensor functions, through torch.compile when
        ``cfg.compile`` asks (agents/compiled.py) and it can work here, else the eager ones. Built
        on first use (importing torch._dynamo costs seconds: an agent that only acts skips it)."""
        if self._hot is None:
            mode, dev = self.cfg.compile, next(self.net.parameters()).device
            # measured on a CPU (bench/RESULTS.md): the compiled policy and value steps
            # ran 1.2-1.9x slower than eager ones at 16 to 4,096 rows (a compiled call's overhead
            # and inductor's loops against ATen's kernels), so a CPU pod compiles the loss only
            eager_here = self.CPU_EAGER if dev.type == "cpu" else ()
            # Gaussian MLPs: the gradients written out (ppo_grads); else the loss through autograd
            step = "grads" if self.written_out() else "loss"
            fns = {
                "act": (self._act_noise, "the PPO policy step"),
                "value": (self.net.value, "the PPO value step"),
                step: (
                    (self._minibatch_grads, "the PPO gradients")
                    if step == "grads"
                    else (self._minibatch_loss, "the PPO loss")
                ),
            }
            hot: dict[str, Any] = {
                k: fn if k in eager_here else compiled(fn, mode, dev, name) for k, (fn, name) in fns.items()
            }
            hot["on"] = isinstance(hot[step], Compiled)
            self._hot = hot
        return self._hot

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Adam over the networks, built on first use: an agent that only acts (a backtest, a
        policy read from a checkpoint) never builds one, because the first torch optimizer of a
        process imports torch._dynamo (2-3 s of start-up here). Fused: one kernel for all
        parameters instead of a dozen small ops per tensor."""
        if self._optimizer is None:
            self._optimizer = torch.optim.Adam(self.net.parameters(), lr=self.cfg.learning_rate, eps=1e-5, fused=True)
            self._stepper = FusedAdam(self._optimizer)
        return self._optimizer

    def written_out(self) -> bool:
        """Whether the update computes its gradients without autograd (:mod:`.ppo_grads`): Gaussian
        actions and the plain actor and critic MLPs (the per-asset networks and categorical
        actions go through autograd)."""
        return not self.discrete and type(self.net) is ActorCritic

    # --- hyperparameters -----------------------------------------------------------------
    def set_hparams(self, values: dict[str, float]) -> None:
        """Change mutable hyperparameters (PBT); unknown names are refused."""
        for k, v in values.items():
            if k not in MUTABLE_HPARAMS:
                raise KeyError(f"{k!r} is not a mutable hyperparameter ({', '.join(MUTABLE_HPARAMS)})")
            self.hparams[k] = float(v)

    def learning_rate_at(self, progress: float) -> float:
        """The step size of an update at ``progress`` (0..1) of the run: linear decay if annealed."""
        base = self.hparams["learning_rate"]
        return base * (1.0 - progress) if self.cfg.anneal_lr else base

    # --- state ---------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The agent as tensors (keys under :data:`STATE_PREFIXES`) and JSON meta."""
        t: dict[str, torch.Tensor] = {}
        for prefix, module in (("net.", self.net), ("obs_rms.", self.obs_rms), ("reward_rms.", self.reward_rms)):
            for k, v in module.state_dict().items():
                t[prefix + k] = v
        opt = self.optimizer.state_dict()
        for pid, st in opt["state"].items():
            for k, v in st.items():
                # a step is a view of the optimizer's one step tensor (FusedAdam): saved apart
                t[f"optim.{pid}.{k}"] = (v.clone() if k == "step" else v) if torch.is_tensor(v) else torch.tensor(v)
        return t, {"hparams": dict(self.hparams), "optim_param_groups": opt["param_groups"]}

    @classmethod
    def is_state_key(cls, key: str) -> bool:
        return key.startswith(cls.STATE_PREFIXES)

    def load(
        self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], hparams: bool = True, optimizer: bool = True
    ) -> None:
        """Take over an agent's networks, optimizer and statistics; its hyperparameters only if
        ``hparams`` (a pod's own stay otherwise); the optimizer's state only if ``optimizer`` (an
        agent that will only act skips it). Raises KeyError/RuntimeError/ValueError on a state
        that does not fit; an agent that never updated has no optimizer tensors (fine)."""
        tensors = upgrade_state_keys(tensors)
        dev = next(self.net.parameters()).device

        def sub(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v.to(dev) for k, v in tensors.items() if k.startswith(prefix)}

        self.net.load_state_dict(sub("net."))
        self.obs_rms.load_state_dict(sub("obs_rms."))
        rms = sub("reward_rms.")
        if rms:
            self.reward_rms.load_state_dict(rms)
        if optimizer:
            optim_state: dict[int, dict[str, torch.Tensor]] = {}
            for k, v in sub("optim.").items():
                pid, name = k.split(".", 1)
                optim_state.setdefault(int(pid), {})[name] = v.cpu() if name == "step" else v
            groups = meta.get("optim_param_groups") or self.optimizer.state_dict()["param_groups"]
            self.optimizer.load_state_dict({"state": optim_state, "param_groups": groups})
            assert self._stepper is not None
            self._stepper.reset()
        if hparams:
            src = dict(meta.get("hparams") or {})
            if "learning_rate" not in src and "learning_rate" in meta:  # files written before hparams existed
                src["learning_rate"] = meta["learning_rate"]
            self.set_hparams({k: v for k, v in src.items() if k in MUTABLE_HPARAMS})

    # --- acting --------------------------------------------------------------------------
    @torch.no_grad()
    def normalize_obs(self, obs: torch.Tensor, update: bool) -> torch.Tensor:
        if not self.cfg.norm_obs:
            return obs
        if update:
            self.obs_rms.update(obs)
        return self.obs_rms.normalize(obs, self.cfg.clip_obs)

    @torch.no_grad()
    def scale_reward(self, reward: torch.Tensor, done: torch.Tensor, ret: torch.Tensor) -> torch.Tensor:
        """Scaled rewards; ``ret`` is the caller's per-env running return (updated in place)."""
        if not self.cfg.norm_reward:
            return reward
        return scale_by_return_std(reward, done, ret, self.reward_rms, self.cfg.gamma)

    @torch.no_grad()
    def act(self, nobs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions for normalized observations; returns (action, log_prob)."""
        if self.discrete:
            params = self.net.dist_params(nobs)
            action = self.net.sample(params, gen)
            logp, _ = self.net.log_prob_entropy(params, action)
            return action, logp
        noise = torch.randn((nobs.shape[0], self.act_dim), generator=gen, device=nobs.device, dtype=nobs.dtype)
        return self.hot()["act"](nobs, noise)

    def _act_noise(self, nobs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log_prob) of continuous actions from standard normal ``noise`` (pure: compiled)."""
        params = self.net.dist_params(nobs)
        action = self.net.shift(params, noise)
        logp, _ = self.net.log_prob_entropy(params, action)
        return action, logp

    @torch.no_grad()
    def act_deterministic(self, nobs: torch.Tensor) -> torch.Tensor:
        return self.net.mode(self.net.dist_params(nobs))

    @torch.no_grad()
    def value(self, nobs: torch.Tensor) -> torch.Tensor:
        return self.hot()["value"](nobs)

    # --- learning ------------------------------------------------------------------------
    def update(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        logprobs: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        values: torch.Tensor,
        gen: torch.Generator,
        progress: float,
    ) -> dict[str, torch.Tensor]:
        """Minibatch epochs over a flattened rollout batch; returns metrics as 0-d tensors."""
        cfg, hp = self.cfg, self.hparams
        lr = self.learning_rate_at(progress)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        B = obs.shape[0]
        mb = B // cfg.num_minibatches
        stats = torch.zeros(6, device=obs.device)
        n = 0
        params_list = list(self.net.parameters())
        hot = self.hot()
        stepper = self._stepper
        # compiled: the coefficients as tensors (PBT changes them; a float would recompile)
        coefs = [hp[k] for k in ("clip_coef", "vf_coef", "ent_coef")]
        if hot["on"]:
            coefs = [torch.tensor(c, device=obs.device) for c in coefs]
        for _epoch in range(cfg.update_epochs):
            # One shuffle per epoch, then contiguous minibatch slices (fewer, larger gathers).
            perm = torch.randperm(B, generator=gen, device=obs.device)
            s_obs, s_act, s_logp = obs[perm], actions[perm], logprobs[perm]
            s_adv, s_ret, s_val = advantages[perm], returns[perm], values[perm]
            kl_sum = torch.zeros((), device=obs.device)
            for start in range(0, B, mb):
                sl = slice(start, start + mb)
                rows = (s_obs[sl], s_act[sl], s_logp[sl], s_adv[sl], s_val[sl], s_ret[sl], *coefs)
                if "grads" in hot:
                    grads, mb_stats = hot["grads"](*rows)
                else:  # categorical and per-asset networks: the loss through autograd
                    loss, mb_stats = hot["loss"](*rows)
                    grads = list(torch.autograd.grad(loss, params_list))
                # clip_grad_norm_ and Adam.step without torch's per-call bookkeeping
                # (agents/compiled.py: the same kernels, the same results bit for bit)
                clip_grads(grads, hp["max_grad_norm"])
                stepper.step(grads)
                stats += mb_stats
                kl_sum += mb_stats[4]
                n += 1
            if cfg.target_kl > 0 and float(kl_sum) / cfg.num_minibatches > cfg.target_kl:
                break
        stats /= n
        var_y = returns.var()
        explained_var = 1 - (returns - values).var() / var_y.clamp_min(1e-8)
        names = ["loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac"]
        metrics = dict(zip(names, stats.unbind()))
        metrics["explained_variance"] = explained_var
        metrics["learning_rate"] = torch.tensor(lr)
        return metrics

    def _minibatch_grads(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        clip_coef: torch.Tensor | float,
        vf_coef: torch.Tensor | float,
        ent_coef: torch.Tensor | float,
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One minibatch's gradients (the order of ``net.parameters()``) and the statistics of
        :meth:`_minibatch_loss`, written out (:func:`.ppo_grads.gaussian_mlp_grads`; pure: compiled)."""
        cfg = self.cfg
        return gaussian_mlp_grads(
            self.net,
            cfg.activation,
            cfg.norm_adv,
            cfg.clip_vloss,
            obs,
            actions,
            old_logp,
            advantages,
            old_values,
            returns,
            clip_coef,
            vf_coef,
            ent_coef,
        )

    def _minibatch_loss(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        clip_coef: torch.Tensor | float,
        vf_coef: torch.Tensor | float,
        ent_coef: torch.Tensor | float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One minibatch's loss and its statistics ``[loss, policy_loss, value_loss, entropy,
        approx_kl, clipfrac]`` (detached): the forward part of an update step (pure: compiled)."""
        params = self.net.dist_params(obs)
        new_logp, ent = self.net.log_prob_entropy(params, actions)
        new_v = self.net.value(obs)
        out = ppo_loss(
            new_logp,
            old_logp,
            advantages,
            new_v,
            old_values,
            returns,
            ent,
            clip_coef,
            vf_coef,
            ent_coef,
            self.cfg.clip_vloss,
            self.cfg.norm_adv,
        )
        stats = torch.stack([out.loss, out.policy_loss, out.value_loss, out.entropy, out.approx_kl, out.clipfrac])
        return out.loss, stats.detach()


# Keys of state files written before the agent owned its state: the reward
# scaler's statistics were "reward_scaler.rms.*" and its per-env returns "reward_scaler.ret".
_RENAMED = {"reward_scaler.rms.": "reward_rms."}


def upgrade_state_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors of an older state file under today's keys (agent keys only; others unchanged)."""
    out = {}
    for k, v in tensors.items():
        for old, new in _RENAMED.items():
            if k.startswith(old):
                k = new + k[len(old) :]
                break
        out[k] = v
    return out
