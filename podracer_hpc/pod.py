"""A pod: one device, thousands of batched environments and one learner (PPO, SAC or TD3).

``Pod.train_iteration`` is the pod's loop body. PPO: a rollout of fixed shape ``(T, N, ...)``
on the device, GAE, and the minibatch epochs. SAC/TD3 (``agent.algo``): ``T`` env steps of the
batch, each stored in the replay ring on the device (uniform random actions before
``learning_starts``) and followed by the gradient updates due (``updates_per_step``). Its whole
state (networks, optimizers, normalizers, replay buffer, env physics, clocks, RNG streams,
counters) round-trips through ``state_tensors``/``load_state`` as plain tensors plus JSON, so a
checkpoint resumes the very same run. The pod knows nothing of MPI, Slurm or log files.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from podracer_hpc.agents.compiled import compile_env
from podracer_hpc.agents.offpolicy import OffPolicyAgent
from podracer_hpc.agents.ppo import PPOAgent, compute_gae
from podracer_hpc.agents.replay import ReplayBuffer
from podracer_hpc.agents.sac import SACAgent
from podracer_hpc.agents.settings import agent_kind, mutable_hparams
from podracer_hpc.agents.td3 import TD3Agent
from podracer_hpc.config import Config, agent_config
from podracer_hpc.envs import build_env
from podracer_hpc.envs.base import split_step
from podracer_hpc.files import safeio

STATE_KIND = "pod-state"
# What makes up the agent (a leaderboard entry) is the agent's to say (PPOAgent.state); the rest
# of the pod state (env physics, the environments' running returns, RNG streams, counters)
# belongs to the pod's own run.
STATE_VERSION = 1
EVAL_SEED_OFFSET = 1_000_003  # the eval envs' construction seed; their start states come from evaluate(seed)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for this pod: the accelerator's free memory, or the host's MemAvailable."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError):
        pass
    return None


def memory_estimate(cfg: Config, obs_dim: int, act_dim: int) -> dict[str, int]:
    """Bytes a pod allocates beyond its environments' own state, by part (an upper estimate)."""
    a, e = cfg.agent, cfg.env
    sizes = [obs_dim, *a.hidden_sizes]
    trunk = sum(x * y + y for x, y in zip(sizes, sizes[1:]))  # weights and biases of one hidden stack
    if a.algo != "ppo":  # actor + twin critics, each with a target copy; the replay ring
        critic = trunk + (act_dim * a.hidden_sizes[0]) + a.hidden_sizes[-1] + 1
        params = trunk + a.hidden_sizes[-1] * 2 * act_dim + 2 * critic
        rows = (a.buffer_size // e.num_envs) * e.num_envs
        return {
            "replay": rows * ReplayBuffer.bytes_per_row(obs_dim, act_dim),
            "networks": 2 * params * 4 * 4,  # online and target: weights, gradients, Adam's two moments
            "activations": 4 * a.batch_size * max(a.hidden_sizes) * len(a.hidden_sizes) * 4 * 3,
            "eval": 4 * cfg.eval.episodes * (obs_dim + max(a.hidden_sizes)) * 4,
        }
    params = 2 * trunk + a.hidden_sizes[-1] * (act_dim + 1)
    per_step = obs_dim + act_dim + 8  # obs, action, log-prob, value, next value, reward, flags, advantage
    batch = a.rollout_steps * e.num_envs
    widest = max(a.hidden_sizes)
    return {
        "rollout": 4 * batch * per_step * 2,  # the buffers and the flattened copies of an update
        "networks": 4 * params * 4,  # weights, gradients, Adam's two moments
        "activations": 4 * (batch // max(1, a.num_minibatches)) * widest * len(a.hidden_sizes) * 4,
        "eval": 4 * cfg.eval.episodes * (obs_dim + widest) * 4,
    }


def check_memory(cfg: Config, env: Any, device: torch.device) -> None:
    """Refuse, before allocating, a pod whose buffers and networks cannot fit this device."""
    parts = memory_estimate(cfg, env.obs_dim, env.act_dim)
    need, free = sum(parts.values()), available_memory(device)
    if free is not None and need > 0.9 * free:
        detail = ", ".join(f"{k} {v / 2**30:.1f} GiB" for k, v in parts.items())
        what = (
            f"agent.buffer_size ({cfg.agent.buffer_size:,})"
            if cfg.agent.algo != "ppo"
            else f"env.num_envs ({cfg.env.num_envs}), agent.rollout_steps ({cfg.agent.rollout_steps})"
        )
        raise MemoryError(
            f"this pod needs about {need / 2**30:.1f} GiB ({detail}) and {device} has {free / 2**30:.1f} GiB free. "
            f"Lower {what}, agent.hidden_sizes ({cfg.agent.hidden_sizes}) or eval.episodes ({cfg.eval.episodes})."
        )


Agent = PPOAgent | OffPolicyAgent
OFF_POLICY_AGENTS = {"sac": SACAgent, "td3": TD3Agent}


class Pod:
    """One agent training on one device."""

    def __init__(self, cfg: Config, rank: int = 0, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.rank = rank
        self.device = torch.device(device)
        self.seed = cfg.seed + rank
        e, a = cfg.env, cfg.agent
        # the task registry builds the env from cfg.env: its name, time limit and option section
        self.env = build_env(e, e.num_envs, self.device, self.seed)
        self.eval_env = build_env(e, cfg.eval.episodes, self.device, self.seed + EVAL_SEED_OFFSET)
        self._verdict_env = None  # built on first use (eval.final_episodes, podracer evaluate --episodes)
        # agent.compile: the training envs' step too (a torch env; the eval envs step eagerly)
        self.env_compiled = a.compile != "off" and compile_env(self.env, a.compile, self.device)
        check_memory(cfg, self.env, self.device)
        torch.manual_seed(self.seed)  # network initialization only; the loop uses self.gen
        self.agent = self._new_agent()
        self.kind = agent_kind(
            agent_config(cfg)["agent"]
        )  # which agents this pod can take (agents.settings.agent_kind)
        self.replay: ReplayBuffer | None = None  # off-policy pods: the replay ring, the pod's (not the agent's)
        if a.algo != "ppo":
            self.replay = ReplayBuffer(
                a.buffer_size,
                e.num_envs,
                self.env.obs_dim,
                self.env.act_dim,
                self.device,
                n_step=a.n_step,
                gamma=a.gamma,
            )
        self.learn_steps = 0  # off-policy: env steps of the batch since learning_starts (the update schedule)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(self.seed)
        self.obs = self.env.reset(self.seed)
        self.env_steps = 0
        self.updates = 0
        self.episodes_t = torch.zeros((), dtype=torch.int64, device=self.device)
        # the environments' running discounted returns (reward scaling): env state, the pod's
        self.reward_ret = torch.zeros(e.num_envs, dtype=torch.float64, device=self.device)
        self.batch_size = a.rollout_steps * e.num_envs
        if not self.env.discrete:
            lo = torch.as_tensor(self.env.action_low, dtype=torch.float32, device=self.device)
            hi = torch.as_tensor(self.env.action_high, dtype=torch.float32, device=self.device)
            self._act_center, self._act_half = (hi + lo) / 2, (hi - lo) / 2

    def prepare_training(self) -> None:
        """Pay before the training clock what a training process pays once: the agent's optimizers
        (built on first use, so that an agent that only acts never pays; the first torch optimizer
        of a process imports torch._dynamo, 1-3 s here). A run calls it at start-up."""
        agent = self.agent
        if hasattr(type(agent), "optimizers"):  # off-policy: {name: Adam}
            agent.optimizers
        else:
            agent.optimizer

    @property
    def backend(self) -> str:
        """Who steps the environments: ``torch`` (batched tensors on the device), or a MuJoCo backend."""
        return getattr(self.env, "backend", "torch")

    @property
    def env_exact(self) -> bool:
        """Whether a checkpoint holds the environments exactly (False for envs another library steps on the host)."""
        try:
            self.env.state_dict()
        except NotImplementedError:
            return False
        return True

    def _new_agent(self) -> Agent:
        """An agent initialized from the global torch RNG (seeded by the caller)."""
        a = dataclasses.replace(self.cfg.agent)  # a copy: PBT changes the pod's own
        if a.algo != "ppo":
            return OFF_POLICY_AGENTS[a.algo](self.env.obs_dim, self.env.act_dim, a, self.device)
        layout = self.env.asset_layout() if self.cfg.agent.network == "per_asset" else None
        return PPOAgent(
            self.env.obs_dim,
            self.env.act_dim,
            self.env.discrete,
            getattr(self.env, "num_actions", 0),
            self.cfg.env.num_envs,
            dataclasses.replace(self.cfg.agent),
            self.device,  # a copy: PBT changes the pod's own
            asset_layout=layout,
        )

    def reset_agent(self) -> None:
        """Re-initialize the agent as at the start (networks, optimizer, normalizers), keeping the
        pod's own hyperparameters and its environments (a NaN pod with no finite source anywhere)."""
        hp = self.hparams()
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            self.agent = self._new_agent()
        self.set_hparams(hp)

    # --- acting in the env ---------------------------------------------------------------
    def to_env_action(self, action: torch.Tensor) -> torch.Tensor:
        """Policy actions live in [-1, 1] (clipped here); the env gets its own units."""
        if self.env.discrete:
            return action
        return self._act_center + self._act_half * action.clamp(-1.0, 1.0)

    # --- the loop body -------------------------------------------------------------------
    def train_iteration(self) -> dict[str, torch.Tensor]:
        """One iteration of the pod's learner; returns metrics as tensors (no host sync)."""
        return self._ppo_iteration() if self.replay is None else self._offpolicy_iteration()

    def _ppo_iteration(self) -> dict[str, torch.Tensor]:
        """Collect one rollout and update."""
        cfg, agent, env = self.cfg.agent, self.agent, self.env
        T, N, dev = cfg.rollout_steps, env.num_envs, self.device
        act_shape = () if env.discrete else (env.act_dim,)
        obs_buf = torch.empty(T, N, env.obs_dim, device=dev)
        act_buf = torch.empty(T, N, *act_shape, device=dev, dtype=torch.long if env.discrete else torch.float32)
        logp_buf = torch.empty(T, N, device=dev)
        val_buf = torch.empty(T, N, device=dev)
        next_val_buf = torch.empty(T, N, device=dev)
        rew_buf = torch.empty(T, N, device=dev)
        term_buf = torch.empty(T, N, device=dev, dtype=torch.bool)
        done_buf = torch.empty(T, N, device=dev, dtype=torch.bool)
        ret_sum = torch.zeros((), device=dev, dtype=torch.float64)
        ret_sq = torch.zeros((), device=dev, dtype=torch.float64)
        ret_cnt = torch.zeros((), device=dev, dtype=torch.int64)

        send, recv = split_step(env)
        nobs = agent.normalize_obs(self.obs, update=True)
        value = agent.value(nobs)
        action, logp = agent.act(nobs, self.gen)
        send(self.to_env_action(action))
        for t in range(T):
            obs_buf[t], act_buf[t], logp_buf[t], val_buf[t] = nobs, action, logp, value
            obs, reward, terminated, truncated, info = recv()
            nobs = agent.normalize_obs(obs, update=True)
            if t + 1 < T:  # the next action goes out first: a host env steps it while this step is recorded
                action, logp = agent.act(nobs, self.gen)
                send(self.to_env_action(action))
            done = info["done"]
            rew_buf[t] = agent.scale_reward(reward, done, self.reward_ret)
            term_buf[t], done_buf[t] = terminated, done
            # Value of the state reached: the next obs, or the final obs of a cut episode.
            value = agent.value(nobs)
            if dev.type != "cpu" or bool(truncated.any()):  # the check is free on CPU only
                v_final = agent.value(agent.normalize_obs(info["final_obs"], update=False))
                next_val_buf[t] = torch.where(truncated, v_final, value)
            else:
                next_val_buf[t] = value
            ep_ret = info["episode_return"]
            ret_sum += (ep_ret * done).sum()
            ret_sq += (ep_ret.square() * done).sum()
            ret_cnt += done.sum()
        self.obs = obs

        adv, returns = compute_gae(
            rew_buf, val_buf, next_val_buf, term_buf, done_buf, cfg.gamma, agent.hparams["gae_lambda"]
        )
        self.env_steps += T * N
        progress = min(1.0, (self.env_steps - T * N) / max(1, self.cfg.total_env_steps))
        metrics = agent.update(
            obs_buf.reshape(T * N, -1),
            act_buf.reshape(T * N, *act_shape),
            logp_buf.reshape(-1),
            adv.reshape(-1),
            returns.reshape(-1),
            val_buf.reshape(-1),
            self.gen,
            progress,
        )
        self.updates += 1
        self.episodes_t += ret_cnt
        metrics["episodes"] = ret_cnt
        metrics["return_sum"] = ret_sum
        metrics["return_sqsum"] = ret_sq
        return metrics

    def _offpolicy_iteration(self) -> dict[str, torch.Tensor]:
        """``rollout_steps`` env steps of the batch into the replay ring, each followed by the
        updates due (uniform random actions until ``learning_starts`` transitions are stored).
        Metrics: the updates' mean losses (NaN without an update) and the episodes that ended."""
        cfg, agent, env, buf, dev = self.cfg.agent, self.agent, self.env, self.replay, self.device
        N = env.num_envs
        ret = torch.zeros(3, device=dev, dtype=torch.float64)  # sum, sum of squares, count of ended episodes
        sums: dict[str, torch.Tensor] = {}
        grad_steps = 0
        for _ in range(cfg.rollout_steps):
            nobs = agent.normalize_obs(self.obs, update=True)
            if self.env_steps < cfg.learning_starts:
                action = agent.random_action(N, self.gen)
            else:
                action, _ = agent.act(nobs, self.gen)
            obs, reward, terminated, truncated, info = env.step(self.to_env_action(action))
            done = info["done"]
            # the raw observation acted on and the one reached (the final one of an ended episode)
            buf.add(
                self.obs,
                action,
                agent.scale_reward(reward, done, self.reward_ret),
                info["final_obs"],
                terminated,
                truncated,
            )
            self.obs = obs
            self.env_steps += N
            ep_ret = info["episode_return"]
            ret += torch.stack([(ep_ret * done).sum(), (ep_ret.square() * done).sum(), done.sum().double()])
            if self.env_steps >= cfg.learning_starts:
                self.learn_steps += 1
                n = agent.updates_due(self.learn_steps)
                if n:
                    for k, v in agent.update(buf, self.gen, n).items():
                        sums[k] = sums.get(k, 0.0) + v * n
                    grad_steps += n
        self.updates += 1
        cnt = ret[2].to(torch.int64)
        self.episodes_t += cnt
        nan = torch.tensor(float("nan"), device=dev)

        def mean(k: str) -> torch.Tensor:
            return sums[k] / grad_steps if k in sums else nan

        return {
            "loss": mean("qf_loss") + mean("actor_loss"),
            "policy_loss": mean("actor_loss"),
            "value_loss": mean("qf_loss"),
            "entropy": mean("entropy"),
            "q_mean": mean("q_mean"),
            "alpha": mean("alpha"),
            "learning_rate": torch.tensor(agent.hparams["actor_lr"], device=dev),
            "approx_kl": nan,
            "clipfrac": nan,
            "explained_variance": nan,
            "grad_steps": torch.tensor(float(grad_steps), device=dev),
            "episodes": cnt,
            "return_sum": ret[0],
            "return_sqsum": ret[1],
        }

    # --- evaluation ----------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, seed: int, agent: Agent | None = None, episodes: int = 0) -> torch.Tensor:
        """Returns of deterministic episodes from the start states of ``seed`` (episode i from the
        state the task draws for ``seed`` and index i: every pod that passes the same seed meets
        the same states; fitness.eval_seed gives a run's seeds). ``agent``: another agent than the
        pod's own (a candidate evaluated before it is taken); ``episodes``: other than
        ``eval.episodes`` (the run's final verdict), on an env of its own built once."""
        agent = agent or self.agent
        env = self.eval_env
        if episodes and episodes != env.num_envs:
            if self._verdict_env is None or self._verdict_env.num_envs != episodes:
                self._verdict_env = build_env(self.cfg.env, episodes, self.device, self.seed + EVAL_SEED_OFFSET)
            env = self._verdict_env
        obs = env.reset(seed)
        n = env.num_envs
        returns = torch.zeros(n, dtype=torch.float64, device=self.device)
        running = torch.ones(n, dtype=torch.bool, device=self.device)
        check_every = 1 if self.device.type == "cpu" else 64  # a host sync on an accelerator
        for t in range(env.max_episode_steps):
            action = agent.act_deterministic(agent.normalize_obs(obs, update=False))
            obs, _, _, _, info = env.step(self.to_env_action(action))
            finished = info["done"] & running
            returns = torch.where(finished, info["episode_return"], returns)
            running &= ~info["done"]
            if t % check_every == check_every - 1 and not bool(running.any()):
                break  # every episode has ended (the eval env is reset before each evaluation)
        return returns

    # --- hyperparameters ----------------------------------------------------------------
    def hparams(self, names: tuple[str, ...] | list[str] | None = None) -> dict[str, float]:
        """The agent's current values of the mutable hyperparameters ``names`` (default: all of
        its learner's, agents.settings.mutable_hparams)."""
        return {n: self.agent.hparams[n] for n in (mutable_hparams(self.cfg.agent) if names is None else names)}

    def set_hparams(self, hp: dict[str, float]) -> None:
        self.agent.set_hparams(hp)

    # --- state ---------------------------------------------------------------------------
    def agent_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The agent alone (networks, optimizer, statistics, hyperparameters): a leaderboard entry."""
        t, meta = self.agent.state()
        meta.update(
            env_steps=self.env_steps,
            updates=self.updates,
            rank=self.rank,
            seed=self.seed,
            config=agent_config(self.cfg),
            algo=self.cfg.agent.algo,
            kind=self.kind,
            shapes={"obs": self.env.obs_dim, "act": self.env.act_dim},
        )
        return t, meta

    def agent_from(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], source: str = "entry") -> Agent:
        """Another agent (a leaderboard entry) in an agent of its own, to evaluate it before taking
        it; the pod's agent, environments and random streams are untouched."""
        self._check_compatible(meta, source)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            agent = self._new_agent()
        try:
            agent.load(tensors, meta, hparams=False, optimizer=False)
        except (RuntimeError, KeyError, ValueError) as e:
            raise safeio.StateFileError(f"{source}: does not fit this pod ({e}). Was the network changed?") from None
        return agent

    def load_agent(
        self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], source: str = "entry", load_hparams: bool = True
    ) -> None:
        """Take over another agent (not its environments); its hyperparameters only if
        ``load_hparams`` (the ElegantRL rule and a NaN restore keep the pod's own)."""
        self._check_compatible(meta, source)
        missing = [p for p in ("net.", "obs_rms.") if not any(k.startswith(p) for k in tensors)]
        if missing:
            raise safeio.StateFileError(f"{source}: holds no {', '.join(missing)} tensors; not an agent")
        try:
            self.agent.load(tensors, meta, hparams=load_hparams)
        except (RuntimeError, KeyError, ValueError) as e:
            raise safeio.StateFileError(f"{source}: does not fit this pod ({e}). Was the network changed?") from None

    def _check_compatible(self, meta: dict[str, Any], source: str) -> None:
        """Refuse an agent of another task or kind (another learner or network: agents.settings.agent_kind)."""
        cfg = meta.get("config", {})
        if cfg.get("env", {}).get("name") != self.cfg.env.name:
            raise safeio.StateFileError(
                f"{source}: trained on task {cfg.get('env', {}).get('name')!r}, this run is {self.cfg.env.name!r}"
            )
        kind = entry_kind(meta)
        if kind != self.kind:
            raise safeio.StateFileError(
                f"{source}: does not fit this pod: a {kind!r} agent, this pod is "
                f"{self.kind!r} (a pod takes only agents of its own learner and network)"
            )

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Everything needed to continue this pod exactly: (tensors, JSON-able meta)."""
        t, agent_meta = self.agent.state()
        t["reward_ret"] = self.reward_ret
        try:
            for k, v in self.env.state_dict().items():
                t[f"env.{k}"] = v
            t["obs"] = self.obs
            env_exact = True
        except NotImplementedError:  # a host backend (gymnasium, envpool) cannot be checkpointed
            env_exact = False
        t["gen_state"] = self.gen.get_state()
        t["cpu_rng_state"] = torch.get_rng_state()
        replay_meta = None
        if self.replay is not None:  # the stored transitions: a resume continues on the same buffer
            rt, replay_meta = self.replay.state()
            t.update({f"replay.{k}": v for k, v in rt.items()})
        meta = {
            "env_steps": self.env_steps,
            "updates": self.updates,
            "learn_steps": self.learn_steps,
            "replay": replay_meta,
            "episodes": int(self.episodes_t),
            "rank": self.rank,
            "seed": self.seed,
            "env_exact": env_exact,
            **agent_meta,
            "config": agent_config(self.cfg),  # the task and the agent; the whole config is the run's config.yaml
        }
        return t, meta

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], source: str = "state") -> None:
        """Restore from ``state_tensors`` output; refuses states of another shape or task."""
        self._check_compatible(meta, source)
        dev = self.device
        try:
            self.agent.load(tensors, meta, hparams=True)
            ret = tensors.get("reward_ret", tensors.get("reward_scaler.ret"))  # (its key in older state files)
            self.reward_ret.copy_(ret.to(dev))
            if meta.get("env_exact", True):
                self.env.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("env.")})
            if self.replay is not None:
                self.replay.load({k[7:]: v for k, v in tensors.items() if k.startswith("replay.")}, meta["replay"])
        except (RuntimeError, KeyError, ValueError, AttributeError, TypeError) as e:
            raise safeio.StateFileError(
                f"{source}: does not fit this pod ({e}). Was the network or num_envs changed since it was written?"
            ) from None
        if meta.get("env_exact", True):
            self.obs = tensors["obs"].to(dev)
        else:  # resumed with fresh episodes: the agent is exact, the environments restart
            self.obs = self.env.reset(self.seed + int(meta["updates"]))
        self.gen.set_state(tensors["gen_state"])
        torch.set_rng_state(tensors["cpu_rng_state"])
        self.env_steps = int(meta["env_steps"])
        self.updates = int(meta["updates"])
        self.learn_steps = int(meta.get("learn_steps", 0))
        self.episodes_t.fill_(int(meta.get("episodes", 0)))

    def save(self, path, extra_meta: dict[str, Any] | None = None) -> str:
        t, meta = self.state_tensors()
        meta.update(extra_meta or {})
        meta["saved_at"] = time.time()
        return safeio.save(path, t, meta, STATE_KIND, STATE_VERSION)

    def load(self, path) -> dict[str, Any]:
        """Restore from a checkpoint file; returns its meta."""
        tensors, meta, version = safeio.load(path, STATE_KIND)
        self.restore(tensors, meta, version, source=str(path))
        return meta

    def restore(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], version: int, source: str) -> None:
        """Restore from a checkpoint read already (safeio.load's three parts)."""
        if version != STATE_VERSION:
            raise safeio.StateFileError(
                f"{source}: pod-state layout version {version}, this podracer-hpc reads {STATE_VERSION}"
            )
        self.load_state(tensors, meta, source=source)


def entry_kind(meta: dict[str, Any]) -> str:
    """The kind of agent a checkpoint or leaderboard entry holds (agents.settings.agent_kind): its ``kind``,
    else from its config (an entry of an older version: PPO)."""
    return str(meta.get("kind") or agent_kind((meta.get("config") or {}).get("agent") or {}))
