"""agent.compile: the compiled hot paths agree with eager ones, and fall back where they cannot work.

Compiling (torch inductor, C++ on this CPU) takes tens of seconds on two shared cores: each agent
has one tiny case (a pod of a few envs and 8-wide networks, two iterations), marked slow. CUDA
graphs (agent.compile=cudagraphs) cannot be tested without a GPU: their test skips here.

Tolerance: compiled and eager runs differ by floating point reassociation only (same random
draws: the noise is drawn outside the compiled code from the same generator). After two
iterations of updates the parameters agree within 1e-5 absolute (measured: 1.5e-8; they moved
by 2e-3 to 7e-3), the metrics within 1e-4 relative (plus 1e-5 absolute), the envs' observations
within 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import CACHE_HOST, env_without_caches

from podracer_hpc.agents import compiled as C
from podracer_hpc.cluster.caches import CACHE_VARS
from podracer_hpc.config import load_config
from podracer_hpc.docfield import ConfigError
from podracer_hpc.pod import Pod

PPO = [
    "env.name=pendulum",
    "env.num_envs=8",
    "agent.rollout_steps=8",
    "agent.num_minibatches=2",
    "agent.update_epochs=2",
    "agent.hidden_sizes=[8, 8]",
    "eval.episodes=2",
    "threads=1",
]
OFF = [
    "env.name=pendulum",
    "env.num_envs=8",
    "agent.rollout_steps=4",
    "agent.hidden_sizes=[8, 8]",
    "agent.batch_size=16",
    "agent.buffer_size=128",
    "agent.learning_starts=16",
    "agent.norm_obs=true",
    "eval.episodes=2",
    "threads=1",
]


def _pods(overrides: list[str], mode: str) -> tuple[Pod, Pod]:
    eager = Pod(load_config(None, overrides))
    fast = Pod(load_config(None, [*overrides, f"agent.compile={mode}"]))
    return eager, fast


def _agree(eager: Pod, fast: Pod, iterations: int = 2) -> None:
    start = {k: v.clone() for k, v in eager.agent.net.state_dict().items()}
    for _ in range(iterations):
        me, mf = eager.train_iteration(), fast.train_iteration()
        for k in me:
            if torch.isfinite(me[k]).all():
                torch.testing.assert_close(mf[k].double(), me[k].double(), rtol=1e-4, atol=1e-5, msg=k)
    moved = max(float((v - start[k]).abs().max()) for k, v in eager.agent.net.state_dict().items())
    assert moved > 0  # they trained
    worst = max(
        float((v - fast.agent.net.state_dict()[k]).abs().max()) for k, v in eager.agent.net.state_dict().items()
    )
    assert worst <= 1e-5, (worst, moved)
    torch.testing.assert_close(fast.obs, eager.obs, rtol=1e-5, atol=1e-5)  # the env stepped alike


@pytest.mark.slow
@pytest.mark.parametrize("env", ["pendulum", "cartpole"])
def test_a_compiled_ppo_pod_agrees_with_the_eager_one(env, one_torch_thread):
    """Pendulum: the written-out gradients compiled (one graph, no backward); CartPole
    (categorical actions): the loss with AOTAutograd's compiled backward."""
    if C.compile_problem("cpu"):
        pytest.skip(C.compile_problem("cpu"))
    eager, fast = _pods([*PPO, f"env.name={env}"], "on")
    assert fast.env_compiled and not eager.env_compiled
    _agree(eager, fast)
    hot = fast.agent.hot()
    step = "grads" if env == "pendulum" else "loss"
    assert fast.agent.written_out() == (step == "grads")
    assert hot["on"] and isinstance(hot[step], C.Compiled) and hot[step].compiled is not None  # not fallen back
    assert not any(isinstance(hot[k], C.Compiled) for k in fast.agent.CPU_EAGER)  # measured slower compiled here


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_compiled_offpolicy_pod_agrees_with_the_eager_one(algo, one_torch_thread):
    if C.compile_problem("cpu"):
        pytest.skip(C.compile_problem("cpu"))
    eager, fast = _pods([f"agent.algo={algo}", *OFF], "on")
    _agree(eager, fast, iterations=2)  # 32 transitions: updates from the end of the first iteration
    hot = fast.agent.hot()
    assert hot["on"] and isinstance(hot["critic loss"], C.Compiled) and hot["critic loss"].compiled is not None
    assert not any(isinstance(hot[k], C.Compiled) for k in fast.agent.CPU_EAGER)  # measured slower compiled here


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (none here)")
def test_cuda_graphs_agree_with_eager_on_a_gpu():
    eager = Pod(load_config(None, PPO), device="cuda")
    fast = Pod(load_config(None, [*PPO, "agent.compile=cudagraphs"]), device="cuda")
    _agree(eager, fast)
    assert fast.agent.hot()["loss"].cuda_graphs


def test_without_a_cpp_compiler_the_agent_says_so_and_trains_eagerly(monkeypatch, capsys, one_torch_thread):
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, "no-such-c++"))
    why = C.compile_problem("cpu")
    assert why and "no C++ compiler (no-such-c++) on PATH" in why
    eager, fast = _pods(PPO, "on")
    assert not fast.env_compiled
    err = capsys.readouterr().err
    assert "agent.compile=on: no C++ compiler (no-such-c++) on PATH" in err and "training eagerly" in err
    for _ in range(2):
        me, mf = eager.train_iteration(), fast.train_iteration()
        assert all(torch.equal(me[k], mf[k]) or not torch.isfinite(me[k]).all() for k in me)  # eager: bit for bit
    assert not fast.agent.hot()["on"]


def test_a_function_that_cannot_compile_falls_back_to_eager_once(capsys):
    def needs_the_host(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if float(x.sum()) > 0 else x  # a host read: no full graph

    if C.compile_problem("cpu"):
        pytest.skip(C.compile_problem("cpu"))
    fn = C.compiled(needs_the_host, "on", "cpu", "the probe")
    assert isinstance(fn, C.Compiled)
    assert torch.equal(fn(torch.ones(3)), torch.full((3,), 2.0))
    assert torch.equal(fn(-torch.ones(3)), -torch.ones(3)) and fn.compiled is None
    err = capsys.readouterr().err
    assert err.count("compiling the probe failed") == 1 and "running it eagerly" in err


def test_cuda_graphs_on_a_cpu_compile_without_them(capsys):
    assert C.torch_mode("cudagraphs", torch.device("cpu")) is None
    assert "CUDA graphs need a CUDA device" in capsys.readouterr().err
    assert C.torch_mode("on", torch.device("cuda")) is None
    assert C.torch_mode("cudagraphs", torch.device("cuda")) == "reduce-overhead"


def test_off_never_imports_the_compiler():
    fn = lambda x: x  # noqa: E731
    assert C.compiled(fn, "off", "cpu", "x") is fn


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_a_bad_compile_value_names_the_key(algo):
    with pytest.raises(ConfigError, match=r"agent.compile: must be off \| on \| cudagraphs, got 'fast'"):
        load_config(None, [f"agent.algo={algo}", "agent.compile=fast"])
    assert load_config(None, [f"agent.algo={algo}", "agent.compile=off"]).agent.compile == "off"  # not YAML's False


def test_the_caches_go_to_the_node_directory(tmp_path, monkeypatch):
    if C.compile_problem("cpu"):  # (its import of torch._dynamo sets TORCHINDUCTOR_CACHE_DIR: first)
        pytest.skip(C.compile_problem("cpu"))
    monkeypatch.setenv("PODRACER_CACHE_DIR", str(tmp_path))
    # usable() points every compile cache of this process at tmp_path: each variable is restored
    # after the test (set, then deleted, so that monkeypatch records its value or its absence), or
    # the worker's later MuJoCo Warp tests would compile their kernels into this test's folder
    for var in CACHE_VARS:
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    assert C.usable("on", "cpu")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / CACHE_HOST / "inductor")


def test_inductor_takes_the_cpus_vector_isas_from_its_flags_unless_the_user_says(monkeypatch):
    """The ISA probe (a test build and a fresh Python per instruction set: 8 s of a cold first
    compile here) is skipped; a user's TORCHINDUCTOR_VEC_ISA_OK, or a value set already, wins."""
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "vec_isa_ok", None)
    assert not C.trust_cpu_isa({"TORCHINDUCTOR_VEC_ISA_OK": "0"}) and inductor_config.cpp.vec_isa_ok is None
    assert C.trust_cpu_isa({}) and inductor_config.cpp.vec_isa_ok is True
    monkeypatch.setattr(inductor_config.cpp, "vec_isa_ok", False)
    assert not C.trust_cpu_isa({}) and inductor_config.cpp.vec_isa_ok is False
    if not C.compile_problem("cpu"):
        monkeypatch.setattr(inductor_config.cpp, "vec_isa_ok", None)
        monkeypatch.delenv("TORCHINDUCTOR_VEC_ISA_OK", raising=False)
        assert C.usable("on", "cpu") and inductor_config.cpp.vec_isa_ok is True  # what an agent's compile does


def test_cuda_graph_outputs_are_copied_out_however_they_are_nested():
    """A CUDA graph's replay reuses its output buffers: tensors in tuples and lists (PPO's gradients
    come back as ``(list, stats)``) are copied; on a CPU the copy is what is checked."""
    grads, stats = [torch.ones(2), torch.zeros(3)], torch.arange(3.0)
    out = C._copy_out((grads, stats))
    assert isinstance(out, tuple) and isinstance(out[0], list)
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip([*out[0], out[1]], [*grads, stats]))


def test_a_fresh_process_puts_inductors_cache_in_the_node_directory(tmp_path):
    """In a new Python whose first pod is built without resolve_device (which sets the caches for
    `podracer train`), as `podracer evaluate` and `export` build theirs, usable() sets the node's
    caches itself: before its import of torch._dynamo, which sets TORCHINDUCTOR_CACHE_DIR to torch's
    own /tmp default, else taken for the user's."""
    if C.compile_problem("cpu"):
        pytest.skip(C.compile_problem("cpu"))
    env = env_without_caches()
    code = "import json, os; from podracer_hpc.agents import compiled as C; ok = C.usable('on', 'cpu'); "
    code += "print(json.dumps([ok, os.environ.get('TORCHINDUCTOR_CACHE_DIR')]))"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "PODRACER_CACHE_DIR": str(tmp_path)}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    ok, inductor = json.loads(out.stdout.strip().splitlines()[-1])
    assert ok and inductor == str(tmp_path / CACHE_HOST / "inductor")
