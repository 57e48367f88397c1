#!/usr/bin/env bash
# One prepared GPU check (at most about 10 minutes on one GPU): env throughput eager and
# compiled (CUDA graphs), end-to-end PPO throughput, a short Pendulum learning run, an off-policy
# (SAC) pod on thousands of envs (Pendulum, and HalfCheetah on MuJoCo Warp), MuJoCo Warp
# (correctness of one step against MuJoCo C, env steps/s, PPO on it) and the stock-trading env, on
# cuda:0. Prints tables and JSON lines; copy the output into bench/RESULTS.md (and bench/HISTORY.md) with the date and
# the device. Usage on the GPU machine, from the repo root:
#   bash bench/gpu_check.sh [all|core|warp|study]   # python3 from PATH (torch with CUDA installed)
# core: the pendulum/cartpole envs, PPO and the stock-trading env (about 5 minutes);
# warp: MuJoCo Warp (needs warp-lang, mujoco-warp, mujoco, gymnasium; about 3.5 minutes);
# study: the scaling study on one GPU, jobs/studies/pendulum_scaling_gpu.yaml: 1, 2, 4, 8 pods sharing
#   the GPU, 3 seeds, and RLlib with a GPU learner where .venv-rllib exists (about 5 minutes; not in all).
#   The pods share the GPU on purpose (device=cuda:shared in the study file).
# device: a pod's GPU set-up (podracer_hpc/cluster/device.py): the device from the local rank and
#   its checks, the start line, per-node caches, and with 2+ GPUs one GPU per pod under mpiexec
#   (about 1 minute; also first in all).
# jax: env.name: jax on cuda:0, needs a CUDA jax next to torch (pip install 'jax[cuda12]'):
#   the adapter on the GPU against the same env on the CPU, zero copy and JAX not preallocating the GPU,
#   env steps/s vs the torch Pendulum at 4,096 to 1M envs, PPO end to end (about 2 minutes; also in all);
#   where MuJoCo Playground imports too (PY=.venv-mjx/bin/python with jax[cuda12], docs/jax.md), its
#   CartpoleBalance through the adapter vs Playground's own jit(vmap(step)), MJX's jax and warp
#   implementations, 4,096 and 65,536 envs, and PPO on it end to end (about 3 more minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export PYTHONUNBUFFERED=1
PART=${1:-all}
case "$PART" in all|core|warp|study|device|jax) ;; *) echo "usage: bash bench/gpu_check.sh [all|core|warp|study|device|jax]" >&2; exit 2;; esac
run() { echo; echo "### $*"; timeout "${STEP_TIMEOUT:-60}" "$@" || echo "(step failed or timed out: rc=$?)"; }

$PY - <<'PYEOF'
import torch, platform
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE", "python", platform.python_version())
PYEOF
if [[ $PART == device || $PART == all ]]; then
  # What the CPU-only test machine cannot show. Each line says ok or FAIL; with one GPU the
  # multi-GPU binding is reported as not verified.
  STEP_TIMEOUT=120 run env PODRACER_CACHE_DIR=/tmp/podracer-gpu-check-cache $PY - <<'PYEOF'
import os, socket, subprocess, sys, torch
from podracer_hpc import device as D
def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail else ''}", flush=True)
env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PODRACER_GPU"))}
dev = D.resolve_device("auto", 0, 1, environ=dict(env))
check("auto -> cuda:0, set as the current device", dev == torch.device("cuda", 0) and torch.cuda.current_device() == 0, dev)
line = D.start_line(0, socket.gethostname(), dev, torch.get_num_threads(), "torch", world_size=1, local_rank=0)
check("start line names the GPU and CUDA", torch.cuda.get_device_name(0) in line and f"CUDA {torch.version.cuda}" in line, line)
check("GPU UUID readable", D._gpu_uuid(0).startswith("GPU-") or "-" in D._gpu_uuid(0), D._gpu_uuid(0))
n = torch.cuda.device_count()
try:
    D.resolve_device(f"cuda:{n}", environ=dict(env)); check("cuda:<count> refused", False)
except D.DeviceError as e:
    check("cuda:<count> refused", True, e)
bound = {**env, "PODRACER_GPU_BIND": "per-task", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
r = subprocess.run([sys.executable, "-c", "import torch; from podracer_hpc import device as D; "
                    "print(D.resolve_device('auto', 3, 8))"], env=bound, capture_output=True, text=True)
check("a pod bound to one GPU (CUDA_VISIBLE_DEVICES=one) takes cuda:0", r.stdout.strip() == "cuda:0", r.stdout + r.stderr[-300:])
try:
    D.resolve_device("auto", 0, 2, allgather=lambda x: [x, (x[0], x[1], "")], environ=dict(env))
    check("two pods on one GPU refused", False)
except D.DeviceError as e:
    check("two pods on one GPU refused", "share one GPU" in str(e), e)
from podracer_hpc.cluster.caches import node_caches
cache = node_caches({"PODRACER_CACHE_DIR": os.environ["PODRACER_CACHE_DIR"]})
try:
    import warp as wp
    os.environ["WARP_CACHE_PATH"] = cache["WARP_CACHE_PATH"]
    wp.config.quiet = True
    wp.init()
    check("Warp's kernel cache under PODRACER_CACHE_DIR/<host>", str(wp.config.kernel_cache_dir).startswith(cache["WARP_CACHE_PATH"]),
          wp.config.kernel_cache_dir)
except ImportError:
    print("(warp not installed: its cache directory not checked)")
if n >= 2:
    probe = ("import os, torch; from mpi4py import MPI; from podracer_hpc import device as D; c = MPI.COMM_WORLD; "
             "loc = c.Split_type(MPI.COMM_TYPE_SHARED); d = D.resolve_device('auto', loc.Get_rank(), loc.Get_size(), "
             "allgather=c.allgather); print('rank', c.Get_rank(), d, D._gpu_uuid(d.index), flush=True)")
    r = subprocess.run(["mpiexec", "-n", str(min(n, 4)), sys.executable, "-c", probe], env=env, capture_output=True,
                       text=True, timeout=90)
    uuids = [ln.split()[-1] for ln in r.stdout.splitlines() if ln.startswith("rank")]
    check(f"{min(n, 4)} pods under mpiexec, one GPU each", len(uuids) == min(n, 4) and len(set(uuids)) == len(uuids),
          r.stdout + r.stderr[-500:])
else:
    print(f"not verified: one GPU per pod on a multi-GPU node (this machine has {n} GPU)")
PYEOF
  [[ $PART == device ]] && exit 0
fi
if [[ $PART == jax || $PART == all ]]; then
  if $PY -c "import sys, jax; sys.exit(not any(d.platform == 'gpu' for d in jax.devices()))" 2>/dev/null; then
    STEP_TIMEOUT=120 run $PY - <<'PYEOF'
import torch
from podracer_hpc.envs import make_env
def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + str(detail) if detail else ''}", flush=True)
f, n = "podracer_hpc.envs.jax_pendulum:make", 4096
gpu, cpu = make_env("jax", n, device="cuda", seed=0, factory=f), make_env("jax", n, device="cpu", seed=0, factory=f)
free, total = torch.cuda.mem_get_info()
check("JAX did not preallocate the GPU (XLA_PYTHON_CLIENT_PREALLOCATE=false)", free > 0.5 * total, f"{free / 2**30:.0f} of {total / 2**30:.0f} GiB free")
g0, c0 = gpu.reset(0), cpu.reset(0)
check("same start states on GPU and CPU", torch.allclose(g0.cpu(), c0, atol=1e-6), (g0.cpu() - c0).abs().max().item())
gen, err, flags = torch.Generator().manual_seed(0), 0.0, True
for i in range(210):
    a = 4 * torch.rand(n, 1, generator=gen) - 2
    og, rg, tg, trg, ig = gpu.step(a.cuda())
    oc, rc, tc, trc, ic = cpu.step(a)
    if i < 20:
        err = max(err, (og.cpu() - oc).abs().max().item(), (rg.cpu() - rc).abs().max().item())
    flags &= torch.equal(trg.cpu(), trc) and torch.equal(ig["episode_length"].cpu(), ic["episode_length"])
check("20 steps on GPU = CPU to 1e-5 (obs, reward)", err < 1e-5, f"{err:.1e}")
check("truncations and episode lengths equal on GPU and CPU (through the time limit at 200)", flags)
check("observations stay on cuda (DLPack views, no host copy)", og.device.type == "cuda" and ig["final_obs"].is_cuda, og.device)
PYEOF
    run $PY bench/jax_env.py --device cuda --num-envs 4096 65536 1048576 --steps 200
    STEP_TIMEOUT=120 run $PY -m podracer_hpc.cli bench train --set device=cuda --set env.name=jax \
      --set env.jax.factory=podracer_hpc.envs.jax_pendulum:make --set env.num_envs=4096 --set agent.num_minibatches=8 --seconds 10
    if $PY -c "import mujoco_playground" 2>/dev/null; then
      for impl in jax warp; do  # warp: Playground's default, MuJoCo Warp under MJX (its kernels compile first)
        STEP_TIMEOUT=180 run $PY bench/jax_env.py --device cuda --playground CartpoleBalance --impl $impl \
          --num-envs 4096 65536 --steps 200
      done
      STEP_TIMEOUT=180 run $PY -m podracer_hpc.cli bench train --set device=cuda --set env.name=jax \
        --set env.jax.factory=mujoco_playground:registry.load \
        --set "env.jax.kwargs={env_name: CartpoleBalance, config_overrides: {impl: jax}}" \
        --set env.num_envs=4096 --set agent.num_minibatches=8 --seconds 10
    else
      echo "(Playground rows skipped: mujoco_playground does not import with $PY; docs/jax.md)"
    fi
  else
    echo "(jax part skipped: no CUDA jax importable here; pip install 'jax[cuda12]')"
  fi
  [[ $PART == jax ]] && exit 0
fi
if [[ $PART == study ]]; then
  # The scaling study (podracer study, local executor) on cuda:0; prints the table and a JSON line.
  # Without .venv-rllib (ray[rllib], baselines/rllib/README.md) the RLlib system is left out.
  $PY - <<'PYEOF'
import os, sys, yaml
d = yaml.safe_load(open("jobs/studies/pendulum_scaling_gpu.yaml"))
if not os.path.exists(".venv-rllib/bin/python"):
    d["systems"].pop("rllib")
    print("no .venv-rllib here: the study runs podracer only", file=sys.stderr)
d["out"] = os.path.abspath("runs/studies/pendulum_scaling_gpu")
yaml.safe_dump(d, open("/tmp/pendulum_scaling_gpu.yaml", "w"), sort_keys=False)
PYEOF
  STEP_TIMEOUT=${STUDY_TIMEOUT:-420} run $PY -m podracer_hpc.cli study /tmp/pendulum_scaling_gpu.yaml --executor local
  exit 0
fi
if [[ $PART != warp ]]; then
run $PY -m podracer_hpc.cli bench env --task pendulum --device cuda --num-envs 4096 65536 1048576 4194304 --gym-envs 64 --seconds 2 --compile reduce-overhead
run $PY -m podracer_hpc.cli bench env --task cartpole --device cuda --num-envs 65536 1048576 --gym-envs 0 --seconds 2
run $PY -m podracer_hpc.cli bench train --set device=cuda --set env.num_envs=4096 --set agent.num_minibatches=8 --seconds 10
run $PY -m podracer_hpc.cli bench train --set device=cuda --set env.num_envs=16384 --set agent.num_minibatches=16 --set agent.hidden_sizes=[256,256] --seconds 10
run $PY -m podracer_hpc.cli train jobs/pendulum.yaml --set device=cuda --set env.num_envs=4096 --set agent.num_minibatches=16 --run-dir /tmp/gpu-pendulum --set log.progress_interval_s=5
# the stock-trading env (30 stocks) on CUDA; the issue's CPU figure is 1M env steps/s at 4,096 envs
run $PY bench/trading.py --device cuda --num-envs 4096 65536 262144 --threads 1 --no-peer --seconds 3
# an off-policy pod on thousands of envs: SAC on 4,096 Pendulum envs, the replay ring on the
# GPU, batch 8,192, 2 updates per env step of the batch; env steps/s, gradient steps/s, time to -250,
# next to the PPO job on the same GPU
STEP_TIMEOUT=180 run $PY bench/offpolicy_pod.py --device cuda --set env.num_envs=4096 --set agent.batch_size=8192 \
  --set agent.updates_per_step=2 --set agent.learning_starts=16384 --set agent.buffer_size=4194304 \
  --set eval.interval_env_steps=65536 --steps 1048576 --peer-steps 1500000
fi

[[ $PART == core ]] && exit 0
# MuJoCo Warp backend (env.mujoco.backend=warp) at scale on cuda:0. Needs warp-lang, mujoco-warp, mujoco (+ mujoco-core)
# and gymnasium (only its v5 XML files are read) importable; the first step compiles and caches the CUDA kernels.
STEP_TIMEOUT=90 run $PY - <<'PYEOF'
import os, time, torch, mujoco, numpy as np
from podracer_hpc.envs.mujoco_warp import WarpMujoco, load_model
dev = os.environ.get("DEV", "cuda")
for task in ("halfcheetah", "ant"):
    t0 = time.perf_counter(); env = WarpMujoco(task, 256, dev, seed=0); torch.cuda.synchronize() if dev == "cuda" else None
    build = time.perf_counter() - t0
    q, qd = env._qpos[:8].double().cpu().numpy(), env._qvel[:8].double().cpu().numpy()
    a = 2 * torch.rand(256, env.act_dim, device=dev) - 1
    obs, rew, term, trunc, info = env.step(a)
    m, err = load_model(task), 0.0
    for i in range(8):  # the same step in MuJoCo C (float64) from the same state
        d = mujoco.MjData(m); d.qpos[:] = q[i]; d.qvel[:] = qd[i]; d.ctrl[:] = a[i].cpu().numpy()
        mujoco.mj_step(m, d, nstep=env.spec.frame_skip)
        w, ref = torch.cat([env._qpos[i], env._qvel[i]]).double().cpu().numpy(), np.concatenate([d.qpos, d.qvel])
        err = max(err, float(np.max(np.abs(w - ref) / (1 + np.abs(ref)))))
    print(f"warp {task} on {dev}: build+compile {build:.1f} s, obs {tuple(obs.shape)} {obs.device}, "
          f"one step vs MuJoCo C from the same state: max rel err {err:.1e} (CPU run: ~1e-5)", flush=True)
PYEOF
STEP_TIMEOUT=60 run $PY bench/mujoco_envs.py --backends warp --device cuda --tasks halfcheetah,ant --num-envs 4096 32768 --steps 100
# SAC on 1,024 MuJoCo Warp HalfCheetah envs (physics, replay ring and updates on the GPU)
STEP_TIMEOUT=150 run $PY bench/offpolicy_pod.py --job jobs/halfcheetah_sac.yaml --peer '' --device cuda \
  --set env.mujoco.backend=warp --set env.num_envs=1024 --set agent.rollout_steps=8 --set agent.batch_size=8192 \
  --set agent.updates_per_step=1 --set agent.learning_starts=32768 --set eval.interval_env_steps=100000 \
  --steps 400000 --target 2000
# PPO end to end on MuJoCo Warp (the pod's loop with physics on the GPU)
STEP_TIMEOUT=60 run $PY -m podracer_hpc.cli bench train jobs/halfcheetah.yaml --set device=cuda --set env.mujoco.backend=warp --set env.num_envs=4096 --set agent.rollout_steps=16 --set agent.num_minibatches=8 --set agent.update_epochs=4 --seconds 20
