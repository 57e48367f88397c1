#!/usr/bin/env bash
# One prepared GPU check (5 steps of at most 60 s each: at most 5 minutes on one GPU): env throughput eager and
# compiled (CUDA graphs), end-to-end PPO throughput, and a short Pendulum learning run, on
# cuda:0. Prints tables and JSON lines; copy the output into bench/RESULTS.md with the date and
# the device. Usage on the GPU machine, from the repo root:
#   bash bench/gpu_check.sh            # uses python3 from PATH (torch with CUDA installed)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
export PYTHONUNBUFFERED=1
run() { echo; echo "### $*"; timeout "${STEP_TIMEOUT:-60}" "$@" || echo "(step failed or timed out: rc=$?)"; }

$PY - <<'PYEOF'
import torch, platform
print("torch", torch.__version__, "cuda", torch.version.cuda, "device",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE", "python", platform.python_version())
PYEOF
run $PY -m podracer_hpc.cli bench env --task pendulum --device cuda --num-envs 4096 65536 1048576 4194304 --gym-envs 64 --seconds 2 --compile reduce-overhead
run $PY -m podracer_hpc.cli bench env --task cartpole --device cuda --num-envs 65536 1048576 --gym-envs 0 --seconds 2
run $PY -m podracer_hpc.cli bench train --set device=cuda --set env.num_envs=4096 --set agent.num_minibatches=8 --seconds 10
run $PY -m podracer_hpc.cli bench train --set device=cuda --set env.num_envs=16384 --set agent.num_minibatches=16 --set agent.hidden_sizes=[256,256] --seconds 10
run $PY -m podracer_hpc.cli train jobs/pendulum.yaml --set device=cuda --set env.num_envs=4096 --set agent.num_minibatches=16 --run-dir /tmp/gpu-pendulum --set log.progress_interval_s=5
