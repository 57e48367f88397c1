"""Soft Actor-Critic (Haarnoja et al. 2018, with the learned temperature) for actions in [-1, 1].

Reads top to bottom: settings -> the tanh-squashed Gaussian actor (with the log-prob
correction) -> the losses -> the agent (act, update). The shared pieces (twin critics, clipped
double-Q target, polyak averaging, state and hyperparameters) are in :mod:`.offpolicy`, the
replay buffer in :mod:`.replay`. As CleanRL's ``sac_continuous_action.py``, but batched for
many environments and with every random draw from the caller's generator.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn

from podracer_hpc.agents.mlp_math import linears, mlp, mlp_backward, mlp_forward, mlp_saved_forward
from podracer_hpc.agents.offpolicy import OffPolicyAgent, TwinQ, ensemble_target, frozen_copy
from podracer_hpc.agents.replay import ReplayBuffer
from podracer_hpc.agents.settings import SAC_MUTABLE, SACConfig

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


# ----------------------------------------------------------------------------------------
# The actor: a tanh-squashed Gaussian
# ----------------------------------------------------------------------------------------
def squashed_gaussian_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log-density of ``a = tanh(u)``, ``u ~ N(mean, exp(log_std))``, summed over the last dim.

    ``log p(a) = log N(u) - sum log(1 - tanh(u)^2)`` (change of variables), with
    ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``: exact and stable for large ``|u|``,
    where ``1 - tanh(u)^2`` underflows (no ``+ 1e-6`` fudge).
    """
    z = (u - mean) * torch.exp(-log_std)
    log_normal = -0.5 * z.square() - log_std - HALF_LOG_2PI
    log_det = 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
    return (log_normal - log_det).sum(-1)


class SquashedGaussianActor(nn.Module):
    """``obs -> (mean, log_std)``; actions ``tanh(mean + std * eps)``; ``log_std`` squashed into
    ``[LOG_STD_MIN, LOG_STD_MAX]`` by a tanh (as CleanRL)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        self.body = mlp([obs_dim, *hidden_sizes, 2 * act_dim], activation)
        self.activation = activation

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = mlp_forward(linears(self.body), self.activation, obs) if obs.dim() == 2 else self.body(obs)
        mean, raw = out.chunk(2, -1)
        return mean, self.bounded_log_std(torch.tanh(raw))

    @staticmethod
    def bounded_log_std(t: torch.Tensor) -> torch.Tensor:
        """The log std from ``t``, the tanh of the raw output: ``t`` in (-1, 1) mapped onto
        ``(LOG_STD_MIN, LOG_STD_MAX)``."""
        return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (t + 1.0)

    def sample(self, obs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(action in (-1, 1), its log-probability), reparameterized (gradients flow)."""
        mean, log_std = self(obs)
        eps = torch.randn(mean.shape, generator=gen, device=mean.device, dtype=mean.dtype)
        return self.squash(mean, log_std, eps)

    def sample_from(self, obs: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`sample` with the standard normal draw ``eps`` given (pure: compiled)."""
        mean, log_std = self(obs)
        return self.squash(mean, log_std, eps)

    @staticmethod
    def squash(mean: torch.Tensor, log_std: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tanh(u), log p)`` for ``u = mean + exp(log_std) * eps``: :func:`squashed_gaussian_log_prob`
        with its standardized ``(u - mean) / std`` taken as ``eps`` itself (what it is, without
        the round trip: fewer ops, the same density and gradients)."""
        return SquashedGaussianActor._squash(mean, log_std, torch.exp(log_std), eps)

    @staticmethod
    def _squash(
        mean: torch.Tensor, log_std: torch.Tensor, std: torch.Tensor, eps: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`squash` with ``std = exp(log_std)`` given."""
        u = mean + std * eps
        log_det = 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
        return torch.tanh(u), (-0.5 * eps.square() - log_std - log_det).sum(-1) - HALF_LOG_2PI * eps.shape[-1]

    @torch.no_grad()
    def saved_sample(
        self, obs: torch.Tensor, eps: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """:meth:`sample_from` of a batch ``[B, obs]``, keeping the record that
        :meth:`SACAgent._actor_grads` (the written-out backward) needs: each layer's input and
        pre-activation, ``tanh`` of the raw log std, the std. Returns (actions, log-probabilities,
        record)."""
        out, inputs, pre = mlp_saved_forward(linears(self.body), self.activation, obs)
        mean, raw = out.chunk(2, -1)
        t = torch.tanh(raw)
        log_std = self.bounded_log_std(t)
        std = torch.exp(log_std)
        a, logp = self._squash(mean, log_std, std, eps)
        return a, logp, [*inputs, *pre, t, std]


class SquashedMean(nn.Module):
    """``normalized obs -> tanh(mean)``: SAC's evaluation policy on its own (TorchScript/ONNX)."""

    def __init__(self, actor: SquashedGaussianActor):
        super().__init__()
        self.body = actor.body

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.body(obs).chunk(2, -1)[0])


class SACNetworks(nn.Module):
    """Everything with weights: the actor, the twin critics and their targets, log alpha."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig):
        super().__init__()
        hs = [int(h) for h in cfg.hidden_sizes]
        self.actor = SquashedGaussianActor(obs_dim, act_dim, hs, cfg.activation)
        self.critic = TwinQ(obs_dim, act_dim, hs, cfg.activation)
        self.critic_target = frozen_copy(self.critic)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.alpha)))


# ----------------------------------------------------------------------------------------
# The losses
# ----------------------------------------------------------------------------------------
def sac_actor_loss(logp: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """``mean(alpha log pi(a|s) - min(Q1, Q2)(s, a))`` at actions sampled from the policy."""
    return (alpha * logp - torch.min(q1, q2)).mean()


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """``-mean(alpha (log pi + target_entropy))``: its gradient raises alpha while the policy's
    entropy ``-log pi`` is below the target and lowers it above (CleanRL's form)."""
    return -(log_alpha.exp() * (logp.detach() + target_entropy)).mean()


# ----------------------------------------------------------------------------------------
# The agent
# ----------------------------------------------------------------------------------------
class SACAgent(OffPolicyAgent):
    """SAC: networks, optimizers (actor, critic, alpha), normalizer and mutable hyperparameters.

    State keys: ``net.actor.*``, ``net.critic.*``, ``net.critic_target.*``, ``net.log_alpha``,
    ``obs_rms.*``, ``optim.{actor,critic,alpha}.*`` (see :class:`.OffPolicyAgent`).
    """

    MUTABLE = SAC_MUTABLE

    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig, device: str | torch.device = "cpu"):
        super().__init__(obs_dim, act_dim, cfg, device)
        self.net = SACNetworks(obs_dim, act_dim, cfg).to(self.device)
        self.target_entropy = float(cfg.target_entropy) if cfg.target_entropy else -float(act_dim)
        self.mutable = cfg.mutable()
        self._init_hparams()

    def _build_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        opts = {
            "actor": self._adam(list(self.net.actor.parameters()), self.cfg.actor_lr),
            "critic": self._adam(list(self.net.critic.parameters()), self.cfg.critic_lr),
        }
        if self.cfg.autotune:
            opts["alpha"] = self._adam([self.net.log_alpha], self.cfg.alpha_lr)
        return opts

    @property
    def alpha(self) -> torch.Tensor:
        """The temperature in use: ``exp(log alpha)`` (autotune) or the hyperparameter."""
        if self.cfg.autotune:
            return self.net.log_alpha.detach().exp()
        return torch.tensor(self.hparams["alpha"], device=self.device)

    # --- acting --------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, nobs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample actions in (-1, 1) for normalized observations; returns (action, log_prob)."""
        return self.hot()["policy step"](nobs, self._randn(nobs.shape[0], gen))

    @torch.no_grad()
    def act_deterministic(self, nobs: torch.Tensor) -> torch.Tensor:
        """``tanh(mean)``: the evaluation policy."""
        return torch.tanh(self.net.actor(nobs)[0])

    def deterministic_policy(self) -> nn.Module:
        """:meth:`act_deterministic` as a module of its own (a copy of the actor; export.py)."""
        return SquashedMean(copy.deepcopy(self.net.actor))

    # --- learning ------------------------------------------------------------------------
    def _polyak_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.net.critic_target, self.net.critic)]

    def update(self, buffer: ReplayBuffer, gen: torch.Generator, num_updates: int) -> dict[str, torch.Tensor]:
        """``num_updates`` gradient steps, each on a fresh batch of ``cfg.batch_size`` from
        ``buffer``: critics, then actor and temperature (one backward for both), then the targets.
        The batches of all the steps are drawn at once (one draw of indices, noises and n-step
        returns; the buffer does not change between the steps). Returns the metrics averaged over
        the steps as 0-d tensors (no host sync)."""
        cfg, hp, net = self.cfg, self.hparams, self.net
        names = ["qf_loss", "actor_loss", "alpha_loss", "q_mean", "entropy", "alpha"]
        if num_updates < 1:
            return {k: torch.zeros((), device=self.device) for k in names}
        self._set_lr("actor", hp["actor_lr"])
        self._set_lr("critic", hp["critic_lr"])
        if cfg.autotune:
            self._set_lr("alpha", hp["alpha_lr"])
        hot = self.hot()
        n, B = num_updates, cfg.batch_size
        rows = self._draw_batches(buffer, n, gen)
        eps = self._randn(n * 2 * B, gen).view(n, 2 * B, -1).unbind(0)  # rows :B the next actions', B: the policy's
        fixed_alpha = None if cfg.autotune else self.alpha
        tau = hp["tau"]
        out: list[list[torch.Tensor]] = [[] for _ in names]
        for i in range(n):
            o, a, r, bt, no = (x[i] for x in rows)
            alpha = net.log_alpha.detach().exp() if fixed_alpha is None else fixed_alpha
            # the actor's one pass over [next obs; obs] (its weights change only after the critics'
            # step): the next actions of the critics' target and the policy's actions of its loss
            pi, pi_logp, record = hot["policy pass"](torch.cat([no, o]), eps[i])
            # critics: regress both onto the soft clipped double-Q target
            qf_loss, q_mean, grads = hot["critic loss"](o, a, r, bt, no, pi[:B], pi_logp[:B], alpha)
            self._steppers["critic"].step(grads)
            # actor: maximize min Q - alpha log pi at its own reparameterized actions (the
            # gradient through the critics reaches the actions only); temperature: its loss
            # -exp(log alpha) mean(log pi + target) is its own gradient in log alpha
            actor_loss, logp, grads = hot["actor loss"](
                o, eps[i][B:], alpha, pi[B:], pi_logp[B:], [x[B:] for x in record]
            )
            self._steppers["actor"].step(grads)
            if cfg.autotune:
                with torch.no_grad():
                    alpha_loss = temperature_loss(net.log_alpha, logp, self.target_entropy)
                self._steppers["alpha"].step([alpha_loss])
            else:
                alpha_loss = None
            self._polyak_step(tau)
            for lst, v in zip(out, (qf_loss, actor_loss, alpha_loss, q_mean, logp, alpha)):
                lst.append(v)
        self.num_updates += n
        with torch.no_grad():
            zero = torch.zeros((), device=self.device)
            means = [torch.stack(v).mean() if v[0] is not None else zero for v in out]
        means[4] = -means[4]  # entropy: -mean log pi
        return dict(zip(names, means))

    # --- the hot paths (pure tensor functions; agents/compiled.py compiles them) --------------
    # the policy pass is the policy step's forward with its record kept: eager on a CPU as that one
    # (measured slower compiled there; the pass itself was not timed compiled)
    CPU_EAGER = ("policy step", "policy pass", "actor loss")

    def _hot_functions(self) -> dict:
        return {
            "policy step": self.net.actor.sample_from,
            "policy pass": self.net.actor.saved_sample,
            "critic loss": self._critic_loss,
            "actor loss": self._actor_grads,
        }

    def _critic_loss(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        bootstrap: torch.Tensor,
        next_obs: torch.Tensor,
        next_action: torch.Tensor,
        next_logp: torch.Tensor,
        alpha: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(critic loss, mean Q, its gradients) of a sampled batch (normalized observations; ``bootstrap`` =
        discount * (1 - terminated)); ``next_action``, ``next_logp``: the policy's at ``next_obs``."""
        net = self.net
        with torch.no_grad():
            y = ensemble_target(reward, bootstrap, net.critic_target(next_obs, next_action), next_logp, alpha)
        return net.critic.loss_and_grads(obs, action, y)

    @torch.no_grad()
    def _actor_grads(
        self,
        obs: torch.Tensor,
        eps: torch.Tensor,
        alpha: torch.Tensor,
        a: torch.Tensor,
        logp: torch.Tensor,
        record: list[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(actor loss, log-probabilities, the loss's gradients in the actor's parameters) at the
        policy's actions ``a`` (``eps``: their draw; ``logp``, ``record``:
        :meth:`SquashedGaussianActor.saved_sample`'s),
        the backward pass written out (as the critics': :meth:`.TwinQ.backward`):
        ``d logp/du = 2 tanh(u)``, ``d logp/d log_std = -1``; through the critics (their weights
        unchanged) to the actions only."""
        net, act_name = self.net, self.cfg.activation
        layers = linears(net.actor.body)
        k = len(layers)
        inputs, pre, (t, std) = record[:k], record[k : 2 * k], record[2 * k :]
        q, q_in, q_pre = net.critic.saved_forward(torch.cat([obs, a], -1))
        q_min = q.amin(0)
        rows = obs.shape[0]
        loss = (alpha * logp - q_min).mean()
        low = (q == q_min).to(q.dtype)  # amin's gradient: shared evenly by ties
        _, g_x = net.critic.backward(low * (-1.0 / rows) / low.sum(0), q_in, q_pre, params=False, to_input=True)
        g_logp = alpha / rows
        g_u = g_x.sum(0)[:, self.obs_dim :] * (1.0 - a.square()) + (2.0 * g_logp) * a
        g_log_std = g_u * std * eps - g_logp
        g_raw = g_log_std * (0.5 * (LOG_STD_MAX - LOG_STD_MIN)) * (1.0 - t.square())
        grads = mlp_backward(layers, act_name, inputs, pre, torch.cat([g_u, g_raw], -1))
        return loss, logp, grads
