#!/usr/bin/env bash
# All CPU benchmarks, each printing a table and a last JSON line. Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PODRACER=${PODRACER:-.venv/bin/podracer}
PY=${PY:-.venv/bin/python}
$PODRACER bench env --task pendulum
$PODRACER bench env --task cartpole --num-envs 64 4096 65536 --threads 1  # one thread, vs gymnasium's vector CartPole
$PODRACER bench train
$PY bench/learning.py
$PY bench/status_poll.py
$PY bench/decide_scale.py
if $PY -c "import jax" 2>/dev/null; then $PY bench/jax_env.py; else echo "bench/jax_env.py skipped: no jax (the jax extra)"; fi
