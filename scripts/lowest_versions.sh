#!/usr/bin/env bash
# The lowest versions pyproject.toml allows, checked: a venv of its own (.venv-lowest) with every
# [project] dependency pinned to its floor (">=X" -> "==X"; torch at its floor is PyPI's CUDA build,
# about 3 GB, run on the CPU), the test tools at whatever resolves beside them, and the tests that
# exercise the core: the PPO math, the pod and its exact resume, the config, envs against gymnasium,
# the tournament and fitness, the logs, the leaderboard, the launcher (submitit), analysis
# (matplotlib, scipy), MPI under a real mpiexec.
#
#   scripts/lowest_versions.sh            (make test-lowest; LOWEST_VENV=DIR for another venv)
#   scripts/lowest_versions.sh install    the venv only (CI starts it beside the main lane: the floors'
#                                         torch is a download of about 3 GB, minutes of network, not CPU)
#   scripts/lowest_versions.sh test       the tests only, in a venv an install made
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENV=${LOWEST_VENV:-.venv-lowest}
PHASE=${1:-all}

install() {
  rm -f "$VENV/.installed"
  [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" - > "$VENV/constraints.txt" <<'PYCODE'
import re, tomllib
for dep in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9.]+)", dep)
    if m:
        print(f"{m.group(1)}=={m.group(2)}")
PYCODE
  echo "[lowest] the floors: $(tr '\n' ' ' < "$VENV/constraints.txt")"
  "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" -e . "pytest>=7.4,<9" "pytest-xdist>=3.5" "hypothesis>=6.80" \
      "gymnasium>=1.0" "mpich>=4.1"
  "$VENV/bin/python" - "$VENV/constraints.txt" <<'PYCODE'
import importlib.metadata as md, sys
from packaging.version import Version
floors = dict(line.strip().split("==") for line in open(sys.argv[1]) if line.strip())
got = {k: md.version(k) for k in floors}
print("[lowest] installed: " + ", ".join(f"{k} {v}" for k, v in got.items()))
bad = {k: (floors[k], v) for k, v in got.items() if Version(v.split("+")[0]) != Version(floors[k])}
assert not bad, f"not at the floor: {bad}"
PYCODE
  touch "$VENV/.installed"
}

run_tests() {
  if [[ ! -f $VENV/.installed ]]; then
    echo "$VENV has no finished install: run '$0 install' first (or '$0' for both)" >&2
    exit 2
  fi
  # The floors change library code paths (torch's RNG and optimizer state, h5py, mpi4py, numpy),
  # not our process plumbing: one MPI run that is killed and resumes exactly (a tournament's rank
  # under mpiexec: checkpoints, the leaderboard, the logs) covers what the floors can break there;
  # the other stop-and-resume scenarios of test_chaos.py, the signal relays of podracer mpirun and of
  # the local executor (a USR2 to a 2-rank job), and the refusal of a resume under another config (a
  # comparison of two of our dicts) are the main lane's, where they run on every change.
  "$VENV/bin/python" -m pytest -q -n 2 -p no:cacheprovider tests/agents/test_ppo.py tests/test_pod.py tests/test_config.py \
      tests/envs/test_base.py tests/pool/test_rules.py tests/pool/test_hparams.py tests/pool/test_fitness.py \
      tests/files/test_h5log.py tests/pool/test_leaderboard.py tests/launch/test_launch.py tests/report/test_aggregate.py \
      tests/rank/test_resume.py \
      tests/system/test_chaos.py::test_sigkill_of_one_rank_in_a_tournament_resumes_exactly \
      --deselect tests/launch/test_launch.py::test_podracer_mpirun_as_documented_survives_usr2_to_its_process_group \
      --deselect tests/launch/test_launch.py::test_local_job_usr2_stops_every_rank_with_a_checkpoint_and_resumes \
      --deselect tests/test_pod.py::test_resume_with_another_config_is_refused
}

case $PHASE in
  all)
    install
    run_tests
    ;;
  install) install ;;
  test) run_tests ;;
  *) echo "usage: $0 [all|install|test] (got '$PHASE')" >&2; exit 2 ;;
esac
