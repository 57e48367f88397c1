#!/usr/bin/env bash
# A real Slurm cluster of 4 logical nodes (n1..n4) on this one host, with accounting
# (slurmdbd + a private MariaDB), or without (--no-accounting), for tests and CI.
# See docs/local-slurm.md.
#
#   scripts/local_slurm.sh install            # apt packages (root); quick when present
#   scripts/local_slurm.sh start  [--no-accounting] [DIR]   # write configs, start daemons, wait until idle
#   scripts/local_slurm.sh status [--no-accounting] [DIR]   # exit 0 only when every daemon answers
#   scripts/local_slurm.sh env    [--no-accounting] [DIR]   # eval "$(scripts/local_slurm.sh env)"
#   scripts/local_slurm.sh stop   [--no-accounting] [DIR]   # cancel jobs, stop daemons (idempotent)
#
# DIR defaults to ${PODRACER_SLURM_DIR:-/tmp/podracer-slurm}, and with --no-accounting to
# /tmp/podracer-slurm-noacct, so both kinds can run at once. Everything (configs, state, logs,
# pid files, the MariaDB datadir, the chosen ports, the mode) lives under DIR; status, env and
# stop read the mode that start recorded there.
# --no-accounting: no slurmdbd, no MariaDB (AccountingStorageType=accounting_storage/none), as
# on many small sites: sacct knows nothing, and an ended job is known only to scontrol, for
# MinJobAge (300) seconds.
# Env knobs: PODRACER_SLURM_TIMEOUT (seconds to wait for the cluster, default 60);
# PODRACER_SLURM_ACCOUNTING=0 (same as --no-accounting).
set -euo pipefail

PROG=$(basename "$0")
export PATH=$PATH:/usr/sbin:/sbin   # the daemons live there; a user's PATH may lack it
NODES=(n1 n2 n3 n4)
CLUSTER=podlab
PACKAGES=(slurm-wlm munge slurmdbd mariadb-server)
TIMEOUT=${PODRACER_SLURM_TIMEOUT:-60}
DB_PASS=podracer-slurm   # loopback-only MariaDB under DIR: not a secret

log() { printf '[%s] %s\n' "$PROG" "$*"; }
err() { printf '[%s] ERROR: %s\n' "$PROG" "$*" >&2; }
die() { err "$*"; exit 1; }

usage() {
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
}

need_root() {
    [[ $(id -u) -eq 0 ]] || die "$1 needs root (this script runs slurmd/munged/mariadbd as root); you are $(id -un)"
}

# ---------------------------------------------------------------- helpers

ACCOUNTING=${PODRACER_SLURM_ACCOUNTING:-1}
CMD=

set_dir() {
    local default=${PODRACER_SLURM_DIR:-/tmp/podracer-slurm}
    ((ACCOUNTING)) || default=/tmp/podracer-slurm-noacct
    DIR=$(realpath -m -- "${1:-$default}")
    CONF=$DIR/slurm.conf
    RUN=$DIR/run
    LOGD=$DIR/log
    export SLURM_CONF=$CONF
    RECORDED=
    if [[ -f $DIR/mode.env ]]; then
        RECORDED=$(sed -n 's/^ACCOUNTING=//p' "$DIR/mode.env")
        # status/env/stop follow what start recorded; start follows the command line
        [[ $CMD == start || -z $RECORDED ]] || ACCOUNTING=$RECORDED
    fi
}

# pid from a pid file if that process is alive and named $2 (guards against pid reuse)
live_pid() {
    local f=$1 name=$2 pid comm
    [[ -s $f ]] || return 1
    pid=$(tr -dc '0-9' <"$f")
    [[ -n $pid ]] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == "$name" ]] || return 1
    echo "$pid"
}

# "file:name" pairs of every daemon this cluster runs, in start order
daemons() {
    if ((ACCOUNTING)); then
        echo "$RUN/mariadbd.pid:mariadbd"
        echo "$RUN/slurmdbd.pid:slurmdbd"
    fi
    echo "$RUN/slurmctld.pid:slurmctld"
    local n
    for n in "${NODES[@]}"; do echo "$RUN/slurmd-$n.pid:slurmd"; done
}

any_alive() {
    local d
    while IFS= read -r d; do
        live_pid "${d%%:*}" "${d##*:}" >/dev/null && return 0
    done < <(daemons)
    return 1
}

all_alive() {
    local d
    while IFS= read -r d; do
        live_pid "${d%%:*}" "${d##*:}" >/dev/null || return 1
    done < <(daemons)
    return 0
}

# N free TCP ports (free on 0.0.0.0 and 127.0.0.1), below the ephemeral range, spaced out
pick_ports() {
    local n=$1
    if [[ -x /usr/bin/python3 ]] || command -v python3 >/dev/null; then
        "$(command -v /usr/bin/python3 || command -v python3)" - "$n" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
def free(p):
    for host in ("0.0.0.0", "127.0.0.1"):
        s = socket.socket()
        try:
            s.bind((host, p))
        except OSError:
            return False
        finally:
            s.close()
    return True
rng = random.Random()
for _ in range(200):
    base = rng.randrange(20000, 32000 - n)
    ports = list(range(base, base + n))
    if all(free(p) for p in ports):
        print(" ".join(map(str, ports)))
        sys.exit(0)
sys.exit("no block of free ports found")
PY
    else
        local used base p ok
        used=$(ss -Htan | awk '{print $4}' | sed 's/.*://' | sort -u)
        for _ in $(seq 200); do
            base=$((20000 + RANDOM % 11000)); ok=1
            for ((p = base; p < base + n; p++)); do
                grep -qx "$p" <<<"$used" && { ok=0; break; }
            done
            ((ok)) && { seq -s ' ' "$base" $((base + n - 1)); return 0; }
        done
        die "no block of free ports found"
    fi
}

ports_free() {
    local p
    for p in "$@"; do
        ss -Htan "sport = :$p" | grep -q . && return 1
    done
    return 0
}

load_ports() {
    # shellcheck disable=SC1091
    [[ -f $DIR/ports.env ]] && source "$DIR/ports.env"
    [[ -n ${DB_PORT:-} ]]
}

tail_log() {
    local f=$1
    if [[ -f $f ]]; then
        err "last lines of $f:"
        tail -n "${2:-25}" "$f" | sed 's/^/    /' >&2
    else
        err "($f does not exist)"
    fi
}

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

cluster_idle() {
    local states
    states=$(timeout 10 sinfo -h -o %t 2>/dev/null) || return 1
    [[ -n $states ]] || return 1
    ! grep -qvx 'idle' <<<"$states"
}

# nodes usable (running jobs is fine); used by status
cluster_up() {
    local states
    states=$(timeout 10 sinfo -h -o %t 2>/dev/null) || return 1
    [[ -n $states ]] || return 1
    ! grep -Eqv '^(idle|alloc|mix|comp)$' <<<"$states"
}

dbd_ok() {
    ((ACCOUNTING)) || return 0
    timeout 10 sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"
}

# wait_for SECONDS DESCRIPTION LOGFILE CMD... : until CMD succeeds; CMD's status 2 means
# "will never succeed" (a daemon died) and ends the wait at once
wait_for() {
    local secs=$1 what=$2 logf=$3; shift 3
    local end=$((SECONDS + secs)) rc
    while :; do
        rc=0
        "$@" || rc=$?
        ((rc == 0)) && return 0
        if ((rc == 2)); then
            err "gave up waiting for $what: a daemon exited"
            tail_log "$logf"
            return 1
        fi
        if ((SECONDS >= end)); then
            err "timed out after ${secs}s waiting for $what"
            tail_log "$logf"
            return 1
        fi
        sleep 0.2
    done
}

# status 2 when one of the named daemons has died (after its pid file appeared)
died() {
    local name
    for name in "$@"; do
        case $name in
            slurmd) local n; for n in "${NODES[@]}"; do
                    [[ -s $RUN/slurmd-$n.pid ]] && ! live_pid "$RUN/slurmd-$n.pid" slurmd >/dev/null && return 0
                done ;;
            *) [[ -s $RUN/$name.pid ]] && ! live_pid "$RUN/$name.pid" "$name" >/dev/null && return 0 ;;
        esac
    done
    return 1
}

db_up() {
    db_ping && return 0
    [[ -d /proc/$MARIADBD_PID ]] || return 2
    return 1
}

dbd_up() {
    dbd_listening && return 0
    died slurmdbd mariadbd && return 2
    return 1
}

nodes_up() {
    cluster_idle && return 0
    died slurmctld slurmd slurmdbd mariadbd && return 2
    return 1
}

# ---------------------------------------------------------------- install

cmd_install() {
    local missing=() b
    for b in slurmctld slurmd slurmdbd sinfo sacct munged mariadbd mariadb-install-db; do
        command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || missing+=("$b")
    done
    if ((${#missing[@]} == 0)); then
        log "already installed: $(slurmctld -V 2>/dev/null), $(munged -V 2>&1 | head -1), $(mariadbd --version 2>/dev/null | awk '{print $3}')"
        return 0
    fi
    log "missing: ${missing[*]}"
    need_root install
    command -v apt-get >/dev/null || die "install needs apt-get (Debian/Ubuntu); install ${PACKAGES[*]} by other means"
    # Debian images usually carry a policy-rc.d that stops package scripts from starting
    # services (MariaDB on :3306); add one for the install if this one has none.
    local policy=/usr/sbin/policy-rc.d added=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1
    fi
    local rc=0
    {
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PACKAGES[@]}"
    } || rc=$?
    ((added)) && rm -f "$policy"
    ((rc == 0)) || die "apt-get failed (exit $rc)"
    log "installed: $(slurmctld -V), $(munged -V 2>&1 | head -1)"
}

# ---------------------------------------------------------------- configs

accounting_lines() {
    if ((ACCOUNTING)); then
        printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nAccountingStoragePort=%s\n' "$DBD_PORT"
    else
        echo "AccountingStorageType=accounting_storage/none"
    fi
}

# Job ids from a range of this cluster's own (from its slurmctld port): two clusters on one host
# (two DIRs, or two users' test tiers) then never give two live jobs the same id. MPICH names its
# /dev/shm segments after <job id>.<step id>, so equal ids on one host would share segments.
first_job_id() { echo $(((CTLD_PORT - 19000) * 1000)); }

write_configs() {
    local node_ports=("$N1_PORT" "$N2_PORT" "$N3_PORT" "$N4_PORT") n i
    cat >"$CONF" <<EOF
# Written by scripts/local_slurm.sh: a 4-node Slurm cluster on one host.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$N1_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGD/slurmctld.log
SlurmdLogFile=$LOGD/slurmd-%n.log
ProctrackType=proctrack/linuxproc
# task/affinity binds each task to the CPUs it was given (--cpus-per-task), as on a real cluster;
# the 4 logical nodes all map their CPUs 0-1 onto the host's CPUs 0-1
TaskPlugin=task/affinity
# 2 stand-in GPUs per node (gres.conf; device files under DIR/dev): Slurm allocates and binds them
# (--gpus-per-node, --gpus-per-task: CUDA_VISIBLE_DEVICES of each task) without any GPU here
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGD/jobcomp.txt
$(accounting_lines)
FirstJobId=$(first_job_id)
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=300
KillWait=5
MailProg=/bin/true
EOF
    for i in "${!NODES[@]}"; do
        n=${NODES[$i]}
        echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=${node_ports[$i]} CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4000 Gres=gpu:2 State=UNKNOWN" >>"$CONF"
    done
    # slurmd wants character devices: links to /dev/null and /dev/zero (never opened by anything)
    mkdir -p "$DIR/dev"
    ln -sfn /dev/null "$DIR/dev/nvidia0"
    ln -sfn /dev/zero "$DIR/dev/nvidia1"
    echo "NodeName=$(IFS=,; echo "${NODES[*]}") Name=gpu File=$DIR/dev/nvidia[0-1]" >"$DIR/gres.conf"
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
    echo "ACCOUNTING=$ACCOUNTING" >"$DIR/mode.env"
    if ! ((ACCOUNTING)); then
        rm -f "$DIR/slurmdbd.conf"
        return 0
    fi

    (
        umask 077
        cat >"$DIR/slurmdbd.conf" <<EOF
# Written by scripts/local_slurm.sh
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGD/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$DIR/slurmdbd.conf"
}

# ---------------------------------------------------------------- daemons

start_munge() {
    if munge_ok; then
        log "munged: already running (left as is)"
        return 0
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
        chown munge:munge /etc/munge/munge.key
        chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge
    # a stale socket/pid from a killed munged makes the new one refuse to start
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    setsid runuser -u munge -- /usr/sbin/munged </dev/null >>"$LOGD/munged.out" 2>&1 ||
        { tail_log /var/log/munge/munged.log; die "munged failed to start"; }
    wait_for 10 munged /var/log/munge/munged.log munge_ok || die "munged does not answer"
    cp /run/munge/munged.pid "$RUN/munged.started-here"
    log "munged: started (pid $(cat /run/munge/munged.pid)); 'stop' will stop it"
}

db_sql() {
    mariadb --no-defaults --protocol=socket --socket="$RUN/mariadb.sock" -uroot -e "$1"
}

db_ping() {
    mariadb-admin --no-defaults --protocol=socket --socket="$RUN/mariadb.sock" -uroot ping >/dev/null 2>&1
}

# a small, fast, throwaway InnoDB (losing the last second of accounting on a crash is fine)
DB_OPTS=(--innodb-buffer-pool-size=32M --innodb-log-file-size=16M --innodb-lock-wait-timeout=900
    --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --skip-name-resolve)

start_mariadb() {
    local data=$DIR/db
    if [[ ! -d $data/mysql ]]; then
        rm -rf "$data"
        mkdir -p "$data"
        mariadb-install-db --no-defaults --datadir="$data" --user=root \
            --auth-root-authentication-method=socket --skip-test-db "${DB_OPTS[@]}" \
            >"$LOGD/mariadb-install.log" 2>&1 ||
            { tail_log "$LOGD/mariadb-install.log"; die "mariadb-install-db failed"; }
    fi
    rm -f "$RUN/mariadb.sock"
    setsid nohup mariadbd --no-defaults --user=root --datadir="$data" \
        --socket="$RUN/mariadb.sock" --pid-file="$RUN/mariadbd.pid" \
        --port="$DB_PORT" --bind-address=127.0.0.1 --log-error="$LOGD/mariadb.log" \
        "${DB_OPTS[@]}" --performance-schema=OFF --max-connections=50 \
        </dev/null >>"$LOGD/mariadb.out" 2>&1 &
    MARIADBD_PID=$!
    wait_for "$TIMEOUT" "mariadbd on 127.0.0.1:$DB_PORT" "$LOGD/mariadb.log" db_up || exit 1
    db_sql "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
            CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
            FLUSH PRIVILEGES;" || die "could not create the MariaDB user slurm"
}

dbd_listening() { ss -Hltn "sport = :$DBD_PORT" | grep -q .; }

start_slurm_daemons() {
    if ((ACCOUNTING)); then
        setsid slurmdbd </dev/null >>"$LOGD/slurmdbd.out" 2>&1 ||
            { tail_log "$LOGD/slurmdbd.log"; die "slurmdbd failed to start"; }
        wait_for "$TIMEOUT" "slurmdbd on port $DBD_PORT" "$LOGD/slurmdbd.log" dbd_up || exit 1
    fi

    setsid slurmctld -i -f "$CONF" </dev/null >>"$LOGD/slurmctld.out" 2>&1 ||
        { tail_log "$LOGD/slurmctld.log"; tail_log "$LOGD/slurmctld.out"; die "slurmctld failed to start"; }
    local n
    for n in "${NODES[@]}"; do
        setsid slurmd -N "$n" -f "$CONF" </dev/null >>"$LOGD/slurmd-$n.out" 2>&1 ||
            { tail_log "$LOGD/slurmd-$n.log"; tail_log "$LOGD/slurmd-$n.out"; die "slurmd -N $n failed to start"; }
    done
}

# ---------------------------------------------------------------- subcommands

cmd_start() {
    need_root start
    set_dir "${1:-}"
    mkdir -p "$DIR" || die "cannot create $DIR"
    local b needed=(slurmctld slurmd munged)
    ((ACCOUNTING)) && needed+=(slurmdbd mariadbd mariadb-install-db)
    for b in "${needed[@]}"; do
        command -v "$b" >/dev/null 2>&1 || die "$b not found: run '$PROG install' first (as root)"
    done

    if [[ -n $RECORDED && $RECORDED != "$ACCOUNTING" ]]; then
        log "$DIR was a cluster with ACCOUNTING=$RECORDED; restarting it with ACCOUNTING=$ACCOUNTING"
        local want=$ACCOUNTING
        ACCOUNTING=$RECORDED
        cmd_stop "$DIR"
        ACCOUNTING=$want
    fi
    if all_alive && munge_ok && cluster_up && dbd_ok; then
        log "already running in $DIR"
        print_summary
        return 0
    fi
    if any_alive; then
        log "partly running in $DIR: stopping it first"
        cmd_stop "$DIR"
    fi

    local t0=$SECONDS
    trap 'rc=$?; ((rc == 0)) || err "start failed (exit $rc); logs: $LOGD; what did start is left running for inspection: $0 stop $DIR"' EXIT
    mkdir -p "$DIR/state" "$LOGD" "$RUN"
    for b in "${NODES[@]}"; do mkdir -p "$DIR/spool/$b" "$DIR/tmp/$b"; done

    # reuse the recorded ports when they are still free, else pick new ones
    if ! { load_ports && ports_free "$DB_PORT" "$DBD_PORT" "$CTLD_PORT" "$N1_PORT" "$N2_PORT" "$N3_PORT" "$N4_PORT"; }; then
        local ports
        read -r -a ports <<<"$(pick_ports 7)"
        DB_PORT=${ports[0]} DBD_PORT=${ports[1]} CTLD_PORT=${ports[2]}
        N1_PORT=${ports[3]} N2_PORT=${ports[4]} N3_PORT=${ports[5]} N4_PORT=${ports[6]}
        cat >"$DIR/ports.env" <<EOF
DB_PORT=$DB_PORT
DBD_PORT=$DBD_PORT
CTLD_PORT=$CTLD_PORT
N1_PORT=$N1_PORT
N2_PORT=$N2_PORT
N3_PORT=$N3_PORT
N4_PORT=$N4_PORT
EOF
    fi
    write_configs

    start_munge
    if ((ACCOUNTING)); then start_mariadb; fi
    start_slurm_daemons

    wait_for "$TIMEOUT" "all nodes idle (sinfo -h -o %t)" "$LOGD/slurmctld.log" nodes_up || {
        sinfo -N -o '%N %t %E' >&2 2>/dev/null || true
        tail_log "$LOGD/slurmd-n1.log" 10
        exit 1
    }
    wait_for "$TIMEOUT" "sacctmgr show cluster to list $CLUSTER" "$LOGD/slurmdbd.log" dbd_ok || exit 1
    trap - EXIT
    log "started in $((SECONDS - t0))s"
    print_summary
}

print_summary() {
    load_ports || true
    local d f name pid
    echo "cluster $CLUSTER in $DIR ($( ((ACCOUNTING)) && echo "with accounting: slurmdbd + MariaDB" || echo "without accounting: sacct knows nothing"))"
    echo "  SLURM_CONF=$CONF"
    while IFS= read -r d; do
        f=${d%%:*} name=${d##*:}
        pid=$(live_pid "$f" "$name") || pid=-
        printf '  %-10s pid %-8s %s\n' "$name" "$pid" "$(basename "$f" .pid)"
    done < <(daemons)
    if munge_ok; then
        printf '  %-10s pid %-8s %s\n' munged "$(cat /run/munge/munged.pid 2>/dev/null || echo '?')" \
            "$([[ -f $RUN/munged.started-here ]] && echo 'started by this script' || echo 'not ours: left running by stop')"
    fi
    if ((ACCOUNTING)); then
        echo "  ports: mariadb 127.0.0.1:${DB_PORT:-?} slurmdbd ${DBD_PORT:-?} slurmctld ${CTLD_PORT:-?} slurmd n1-n4 ${N1_PORT:-?}-${N4_PORT:-?}"
    else
        echo "  ports: slurmctld ${CTLD_PORT:-?} slurmd n1-n4 ${N1_PORT:-?}-${N4_PORT:-?}"
    fi
    echo "  logs:  $LOGD"
    echo "  use:   eval \"\$($0 env $DIR)\""
}

cmd_status() {
    set_dir "${1:-}"
    [[ -f $CONF ]] || { echo "no cluster in $DIR (no slurm.conf)"; return 1; }
    local ok=0
    all_alive || { echo "not all daemons are running"; ok=1; }
    munge_ok || { echo "munged does not answer"; ok=1; }
    if ((ok == 0)); then
        cluster_up || { echo "sinfo does not show all nodes up"; ok=1; }
        dbd_ok || { echo "sacctmgr does not list cluster $CLUSTER"; ok=1; }
    fi
    print_summary
    if ((ok == 0)); then
        timeout 10 sinfo -N -o '  %N %P %t' 2>/dev/null || true
        echo "status: running"
    else
        echo "status: NOT running"
    fi
    return $ok
}

cmd_env() {
    set_dir "${1:-}"
    [[ -f $CONF ]] || die "no cluster in $DIR (run '$PROG start $DIR' first)"
    echo "export SLURM_CONF=$CONF"
    echo "export PODRACER_SLURM_DIR=$DIR"
}

# pids of the live daemons with those names
pids_of() {
    local d f name pid want
    while IFS= read -r d; do
        f=${d%%:*} name=${d##*:}
        for want in "$@"; do
            [[ $name == "$want" ]] || continue
            if pid=$(live_pid "$f" "$name"); then echo "$pid"; fi
        done
    done < <(daemons)
    return 0
}

# term_wait SECONDS PID... : TERM them together, wait until all are gone, KILL after SECONDS
term_wait() {
    local secs=$1; shift
    (($#)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    local end=$((SECONDS + secs)) alive pid
    while :; do
        alive=()
        for pid in "$@"; do [[ -d /proc/$pid ]] && alive+=("$pid"); done
        ((${#alive[@]})) || return 0
        if ((SECONDS >= end)); then
            err "still alive after ${secs}s, killing: ${alive[*]}"
            kill -KILL "${alive[@]}" 2>/dev/null || true
            sleep 0.5
            return 0
        fi
        sleep 0.1
    done
}

# slurmstepd processes of this cluster (their environment names our slurm.conf)
our_stepds() {
    local p
    for p in /proc/[0-9]*; do
        [[ $(cat "$p/comm" 2>/dev/null) == slurmstepd ]] || continue
        tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qx "SLURM_CONF=$CONF" && echo "${p#/proc/}"
    done
    return 0
}

# processes of this cluster's jobs (batch scripts, srun, ranks): a SLURM_JOB_ID and our slurm.conf
our_job_procs() {
    local p env
    for p in /proc/[0-9]*; do
        [[ ${p#/proc/} == "$$" ]] && continue
        env=$({ tr '\0' '\n' <"$p/environ"; } 2>/dev/null) || continue
        grep -qx "SLURM_CONF=$CONF" <<<"$env" && grep -q '^SLURM_JOB_ID=' <<<"$env" && echo "${p#/proc/}"
    done
    return 0
}

cmd_stop() {
    set_dir "${1:-}"
    [[ -d $RUN ]] || { log "nothing to stop in $DIR"; return 0; }
    local pid
    if pid=$(live_pid "$RUN/slurmctld.pid" slurmctld); then
        local jobs
        jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            log "cancelling jobs: ${jobs//$'\n'/ }"
            # shellcheck disable=SC2086
            timeout 10 scancel $jobs 2>/dev/null || true
            local end=$((SECONDS + 15))
            while [[ -n $(timeout 10 squeue -h -o %A -t PD,R,CG,S,CF 2>/dev/null) ]] && ((SECONDS < end)); do
                sleep 0.3
            done
        fi
    fi
    # slurmd and slurmctld first (slurmctld flushes its last records to slurmdbd), then
    # slurmdbd, then MariaDB and (when this script started it) munged together
    # shellcheck disable=SC2046
    term_wait 15 $(pids_of slurmd slurmctld)
    local steps
    steps=$(our_stepds)
    if [[ -n $steps ]]; then
        log "killing leftover slurmstepd: ${steps//$'\n'/ }"
        # shellcheck disable=SC2086
        kill -KILL $steps 2>/dev/null || true
    fi
    # what those stepds ran would outlive them (orphaned batch scripts and sruns, seen after a
    # failed test): end it too
    local procs
    procs=$(our_job_procs)
    if [[ -n $procs ]]; then
        log "killing leftover job processes: ${procs//$'\n'/ }"
        # shellcheck disable=SC2086
        kill -KILL $procs 2>/dev/null || true
    fi
    # shellcheck disable=SC2046
    term_wait 15 $(pids_of slurmdbd)
    local last munged_pid=
    last=$(pids_of mariadbd)
    if [[ -f $RUN/munged.started-here ]]; then
        munged_pid=$(live_pid "$RUN/munged.started-here" munged) || munged_pid=
    fi
    # shellcheck disable=SC2086
    term_wait 30 $last $munged_pid
    if [[ -n $munged_pid ]]; then log "munged stopped (pid $munged_pid; this script had started it)"; fi
    rm -f "$RUN"/*.pid "$RUN/mariadb.sock" "$RUN/munged.started-here"
    log "stopped cluster in $DIR"
}

# ---------------------------------------------------------------- main

main() {
    CMD=${1:-}
    shift || true
    local args=() a
    for a in "$@"; do
        case $a in
            --no-accounting) ACCOUNTING=0 ;;
            --accounting) ACCOUNTING=1 ;;
            -*) err "unknown option $a"; usage >&2; exit 2 ;;
            *) args+=("$a") ;;
        esac
    done
    set -- ${args[@]+"${args[@]}"}
    local cmd=$CMD
    case $cmd in
        install) cmd_install "$@" ;;
        start) cmd_start "$@" ;;
        stop) need_root stop; cmd_stop "$@" ;;
        status) cmd_status "$@" ;;
        env) cmd_env "$@" ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

main "$@"
