#!/usr/bin/env bash
# container/quickstart.sh -- `make container-quickstart`: the 4-pod quickstart tournament inside the
# image that `make container` built, run unprivileged by Charliecloud's ch-run from its directory
# (build/container/podracer). Under the local Slurm cluster (scripts/local_slurm.sh) when it runs
# (`srun -N1 -n1 ch-run ...`), else ch-run directly. Inside: `podracer mpirun -n PODS podracer train
# jobs/quickstart.yaml` (the image's own job file, code and mpiexec; nothing read from the checkout).
# The run directory is on the host: build/container/runs/<name>, bound at /runs. Prints the summary's
# JSON line last.
#
# Knobs: PODS (4), STEPS (total_env_steps, default 204800: 2 rounds of the quickstart's 100k
# interval), PODRACER_CONTAINER_DIR, CONTAINER_SLURM=0 (never srun), PODRACER_SLURM_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${PODRACER_CONTAINER_DIR:-$ROOT/build/container}
IMG=$OUT/podracer
PODS=${PODS:-4}
STEPS=${STEPS:-204800}
die() { printf '[container] error: %s\n' "$*" >&2; exit 2; }
[[ $PODS =~ ^[1-9][0-9]*$ ]] || die "PODS=$PODS is not a count of pods"
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "STEPS=$STEPS is not a count of env steps"
[[ -x $IMG/usr/bin/python3 ]] || die "no image directory $IMG: run \`make container\` first"
command -v ch-run >/dev/null || die "no ch-run: apt-get install charliecloud"

name=quickstart-$(date -u +%Y%m%dT%H%M%S)-$$
mkdir -p "$OUT/runs"
export USER=${USER:-$(id -un)}
# -t: a private /tmp (mpiexec's sockets); HOME and caches under /runs (the image is read-only)
inner=(env HOME=/runs PODRACER_CACHE_DIR=/runs/.cache OMP_NUM_THREADS=1
    podracer mpirun -n "$PODS" podracer train jobs/quickstart.yaml --run-dir "/runs/$name"
    --set total_env_steps="$STEPS" --set threads=1 --quiet)
# --unset-env: inside an srun step, MPICH's mpiexec (Hydra) would see SLURM_* and start its ranks
# with srun, which the image does not have; it starts them itself (fork) on this node
cmd=(ch-run -t --unset-env='SLURM_*' --unset-env='PMI_*' --set-env="$IMG/ch/environment" -b "$OUT/runs:/runs"
    -c /opt/podracer "$IMG" -- "${inner[@]}")

slurm=""
if [[ ${CONTAINER_SLURM:-1} != 0 ]] && bash "$ROOT/scripts/local_slurm.sh" status >/dev/null 2>&1; then
    eval "$(bash "$ROOT/scripts/local_slurm.sh" env)"
    slurm="srun -N1 -n1 -c2 (local Slurm cluster)"
    cmd=(srun -N1 -n1 --cpus-per-task=2 --mpi=none "${cmd[@]}")
fi
printf '[container] %s: %s\n' "${slurm:-ch-run directly (no local Slurm cluster runs)}" "${cmd[*]}"
t0=$SECONDS
log=$OUT/runs/$name.out
set +e
"${cmd[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
printf '[container] exit %d after %d s; run directory %s\n' "$rc" $((SECONDS - t0)) "$OUT/runs/$name"
((rc == 0)) || exit "$rc"
line=$(grep '^{' "$log" | tail -1)
[[ -n $line ]] || die "the run printed no summary line (see $log)"
printf '%s\n' "$line"
