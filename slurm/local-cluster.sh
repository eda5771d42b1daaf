#!/usr/bin/env bash
# A two-node Slurm cluster on this one machine, for tests and for trying the sbatch templates.
#
#   slurm/local-cluster.sh up        install Slurm if missing (root + apt), start it, wait for idle
#   eval "$(slurm/local-cluster.sh env)"   point sinfo/srun/sbatch at it (sets SLURM_CONF)
#   slurm/local-cluster.sh status    exit 0 and one line if it runs, 1 if not
#   slurm/local-cluster.sh down      stop it; only the daemons this script started
#
# Two slurmd ("n1", "n2", 2 CPUs each) listen on 127.0.0.1 with their own ports, so
# `srun -N 2` crosses a real (loopback) network path. Everything lives in slurm/.local/
# (git-ignored): config, state, per-node spool, logs, pid files. Daemons run without
# systemd, started by hand; auth/none, so munge is not needed.
#
# A second cluster on the same host (e.g. next to one that tests use) needs its own folder and
# ports: LOCAL_SLURM_DIR (slurm/.local), LOCAL_SLURM_CTLD_PORT (16817),
# LOCAL_SLURM_N1_PORT (17001), LOCAL_SLURM_N2_PORT (17002). Pass the same values to every verb.
# Measured on a 2-core VM: up 0.3-2 s (12 s with the apt install), down 0.1-2.5 s.
set -euo pipefail

# --- paths, resolved from this script's location so any cwd works ---------------------------
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(realpath -m "${LOCAL_SLURM_DIR:-$HERE/.local}")"
CONF="$ROOT/slurm.conf"
STATE="$ROOT/state"
SPOOL="$ROOT/spool"            # one subfolder per node: spool/n1, spool/n2
LOG="$ROOT/log"
RUN="$ROOT/run"                # pid files
NODES=(n1 n2)

CTLD_PORT="${LOCAL_SLURM_CTLD_PORT:-16817}"
N1_PORT="${LOCAL_SLURM_N1_PORT:-17001}"
N2_PORT="${LOCAL_SLURM_N2_PORT:-17002}"
UP_TIMEOUT_S=20                # bound on waiting for both nodes to be idle
DOWN_TIMEOUT_S=10              # bound on waiting for the daemons to exit

# Every daemon gets this variable in its environment; slurmstepd inherits it from slurmd, so
# `down` can tell this cluster's step daemons from anyone else's.
MARKER="INFERCOMM_LOCAL_SLURM=$ROOT"

export SLURM_CONF="$CONF"

say() { echo "local-cluster: $*"; }
die() { echo "local-cluster: error: $*" >&2; exit 1; }

# --- process bookkeeping ----------------------------------------------------------------------
# pid_of NAME: the pid in run/NAME.pid if that process is alive AND was started with our
# config (checked through /proc cmdline), so a recycled pid is never mistaken for ours.
pid_of() {
    local file="$RUN/$1.pid" pid
    [[ -r "$file" ]] || return 1
    pid="$(tr -dc '0-9' <"$file")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$CONF" || return 1
    echo "$pid"
}

# our_pids: every live process of this cluster: the daemons by pid file, every process that
# carries the marker (slurmscriptd, slurmstepd), and all their descendants (job tasks, which
# a killed slurmstepd would otherwise orphan). Nothing else.
our_pids() {
    local -A keep=() parent=()
    local name p pid ppid stat
    for name in slurmctld "${NODES[@]/#/slurmd-}"; do
        pid="$(pid_of "$name")" && keep[$pid]=1
    done
    for p in /proc/[0-9]*; do
        tr '\0' '\n' 2>/dev/null <"$p/environ" | grep -qxF -- "$MARKER" && keep[${p#/proc/}]=1
    done
    ((${#keep[@]})) || return 0
    # ppid of every process from /proc/*/stat (second field after the "(comm)").
    for p in /proc/[0-9]*/stat; do
        stat="$(cat "$p" 2>/dev/null)" || continue
        pid="${stat%% *}"; stat="${stat##*) }"; ppid="${stat#* }"; ppid="${ppid%% *}"
        parent[$pid]="$ppid"
    done
    local changed=1
    while ((changed)); do   # grow the set until no process has a kept parent but is not kept
        changed=0
        for pid in "${!parent[@]}"; do
            [[ -z "${keep[$pid]:-}" && -n "${keep[${parent[$pid]}]:-}" ]] || continue
            keep[$pid]=1; changed=1
        done
    done
    echo "${!keep[@]}"
}

running() {  # all three daemons alive
    local name
    for name in slurmctld "${NODES[@]/#/slurmd-}"; do pid_of "$name" >/dev/null || return 1; done
}

# wait_gone SECONDS PID...: true once none of the pids exists any more.
wait_gone() {
    local deadline=$((SECONDS + $1)) pid alive; shift
    while ((SECONDS < deadline)); do
        alive=0
        for pid in "$@"; do [[ -e /proc/$pid ]] && alive=1; done
        ((alive)) || return 0
        sleep 0.1
    done
    return 1
}

# --- install ----------------------------------------------------------------------------------
install_slurm() {
    local pkgs=()
    command -v slurmctld >/dev/null || pkgs+=(slurm-wlm)
    # The pmix MPI plugin dlopens the unversioned libpmix.so that only libpmix-dev ships;
    # without it `srun --mpi=pmix` (Open MPI) fails.
    dpkg -s libpmix-dev >/dev/null 2>&1 || pkgs+=(libpmix-dev)
    ((${#pkgs[@]})) || return 0
    [[ "$(id -u)" == 0 ]] || die "Slurm is not installed and installing it needs root: apt-get install ${pkgs[*]}"
    command -v apt-get >/dev/null || die "Slurm is not installed and there is no apt-get to install it"
    say "installing ${pkgs[*]} (apt, --no-install-recommends)"
    # Without --no-install-recommends slurm-wlm pulls ~43 packages instead of ~9.
    apt-get update -qq >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" \
        >/dev/null || die "apt-get install ${pkgs[*]} failed"
    command -v slurmctld >/dev/null || die "slurmctld still missing after installing ${pkgs[*]}"
}

# --- config -----------------------------------------------------------------------------------
# The task prolog's `export` lines go into every task's environment. MPICH (the pip wheel,
# PMI-1 client) under srun --mpi=pmi2 sends its UCX netmod's addresses as `cmd=put` lines, and
# Slurm's pmi2 plugin reads each request with one read() of at most 1024 bytes
# (src/plugins/mpi/pmi2/pmi1.c, handle_pmi1_cmd). The lines are run-length encoded random
# address bytes: 494-856 bytes in the runs traced here, and now and then over 1024. Then the
# line is cut, MPI_Init aborts on one rank and waits on the others ("mpi/pmi2: value not
# properly terminated"): in CI both MPICH steps of one run, 1 of 2 in a clone here, 0 of 45 by
# hand. The OFI netmod's lines are 67 bytes (traced with strace). A user's own choice wins.
# Ranks of one node keep MPICH's shared memory with it (MPIR_CVAR_NOLOCAL=0, said outright so
# that every run records it): under `srun -N 1 -n 2 --mpi=pmi2` a lone 128 KiB all-reduce took
# 28-29 us, and 56-87 us with MPIR_CVAR_NOLOCAL=1 sending it through OFI's tcp provider.
# But in a replay (llama-3.2-1b TP2, prompt 32: 33 such calls back to back among others) the
# shared-memory all-reduce MPICH picks by default (release_gather) took 235 us a call against
# 64 us with MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM=mpir (MPICH's own algorithms over shared
# memory point to point) and ~100 us over the network between the two fake nodes: one node read
# slower than two (prefill 7.9 ms vs 3.7 ms). With mpir: 2.0 ms on one node.
write_task_prolog() {
    cat >"$ROOT/task-prolog.sh" <<'PROLOG'
#!/bin/sh
[ -n "${MPIR_CVAR_CH4_NETMOD:-}" ] || echo "export MPIR_CVAR_CH4_NETMOD=ofi"
[ -n "${MPIR_CVAR_NOLOCAL:-}" ] || echo "export MPIR_CVAR_NOLOCAL=0"
[ -n "${MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM:-}" ] || \
    echo "export MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM=mpir"
PROLOG
    chmod +x "$ROOT/task-prolog.sh"
}

write_conf() {
    local host user
    host="$(hostname -s)"
    user="$(id -un)"
    # A missing SlurmdSpoolDir makes pmix steps hang in slurmstepd: create every folder.
    mkdir -p "$STATE" "$LOG" "$RUN" "${NODES[@]/#/$SPOOL/}"
    write_task_prolog
    cat >"$CONF" <<EOF
# Written by slurm/local-cluster.sh; rewritten on every \`up\`. Two fake nodes on one host.
ClusterName=infercomm
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=$user
SlurmdUser=$user
# No munge: this cluster only ever talks to itself.
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$STATE
# %n = node name: each slurmd needs its own spool; TmpFS per node, or pmix steps of two
# nodes collide on the same spmix_appdir ("File exists").
SlurmdSpoolDir=$SPOOL/%n
TmpFS=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# cgroups are unreliable in containers: track processes by pid, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Schedule batch jobs at once (default: up to 3 s later, for high-throughput sites).
SchedulerParameters=batch_sched_delay=0
# srun --mpi=none would silently give every MPICH task a world of size 1.
MpiDefault=pmi2
# Picks MPICH's OFI netmod, whose PMI-1 lines fit Slurm's 1024-byte read, and keeps shared
# memory within a node (see write_task_prolog).
TaskProlog=$ROOT/task-prolog.sh
# Nodes may claim more CPUs than the host has.
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
KillWait=5
# Keep finished jobs for 5 min so \`scontrol show job\` can read their ExitCode.
MinJobAge=300
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$N1_PORT CPUs=2 RealMemory=2000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$N2_PORT CPUs=2 RealMemory=2000 State=UNKNOWN
# No time limit: the sbatch templates ask for up to 1 h.
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

# --- verbs ------------------------------------------------------------------------------------
cmd_up() {
    if running; then
        say "already running ($CONF)"
        return 0
    fi
    if [[ -n "$(our_pids)" ]]; then   # half up from an earlier crash: start clean
        say "stopping leftovers of an earlier run"
        cmd_down >/dev/null
    fi
    install_slurm
    write_conf
    # Fresh logs per start (the previous ones kept as *.prev), so errors quoted below are new.
    local f
    for f in "$LOG"/*.log; do if [[ -e "$f" ]]; then mv -f "$f" "$f.prev"; fi; done
    # -c: start without the saved job state of an earlier run. The marker rides in the env.
    env "$MARKER" slurmctld -c -f "$CONF" || die "slurmctld failed to start; see $LOG/slurmctld.log"
    local node
    for node in "${NODES[@]}"; do
        env "$MARKER" slurmd -N "$node" -f "$CONF" \
            || die "slurmd -N $node failed to start; see $LOG/slurmd-$node.log"
    done
    # Both nodes idle within UP_TIMEOUT_S. A daemon that died (port taken, bad config) ends the
    # wait after ~2 s; on any failure stop what did start and quote the logs.
    local deadline=$((SECONDS + UP_TIMEOUT_S)) states="" why=""
    while ((SECONDS < deadline)); do
        states="$(timeout 5 sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)"
        [[ "$states" == "n1=idle n2=idle " ]] && { say "up: n1, n2 idle ($CONF)"; return 0; }
        sleep 0.2
        if ((SECONDS >= deadline - UP_TIMEOUT_S + 2)) && ! running; then  # pid files take ~0.1 s
            why="a daemon exited"; break
        fi
    done
    cmd_down >/dev/null || true
    # The root cause is usually the last fatal line (e.g. a port in use), else the last error.
    local last
    last="$(grep -h 'fatal:' "$LOG"/*.log 2>/dev/null | tail -n 1 || true)"
    [[ -n "$last" ]] || last="$(grep -h 'error:' "$LOG"/*.log 2>/dev/null | tail -n 1 || true)"
    die "${why:-nodes not idle after ${UP_TIMEOUT_S}s} (sinfo: ${states:-no answer});" \
        "last in $LOG: ${last:-nothing}"
}

cmd_down() {
    local pids
    pids="$(our_pids | tr '\n' ' ')"
    if [[ -z "${pids// /}" ]]; then
        say "not running"
        return 0
    fi
    if pid_of slurmctld >/dev/null; then
        # Cancel every job first: `scontrol shutdown` leaves running steps (slurmstepd and
        # tasks) behind and their sruns hanging. Then wait (bounded) for the queue to drain.
        timeout 5 scancel --quiet --partition=debug >/dev/null 2>&1 || true
        local deadline=$((SECONDS + 5))
        while ((SECONDS < deadline)) \
                && [[ -n "$(timeout 2 squeue -h -o %i 2>/dev/null || true)" ]]; do
            sleep 0.2
        done
        # Stops slurmctld and every slurmd it knows in ~0.02 s.
        timeout 5 scontrol shutdown >/dev/null 2>&1 || true
    fi
    # shellcheck disable=SC2086  # word splitting of the pid list is intended
    wait_gone 3 $pids && { say "down"; return 0; }
    # Leftovers (a stuck slurmstepd, a slurmd that ignored shutdown): TERM, then KILL. Only the
    # pids we found above, which are ours by pid file + config path or by marker.
    pids="$(our_pids | tr '\n' ' ')"
    if [[ -z "${pids// /}" ]]; then say "down"; return 0; fi
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    # shellcheck disable=SC2086
    wait_gone 1 $pids || kill -KILL $pids 2>/dev/null || true
    # shellcheck disable=SC2086
    wait_gone "$DOWN_TIMEOUT_S" $pids || die "processes still alive after kill: $pids"
    say "down (killed leftovers: ${pids% })"
}

cmd_status() {
    if running; then
        say "running ($CONF)"
    else
        say "not running"
        return 1
    fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|env|status" >&2; exit 2 ;;
esac
