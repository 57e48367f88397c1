#!/usr/bin/env bash
# submit.sh -- sbatch with the site's resource settings (site.sh), from any directory.
#
#   slurm_templates/submit.sh [--print] [sbatch options...] TEMPLATE [template args...]
#   slurm_templates/submit.sh -N 8 slurm_templates/tournament.sbatch jobs/quickstart.yaml
#
# Adds --partition/--account/--qos/--cpus-per-task/--mem/--constraint/--mail-type/--mail-user
# and PODRACER_SBATCH_ARGS from site.sh (or the environment) before your options, which win;
# exports PODRACER_ROOT (this checkout) so that the job finds lib.sh and site.sh wherever you
# submit from, and takes the code snapshot now (PODRACER_RUNS/.code/<id>, passed to the job as
# PODRACER_CODE_FROM): the job runs the code of its submission even if it waits in the queue
# while the checkout changes. --print prints the sbatch command instead of running it (no
# snapshot). A plain `sbatch` from the checkout works as well (the snapshot is then taken
# when the job starts).
# Before sbatch (and before --print prints), what would fail only after the queue is refused with
# exit 2: a pod template's job file (and sweep file) that is missing, or that `podracer config`
# rejects (with the template's --set options), and more tasks per node than GPUs per node (the
# template's #SBATCH lines, site.sh's options, then yours). PODRACER_SUBMIT_CHECK=0 skips the job
# file check (a login node whose Python takes long); the tasks/GPUs check always runs.
set -euo pipefail

print=0
if [[ ${1:-} == --print ]]; then print=1; shift; fi
[[ $# -ge 1 ]] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
PODRACER_ROOT=${PODRACER_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export PODRACER_ROOT
site=${PODRACER_SITE:-$PODRACER_ROOT/slurm_templates/site.sh}
[[ -f $site ]] || { echo "submit.sh: no site file $site" >&2; exit 2; }
# only the submission settings: the rest of site.sh (OMP_NUM_THREADS, ...) is for the job's own
# environment and is worked out on the compute node
eval "$(
    # shellcheck disable=SC1090
    source "$site" >/dev/null
    declare -p PODRACER_PARTITION PODRACER_ACCOUNT PODRACER_QOS PODRACER_CPUS_PER_TASK PODRACER_MEM \
        PODRACER_CONSTRAINT PODRACER_MAIL_TYPE PODRACER_MAIL_USER PODRACER_SBATCH_ARGS PODRACER_RUNS \
        PODRACER_SNAPSHOT PODRACER_VENV PODRACER_CONDA_ENV
)"
cmd=(sbatch)
[[ -n $PODRACER_PARTITION ]] && cmd+=(--partition="$PODRACER_PARTITION")
[[ -n $PODRACER_ACCOUNT ]] && cmd+=(--account="$PODRACER_ACCOUNT")
[[ -n $PODRACER_QOS ]] && cmd+=(--qos="$PODRACER_QOS")
[[ -n $PODRACER_CPUS_PER_TASK ]] && cmd+=(--cpus-per-task="$PODRACER_CPUS_PER_TASK")
[[ -n $PODRACER_MEM ]] && cmd+=(--mem="$PODRACER_MEM")
[[ -n $PODRACER_CONSTRAINT ]] && cmd+=(--constraint="$PODRACER_CONSTRAINT")
[[ -n $PODRACER_MAIL_TYPE ]] && cmd+=(--mail-type="$PODRACER_MAIL_TYPE")
[[ -n $PODRACER_MAIL_USER ]] && cmd+=(--mail-user="$PODRACER_MAIL_USER")
# shellcheck disable=SC2206
[[ -n $PODRACER_SBATCH_ARGS ]] && cmd+=($PODRACER_SBATCH_ARGS)
cmd+=("$@")
# shellcheck source=submit_check.sh
source "$PODRACER_ROOT/slurm_templates/submit_check.sh"
submit_check "${cmd[@]:1}"
if ((print)); then
    echo "PODRACER_ROOT=$PODRACER_ROOT ${cmd[*]}"
    exit 0
fi
# the code as it is now, content-addressed (the job copies it into its run directory)
if [[ $PODRACER_SNAPSHOT == 1 && -d $PODRACER_ROOT/podracer_hpc && -z ${PODRACER_CODE_FROM:-} ]]; then
    id=$(cd "$PODRACER_ROOT" && find podracer_hpc -type f ! -path '*/__pycache__/*' ! -name '*.py[co]' -print0 |
        LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)
    stage=$PODRACER_RUNS/.code/$id
    if [[ ! -f $stage/SNAPSHOT.json ]]; then
        rev=$(git -C "$PODRACER_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
        [[ $rev != unknown && -n $(git -C "$PODRACER_ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]] &&
            rev+=-dirty
        tmp=$stage.tmp$$
        mkdir -p "$tmp"
        (cd "$PODRACER_ROOT" && find podracer_hpc -type f ! -path '*/__pycache__/*' ! -name '*.py[co]' -print0 |
            xargs -0 cp --parents -p -t "$tmp")
        printf '{\n  "revision": "%s",\n  "dirty": %s,\n  "id": "%s",\n  "source": "%s"\n}\n' "$rev" \
            "$([[ $rev == *-dirty ]] && echo true || echo false)" "$id" "$PODRACER_ROOT" >"$tmp/SNAPSHOT.json"
        mv -T "$tmp" "$stage" 2>/dev/null || rm -rf "$tmp"
    fi
    export PODRACER_CODE_FROM=$stage
    echo "submit.sh: code snapshot $stage ($(sed -n 's/.*"revision": *"\([^"]*\)".*/\1/p' "$stage/SNAPSHOT.json"))" >&2
fi
exec "${cmd[@]}"
