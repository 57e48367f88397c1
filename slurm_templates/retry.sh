#!/usr/bin/env bash
# retry.sh -- a template job and K retries of it, chained with --dependency=afternotok.
#
#   slurm_templates/retry.sh [--print] -K N [sbatch options...] TEMPLATE [template args...]
#   slurm_templates/retry.sh -K 2 -N 8 slurm_templates/tournament.sbatch jobs/quickstart.yaml
#
# Submits the job through submit.sh (site settings, checks, code snapshot), then N copies of it,
# copy i held until copy i-1 ends not OK (--dependency=afternotok:<previous>: FAILED, TIMEOUT,
# NODE_FAIL, PREEMPTED, CANCELLED, exit 76 of a hung world) and dropped by Slurm as soon as its
# dependency can no longer be met (--kill-on-invalid-dep=yes: the previous one COMPLETED). Every
# copy runs the same template on the same run directory, so it resumes from the checkpoints. A
# node that failed is DOWN or DRAINED by Slurm and not scheduled again; name another with
# --exclude. Prints the job ids, first the job, then its retries: to stop the whole chain, scancel
# every one of them (a cancel of the running job alone lets the next copy start). podracer
# submit --wait --retries K does more (no retry of a cancel of yours, the failed node excluded,
# a silent part cancelled as hung, a row per retry): docs/slurm-templates.md.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
print=()
if [[ ${1:-} == --print ]]; then print=(--print); shift; fi
[[ ${1:-} == -K && ${2:-} =~ ^[0-9]+$ ]] || {
    echo "retry.sh: give -K N first (N >= 0 retries), e.g. retry.sh -K 2 -N 8 TEMPLATE JOB.yaml" >&2
    exit 2
}
k=$2
shift 2
[[ $# -ge 1 ]] || { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
if ((${#print[@]})); then
    "$here/submit.sh" --print "$@"
    for ((i = 1; i <= k; i++)); do
        "$here/submit.sh" --print --dependency="afternotok:<job $((i - 1))>" --kill-on-invalid-dep=yes "$@"
    done
    exit 0
fi
prev=$("$here/submit.sh" --parsable "$@")
prev=${prev%%;*}
ids=("$prev")
for ((i = 1; i <= k; i++)); do
    prev=$(PODRACER_CODE_FROM=${PODRACER_CODE_FROM:-} "$here/submit.sh" --parsable --dependency="afternotok:$prev" \
        --kill-on-invalid-dep=yes "$@")
    prev=${prev%%;*}
    ids+=("$prev")
done
echo "job ${ids[0]}, retries ${ids[*]:1} (each after the one before it ended not OK); stop them all: scancel ${ids[*]}"
