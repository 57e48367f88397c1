#!/usr/bin/env bash
# submit.sh -- sbatch with the site's partition, account and QoS (site.sh), from any directory.
#
#   slurm_templates/submit.sh [--print] [sbatch options...] TEMPLATE [template args...]
#   slurm_templates/submit.sh -N 8 slurm_templates/tournament.sbatch jobs/quickstart.yaml
#
# Adds --partition/--account/--qos from PODRACER_PARTITION/ACCOUNT/QOS (site.sh, or the
# environment) before your options, which win; exports PODRACER_ROOT (this checkout) so that the
# job finds lib.sh and site.sh wherever you submit from. --print prints the sbatch command
# instead of running it. A plain `sbatch` from the checkout works as well (then give -p/-A).
set -euo pipefail

print=0
if [[ ${1:-} == --print ]]; then print=1; shift; fi
[[ $# -ge 1 ]] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
PODRACER_ROOT=${PODRACER_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export PODRACER_ROOT
site=${PODRACER_SITE:-$PODRACER_ROOT/slurm_templates/site.sh}
[[ -f $site ]] || { echo "submit.sh: no site file $site" >&2; exit 2; }
# only the three submission settings: the rest of site.sh (OMP_NUM_THREADS, ...) is for the
# job's own environment and is worked out on the compute node
eval "$(
    # shellcheck disable=SC1090
    source "$site" >/dev/null
    declare -p PODRACER_PARTITION PODRACER_ACCOUNT PODRACER_QOS
)"
cmd=(sbatch)
[[ -n $PODRACER_PARTITION ]] && cmd+=(--partition="$PODRACER_PARTITION")
[[ -n $PODRACER_ACCOUNT ]] && cmd+=(--account="$PODRACER_ACCOUNT")
[[ -n $PODRACER_QOS ]] && cmd+=(--qos="$PODRACER_QOS")
cmd+=("$@")
if ((print)); then
    echo "PODRACER_ROOT=$PODRACER_ROOT ${cmd[*]}"
    exit 0
fi
exec "${cmd[@]}"
