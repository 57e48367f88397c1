"""The settings of the off-policy agents (section ``agent`` when ``agent.algo`` is sac or td3):
plain dataclasses with a one-line doc per field, no torch, so that config.py (the ground floor)
reads them as it reads PPOConfig. The agents themselves are sac.py and td3.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..docfield import ConfigError, F

__all__ = ["ACTIVATION_NAMES", "OffPolicyConfig", "SACConfig", "SAC_MUTABLE", "TD3Config", "TD3_MUTABLE"]

ACTIVATION_NAMES = ("relu", "tanh", "elu", "silu")


@dataclass
class OffPolicyConfig:
    """Settings of an off-policy learner (SAC and TD3 add their own)."""

    gamma: float = F(0.99, "discount factor")
    tau: float = F(0.005, "polyak step of the target networks: target <- (1 - tau) target + tau online")
    batch_size: int = F(256, "transitions per gradient update, sampled uniformly from the replay buffer")
    buffer_size: int = F(1_000_000, "replay capacity in transitions (rounded down to a multiple of num_envs; "
                                    "bytes per transition: ReplayBuffer.bytes_per_row)")
    updates_per_step: float = F(1.0, "gradient updates per env step of the whole batch (num_envs transitions); "
                                     "fractional (0.25: one every 4th step) or > 1")
    learning_starts: int = F(10_000, "transitions (all envs together) stored with uniform random actions before "
                                     "the first update")
    n_step: int = F(1, "n-step returns: rewards summed over up to n steps before bootstrapping (1 = TD(0))")
    hidden_sizes: list = F([256, 256], "hidden layer widths of actor and critics")
    activation: str = F("relu", "hidden activation: relu | tanh | elu | silu")
    norm_obs: bool = F(False, "running mean/std observation normalization (part of the agent state)")
    clip_obs: float = F(10.0, "clip normalized observations to +-clip_obs")
    reward_scale: float = F(1.0, "constant factor on the rewards stored in the buffer (scale_reward)")
    actor_lr: float = F(3e-4, "Adam step size of the actor")
    critic_lr: float = F(1e-3, "Adam step size of the twin critics")

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first field out of range."""

        def need(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"agent.{key}: {msg}")

        need(0 < self.gamma <= 1, "gamma", f"must be in (0, 1], got {self.gamma}")
        need(0 < self.tau <= 1, "tau", f"must be in (0, 1], got {self.tau}")
        need(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        need(self.buffer_size >= 1, "buffer_size", f"must be >= 1, got {self.buffer_size}")
        need(math.isfinite(self.updates_per_step) and self.updates_per_step > 0, "updates_per_step",
             f"must be a finite number > 0, got {self.updates_per_step}")
        need(self.learning_starts >= 0, "learning_starts", f"must be >= 0, got {self.learning_starts}")
        need(self.n_step >= 1, "n_step", f"must be >= 1, got {self.n_step}")
        need(len(self.hidden_sizes) >= 1 and all(int(h) >= 1 for h in self.hidden_sizes), "hidden_sizes",
             f"must be a non-empty list of widths >= 1, got {self.hidden_sizes}")
        need(self.activation in ACTIVATION_NAMES, "activation",
             f"must be one of {', '.join(ACTIVATION_NAMES)}, got {self.activation!r}")
        need(self.clip_obs > 0, "clip_obs", f"must be > 0, got {self.clip_obs}")
        need(self.reward_scale > 0, "reward_scale", f"must be > 0, got {self.reward_scale}")
        need(self.actor_lr > 0, "actor_lr", f"must be > 0, got {self.actor_lr}")
        need(self.critic_lr > 0, "critic_lr", f"must be > 0, got {self.critic_lr}")


@dataclass
class SACConfig(OffPolicyConfig):
    """Section ``agent`` of an SAC pod."""

    alpha: float = F(0.2, "entropy temperature; with autotune its initial value")
    autotune: bool = F(True, "learn the temperature (log alpha) toward the target entropy")
    target_entropy: float = F(0.0, "target entropy of the autotuned temperature; 0 = -act_dim (the usual choice)")
    alpha_lr: float = F(1e-3, "Adam step size of log alpha (autotune)")

    def validate(self) -> None:
        super().validate()
        if not self.alpha > 0:
            raise ConfigError(f"agent.alpha: must be > 0, got {self.alpha}")
        if not self.alpha_lr > 0:
            raise ConfigError(f"agent.alpha_lr: must be > 0, got {self.alpha_lr}")


# Hyperparameters a pod may change while it trains (PBT). "alpha" only without autotune (the
# temperature is learned state otherwise), "alpha_lr" only with it.
SAC_MUTABLE = ("actor_lr", "critic_lr", "tau", "alpha", "alpha_lr")


@dataclass
class TD3Config(OffPolicyConfig):
    """Section ``agent`` of a TD3 pod (noises in action units: the policy's range is [-1, 1])."""

    actor_lr: float = F(3e-4, "Adam step size of the actor")
    critic_lr: float = F(3e-4, "Adam step size of the twin critics")
    exploration_noise: float = F(0.1, "std of the Gaussian noise added to the actions while training")
    policy_noise: float = F(0.2, "std of the target policy smoothing noise")
    noise_clip: float = F(0.5, "the smoothing noise is clipped to +-noise_clip")
    policy_delay: int = F(2, "critic updates per actor (and target network) update")

    def validate(self) -> None:
        super().validate()
        for key in ("exploration_noise", "policy_noise", "noise_clip"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"agent.{key}: must be >= 0, got {getattr(self, key)}")
        if self.policy_delay < 1:
            raise ConfigError(f"agent.policy_delay: must be >= 1, got {self.policy_delay}")


# Hyperparameters a pod may change while it trains (PBT).
TD3_MUTABLE = ("actor_lr", "critic_lr", "tau", "exploration_noise", "policy_noise")
