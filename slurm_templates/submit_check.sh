# shellcheck shell=bash
# slurm_templates/submit_check.sh -- what submit.sh refuses before sbatch is called (sourced by it).
#
#   submit_check [sbatch options...] TEMPLATE [template args...]
#
# Exits 2 with a message (nothing is queued) when
#   - the template is not a file;
#   - a pod template (one that calls podracer_launch) would put more tasks on a node than the node
#     has GPUs: the job would only fail with exit 2 at its start (lib.sh's podracer_launch makes
#     the same check). Tasks and GPUs per node come from the template's #SBATCH lines, then the
#     options (site.sh's, then the user's: later wins): --ntasks-per-node, else --ntasks / --nodes;
#     --gpus-per-node or --gres=gpu:N (none or 0: CPU pods, not checked);
#   - its job file (`podracer_file "job file" ...` in the template: the first template argument, or
#     the template's default) or sweep file (the second) is missing;
#   - `podracer config JOB [--set ...]` (the template's --set options) rejects the job file, run
#     with the site's Python (PODRACER_CONDA_ENV, else PODRACER_VENV, else python3 on PATH) and this
#     checkout on PYTHONPATH. Where that Python lacks the package's dependencies the job file is
#     only checked to look like YAML (a `key:` line, no tabs), and submit.sh says so.
# PODRACER_SUBMIT_CHECK=0 skips the `podracer config` run (not the other checks).

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"  # podracer_find_file: the job's own file rule

_submit_refuse() {
    printf 'submit.sh: error: %s; nothing submitted\n' "$*" >&2
    exit 2
}

# the value of a count option ("8", "h100:8", "gpu:a100:4", "1-4" -> 1), or "" if not a count
_submit_count() {
    local v=${1##*:}
    v=${v%%-*}
    [[ $v =~ ^[0-9]+$ ]] && echo "$v"
    return 0
}

# _submit_gres LIST: the GPUs of a --gres list (gpu:8, gpu:h100:8,shard:2), "" if none named
_submit_gres() {
    local item items=()
    IFS=, read -ra items <<<"$1"
    for item in "${items[@]}"; do
        [[ $item == gpu || $item == gpu:* ]] || continue
        [[ $item == gpu ]] && { echo 1; return; }
        _submit_count "$item"
        return
    done
}

# _submit_file WHAT PATH: PATH as the job will find it (lib.sh's podracer_find_file), or refuse
_submit_file() {
    podracer_find_file "$2" || _submit_refuse "$1 $2 not found (a relative path is tried in $PWD, then in $PODRACER_ROOT)"
}

# _submit_yamlish FILE: the check without Python: some `key:` line, no tab indentation
_submit_yamlish() {
    grep -qE '^[A-Za-z_][A-Za-z0-9_.-]*:' "$1" ||
        _submit_refuse "job file $1 does not look like YAML (no 'key: value' line)"
    ! grep -qP '^\t' "$1" 2>/dev/null || _submit_refuse "job file $1 is indented with tabs (YAML allows spaces only)"
}

# _submit_config JOB [--set KEY=VALUE...]: `podracer config` with the site's Python
_submit_config() {
    local job=$1 py=() out rc
    shift
    if [[ -n ${PODRACER_CONDA_ENV:-} ]] && command -v conda >/dev/null; then
        py=(conda run -n "$PODRACER_CONDA_ENV" python)
    elif [[ -n ${PODRACER_VENV:-} && -x $PODRACER_VENV/bin/python ]]; then
        py=("$PODRACER_VENV/bin/python")
    elif command -v python3 >/dev/null; then
        py=(python3)
    fi
    if ((${#py[@]})); then
        rc=0
        out=$(cd "$PODRACER_ROOT" && PYTHONPATH=$PODRACER_ROOT${PYTHONPATH:+:$PYTHONPATH} \
            "${py[@]}" -m podracer_hpc.cli config "$job" "$@" 2>&1 >/dev/null) || rc=$?
        if ((rc == 0)); then
            return
        elif ((rc == 2)); then
            printf '%s\n' "$out" >&2
            _submit_refuse "podracer config rejects the job file $job"
        fi
        echo "submit.sh: cannot run \`podracer config\` with ${py[*]} (exit $rc: ${out##*$'\n'}); checked only that $job looks like YAML" >&2
    else
        echo "submit.sh: no Python to run \`podracer config\` with; checked only that $job looks like YAML" >&2
    fi
    _submit_yamlish "$job"
}

submit_check() {
    local args=("$@") opts=() i=0 a template="" name val
    # sbatch options up to the template (the first word that is not an option or an option's value)
    while ((i < ${#args[@]})); do
        a=${args[i]}
        if [[ $a == --*=* ]]; then
            opts+=("$a")
        elif [[ $a =~ ^--(exclusive|requeue|no-requeue|test-only|parsable|wait|hold|quiet|verbose|overcommit|oversubscribe|contiguous|spread-job|use-min-nodes|no-kill|ignore-pbs|get-user-env|help|usage|version)$ ]]; then
            :
        elif [[ $a == --* ]]; then
            opts+=("$a=${args[i + 1]:-}")
            i=$((i + 1))
        elif [[ $a =~ ^-[HkOQsvWhV]+$ ]]; then
            :
        elif [[ $a =~ ^-[A-Za-z]$ ]]; then
            opts+=("$a" "${args[i + 1]:-}")
            i=$((i + 1))
        elif [[ $a == -* ]]; then
            opts+=("${a:0:2}" "${a:2}")
        else
            template=$a
            break
        fi
        i=$((i + 1))
    done
    [[ -n $template ]] || _submit_refuse "no template given (e.g. slurm_templates/tournament.sbatch)"
    [[ -f $template ]] || _submit_refuse "template $template not found"
    local targs=("${args[@]:i+1}")
    grep -q 'podracer_launch' "$template" || return 0 # not a pod template (rllib.sbatch): sbatch decides

    # tasks and GPUs per node: the template's #SBATCH lines, then the options, in order
    local words=() per_node="" ntasks="" nodes="" gpus="" -
    set -f # the #SBATCH words are split, never globbed (restored on return: local -)
    # shellcheck disable=SC2207
    words=($(sed -n 's/^#SBATCH[[:space:]]\{1,\}//p' "$template" | sed 's/[[:space:]]#.*//'))
    words+=("${opts[@]}")
    i=0
    while ((i < ${#words[@]})); do
        a=${words[i]}
        if [[ $a == --*=* ]]; then
            name=${a%%=*} val=${a#*=}
        elif [[ $a =~ ^-[A-Za-z]$ ]]; then
            name=$a val=${words[i + 1]:-}
            i=$((i + 1))
        else
            name=$a val=""
        fi
        case $name in
            --ntasks-per-node) per_node=$(_submit_count "$val") ;;
            -n | --ntasks) ntasks=$(_submit_count "$val") ;;
            -N | --nodes) nodes=$(_submit_count "$val") ;;
            --gpus-per-node) gpus=$(_submit_count "$val") ;;
            --gres) val=$(_submit_gres "$val") && [[ -n $val ]] && gpus=$val ;;
        esac
        i=$((i + 1))
    done
    if [[ -n $ntasks ]]; then
        local spread=$(((ntasks + ${nodes:-1} - 1) / ${nodes:-1}))
        [[ -z $per_node ]] || ((spread > per_node)) && per_node=$spread
    fi
    per_node=${per_node:-1}
    if [[ -n $gpus ]] && ((gpus > 0 && per_node > gpus)); then
        _submit_refuse "$per_node tasks per node but $gpus GPUs per node: two pods would share a GPU, and" \
            "the job would stop with exit 2 at its start (one pod per GPU: --ntasks-per-node <= --gpus-per-node)"
    fi

    # the job file (and a sweep file), as the template will read them
    local default
    grep -q 'podracer_file "job file"' "$template" || return 0
    default=$(sed -n 's/.*podracer_file "job file" "${1:-\([^}]*\)}".*/\1/p' "$template" | head -1)
    local job=${targs[0]:-$default}
    [[ -n $job ]] || _submit_refuse "$(basename "$template") needs a job file (its first argument)"
    job=$(_submit_file "job file" "$job")
    local rest=("${targs[@]:1}")
    if grep -q 'podracer_file "sweep file"' "$template"; then
        [[ -n ${rest[0]:-} ]] || _submit_refuse "$(basename "$template") needs a sweep file (its second argument)"
        _submit_file "sweep file" "${rest[0]}" >/dev/null
        rest=("${rest[@]:1}")
    fi
    [[ ${PODRACER_SUBMIT_CHECK:-1} == 0 ]] && return 0
    local sets=()
    i=0
    while ((i < ${#rest[@]})); do
        case ${rest[i]} in
            --set) sets+=(--set "${rest[i + 1]:-}") && i=$((i + 1)) ;;
            --set=*) sets+=("${rest[i]}") ;;
        esac
        i=$((i + 1))
    done
    _submit_config "$job" "${sets[@]}"
}
