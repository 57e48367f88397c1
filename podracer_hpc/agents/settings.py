"""Each learner's settings (section ``agent``, chosen by ``agent.algo``: ppo, sac or td3): plain
dataclasses with a one-line doc per field, no torch, so that config.py (the ground floor) reads
them; which of them PBT may change while an agent trains; and an agent's kind (which agents a pod
can take). The agents themselves are ppo.py, sac.py and td3.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from podracer_hpc.docfield import ConfigError, F

__all__ = [
    "ACTIVATION_NAMES",
    "COMPILE_MODES",
    "MAX_ROLLOUT_STEPS",
    "MUTABLE_HPARAMS",
    "NETWORKS",
    "OffPolicyConfig",
    "PPOConfig",
    "SACConfig",
    "SAC_MUTABLE",
    "TD3Config",
    "TD3_MUTABLE",
    "agent_kind",
    "mutable_hparams",
]

ACTIVATION_NAMES = ("relu", "tanh", "elu", "silu")
COMPILE_MODES = ("off", "on", "cudagraphs")  # agent.compile (agents/compiled.py)
_COMPILE_DOC = (
    "torch.compile the update, the torch env step and (on a GPU) the rollout's policy step: off | on | "
    "cudagraphs (CUDA graphs too, on a GPU; as on elsewhere); eager with a notice where it cannot compile"
)
NETWORKS = ("mlp", "per_asset")  # agent.network of PPO
MAX_ROLLOUT_STEPS = 2**16
# PPO's hyperparameters that a pod may change while it trains (PBT explores these)
MUTABLE_HPARAMS = ("learning_rate", "ent_coef", "clip_coef", "gae_lambda", "vf_coef", "max_grad_norm")


@dataclass
class PPOConfig:
    """Section ``agent`` of a PPO pod (``agent.algo: ppo``, the default)."""

    algo: str = F("ppo", "learner: ppo | sac | td3; each has its own keys (podracer config lists them)")
    learning_rate: float = F(3e-4, "Adam step size at the start of training")
    anneal_lr: bool = F(True, "decay the learning rate linearly to 0 over total_env_steps")
    rollout_steps: int = F(32, "steps per environment in one rollout (T); a batch is T x num_envs")
    num_minibatches: int = F(4, "minibatches per epoch (the batch is split evenly)")
    update_epochs: int = F(4, "passes over each rollout batch")
    gamma: float = F(0.99, "discount factor")
    gae_lambda: float = F(0.95, "GAE lambda")
    clip_coef: float = F(0.2, "PPO surrogate clip range")
    clip_vloss: bool = F(False, "clip the value loss around the old values")
    ent_coef: float = F(0.0, "entropy bonus coefficient")
    vf_coef: float = F(0.5, "value loss coefficient")
    max_grad_norm: float = F(0.5, "global gradient-norm clip")
    target_kl: float = F(0.0, "stop an update's epochs early above this approx KL; 0 = never")
    norm_adv: bool = F(True, "normalize advantages per minibatch")
    norm_obs: bool = F(True, "running mean/std observation normalization (part of the pod state)")
    norm_reward: bool = F(True, "scale rewards by the running std of the discounted return")
    clip_obs: float = F(10.0, "clip normalized observations to +-clip_obs")
    network: str = F("mlp", "mlp | per_asset (weights shared across assets, permutation-equivariant; stock_trading)")
    hidden_sizes: list = F([64, 64], "hidden layer widths of actor and critic")
    activation: str = F("tanh", "hidden activation: tanh | relu | elu | silu (tanh is slow on some CPU builds)")
    init_log_std: float = F(0.0, "initial log std of the Gaussian policy (continuous actions)")
    compile: str = F("off", _COMPILE_DOC)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first field out of range (the checks that need the
        task or the batch, ``num_minibatches`` and ``network: per_asset``, are config.validate's)."""

        def need(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"agent.{key}: {msg}")

        def within(value: int, low: int, high: int, key: str) -> None:
            need(low <= value <= high, key, f"must be in [{low:,}, {high:,}], got {value:,}")

        need(
            0 < self.learning_rate < math.inf, "learning_rate", f"must be a finite number > 0, got {self.learning_rate}"
        )
        within(self.rollout_steps, 1, MAX_ROLLOUT_STEPS, "rollout_steps")
        within(self.update_epochs, 1, 10_000, "update_epochs")
        need(0 < self.gamma <= 1, "gamma", f"must be in (0, 1], got {self.gamma}")
        need(0 <= self.gae_lambda <= 1, "gae_lambda", f"must be in [0, 1], got {self.gae_lambda}")
        need(self.clip_coef > 0, "clip_coef", f"must be > 0, got {self.clip_coef}")
        need(self.ent_coef >= 0, "ent_coef", f"must be >= 0, got {self.ent_coef}")
        need(self.vf_coef >= 0, "vf_coef", f"must be >= 0, got {self.vf_coef}")
        need(self.max_grad_norm > 0, "max_grad_norm", f"must be > 0, got {self.max_grad_norm}")
        need(self.target_kl >= 0, "target_kl", f"must be >= 0, got {self.target_kl}")
        need(self.clip_obs > 0, "clip_obs", f"must be > 0, got {self.clip_obs}")
        need(
            self.activation in ACTIVATION_NAMES,
            "activation",
            f"must be tanh, relu, elu or silu, got {self.activation!r}",
        )
        need(self.compile in COMPILE_MODES, "compile", f"must be {' | '.join(COMPILE_MODES)}, got {self.compile!r}")
        need(self.network in NETWORKS, "network", f"must be {' or '.join(NETWORKS)}, got {self.network!r}")


@dataclass
class OffPolicyConfig:
    """Settings of an off-policy learner (SAC and TD3 add their own)."""

    algo: str = F("sac", "learner: ppo | sac | td3; each has its own keys (podracer config lists them)")
    rollout_steps: int = F(
        8,
        "env steps per environment in one pod iteration (each followed by the updates due); "
        "an iteration is one log row, and evaluations, rounds and checkpoints fall between them",
    )
    gamma: float = F(0.99, "discount factor")
    tau: float = F(0.005, "polyak step of the target networks: target <- (1 - tau) target + tau online")
    batch_size: int = F(256, "transitions per gradient update, sampled uniformly from the replay buffer")
    buffer_size: int = F(
        1_000_000,
        "replay capacity in transitions (rounded down to a multiple of num_envs; "
        "bytes per transition: ReplayBuffer.bytes_per_row)",
    )
    updates_per_step: float = F(
        1.0,
        "gradient updates per env step of the whole batch (num_envs transitions); "
        "fractional (0.25: one every 4th step) or > 1",
    )
    learning_starts: int = F(
        10_000, "transitions (all envs together) stored with uniform random actions before the first update"
    )
    n_step: int = F(1, "n-step returns: rewards summed over up to n steps before bootstrapping (1 = TD(0))")
    hidden_sizes: list = F([256, 256], "hidden layer widths of actor and critics")
    activation: str = F("relu", "hidden activation: relu | tanh | elu | silu")
    norm_obs: bool = F(False, "running mean/std observation normalization (part of the agent state)")
    clip_obs: float = F(10.0, "clip normalized observations to +-clip_obs")
    reward_scale: float = F(1.0, "constant factor on the rewards stored in the buffer (scale_reward)")
    actor_lr: float = F(3e-4, "Adam step size of the actor")
    critic_lr: float = F(1e-3, "Adam step size of the twin critics")
    compile: str = F("off", _COMPILE_DOC)

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first field out of range."""

        def need(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"agent.{key}: {msg}")

        need(1 <= self.rollout_steps <= 2**16, "rollout_steps", f"must be in [1, 65,536], got {self.rollout_steps}")
        need(0 < self.gamma <= 1, "gamma", f"must be in (0, 1], got {self.gamma}")
        need(0 < self.tau <= 1, "tau", f"must be in (0, 1], got {self.tau}")
        need(self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}")
        need(self.buffer_size >= 1, "buffer_size", f"must be >= 1, got {self.buffer_size}")
        need(
            math.isfinite(self.updates_per_step) and self.updates_per_step > 0,
            "updates_per_step",
            f"must be a finite number > 0, got {self.updates_per_step}",
        )
        need(self.learning_starts >= 0, "learning_starts", f"must be >= 0, got {self.learning_starts}")
        need(self.n_step >= 1, "n_step", f"must be >= 1, got {self.n_step}")
        need(
            len(self.hidden_sizes) >= 1 and all(int(h) >= 1 for h in self.hidden_sizes),
            "hidden_sizes",
            f"must be a non-empty list of widths >= 1, got {self.hidden_sizes}",
        )
        need(
            self.activation in ACTIVATION_NAMES,
            "activation",
            f"must be one of {', '.join(ACTIVATION_NAMES)}, got {self.activation!r}",
        )
        need(self.clip_obs > 0, "clip_obs", f"must be > 0, got {self.clip_obs}")
        need(self.reward_scale > 0, "reward_scale", f"must be > 0, got {self.reward_scale}")
        need(self.actor_lr > 0, "actor_lr", f"must be > 0, got {self.actor_lr}")
        need(self.critic_lr > 0, "critic_lr", f"must be > 0, got {self.critic_lr}")
        need(self.compile in COMPILE_MODES, "compile", f"must be {' | '.join(COMPILE_MODES)}, got {self.compile!r}")


@dataclass
class SACConfig(OffPolicyConfig):
    """Section ``agent`` of an SAC pod."""

    algo: str = F("sac", "learner: ppo | sac | td3; each has its own keys (podracer config lists them)")
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

    def mutable(self) -> tuple[str, ...]:
        """The hyperparameters this agent may change while it trains (PBT): :data:`SAC_MUTABLE`
        without ``alpha`` when the temperature is learned, without ``alpha_lr`` when it is fixed."""
        return tuple(k for k in SAC_MUTABLE if k != ("alpha" if self.autotune else "alpha_lr"))


# Hyperparameters a pod may change while it trains (PBT). "alpha" only without autotune (the
# temperature is learned state otherwise), "alpha_lr" only with it.
SAC_MUTABLE = ("actor_lr", "critic_lr", "tau", "alpha", "alpha_lr")


@dataclass
class TD3Config(OffPolicyConfig):
    """Section ``agent`` of a TD3 pod (noises in action units: the policy's range is [-1, 1])."""

    algo: str = F("td3", "learner: ppo | sac | td3; each has its own keys (podracer config lists them)")
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

    def mutable(self) -> tuple[str, ...]:
        """The hyperparameters this agent may change while it trains (PBT): :data:`TD3_MUTABLE`."""
        return TD3_MUTABLE


# Hyperparameters a pod may change while it trains (PBT).
TD3_MUTABLE = ("actor_lr", "critic_lr", "tau", "exploration_noise", "policy_noise")


def mutable_hparams(agent: Any) -> tuple[str, ...]:
    """The hyperparameters an agent with settings ``agent`` may change while it trains (PBT)."""
    return MUTABLE_HPARAMS if agent.algo == "ppo" else agent.mutable()


def agent_kind(agent: Mapping[str, Any]) -> str:
    """What makes agents interchangeable (a pod takes only agents of its own kind): the learner
    and its network, e.g. ``ppo mlp 64x64 tanh norm`` or ``sac 256x256 relu raw``. ``agent``: a config's
    agent section as a dict (an entry written before agent.algo existed is PPO)."""
    algo = str(agent.get("algo", "ppo"))
    hidden = "x".join(str(int(h)) for h in agent.get("hidden_sizes") or [])
    net = f" {agent.get('network', 'mlp')}" if algo == "ppo" else ""
    obs = "norm" if agent.get("norm_obs", algo == "ppo") else "raw"
    return f"{algo}{net} {hidden} {agent.get('activation', '')} {obs}"
