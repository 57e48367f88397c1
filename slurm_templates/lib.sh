# shellcheck shell=bash
# slurm_templates/lib.sh -- what every template does, written once. Sourced by the templates
# (not run by users). Bash only: no Python outside the ranks.
#
#   podracer_setup NAME           site settings (site.sh), run-wide checks, the banner
#   podracer_activate             module load / conda activate / venv (host-side templates)
#   podracer_file WHAT PATH       prints the absolute path of an input file, or exits 2
#   podracer_launch [OPT...] -- CMD...  runs `srun [OPT...] CMD...` with the signal relay, then ends
#                                 the script: 0 complete, requeue on 75, else the failure code.
#                                 srun gets --cpus-per-task (Slurm 22.05-23.02 srun does not inherit
#                                 it from sbatch) and, when the job has GPUs, --gpus-per-task=1 (one
#                                 bound GPU per pod, --gpu-bind=single:1 --distribution=block:block: on
#                                 the NUMA node of its CPUs; PODRACER_GPU_BIND=none: every GPU visible);
#                                 more pods than GPUs on a node is refused (exit 2).
#   podracer_rundir JOBFILE       creates $PODRACER_RUN_DIR, moves the job's output into it
#                                 ($PODRACER_RUN_DIR/slurm-<job id>.out; the #SBATCH --output file
#                                 keeps the first lines and Slurm's own messages), and makes or
#                                 reuses the code snapshot: $PODRACER_RUN_DIR/code/<id>/ holds
#                                 podracer_hpc/ and the job file, from $PODRACER_CODE_FROM (the copy
#                                 submit.sh made at submission) else $PODRACER_ROOT, made at the job's
#                                 first start and reused by its requeues; the ranks import it
#                                 (PYTHONPATH) and train with its job file ($PODRACER_JOB_FILE)
#
# Exit codes of the rank program (podracer train): 0 complete; 75 (EX_TEMPFAIL) stopped by a
# signal with every rank checkpointed, run again to resume; 2 bad input.
#
# Signals and requeue. The batch shell traps USR1, USR2 and TERM and sends SIGUSR1 to its srun
# (srun forwards it to every rank on every node); the ranks finish their update, checkpoint
# and exit 75. Then:
#   srun 0                              -> exit 0, done
#   srun 75 after USR1/USR2, or 75 with no signal seen here (the steps were signalled directly,
#     e.g. `scancel --signal=USR1 JOB`)  -> `scontrol requeue $SLURM_JOB_ID`; the job resumes
#   srun failed after USR1/USR2         -> requeue too (ranks killed before their handler was up)
#   anything after TERM (scancel, hard time limit, preemption) -> no requeue: a cancel stays a
#     cancel; exit 75 (resubmit with PODRACER_RUN_DIR to resume)
#   srun 2                              -> exit 2 (bad input), never requeued
# PODRACER_MAX_REQUEUES bounds the restarts (SLURM_RESTART_COUNT).
#
# PODRACER_DRY_RUN=1: print what would run (environment, srun line) and run nothing; render.sh
# uses it for the golden files of tests/golden/templates/.

PODRACER_EX_REQUEUE=75
PODRACER_EX_USAGE=2
_PODRACER_SIGNAL=""
_PODRACER_TERM=0
_PODRACER_SRUN_PID=""

_PODRACER_SAID=""  # what was said before the output moved into the run directory
podracer_say() {
    printf '[podracer-slurm] %s\n' "$*"
    _PODRACER_SAID+="[podracer-slurm] $*"$'\n'
}
podracer_die() {
    printf '[podracer-slurm] error: %s\n' "$*" >&2
    exit "$PODRACER_EX_USAGE"
}
podracer_dry() { [[ ${PODRACER_DRY_RUN:-0} == 1 ]]; }

# a command line as a shell would read it back
_podracer_quote() {
    local out="" a
    for a in "$@"; do
        if [[ $a =~ ^[A-Za-z0-9_./=:,+@%^-]+$ ]]; then
            out+=" $a"
        else
            out+=" '${a//\'/\'\\\'\'}'"
        fi
    done
    printf '%s' "${out# }"
}

podracer_setup() {
    PODRACER_TEMPLATE=$1
    [[ -n ${PODRACER_ROOT:-} && -d $PODRACER_ROOT ]] ||
        podracer_die "PODRACER_ROOT=${PODRACER_ROOT:-} is not a directory (the podracer-hpc checkout)"
    local site=${PODRACER_SITE:-$PODRACER_ROOT/slurm_templates/site.sh}
    [[ -f $site ]] || podracer_die "no site file $site (set PODRACER_SITE)"
    # shellcheck source=site.sh
    source "$site"
    PODRACER_SITE=$site
    [[ $PODRACER_MPI =~ ^(pmix|pmi2|pmix_v[0-9]+|pmi|none|cray_shasta)$ ]] ||
        podracer_die "PODRACER_MPI=$PODRACER_MPI: use pmix (Open MPI/HPC-X) or pmi2 (MPICH, the mpich wheel)"
    [[ $PODRACER_MAX_REQUEUES =~ ^[0-9]+$ ]] || podracer_die "PODRACER_MAX_REQUEUES=$PODRACER_MAX_REQUEUES is not a count"
    [[ $PODRACER_SRUN_WAIT =~ ^[0-9]+$ ]] || podracer_die "PODRACER_SRUN_WAIT=$PODRACER_SRUN_WAIT is not a number of seconds"
    [[ -n ${SLURM_JOB_ID:-} ]] ||
        podracer_die "SLURM_JOB_ID is not set: submit this with sbatch (or preview it: slurm_templates/render.sh)"
    if ! podracer_dry; then
        # from here on a warning signal (--signal=B:USR1@..., scancel, preemption) is relayed
        # to the ranks or, before they start, turns into a requeue
        trap '_podracer_on_signal USR1' USR1
        trap '_podracer_on_signal USR2' USR2
        trap '_podracer_on_signal TERM' TERM
    fi
    podracer_say "$PODRACER_TEMPLATE: job ${SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+ (array ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID})}," \
        "restart ${SLURM_RESTART_COUNT:-0}, ${SLURM_JOB_NUM_NODES:-?} node(s) ${SLURM_JOB_NODELIST:-?}," \
        "${SLURM_NTASKS:-?} task(s), mpi=$PODRACER_MPI, site $PODRACER_SITE"
}

podracer_activate() {
    if [[ -n $PODRACER_MODULES ]]; then
        podracer_say "module load $PODRACER_MODULES"
        if ! podracer_dry; then
            type module >/dev/null 2>&1 || podracer_die "PODRACER_MODULES is set but there is no \`module\` command"
            # shellcheck disable=SC2086
            module load $PODRACER_MODULES || podracer_die "module load $PODRACER_MODULES failed"
        fi
    fi
    if [[ -n $PODRACER_CONDA_ENV ]]; then
        podracer_say "conda activate $PODRACER_CONDA_ENV"
        if ! podracer_dry; then
            command -v conda >/dev/null || podracer_die "PODRACER_CONDA_ENV is set but conda is not on PATH"
            eval "$(conda shell.bash hook)" && conda activate "$PODRACER_CONDA_ENV" ||
                podracer_die "conda activate $PODRACER_CONDA_ENV failed"
        fi
    elif [[ -n $PODRACER_VENV ]]; then
        podracer_say "venv $PODRACER_VENV (if it exists)"
        if ! podracer_dry && [[ -f $PODRACER_VENV/bin/activate ]]; then
            # shellcheck disable=SC1091
            source "$PODRACER_VENV/bin/activate"
        fi
    fi
    if ! podracer_dry; then
        command -v podracer >/dev/null ||
            podracer_die "no \`podracer\` on PATH: set PODRACER_VENV or PODRACER_CONDA_ENV in site.sh ($PODRACER_SITE)"
        podracer_say "podracer: $(command -v podracer)"
    fi
}

# podracer_file WHAT PATH: the absolute path of an input file, as given (relative to the working
# directory) or else under PODRACER_ROOT; exits 2 if there is none
# podracer_find_file PATH: the absolute path of an input file as a job finds it (PATH itself, else
# a relative PATH under $PODRACER_ROOT), or status 1 (submit_check.sh refuses with the same rule)
podracer_find_file() {
    local f=$1
    if [[ -f $f ]]; then
        realpath -- "$f"
    elif [[ $f != /* && -f $PODRACER_ROOT/$f ]]; then
        realpath -- "$PODRACER_ROOT/$f"
    else
        return 1
    fi
}
podracer_file() {
    podracer_find_file "$2" || podracer_die "$1 $2 not found (a relative path is tried in $PWD, then in $PODRACER_ROOT)"
}

_podracer_on_signal() {
    local sig=$1
    _PODRACER_SIGNAL=$sig
    [[ $sig == TERM ]] && _PODRACER_TERM=1
    if [[ -n $_PODRACER_SRUN_PID ]] && kill -0 "$_PODRACER_SRUN_PID" 2>/dev/null; then
        # srun forwards SIGUSR1 to every task of the step on every node (seen on Slurm 22.05);
        # the ranks treat USR1, USR2 and TERM alike: finish the update, checkpoint, exit 75.
        podracer_say "batch shell got SIG$sig: sending SIGUSR1 to the srun step (pid $_PODRACER_SRUN_PID)"
        kill -s USR1 "$_PODRACER_SRUN_PID" 2>/dev/null || scancel --signal=USR1 "$SLURM_JOB_ID"
    else
        podracer_say "batch shell got SIG$sig while no srun step runs"
    fi
}

_podracer_requeue() {
    local why=$1 n=${SLURM_RESTART_COUNT:-0}
    if ((_PODRACER_TERM)); then
        # SIGTERM is scancel, the hard time limit or preemption: never undo a cancel. Slurm
        # requeues a preempted job itself where PreemptMode=REQUEUE.
        podracer_say "$why; not requeued: the job got SIGTERM (scancel, time limit or preemption)." \
            "To go on: PODRACER_RUN_DIR=$PODRACER_RUN_DIR sbatch ... (same job file and options)"
        exit "$PODRACER_EX_REQUEUE"
    fi
    if ((n >= PODRACER_MAX_REQUEUES)); then
        podracer_say "$why; not requeued: restarted $n times already (PODRACER_MAX_REQUEUES)." \
            "To go on: PODRACER_RUN_DIR=$PODRACER_RUN_DIR sbatch ... (same job file and options)"
        exit "$PODRACER_EX_REQUEUE"
    fi
    podracer_say "$why; requeueing job $SLURM_JOB_ID (restart $((n + 1))): it resumes from $PODRACER_RUN_DIR"
    if scontrol requeue "$SLURM_JOB_ID"; then
        exit 0 # the job is pending again; this instance is accounted as REQUEUED
    fi
    podracer_say "scontrol requeue $SLURM_JOB_ID failed (cancelled, or --no-requeue?)." \
        "To go on: PODRACER_RUN_DIR=$PODRACER_RUN_DIR sbatch ... (same job file and options)"
    exit "$PODRACER_EX_REQUEUE"
}

# GPUs per node of the job, from Slurm's variables (0 when none)
_podracer_gpus_per_node() {
    local g=${SLURM_GPUS_PER_NODE:-}
    g=${g##*:} # "h100:8" form
    if [[ $g =~ ^[0-9]+$ ]]; then
        echo "$g"
    elif [[ -n ${SLURM_JOB_GPUS:-} ]]; then
        local ids
        IFS=, read -ra ids <<<"$SLURM_JOB_GPUS"
        echo "${#ids[@]}"
    else
        echo 0
    fi
}

# podracer_snapshot JOBFILE: make (first start) or reuse (requeue) the job's code snapshot in the
# run directory; sets PODRACER_CODE, PODRACER_JOB_FILE and the ranks' PYTHONPATH
podracer_snapshot() {
    local job=$1 src=${PODRACER_CODE_FROM:-$PODRACER_ROOT} id rev dirty marker
    marker=$PODRACER_RUN_DIR/code/job-${SLURM_JOB_ID}
    if [[ ${PODRACER_SNAPSHOT:-1} == 0 ]]; then
        podracer_say "code: the live checkout $PODRACER_ROOT (PODRACER_SNAPSHOT=0: a requeue runs whatever is there then)"
        PODRACER_JOB_FILE=$job
        return 0
    fi
    [[ -d $src/podracer_hpc ]] || podracer_die "no podracer_hpc/ in $src to snapshot (PODRACER_CODE_FROM or PODRACER_ROOT)"
    if [[ -f $marker ]] && ! podracer_dry; then
        id=$(<"$marker")
    else
        id=$(cd "$src" && {
            find podracer_hpc -type f ! -path '*/__pycache__/*' ! -name '*.py[co]' -print0 | LC_ALL=C sort -z |
                xargs -0 sha256sum
            basename "$job"
            sha256sum <"$job"
        } | sha256sum | cut -c1-12)
    fi
    PODRACER_CODE=$PODRACER_RUN_DIR/code/$id
    if [[ -f $src/SNAPSHOT.json ]]; then # a copy submit.sh made: its revision
        rev=$(sed -n 's/.*"revision": *"\([^"]*\)".*/\1/p' "$src/SNAPSHOT.json")
    elif rev=$(git -C "$src" rev-parse --short HEAD 2>/dev/null); then
        dirty=$(git -C "$src" status --porcelain --untracked-files=no 2>/dev/null)
        [[ -n $dirty ]] && rev+=-dirty
    else
        rev=unknown
    fi
    if [[ -f $PODRACER_CODE/SNAPSHOT.json ]]; then
        rev=$(sed -n 's/.*"revision": *"\([^"]*\)".*/\1/p' "$PODRACER_CODE/SNAPSHOT.json")
        podracer_say "code: snapshot $PODRACER_CODE (revision $rev), made at the first start; reused"
    elif podracer_dry; then
        podracer_say "code: snapshot of $src/podracer_hpc and the job file -> $PODRACER_CODE (revision $rev)"
    else
        local tmp=$PODRACER_RUN_DIR/code/.$id.tmp$$
        rm -rf "$tmp" && mkdir -p "$tmp" &&
            (cd "$src" && find podracer_hpc -type f ! -path '*/__pycache__/*' ! -name '*.py[co]' -print0 |
                xargs -0 cp --parents -p -t "$tmp") &&
            cp -p "$job" "$tmp/" &&
            printf '{\n  "revision": "%s",\n  "dirty": %s,\n  "id": "%s",\n  "source": "%s",\n  "created": "%s"\n}\n' \
                "$rev" "$([[ $rev == *-dirty ]] && echo true || echo false)" "$id" "$src" "$(date -Iseconds)" \
                >"$tmp/SNAPSHOT.json" ||
            podracer_die "cannot write the code snapshot $tmp"
        mv -T "$tmp" "$PODRACER_CODE" 2>/dev/null || rm -rf "$tmp" # another job made the same one first
        podracer_say "code: snapshot $PODRACER_CODE (revision $rev) of $src"
    fi
    podracer_dry || echo "$id" >"$marker"
    PODRACER_JOB_FILE=$PODRACER_CODE/$(basename "$job") # its own name: the run's name defaults to its stem
    export PODRACER_CODE PODRACER_GIT_REVISION=$rev PYTHONSAFEPATH=1
    export PYTHONPATH=$PODRACER_CODE${PYTHONPATH:+:$PYTHONPATH}
}

# podracer_rundir JOBFILE   (needs PODRACER_RUN_DIR): creates the run directory, moves the job's
# output into it, and makes or reuses the code snapshot (PODRACER_JOB_FILE: its job file)
podracer_rundir() {
    if ! podracer_dry; then
        mkdir -p "$PODRACER_RUN_DIR/code" || podracer_die "cannot create $PODRACER_RUN_DIR"
        local log=$PODRACER_RUN_DIR/slurm-${SLURM_JOB_ID}.out
        podracer_say "output continues in $log"
        exec >>"$log" 2>&1 || podracer_die "cannot write $log"
        printf '%s' "$_PODRACER_SAID"
    fi
    podracer_snapshot "$1"
}

# podracer_launch [SRUN_OPTIONS...] -- CMD...   (needs PODRACER_RUN_DIR)
podracer_launch() {
    local opts=()
    while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
    [[ ${1:-} == -- ]] || podracer_die "podracer_launch: no -- before the command"
    shift
    local cmd=("$@")

    # resources of each task: CPUs (srun does not inherit sbatch's -c on Slurm 22.05-23.02) and GPUs
    local res=() gpus per_node o
    if [[ ${SLURM_CPUS_PER_TASK:-} =~ ^[0-9]+$ ]]; then
        export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
        res+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
    fi
    gpus=$(_podracer_gpus_per_node)
    per_node=${SLURM_NTASKS_PER_NODE:-$(((${SLURM_NTASKS:-1} + ${SLURM_JOB_NUM_NODES:-1} - 1) / ${SLURM_JOB_NUM_NODES:-1}))}
    per_node=${per_node%%(*}
    for o in "${opts[@]}"; do [[ $o == --ntasks-per-node=* ]] && per_node=${o#*=}; done
    export PODRACER_GPUS=$gpus # what the job asked for, per node: a pod without a GPU it asked for fails
    if ((gpus > 0)); then
        ((per_node <= gpus)) ||
            podracer_die "$per_node pods per node but $gpus GPUs per node: two pods would share a GPU (one pod per GPU: --ntasks-per-node <= --gpus-per-node)"
        case $PODRACER_GPU_BIND in
            # one GPU per pod on the socket of its CPUs: --gpus-per-task alone implies per_task:1 (GPUs in
            # task order, whatever socket srun's default block:cyclic gave the task's CPUs)
            per-task) res+=(--gpus-per-task=1 --gpu-bind=single:1 --distribution=block:block)
                export PODRACER_GPU_BIND ;;
            none) ;;
            *) podracer_die "PODRACER_GPU_BIND=$PODRACER_GPU_BIND: use per-task or none" ;;
        esac
    fi
    local extra=()
    # shellcheck disable=SC2206  # word-split on purpose: "--cpu-bind=cores --network=..."
    [[ -n ${PODRACER_SRUN_ARGS:-} ]] && extra=($PODRACER_SRUN_ARGS)
    for o in "${extra[@]}" "${opts[@]}"; do
        [[ $o == --gpu-bind=*closest* ]] && podracer_die "$o: each pod would see every GPU near its CPUs and fail its one-GPU check; the default already binds one GPU on the pod's NUMA node (--gpu-bind=single:1): drop it"
    done
    local srun=(srun --mpi="$PODRACER_MPI" --wait="$PODRACER_SRUN_WAIT" "${res[@]}" "${extra[@]}" "${opts[@]}" "${cmd[@]}")
    local v
    for v in $(compgen -e | LC_ALL=C sort); do
        case $v in
            PODRACER_COMM | PODRACER_GPU* | PODRACER_CACHE_DIR | PODRACER_GIT_REVISION | PYTHONUNBUFFERED | PYTHONDONTWRITEBYTECODE | \
                PYTHONPATH | PYTHONSAFEPATH | OMP_NUM_THREADS | SRUN_CPUS_PER_TASK | HDF5_USE_FILE_LOCKING | \
                NCCL_* | UCX_* | PMIX_MCA_* | OMPI_MCA_*)
                podracer_say "env $v=${!v}" ;;
        esac
    done
    podracer_say "run dir $PODRACER_RUN_DIR"
    podracer_say "+ $(_podracer_quote "${srun[@]}")"
    if podracer_dry; then
        exit 0
    fi

    if [[ -n $_PODRACER_SIGNAL ]]; then
        _podracer_requeue "stopped by SIG$_PODRACER_SIGNAL before the ranks started"
    fi
    "${srun[@]}" &
    _PODRACER_SRUN_PID=$!
    local rc
    while :; do
        wait "$_PODRACER_SRUN_PID"
        rc=$?
        # `wait` also returns when a trapped signal arrives: go on waiting while srun lives
        kill -0 "$_PODRACER_SRUN_PID" 2>/dev/null || break
    done
    _PODRACER_SRUN_PID=""  # the traps stay: a later TERM (scancel) still forbids the requeue
    podracer_say "srun exited with $rc${_PODRACER_SIGNAL:+ (after SIG$_PODRACER_SIGNAL)}"
    case $rc in
        0) podracer_say "complete: $PODRACER_RUN_DIR/summary.json"
           exit 0 ;;
        "$PODRACER_EX_REQUEUE") _podracer_requeue "every rank checkpointed and stopped (exit 75)" ;;
        "$PODRACER_EX_USAGE") podracer_say "bad input (exit 2): not requeued"
           exit "$PODRACER_EX_USAGE" ;;
    esac
    if [[ -n $_PODRACER_SIGNAL ]]; then
        # e.g. a rank killed by the signal before it had installed its handler (at start-up):
        # what is on disk is the last checkpoint of every rank, which a requeue resumes
        _podracer_requeue "srun exited with $rc after SIG$_PODRACER_SIGNAL"
    fi
    exit "$rc"
}
