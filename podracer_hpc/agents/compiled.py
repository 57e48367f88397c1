"""``agent.compile``: the agents' hot paths through torch.compile, with an eager fallback.

An agent hands its pure tensor functions (the rollout's policy step, the update's loss and
statistics) to :func:`compiled`; what comes back is called exactly as the eager function was.
Random draws stay outside (the caller draws its noise from its own generator and passes it in),
so a compiled agent consumes its random streams as the eager one does and the two agree up to
floating point reassociation (tests/agents/test_compiled.py states the tolerance). Where an update uses
autograd, its backward runs through AOTAutograd's compiled backward. Every agent, eager or
compiled, hands its gradients (written out, or ``torch.autograd.grad``'s) to the optimizer of
:mod:`podracer_hpc.agents.optimizer`. On a CPU the agents leave what ran slower compiled eager:
PPO's policy and value steps (``PPOAgent.CPU_EAGER``), the off-policy agents' actor loss and policy step
(``OffPolicyAgent.CPU_EAGER``); and inductor reads the CPU's vector ISAs from its flags
(:func:`trust_cpu_isa`).

Modes: ``off`` (eager, the default), ``on`` (torch.compile, inductor), ``cudagraphs`` (on a CUDA
device also CUDA graphs, torch.compile's ``reduce-overhead``; on a CPU the same as ``on``, with a
notice). Where compiling cannot work (:func:`compile_problem`: no C++ compiler or Python headers
for inductor's CPU kernels, no Triton on a GPU, a Python that TorchDynamo does not support) or the
first compiled call fails, the agent says why once on stderr and runs eagerly. Inductor's kernel
cache follows :func:`podracer_hpc.cluster.caches.node_caches` (``$PODRACER_CACHE_DIR/<host>/inductor``,
node-local under the launchers, so a requeued job on the same node compiles from its cache).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any, Callable

import torch

from podracer_hpc.agents.settings import COMPILE_MODES
from podracer_hpc.cluster.caches import node_caches

_told: set[str] = set()  # notices printed already (one per process and text)


def notice(text: str) -> None:
    """Print ``text`` once per process on stderr (the agents' compile notices)."""
    if text not in _told:
        _told.add(text)
        print(f"podracer: {text}", file=sys.stderr, flush=True)


def _names() -> list[str]:
    """The C++ compilers inductor would try on a CPU (its ``cpp.cxx`` setting: ``$CXX`` or g++)."""
    try:
        from torch._inductor import config as inductor_config

        return [str(c) for c in inductor_config.cpp.cxx if c]
    except Exception:  # noqa: BLE001  (an inductor without this setting: its documented default)
        return [os.environ.get("CXX", "g++")]


def _cxx() -> str | None:
    """The C++ compiler inductor would use on a CPU, if one is on PATH."""
    return next((n for n in _names() if shutil.which(n)), None)


def compile_problem(device: torch.device | str) -> str | None:
    """Why torch.compile cannot work for agents on ``device`` here, or None if it can.

    On a CPU inductor writes C++ kernels and builds them with a C++ compiler against the Python
    headers (the compiler: inductor's ``cpp.cxx`` setting, from ``$CXX``); on a GPU it writes
    Triton kernels."""
    dev = torch.device(device)
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            return f"TorchDynamo does not support Python {sys.version.split()[0]}"
    except ImportError as e:
        return f"torch.compile is not available in this torch ({e})"
    if dev.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile on a GPU needs Triton (pip install triton)"
        return None
    if dev.type != "cpu":
        return f"agent.compile supports cpu and cuda devices, not {dev.type}"
    if _cxx() is None:
        want = " or ".join(_names()) or "g++"
        return (
            f"no C++ compiler ({want}) on PATH: torch inductor builds its CPU kernels with one "
            "(install g++, or point $CXX at one)"
        )
    include = sysconfig.get_paths().get("include", "")
    if not (Path(include) / "Python.h").is_file():
        return (
            f"no Python headers ({include}/Python.h): torch inductor builds its CPU kernels against them "
            "(install python3-dev or the interpreter's headers)"
        )
    return None


def torch_mode(mode: str, device: torch.device) -> str | None:
    """The torch.compile ``mode`` for ``agent.compile``; cudagraphs on a CPU falls back with a notice."""
    if mode == "cudagraphs":
        if device.type == "cuda":
            return "reduce-overhead"
        notice(
            f"agent.compile=cudagraphs: CUDA graphs need a CUDA device, this pod runs on {device}: "
            "compiling without them (as agent.compile=on)"
        )
    return None


def usable(mode: str, device: torch.device | str) -> bool:
    """Whether ``agent.compile=mode`` compiles on ``device`` (False for ``off`` and, with a
    notice, where :func:`compile_problem` finds a reason). Sets up the node's compile caches."""
    if mode == "off":
        return False
    if mode not in COMPILE_MODES:
        raise ValueError(f"agent.compile must be {' | '.join(COMPILE_MODES)}, got {mode!r}")
    # before compile_problem: importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR (torch's
    # /tmp/torchinductor_<user>), which node_caches would then keep as the user's own setting
    node_caches()
    why = compile_problem(device)
    if why:
        notice(f"agent.compile={mode}: {why}; training eagerly")
        return False
    if torch.device(device).type == "cpu":
        trust_cpu_isa()
    return True


def trust_cpu_isa(environ: dict[str, str] | None = None) -> bool:
    """Let inductor take the CPU's vector instruction sets from its flags (``/proc/cpuinfo``)
    instead of proving each one: by default it builds a test program per instruction set (AMX,
    AVX-512 VNNI, AVX-512, AVX2) and loads each in a fresh Python, 8 of the 10 s of a first
    compile on a cold cache here and about 1 s of every later process (bench/RESULTS.md). The
    compiler is known to be there (:func:`compile_problem`); one that cannot build for a flag the
    CPU has fails the first compiled call, and the agent runs that function eagerly (with a
    notice). ``TORCHINDUCTOR_VEC_ISA_OK`` set by the user wins. Returns whether it set it."""
    env = os.environ if environ is None else environ
    if env.get("TORCHINDUCTOR_VEC_ISA_OK", "").strip():
        return False
    from torch._inductor import config as inductor_config

    if inductor_config.cpp.vec_isa_ok is not None:  # set already (by the user, or by us)
        return False
    inductor_config.cpp.vec_isa_ok = True
    return True


class Compiled:
    """``fn`` through torch.compile (fullgraph, static shapes), falling back to ``fn`` for good,
    with a notice, if compiling or the first compiled call fails. On CUDA graphs each call marks
    a new step and its outputs are copied out (a replay reuses its output buffers; the caller
    keeps a value or an action across the next call)."""

    def __init__(self, fn: Callable[..., Any], mode: str, device: torch.device, name: str):
        self.fn, self.name, self.agent_mode = fn, name, mode
        self.cuda_graphs = torch_mode(mode, device) == "reduce-overhead"
        self.compiled: Callable[..., Any] | None = torch.compile(
            fn, mode=torch_mode(mode, device), fullgraph=True, dynamic=False
        )
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        """Call the compiled function (the eager one after a failure)."""
        if self.compiled is None:
            return self.fn(*args)
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
            return _copy_out(self._first(*args) if not self.calls else self.compiled(*args))
        if self.calls:
            return self.compiled(*args)
        return self._first(*args)

    def _first(self, *args: Any) -> Any:
        """The first compiled call (where compiling happens), with the fallback."""
        assert self.compiled is not None
        try:
            out = self.compiled(*args)
        except Exception as e:  # noqa: BLE001  (any backend failure: the eager function still works)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            notice(
                f"agent.compile={self.agent_mode}: compiling {self.name} failed ({type(e).__name__}: "
                f"{first[:300]}); running it eagerly"
            )
            self.compiled = None
            return self.fn(*args)
        self.calls += 1
        return out


def _copy_out(out: Any) -> Any:
    """Tensors of ``out`` (a tensor, or tuples and lists of them: PPO's gradients come back as a
    list) copied out of CUDA graph buffers."""
    if isinstance(out, (tuple, list)):
        return type(out)(_copy_out(x) for x in out)
    return out.clone() if isinstance(out, torch.Tensor) else out


def compiled(fn: Callable[..., Any], mode: str, device: torch.device | str, name: str) -> Callable[..., Any]:
    """``fn`` compiled for ``agent.compile=mode`` on ``device``, or ``fn`` itself where it cannot be
    (``off``, or a reason from :func:`compile_problem`, told once)."""
    dev = torch.device(device)
    return Compiled(fn, mode, dev, name) if usable(mode, dev) else fn


def compile_env(env: Any, mode: str, device: torch.device | str) -> bool:
    """Compile the step of a torch env (``TorchVecEnv.compile``) for ``agent.compile=mode``; returns
    whether it did. Host backends (gymnasium, envpool, MuJoCo Warp's own graphs) step as they are.
    If the first compiled step fails, the env steps eagerly from then on (with a notice)."""
    if getattr(env, "backend", "torch") != "torch" or not callable(getattr(env, "compile", None)):
        return False
    if not hasattr(env, "pure_step") or not usable(mode, device):
        return False
    dev = torch.device(device)
    env.compile(mode=torch_mode(mode, dev))
    step = env._compiled_step
    state = {"ok": False}

    def guarded(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if state["ok"]:
            return step(*args)
        try:
            out = step(*args)
        except Exception as e:  # noqa: BLE001  (any backend failure: the eager step still works)
            notice(
                f"agent.compile={mode}: compiling the env step failed ({type(e).__name__}: "
                f"{str(e).strip()[:300]}); stepping it eagerly"
            )
            env._compiled_step = None
            env._cuda_graphs = False
            return env.pure_step(*args)
        state["ok"] = True
        return out

    env._compiled_step = guarded
    return True
