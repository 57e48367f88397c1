# shellcheck shell=bash
# slurm_templates/lib.sh -- what every template does, written once. Sourced by the templates
# (not run by users). Bash only: no Python outside the ranks.
#
#   podracer_setup NAME           site settings (site.sh), run-wide checks, the banner
#   podracer_activate             module load / conda activate / venv (host-side templates)
#   podracer_file WHAT PATH       prints the absolute path of an input file, or exits 2
#   podracer_launch [OPT...] -- CMD...  runs `srun [OPT...] CMD...` with the signal relay, then ends
#                                 the script: 0 complete, requeue on 75, else the failure code
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

podracer_say() { printf '[podracer-slurm] %s\n' "$*"; }
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
podracer_file() {
    local what=$1 f=$2
    if [[ -f $f ]]; then
        realpath -- "$f"
    elif [[ $f != /* && -f $PODRACER_ROOT/$f ]]; then
        realpath -- "$PODRACER_ROOT/$f"
    else
        podracer_die "$what $f not found (a relative path is tried in $PWD, then in $PODRACER_ROOT)"
    fi
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

# podracer_launch [SRUN_OPTIONS...] -- CMD...   (needs PODRACER_RUN_DIR)
podracer_launch() {
    local opts=()
    while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
    [[ ${1:-} == -- ]] || podracer_die "podracer_launch: no -- before the command"
    shift
    local srun=(srun --mpi="$PODRACER_MPI" --wait="$PODRACER_SRUN_WAIT" "${opts[@]}" "$@")
    local v
    for v in $(compgen -e | LC_ALL=C sort); do
        case $v in
            PODRACER_COMM | PYTHONUNBUFFERED | PYTHONPATH | OMP_NUM_THREADS | NCCL_* | UCX_* | PMIX_MCA_* | OMPI_MCA_*)
                podracer_say "env $v=${!v}" ;;
        esac
    done
    podracer_say "run dir $PODRACER_RUN_DIR"
    podracer_say "+ $(_podracer_quote "${srun[@]}")"
    if podracer_dry; then
        exit 0
    fi

    mkdir -p "$PODRACER_RUN_DIR" || podracer_die "cannot create $PODRACER_RUN_DIR"
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
