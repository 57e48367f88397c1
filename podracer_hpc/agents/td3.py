"""TD3 (Fujimoto et al. 2018): twin critics, target policy smoothing, delayed actor updates.

Reads top to bottom: settings -> the deterministic actor and its noises -> the agent (act,
update). The shared pieces (twin critics, clipped double-Q target, polyak averaging, state and
hyperparameters) are in :mod:`.offpolicy`, the replay buffer in :mod:`.replay`. As CleanRL's
``td3_continuous_action.py``, in action units of [-1, 1], batched for many environments and
with every random draw from the caller's generator.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from podracer_hpc.agents.mlp_math import linears, mlp, mlp_backward, mlp_forward, mlp_saved_forward
from podracer_hpc.agents.offpolicy import OffPolicyAgent, TwinQ, ensemble_target, frozen_copy
from podracer_hpc.agents.replay import ReplayBuffer
from podracer_hpc.agents.settings import TD3_MUTABLE, TD3Config


# ----------------------------------------------------------------------------------------
# The deterministic actor and its noises
# ----------------------------------------------------------------------------------------
class DeterministicActor(nn.Module):
    """``obs -> tanh(mlp(obs))`` in (-1, 1)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_sizes: list[int], activation: str):
        super().__init__()
        self.body = mlp([obs_dim, *hidden_sizes, act_dim], activation)
        self.activation = activation

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = mlp_forward(linears(self.body), self.activation, obs) if obs.dim() == 2 else self.body(obs)
        return torch.tanh(out)


def smoothed_target_action(
    mu: torch.Tensor, policy_noise: float, noise_clip: float, gen: torch.Generator
) -> torch.Tensor:
    """Target policy smoothing: ``clip(mu + clip(eps * policy_noise, -c, c), -1, 1)``."""
    eps = torch.randn(mu.shape, generator=gen, device=mu.device, dtype=mu.dtype)
    return smooth(mu, eps, policy_noise, noise_clip)


def smooth(mu: torch.Tensor, eps: torch.Tensor, policy_noise: torch.Tensor | float, noise_clip: float) -> torch.Tensor:
    """:func:`smoothed_target_action` with the standard normal draw ``eps`` given."""
    noise = (eps * policy_noise).clamp(-noise_clip, noise_clip)
    return (mu + noise).clamp(-1.0, 1.0)


def exploration_action(mu: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    """``clip(mu + N(0, std), -1, 1)``: the behaviour policy."""
    eps = torch.randn(mu.shape, generator=gen, device=mu.device, dtype=mu.dtype)
    return (mu + std * eps).clamp(-1.0, 1.0)


def explore(mu: torch.Tensor, eps: torch.Tensor, std: torch.Tensor | float) -> torch.Tensor:
    """:func:`exploration_action` with the standard normal draw ``eps`` given."""
    return (mu + std * eps).clamp(-1.0, 1.0)


class TD3Networks(nn.Module):
    """Everything with weights: the actor, the twin critics and both targets."""

    def __init__(self, obs_dim: int, act_dim: int, cfg: TD3Config):
        super().__init__()
        hs = [int(h) for h in cfg.hidden_sizes]
        self.actor = DeterministicActor(obs_dim, act_dim, hs, cfg.activation)
        self.critic = TwinQ(obs_dim, act_dim, hs, cfg.activation)
        self.actor_target = frozen_copy(self.actor)
        self.critic_target = frozen_copy(self.critic)


def td3_actor_loss(q1: torch.Tensor) -> torch.Tensor:
    """``-mean Q1(s, mu(s))`` (TD3 ascends the first critic only)."""
    return -q1.mean()


# ----------------------------------------------------------------------------------------
# The agent
# ----------------------------------------------------------------------------------------
class TD3Agent(OffPolicyAgent):
    """TD3: networks, optimizers (actor, critic), normalizer and mutable hyperparameters.

    State keys: ``net.actor.*``, ``net.critic.*``, ``net.actor_target.*``,
    ``net.critic_target.*``, ``obs_rms.*``, ``optim.{actor,critic}.*``; the update count (the
    actor delay's phase) is in the meta (see :class:`.OffPolicyAgent`).
    """

    MUTABLE = TD3_MUTABLE

    def __init__(self, obs_dim: int, act_dim: int, cfg: TD3Config, device: str | torch.device = "cpu"):
        super().__init__(obs_dim, act_dim, cfg, device)
        self.net = TD3Networks(obs_dim, act_dim, cfg).to(self.device)
        self._init_hparams()

    def _build_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {
            "actor": self._adam(list(self.net.actor.parameters()), self.cfg.actor_lr),
            "critic": self._adam(list(self.net.critic.parameters()), self.cfg.critic_lr),
        }

    # --- acting --------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, nobs: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Exploration actions for normalized observations; returns (action, zeros) (a
        deterministic policy has no log-probability)."""
        eps = self._randn(nobs.shape[0], gen)
        action = self.hot()["policy step"](nobs, eps, self._scalar(self.hparams["exploration_noise"]))
        return action, torch.zeros(action.shape[0], device=action.device)

    @torch.no_grad()
    def act_deterministic(self, nobs: torch.Tensor) -> torch.Tensor:
        return self.net.actor(nobs)

    def deterministic_policy(self) -> nn.Module:
        """:meth:`act_deterministic` as a module of its own (a copy of the actor; export.py)."""
        return copy.deepcopy(self.net.actor)

    # --- learning ------------------------------------------------------------------------
    def _polyak_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.net.actor_target, self.net.actor), (self.net.critic_target, self.net.critic)]

    def update(self, buffer: ReplayBuffer, gen: torch.Generator, num_updates: int) -> dict[str, torch.Tensor]:
        """``num_updates`` critic steps on fresh batches; every ``policy_delay``-th (counted over
        the agent's life, so a resume keeps the phase) also an actor step and the polyak update
        of both targets. The batches of all the steps are drawn at once (as SAC's). Returns
        metrics averaged over their steps as 0-d tensors (no host sync; ``actor_loss`` is 0 when
        no actor step fell in this call)."""
        cfg, hp = self.cfg, self.hparams
        zero = torch.zeros((), device=self.device)
        if num_updates < 1:
            return {"qf_loss": zero, "q_mean": zero, "actor_loss": zero}
        self._set_lr("actor", hp["actor_lr"])
        self._set_lr("critic", hp["critic_lr"])
        hot = self.hot()
        n, B = num_updates, cfg.batch_size
        policy_noise = self._scalar(hp["policy_noise"])
        rows = self._draw_batches(buffer, n, gen)
        eps = self._randn(n * B, gen).view(n, B, -1).unbind(0)
        tau = hp["tau"]
        qf, qm, actor = [], [], []
        for i in range(n):
            o, a, r, bt, no = (x[i] for x in rows)
            qf_loss, q_mean, grads = hot["critic loss"](o, a, r, bt, no, eps[i], policy_noise)
            self._steppers["critic"].step(grads)
            self.num_updates += 1
            if self.num_updates % cfg.policy_delay == 0:
                actor_loss, grads = hot["actor loss"](o)
                self._steppers["actor"].step(grads)
                self._polyak_step(tau)  # both targets
                actor.append(actor_loss)
            qf.append(qf_loss)
            qm.append(q_mean)
        with torch.no_grad():
            return {
                "qf_loss": torch.stack(qf).mean(),
                "q_mean": torch.stack(qm).mean(),
                "actor_loss": torch.stack(actor).mean() if actor else zero,
            }

    # --- the hot paths (pure tensor functions; agents/compiled.py compiles them) --------------
    def _hot_functions(self) -> dict:
        return {"policy step": self._explore, "critic loss": self._critic_loss, "actor loss": self._actor_loss}

    def _explore(self, nobs: torch.Tensor, eps: torch.Tensor, std: torch.Tensor | float) -> torch.Tensor:
        """Exploration actions from the standard normal draw ``eps``."""
        return explore(self.net.actor(nobs), eps, std)

    def _critic_loss(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        bootstrap: torch.Tensor,
        next_obs: torch.Tensor,
        eps: torch.Tensor,
        policy_noise: torch.Tensor | float,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """(critic loss, mean Q, its gradients) of a sampled batch (normalized observations; ``bootstrap`` =
        discount * (1 - terminated)); ``eps`` the standard normal draw of the target policy smoothing."""
        net = self.net
        with torch.no_grad():
            next_a = smooth(net.actor_target(next_obs), eps, policy_noise, self.cfg.noise_clip)
            y = ensemble_target(reward, bootstrap, net.critic_target(next_obs, next_a))
        return net.critic.loss_and_grads(obs, action, y)

    @torch.no_grad()
    def _actor_loss(self, obs: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """(``-mean Q1(s, mu(s))`` on normalized observations, its gradients in the actor's
        parameters), the backward pass written out (as the critics': :meth:`.TwinQ.backward`;
        through the first critic, its weights unchanged, to the actions only)."""
        net, act_name = self.net, self.cfg.activation
        layers = linears(net.actor.body)
        out, inputs, pre = mlp_saved_forward(layers, act_name, obs)
        a = torch.tanh(out)
        q, q_in, q_pre = net.critic.saved_forward(torch.cat([obs, a], -1), first_only=True)  # Q2 takes no part
        _, g_x = net.critic.backward(torch.full_like(q, -1.0 / obs.shape[0]), q_in, q_pre, params=False, to_input=True)
        g_out = g_x[0, :, self.obs_dim :] * (1.0 - a.square())
        return td3_actor_loss(q[0]), mlp_backward(layers, act_name, inputs, pre, g_out)
