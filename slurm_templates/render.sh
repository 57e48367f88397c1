#!/usr/bin/env bash
# render.sh -- show what a template would run, without Slurm and without submitting anything.
#
#   slurm_templates/render.sh TEMPLATE [NAME=VALUE ...] [-- TEMPLATE ARGS ...]
#   slurm_templates/render.sh slurm_templates/tournament.sbatch SLURM_JOB_NUM_NODES=4 -- jobs/quickstart.yaml
#   slurm_templates/render.sh slurm_templates/sweep.sbatch SLURM_ARRAY_TASK_ID=2 PODRACER_LEADERBOARD=shared \
#       -- jobs/quickstart.yaml slurm_templates/sweeps/pods.txt
#
# Prints the template's #SBATCH header as written, then runs the template with PODRACER_DRY_RUN=1
# in a clean environment (PATH and HOME only, USER=user) plus the Slurm variables a job of that
# header would see (SLURM_JOB_ID=1000, nodes/tasks/CPUs/GPUs/array task from the header) and the
# NAME=VALUE given, which win. The template prints its banner, the code snapshot it would make,
# the rank environment it exports and the srun line, then stops before running it. The golden files of tests/golden/templates/ are this
# text (tests/slurm/test_templates.py; UPDATE_GOLDEN=1 rewrites them).
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 && $1 != -h && $1 != --help ]] || usage
template=$1; shift
[[ -f $template ]] || { echo "render.sh: no template $template" >&2; exit 2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
declare -A given=()
order=()
while [[ $# -gt 0 && $1 != -- ]]; do
    [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "render.sh: expected NAME=VALUE or --, got $1" >&2; exit 2; }
    given[${1%%=*}]=${1#*=}
    order+=("${1%%=*}")
    shift
done
[[ ${1:-} == -- ]] && shift

# the header as sbatch reads it: #SBATCH lines before the first command
header=$(awk '/^#SBATCH/ { print; next } /^[^#]/ && NF { exit }' "$template")
opt() { # value of --NAME=VALUE in the header
    grep -oE -- "--$1=[^ ]+" <<<"$header" | tail -n1 | cut -d= -f2- || true
}
nodes=$(opt nodes); tpn=$(opt ntasks-per-node); cpt=$(opt cpus-per-task); array=$(opt array)
name=$(opt job-name); gpn=$(opt gpus-per-node)

declare -A env=(
    [PATH]=$PATH [HOME]=${HOME:-/root} [USER]=user [PODRACER_ROOT]=$root [PODRACER_DRY_RUN]=1
    [SLURM_SUBMIT_DIR]=$root [SLURM_JOB_NAME]=${name:-sbatch} [SLURM_RESTART_COUNT]=0
)
[[ -n $cpt ]] && env[SLURM_CPUS_PER_TASK]=$cpt
[[ -n $gpn ]] && env[SLURM_GPUS_PER_NODE]=$gpn
for k in "${order[@]}"; do env[$k]=${given[$k]}; done
n=${env[SLURM_JOB_NUM_NODES]:-${nodes:-1}}
env[SLURM_JOB_NUM_NODES]=$n
if ((n == 1)); then nodelist=node001; else nodelist="node[001-$(printf %03d "$n")]"; fi
env[SLURM_JOB_NODELIST]=${env[SLURM_JOB_NODELIST]:-$nodelist}
[[ -n $tpn ]] && env[SLURM_NTASKS_PER_NODE]=${env[SLURM_NTASKS_PER_NODE]:-$tpn}
env[SLURM_NTASKS]=${env[SLURM_NTASKS]:-$((n * ${env[SLURM_NTASKS_PER_NODE]:-1}))}
if [[ -n $array ]]; then
    first=${array%%[-,%:]*}
    env[SLURM_ARRAY_JOB_ID]=${env[SLURM_ARRAY_JOB_ID]:-1000}
    env[SLURM_ARRAY_TASK_ID]=${env[SLURM_ARRAY_TASK_ID]:-$first}
    env[SLURM_JOB_ID]=${env[SLURM_JOB_ID]:-$((env[SLURM_ARRAY_JOB_ID] + 1 + env[SLURM_ARRAY_TASK_ID]))}
else
    env[SLURM_JOB_ID]=${env[SLURM_JOB_ID]:-1000}
fi

echo "# render of $(basename "$template"): what sbatch would run (nothing is submitted)"
echo "$header"
for k in "${order[@]}"; do echo "# given: $k=${given[$k]}"; done
[[ $# -gt 0 ]] && echo "# args: $*"
assign=()
for k in "${!env[@]}"; do assign+=("$k=${env[$k]}"); done
cd "$root"
rc=0
env -i "${assign[@]}" bash "$template" "$@" 2>&1 || rc=$?
exit "$rc"
