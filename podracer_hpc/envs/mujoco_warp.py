"""The MuJoCo v5 locomotion tasks on MuJoCo Warp: every world on the pod's device, no host copy.

``backend: warp`` of :mod:`podracer_hpc.envs.mujoco`. MuJoCo Warp (``mujoco_warp``, on NVIDIA
Warp) steps ``num_envs`` worlds of gymnasium's own v5 MJCF model as one batch; observations,
rewards, terminations and resets are torch ops on zero-copy ``wp.to_torch`` views of the
simulator's arrays, on the same device (CUDA, or Warp's CPU device). Nothing crosses to the host
on a CUDA step (no ``.item()``, no ``.any()``), so a step is graph launches plus a few dozen small
torch kernels.

What a step does, as gymnasium's ``<Task>-v5`` with its default arguments:

- ``ctrl = action`` (unclipped, as gymnasium; the simulator clamps to ``ctrlrange``), then
  ``frame_skip`` physics steps (``mj_step`` with ``nstep=frame_skip``) and one
  ``mj_rnePostConstraint`` (for ``cfrc_ext``) where the task observes contact forces;
- the observation, reward and termination of the v5 task (``_TASKS`` below holds every weight,
  range and noise scale of the v5 defaults; docs/mujoco.md lists where this backend differs);
- the 1000-step time limit (``max_episode_steps``), same-step auto-reset of finished worlds
  (gymnasium's ``reset_model`` noise: uniform on ``qpos``, uniform or normal on ``qvel``,
  drawn from the project's per-env counter-based streams, :mod:`podracer_hpc.envs.rng`).

The physics steps (and, for ant and humanoid, the kinematics of restarted worlds) are captured
once into a Warp graph (a CUDA graph on a GPU; Warp's CPU graph replay on the CPU) and launched
on torch's current stream, so torch and Warp work is ordered without synchronizing.

Every state the simulation carries from one step to the next is in torch tensors or in the
simulator's own arrays, so the env can be checkpointed exactly (``state_dict``): ``qpos, qvel,
act, qacc_warmstart`` (the solver's warm start), the clocks, the RNG streams and the positions
the next forward velocity is measured from. On a GPU, contact order comes from atomics, so two
runs may differ in the last bits (as any GPU simulation); on the CPU they are bitwise equal.
"""

from __future__ import annotations

import importlib.util
import os
import time
import warnings
from dataclasses import dataclass

import torch

from podracer_hpc.envs.rng import BatchRNG

INSTALL_HINT = (
    "pip install 'podracer-hpc[warp]' (warp-lang==1.19.0 mujoco-warp==4.0.0; gymnasium for the "
    "v5 models), or use backend 'envpool' or 'gymnasium'"
)


@dataclass(frozen=True)
class _Task:
    """The defaults of one gymnasium v5 task (the keyword arguments of its ``__init__``)."""

    gym_id: str  # as envs.mujoco.GYM_IDS (that module imports this one for backend warp; never the reverse)
    xml: str
    frame_skip: int
    forward_reward_weight: float
    ctrl_cost_weight: float
    reset_noise_scale: float
    qvel_noise: str  # "uniform": U(-s, s); "normal": s * N(0, 1)
    skip_qpos: int  # exclude_current_positions_from_observation: the first 1 (planar) or 2 (x, y) qpos
    healthy_reward: float = 0.0  # 0: no health (halfcheetah never terminates)
    clip_qvel: float = 0.0  # hopper, walker2d observe clip(qvel, -10, 10)
    contact_cost_weight: float = 0.0


_TASKS: dict[str, _Task] = {
    "halfcheetah": _Task("HalfCheetah-v5", "half_cheetah.xml", 5, 1.0, 0.1, 0.1, "normal", 1),
    "hopper": _Task("Hopper-v5", "hopper.xml", 4, 1.0, 1e-3, 5e-3, "uniform", 1, healthy_reward=1.0, clip_qvel=10.0),
    "walker2d": _Task(
        "Walker2d-v5", "walker2d_v5.xml", 4, 1.0, 1e-3, 5e-3, "uniform", 1, healthy_reward=1.0, clip_qvel=10.0
    ),
    "ant": _Task("Ant-v5", "ant.xml", 5, 1.0, 0.5, 0.1, "normal", 2, healthy_reward=1.0, contact_cost_weight=5e-4),
    "humanoid": _Task(
        "Humanoid-v5", "humanoid.xml", 5, 1.25, 0.1, 1e-2, "uniform", 2, healthy_reward=5.0, contact_cost_weight=5e-7
    ),
}
# Task-specific thresholds of the v5 defaults (used in ``_healthy``).
_HOPPER_STATE, _HOPPER_Z, _HOPPER_ANGLE = 100.0, 0.7, 0.2  # healthy_state_range, healthy_z_range, angle range
_WALKER_Z, _WALKER_ANGLE = (0.8, 2.0), 1.0
_ANT_Z, _ANT_CONTACT_FORCE = (0.2, 1.0), 1.0  # healthy_z_range (inclusive), contact_force_range
_HUMANOID_Z, _HUMANOID_CONTACT_COST_MAX = (1.0, 2.0), 10.0


def _import_warp():
    """``(warp, mujoco, mujoco_warp)``, or an ImportError that says what to install."""
    try:
        import mujoco
        import mujoco_warp as mjw
        import warp as wp
    except ImportError as e:
        raise ImportError(f"backend 'warp' needs MuJoCo Warp ({e}); {INSTALL_HINT}") from None
    if not os.environ.get("PODRACER_WARP_VERBOSE"):
        # Warp prints a banner and one line per compiled module (hundreds): keep warnings only.
        wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)
    return wp, mujoco, mjw


def model_path(task: str) -> str:
    """gymnasium's v5 MJCF file of ``task`` (the same file ``gym.make`` loads).

    Found without importing gymnasium's MuJoCo package (which pulls in its renderer).
    """
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"backend 'warp' loads gymnasium's v5 models: pip install gymnasium ({INSTALL_HINT})")
    return os.path.join(list(spec.submodule_search_locations)[0], "envs", "mujoco", "assets", _TASKS[task].xml)


def load_model(task: str):
    """The host ``mujoco.MjModel`` the warp backend simulates (gymnasium's, with the noted changes)."""
    _, mujoco, _ = _import_warp()
    m = mujoco.MjModel.from_xml_path(model_path(task))
    if m.opt.solver == mujoco.mjtSolver.mjSOL_PGS:  # humanoid.xml: MuJoCo Warp has no PGS solver
        m.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    return m


def _warp_device(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{torch.cuda.current_device() if device.index is None else device.index}"
    raise ValueError(f"backend 'warp' runs on cuda or cpu, not {device}")


class WarpMujoco:
    """``num_envs`` worlds of a MuJoCo v5 task on MuJoCo Warp, behind the VecEnv protocol.

    Options: ``graph`` (capture the physics into a Warp graph; default True), ``nconmax`` and
    ``njmax`` (contacts and constraint rows per world; 0 = MuJoCo Warp's defaults, which hold the
    most any task reached under random actions with room to spare).
    """

    backend = "warp"
    discrete = False
    num_actions = 0

    def __init__(
        self,
        task: str,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: torch.dtype = torch.float32,
        graph: bool = True,
        nconmax: int = 0,
        njmax: int = 0,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if task not in _TASKS:
            raise ValueError(f"unknown MuJoCo task {task!r}; known: {', '.join(_TASKS)}")
        wp, mujoco, mjw = _import_warp()
        self._wp, self._mjw = wp, mjw
        self.task, self.spec = task, _TASKS[task]
        self.gym_id = self.spec.gym_id
        self.num_envs = n = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_episode_steps = int(max_episode_steps) or 1000
        self.seed = seed
        self._wpdev = _warp_device(self.device)
        self._tdev = torch.device(self._wpdev)

        t0 = time.perf_counter()
        mjm = load_model(task)
        self.mjm = mjm
        self.nq, self.nv, self.act_dim = mjm.nq, mjm.nv, mjm.nu
        lo, hi = mjm.actuator_ctrlrange[:, 0], mjm.actuator_ctrlrange[:, 1]
        self.action_low, self.action_high = float(lo.min()), float(hi.max())
        self.dt = float(mjm.opt.timestep) * self.spec.frame_skip
        with wp.ScopedDevice(self._wpdev):
            self.m = mjw.put_model(mjm)
            self.d = mjw.make_data(mjm, nworld=n, nconmax=nconmax or None, njmax=njmax or None)
        d = self.d
        v = wp.to_torch  # zero-copy views of the simulator's arrays (same memory, same device)
        self._qpos, self._qvel, self._ctrl = v(d.qpos), v(d.qvel), v(d.ctrl)
        self._warm, self._time = v(d.qacc_warmstart), v(d.time)
        self._act = v(d.act) if mjm.na else None
        self._cfrc_ext = v(d.cfrc_ext) if task in ("ant", "humanoid") else None  # [N, nbody, 6]
        if task == "humanoid":
            self._cinert, self._cvel, self._qfrc_act = v(d.cinert), v(d.cvel), v(d.qfrc_actuator)
            self._xipos = v(d.xipos)
            mass = torch.as_tensor(mjm.body_mass, dtype=torch.float32, device=self._tdev)
            self._mass_w = mass / mass.sum()
        if task == "ant":
            self._xpos = v(d.xpos)
        self._qpos0 = torch.as_tensor(mjm.qpos0, dtype=torch.float32, device=self._tdev)  # gymnasium's init_qpos
        self.obs_dim = int(self._observe().shape[1])

        self._graph = bool(graph)
        # CUDA: never read a tensor on the host in ``step`` (restart candidates for every world).
        # On the CPU checking is free, so the restart is skipped when nobody finished (same results).
        self._sync_free = self._tdev.type == "cuda"
        self._stream, self._stream_handle = None, None
        self._physics = self._capture(self._physics_fn)
        self._restart = self._capture(self._kinematics_fn) if task in ("ant", "humanoid") else None
        self.compile_s = time.perf_counter() - t0  # model upload and kernel compilation (cached by Warp)

        self.rng = BatchRNG(seed, n, self._tdev)
        self.t = torch.zeros(n, dtype=torch.int64, device=self._tdev)
        self.ep_return = torch.zeros(n, dtype=torch.float64, device=self._tdev)
        self._pos = torch.zeros(n, 2, dtype=torch.float32, device=self._tdev)  # where velocity is measured from
        self.reset(seed)

    # --- the simulator ------------------------------------------------------------------
    def _physics_fn(self) -> None:
        for _ in range(self.spec.frame_skip):
            self._mjw.step(self.m, self.d)
        if self._cfrc_ext is not None:
            self._mjw.rne_postconstraint(self.m, self.d)  # gymnasium's mj_rnePostConstraint: cfrc_ext

    def _kinematics_fn(self) -> None:
        """What gymnasium's ``set_state`` (``mj_forward``) gives a restarted ant or humanoid to observe."""
        self._mjw.kinematics(self.m, self.d)
        self._mjw.com_pos(self.m, self.d)
        self._mjw.com_vel(self.m, self.d)

    def _wp_stream(self):
        """torch's current CUDA stream as a Warp stream (cached), so both queue on one stream."""
        ts = torch.cuda.current_stream(self._tdev)
        if ts.cuda_stream != self._stream_handle:
            self._stream, self._stream_handle = self._wp.stream_from_torch(ts), ts.cuda_stream
        return self._stream

    def _capture(self, fn):
        """A Warp graph of ``fn`` (run once first: that compiles and loads every kernel it launches).

        Without a graph (``graph=False``, or where capture fails) ``fn`` itself is replayed.
        """
        wp = self._wp
        self._run_now(fn)
        if not self._graph:
            return fn
        try:
            with wp.ScopedDevice(self._wpdev):
                if self._tdev.type == "cuda":
                    torch.cuda.synchronize(self._tdev)
                    wp.synchronize_device(self._wpdev)
                with wp.ScopedCapture(device=self._wpdev) as cap:
                    fn()
        except Exception as e:  # noqa: BLE001 - any capture failure: step eagerly instead
            warnings.warn(
                f"MuJoCo Warp: graph capture failed on {self._wpdev} ({type(e).__name__}: {e}); "
                "stepping without a graph (slower)",
                RuntimeWarning,
                stacklevel=3,
            )
            return fn
        return cap.graph

    def _run_now(self, fn) -> None:
        wp = self._wp
        with wp.ScopedDevice(self._wpdev):
            if self._tdev.type == "cuda":
                with wp.ScopedStream(self._wp_stream()):
                    fn()
            else:
                fn()

    def _launch(self, g) -> None:
        if not isinstance(g, self._wp.Graph):  # eager: the function itself
            return self._run_now(g)
        if self._tdev.type == "cuda":
            self._wp.capture_launch(g, stream=self._wp_stream())
        else:
            self._wp.capture_launch(g)

    # --- the task ----------------------------------------------------------------------
    def _observe(self) -> torch.Tensor:
        """The v5 observation of every world from the simulator's current arrays ``[N, obs_dim]``."""
        s = self.spec
        qvel = self._qvel.clamp(-s.clip_qvel, s.clip_qvel) if s.clip_qvel else self._qvel
        parts = [self._qpos[:, s.skip_qpos :], qvel]
        n = self.num_envs
        if self.task == "ant":  # contact_forces = clip(cfrc_ext, -1, 1), bodies 1..
            parts.append(self._cfrc_ext[:, 1:].clamp(-_ANT_CONTACT_FORCE, _ANT_CONTACT_FORCE).reshape(n, -1))
        elif self.task == "humanoid":
            parts += [
                self._cinert[:, 1:].reshape(n, -1),
                self._cvel[:, 1:].reshape(n, -1),
                self._qfrc_act[:, 6:],
                self._cfrc_ext[:, 1:].reshape(n, -1),
            ]
        return torch.cat(parts, dim=1).to(self.dtype)

    def _position(self) -> torch.Tensor:
        """``[N, 2]`` what the v5 forward velocity differentiates (x only, padded, for planar tasks).

        As in gymnasium, ant and humanoid read the simulator's body positions after the step,
        which MuJoCo computed at the last integration stage (not at the new ``qpos``).
        """
        if self.task == "ant":  # data.body(main_body=1).xpos[:2]
            return self._xpos[:, 1, :2].clone()
        if self.task == "humanoid":  # mass_center: body_mass-weighted xipos
            return torch.einsum("b,nbj->nj", self._mass_w, self._xipos[:, :, :2])
        return torch.nn.functional.pad(self._qpos[:, :1], (0, 1))

    def _healthy(self) -> torch.Tensor:
        q, qd = self._qpos, self._qvel
        t = self.task
        if t == "hopper":
            state = torch.cat([q[:, 2:], qd], dim=1)
            return (
                ((state > -_HOPPER_STATE) & (state < _HOPPER_STATE)).all(1)
                & (q[:, 1] > _HOPPER_Z)
                & (q[:, 2] > -_HOPPER_ANGLE)
                & (q[:, 2] < _HOPPER_ANGLE)
            )
        if t == "walker2d":
            return (
                (q[:, 1] > _WALKER_Z[0])
                & (q[:, 1] < _WALKER_Z[1])
                & (q[:, 2] > -_WALKER_ANGLE)
                & (q[:, 2] < _WALKER_ANGLE)
            )
        if t == "ant":
            finite = torch.isfinite(q).all(1) & torch.isfinite(qd).all(1)
            return finite & (q[:, 2] >= _ANT_Z[0]) & (q[:, 2] <= _ANT_Z[1])
        if t == "humanoid":
            return (q[:, 2] > _HUMANOID_Z[0]) & (q[:, 2] < _HUMANOID_Z[1])
        return torch.ones(self.num_envs, dtype=torch.bool, device=self._tdev)

    def _reward(self, action: torch.Tensor, velocity: torch.Tensor, healthy: torch.Tensor) -> torch.Tensor:
        s = self.spec
        reward = s.forward_reward_weight * velocity[:, 0] - s.ctrl_cost_weight * action.square().sum(1)
        if s.healthy_reward:
            reward = reward + s.healthy_reward * healthy.float()
        if self.task == "ant":
            f = self._cfrc_ext.clamp(-_ANT_CONTACT_FORCE, _ANT_CONTACT_FORCE)
            reward = reward - s.contact_cost_weight * f.square().sum((1, 2))
        elif self.task == "humanoid":
            cost = s.contact_cost_weight * self._cfrc_ext.square().sum((1, 2))
            reward = reward - cost.clamp(max=_HUMANOID_CONTACT_COST_MAX)
        return reward

    # --- restarts -----------------------------------------------------------------------
    def _noise(self, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """gymnasium's ``reset_model`` start state for every world; only ``mask`` worlds use up randomness."""
        s, nq, nv = self.spec, self.nq, self.nv
        normal = s.qvel_noise == "normal"
        u = self.rng.uniform(nq + (2 * nv if normal else nv), mask, dtype=torch.float64)
        sc = s.reset_noise_scale
        qpos = self._qpos0.double() + sc * (2 * u[:, :nq] - 1)
        if normal:  # Box-Muller on two uniforms per dof (1 - u is in (0, 1]: the log is finite)
            u1, u2 = u[:, nq : nq + nv], u[:, nq + nv :]
            qvel = sc * torch.sqrt(-2 * torch.log1p(-u1)) * torch.cos(2 * torch.pi * u2)
        else:
            qvel = sc * (2 * u[:, nq:] - 1)
        return qpos.float(), qvel.float()

    def _set(self, mask: torch.Tensor, qpos: torch.Tensor, qvel: torch.Tensor) -> None:
        """Restart the ``mask`` worlds at ``(qpos, qvel)`` as ``mj_resetData`` + ``set_state`` do."""
        m = mask[:, None]
        self._qpos.copy_(torch.where(m, qpos, self._qpos))
        self._qvel.copy_(torch.where(m, qvel, self._qvel))
        self._ctrl.masked_fill_(m, 0.0)
        self._warm.masked_fill_(m, 0.0)
        self._time.masked_fill_(mask, 0.0)
        if self._act is not None:
            self._act.masked_fill_(m, 0.0)
        if self._cfrc_ext is not None:  # mj_resetData zeroes it and mj_forward does not compute it
            self._cfrc_ext.masked_fill_(mask[:, None, None], 0.0)
        if self.task == "humanoid":  # qfrc_actuator of ctrl = 0 (motors without bias): zero
            self._qfrc_act.masked_fill_(m, 0.0)
        if self._restart is not None:
            self._launch(self._restart)

    # --- the protocol -------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every world; a seed restarts every stream (same seed: same starts)."""
        if seed is not None:
            self.seed = seed
            self.rng = BatchRNG(seed, self.num_envs, self._tdev)
        qpos, qvel = self._noise(None)
        return self._start(qpos, qvel)

    def reset_to(self, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        """Start every world's episode at the given state (gymnasium: ``reset`` then ``set_state``)."""
        q = torch.as_tensor(qpos, dtype=torch.float32, device=self._tdev).expand(self.num_envs, self.nq)
        qd = torch.as_tensor(qvel, dtype=torch.float32, device=self._tdev).expand(self.num_envs, self.nv)
        return self._start(q, qd)

    def _start(self, qpos: torch.Tensor, qvel: torch.Tensor) -> torch.Tensor:
        self._set(torch.ones(self.num_envs, dtype=torch.bool, device=self._tdev), qpos, qvel)
        self.t.zero_()
        self.ep_return.zero_()
        self._pos = self._position()
        return self._out(self._observe())

    def _out(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.device == self.device else x.to(self.device)

    def step(self, action: torch.Tensor):
        a = action.detach().to(self._tdev, torch.float32).reshape(self.num_envs, self.act_dim)
        self._ctrl.copy_(a)
        self._launch(self._physics)
        final_obs = self._observe()
        pos = self._position()
        healthy = self._healthy()
        reward = self._reward(a, (pos - self._pos) / self.dt, healthy)
        terminated = ~healthy if self.spec.healthy_reward else torch.zeros_like(healthy)
        # A diverged world (NaN/inf state; MuJoCo C would reset it with a warning) ends as terminated.
        bad = ~(torch.isfinite(self._qpos).all(1) & torch.isfinite(self._qvel).all(1))
        terminated = terminated | bad
        final_obs = torch.where(bad[:, None], 0.0, final_obs).to(self.dtype)
        reward = torch.where(bad, 0.0, reward)
        t = self.t + 1
        truncated = (t >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        ep_ret = self.ep_return + reward.double()
        obs, self._pos = final_obs, pos
        if self._sync_free or bool(done.any()):
            qpos, qvel = self._noise(done)
            self._set(done, qpos, qvel)
            obs = torch.where(done[:, None], self._observe(), final_obs)
            self._pos = torch.where(done[:, None], self._position(), pos)
        self.t = torch.where(done, 0, t)
        self.ep_return = torch.where(done, 0.0, ep_ret)
        info = {
            "final_obs": self._out(final_obs),
            "done": self._out(done),
            "episode_return": self._out(ep_ret),
            "episode_length": self._out(t),
        }
        return self._out(obs), self._out(reward), self._out(terminated), self._out(truncated), info

    def close(self) -> None:
        if self._tdev.type == "cuda":
            self._wp.synchronize_device(self._wpdev)

    # --- exact checkpoints ----------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything the next step depends on: physics state, warm start, clocks, RNG streams."""
        sd = {
            "qpos": self._qpos.clone(),
            "qvel": self._qvel.clone(),
            "qacc_warmstart": self._warm.clone(),
            "time": self._time.clone(),
            "pos": self._pos.clone(),
            "t": self.t.clone(),
            "ep_return": self.ep_return.clone(),
            **{f"rng.{k}": v for k, v in self.rng.state_dict().items()},
        }
        if self._act is not None:
            sd["act"] = self._act.clone()
        return sd

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        if tuple(sd["qpos"].shape) != tuple(self._qpos.shape):
            raise ValueError(
                f"env state has shape {tuple(sd['qpos'].shape)}, expected {tuple(self._qpos.shape)} "
                "(was num_envs changed since the checkpoint?)"
            )
        for name, dst in (
            ("qpos", self._qpos),
            ("qvel", self._qvel),
            ("qacc_warmstart", self._warm),
            ("time", self._time),
            ("act", self._act),
        ):
            if dst is not None:
                dst.copy_(sd[name].to(dst.device, dst.dtype))
        self._ctrl.zero_()
        if self._restart is not None:  # observation-only quantities are recomputed by the next step
            self._launch(self._restart)
        self._pos = sd["pos"].to(self._tdev, torch.float32).clone()
        self.t = sd["t"].to(self._tdev).clone()
        self.ep_return = sd["ep_return"].to(self._tdev).clone()
        self.rng.load_state_dict({"key": sd["rng.key"], "counter": sd["rng.counter"]})
