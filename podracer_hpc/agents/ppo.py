"""PPO for continuous (Gaussian) and discrete (categorical) actions, on one device.

Reads top to bottom: normalizers -> networks -> GAE -> loss -> the agent (act, update, state).
Rollout tensors have fixed shapes ``(steps, envs, ...)``. Nothing here loops over
environments, and nothing reads a value back to the host except the logged metrics, which are
returned as tensors and synchronized by the caller when it logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..config import PPOConfig

LOG_2PI = math.log(2 * math.pi)


# ----------------------------------------------------------------------------------------
# Normalizers: running statistics that are part of the pod state
# ----------------------------------------------------------------------------------------
class RunningMeanStd(nn.Module):
    """Running mean and variance over a stream of batches (Chan et al.'s parallel update), float64."""

    def __init__(self, shape: tuple[int, ...] = (), device: str | torch.device = "cpu", epsilon: float = 1e-4):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64, device=device))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64, device=device))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64, device=device))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``[B, *shape]`` into the statistics."""
        x = x.to(torch.float64)
        b_mean = x.mean(0)
        b_var = x.var(0, unbiased=False)
        b_count = x.shape[0]
        delta = b_mean - self.mean
        tot = self.count + b_count
        self.mean += delta * b_count / tot
        m2 = self.var * self.count + b_var * b_count + delta.square() * self.count * b_count / tot
        self.var.copy_(m2 / tot)
        self.count.copy_(tot)

    def normalize(self, x: torch.Tensor, clip: float = 10.0) -> torch.Tensor:
        y = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + 1e-8)
        return y.clamp(-clip, clip)


class RewardScaler(nn.Module):
    """Divide rewards by the running std of each env's discounted return (as SB3's VecNormalize)."""

    def __init__(self, num_envs: int, gamma: float, device: str | torch.device = "cpu"):
        super().__init__()
        self.gamma = gamma
        self.rms = RunningMeanStd((), device=device)
        self.register_buffer("ret", torch.zeros(num_envs, dtype=torch.float64, device=device))

    @torch.no_grad()
    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        self.ret.mul_(self.gamma).add_(reward.to(torch.float64))
        self.rms.update(self.ret)
        self.ret.masked_fill_(done, 0.0)
        return reward / torch.sqrt(self.rms.var.to(reward.dtype) + 1e-8)


# ----------------------------------------------------------------------------------------
# Networks
# ----------------------------------------------------------------------------------------
_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}


def mlp(sizes: list[int], activation: str, out_gain: float) -> nn.Sequential:
    """An MLP with orthogonal init: hidden gain sqrt(2), output gain ``out_gain``, zero biases."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


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
        return params + self.log_std.exp() * noise

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        """The deterministic action (mean or argmax)."""
        return params.argmax(-1) if self.discrete else params


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
    clip_coef: float,
    vf_coef: float,
    ent_coef: float,
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
    """Networks, optimizer and normalizers of one pod; all its state is in ``state_dict``."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        discrete: bool,
        num_actions: int,
        num_envs: int,
        cfg: PPOConfig,
        device: str | torch.device = "cpu",
    ):
        super().__init__()
        self.cfg = cfg
        self.discrete = discrete
        self.net = ActorCritic(obs_dim, act_dim, discrete, num_actions, cfg).to(device)
        self.obs_rms = RunningMeanStd((obs_dim,), device=device)
        self.reward_scaler = RewardScaler(num_envs, cfg.gamma, device=device)
        # fused Adam: one kernel for all parameters instead of a dozen small ops per tensor
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.learning_rate, eps=1e-5, fused=True)
        self.learning_rate = cfg.learning_rate  # the current base rate (PBT may change it)

    # --- acting --------------------------------------------------------------------------
    @torch.no_grad()
    def normalize_obs(self, obs: torch.Tensor, update: bool) -> torch.Tensor:
        if not self.cfg.norm_obs:
            return obs
        if update:
            self.obs_rms.update(obs)
        return self.obs_rms.normalize(obs, self.cfg.clip_obs)

    @torch.no_grad()
    def scale_reward(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        return self.reward_scaler(reward, done) if self.cfg.norm_reward else reward

    @torch.no_grad()
    def act(self, nobs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions for normalized observations; returns (action, log_prob)."""
        params = self.net.dist_params(nobs)
        action = self.net.sample(params, gen)
        logp, _ = self.net.log_prob_entropy(params, action)
        return action, logp

    @torch.no_grad()
    def act_deterministic(self, nobs: torch.Tensor) -> torch.Tensor:
        return self.net.mode(self.net.dist_params(nobs))

    @torch.no_grad()
    def value(self, nobs: torch.Tensor) -> torch.Tensor:
        return self.net.value(nobs)

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
        cfg = self.cfg
        lr = self.learning_rate * (1.0 - progress) if cfg.anneal_lr else self.learning_rate
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        B = obs.shape[0]
        mb = B // cfg.num_minibatches
        stats = torch.zeros(6, device=obs.device)
        n = 0
        params_list = list(self.net.parameters())
        for _epoch in range(cfg.update_epochs):
            # One shuffle per epoch, then contiguous minibatch slices (fewer, larger gathers).
            perm = torch.randperm(B, generator=gen, device=obs.device)
            s_obs, s_act, s_logp = obs[perm], actions[perm], logprobs[perm]
            s_adv, s_ret, s_val = advantages[perm], returns[perm], values[perm]
            kl_sum = torch.zeros((), device=obs.device)
            for start in range(0, B, mb):
                sl = slice(start, start + mb)
                params = self.net.dist_params(s_obs[sl])
                new_logp, ent = self.net.log_prob_entropy(params, s_act[sl])
                new_v = self.net.value(s_obs[sl])
                out = ppo_loss(
                    new_logp, s_logp[sl], s_adv[sl], new_v, s_val[sl], s_ret[sl], ent,
                    cfg.clip_coef, cfg.vf_coef, cfg.ent_coef, cfg.clip_vloss, cfg.norm_adv,
                )
                self.optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                nn.utils.clip_grad_norm_(params_list, cfg.max_grad_norm, foreach=True)
                self.optimizer.step()
                stats += torch.stack(
                    [out.loss, out.policy_loss, out.value_loss, out.entropy, out.approx_kl, out.clipfrac]
                ).detach()
                kl_sum += out.approx_kl.detach()
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
