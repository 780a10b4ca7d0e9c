#!/usr/bin/env bash
# Starts a four-node Slurm on this machine for the tests that need a real scheduler: nodes
# n1..n4, one slurmd per node (`slurmd -N NAME`, each with its own port, spool, pid and log
# file), the node names in /etc/hosts, memory a consumable resource and enforced through the
# cgroup v1 memory controller (task/cgroup, ConstrainRAMSpace) when the machine has a writable
# one, so that a job over its memory is killed by Slurm and ends OUT_OF_MEMORY.
#
# Idempotent: installs what is missing (apt-get, as root), writes the configuration, starts the
# daemons that are not running yet (directly, without an init system) and waits until the nodes
# accepts jobs. Each daemon it starts gets a marker in $RUN_DIR so that stop-slurm.sh stops only
# those. Without root or apt-get it says why and exits 0: the Slurm tests then skip with a reason.
#
# Environment:
#   PSIJ_SLURM_ACCOUNTING=0   do not run MariaDB + slurmdbd (sacct then reports accounting off)
#   PSIJ_SLURM_TIMEOUT=60     seconds to wait for the node to become usable
#   PSIJ_SLURM_CPUS=8         CPUs each node offers at least (more than it has, for small jobs)
#   PSIJ_SLURM_NODES=4        how many nodes (1 to 16)
#   PSIJ_SLURM_NODE_MEMORY=4096  MiB of memory each node offers (at most the machine's / nodes)
set -euo pipefail
source "$(dirname "$0")/daemons.sh"

RUN_DIR=/run/psij-test-slurm
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm/slurmctld
SPOOL_DIR=/var/lib/slurm/slurmd
ACCOUNTING=${PSIJ_SLURM_ACCOUNTING:-1}
TIMEOUT=${PSIJ_SLURM_TIMEOUT:-60}
NODES=${PSIJ_SLURM_NODES:-4}
case "$NODES" in [1-9] | 1[0-6]) ;; *) printf '[start-slurm] ERROR: PSIJ_SLURM_NODES=%q: a number of nodes from 1 to 16 is accepted\n' "$NODES" >&2; exit 1 ;; esac
NODE_NAMES=()
for i in $(seq "$NODES"); do NODE_NAMES+=("n$i"); done
NODE_LIST="n[1-$NODES]"
[ "$NODES" = 1 ] && NODE_LIST=n1
PORT_BASE=17000  # node nI's slurmd listens on PORT_BASE + I
DB_PASSWORD=psij-test-only

say() { printf '[start-slurm] %s\n' "$*"; }
fail() {
    printf '[start-slurm] ERROR: %s\n' "$*" >&2
    local f
    for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd-n*.log "$LOG_DIR"/slurmdbd.log; do
        [ -s "$f" ] && { printf -- '--- %s\n' "$f" >&2; tail -n 12 "$f" >&2; }
    done
    exit 1
}

if [ "$(id -u)" != 0 ]; then
    say "not root: a local Slurm cannot be installed or started here; Slurm tests will skip"
    exit 0
fi

# Stop a daemon this script started (config changes need a restart):
# stop_ours MARKER PIDFILE [COMMAND]: COMMAND is the process name (MARKER when not given).
stop_ours() {
    local name=$1 pidfile=$2 comm=${3:-$1} i
    [ -f "$RUN_DIR/started.$name" ] && alive "$pidfile" "$comm" || return 0
    say "configuration changed: restarting $name"
    kill -TERM "$(tr -dc '0-9' <"$pidfile")" 2>/dev/null || true
    for i in $(seq 75); do alive "$pidfile" "$comm" || break; sleep 0.2; done
    alive "$pidfile" "$comm" && fail "$name did not stop"
    rm -f "$RUN_DIR/started.$name"
}

# ------------------------------------------------------------------ packages
packages=(munge slurmctld slurmd slurm-client slurmrestd)
[ "$ACCOUNTING" = 1 ] && packages+=(slurmdbd mariadb-server)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        say "apt-get not found: cannot install ${missing[*]}; Slurm tests will skip"
        exit 0
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The packages' maintainer scripts would start the services through their init scripts;
    # a policy-rc.d that refuses keeps every daemon under this script's control.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update -qq || { sleep 3; apt-get update -qq; } || fail "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || fail "apt-get install ${missing[*]} failed"
fi

# ------------------------------------------------------------------ directories, munge key
install -d -m 0755 "$RUN_DIR" "$CONF_DIR" "$SPOOL_DIR"
for n in "${NODE_NAMES[@]}"; do install -d -m 0755 "$SPOOL_DIR/$n"; done
install -d -m 0755 -o slurm -g slurm "$STATE_DIR" "$LOG_DIR"
install -d -m 0755 -o munge -g munge /run/munge /var/log/munge /var/lib/munge
install -d -m 0700 -o munge -g munge /etc/munge
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1024 count=1 of=/etc/munge/munge.key 2>/dev/null
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key

# ------------------------------------------------------------------ node names
# Every node is this machine: each name resolves to 127.0.0.1, on a line of its own so that
# each is its own canonical name (lines of ours in /etc/hosts, marked).
hosts_mark='# psij test Slurm node'
hosts_lines=$(for n in "${NODE_NAMES[@]}"; do printf '127.0.0.1 %s %s\n' "$n" "$hosts_mark"; done)
if [ "$(grep -F -- "$hosts_mark" /etc/hosts || true)" != "$hosts_lines" ]; then
    { grep -vF -- "$hosts_mark" /etc/hosts || true; printf '%s\n' "$hosts_lines"; } >/etc/hosts.psij.new \
        && cat /etc/hosts.psij.new >/etc/hosts && rm -f /etc/hosts.psij.new \
        || fail "cannot add the node names to /etc/hosts"
fi

# ------------------------------------------------------------------ configuration
node=$(hostname -s)
hw=$(slurmd -C 2>/dev/null | head -n1 || true)
field() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$hw"; }
cpus=$(field CPUs); cpus=${cpus:-$(nproc)}
mem=$(field RealMemory); mem=${mem:-$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 ))}
sockets=$(field SocketsPerBoard); cores=$(field CoresPerSocket); threads=$(field ThreadsPerCore)
# The test jobs are tiny: the node offers at least PSIJ_SLURM_CPUS CPUs, more than it may have,
# so that tests can run side by side.
slots=${PSIJ_SLURM_CPUS:-8}
overrides="# SlurmdParameters: default"
if [ "$cpus" -lt "$slots" ]; then
    node_hw="CPUs=$slots"
    overrides="SlurmdParameters=config_overrides"
elif [ -n "$sockets" ] && [ -n "$cores" ] && [ -n "$threads" ]; then
    node_hw="CPUs=$cpus Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads"
else
    node_hw="CPUs=$cpus"
fi
# proctrack/cgroup kills a job's stray background processes; it needs a writable v1 freezer.
proctrack=linuxproc
if mkdir /sys/fs/cgroup/freezer/psij_probe_$$ 2>/dev/null; then
    rmdir /sys/fs/cgroup/freezer/psij_probe_$$
    proctrack=cgroup
fi
# Memory is consumable (each job gets its --mem, DefMemPerCPU without one) and, with a writable
# v1 memory controller, enforced: a job over its share is killed and ends OUT_OF_MEMORY.
node_mem=${PSIJ_SLURM_NODE_MEMORY:-4096}
[[ "$node_mem" =~ ^[1-9][0-9]{0,7}$ ]] || fail "PSIJ_SLURM_NODE_MEMORY=$node_mem: MiB, a whole number from 1 to 99999999, is accepted"
[ "$node_mem" -le $(( mem / NODES )) ] 2>/dev/null || node_mem=$(( mem / NODES ))
def_mem=$(( node_mem / slots ))
taskplugin=task/none
constrain_ram=no
if [ "$proctrack" = cgroup ] && mkdir /sys/fs/cgroup/memory/psij_probe_$$ 2>/dev/null; then
    rmdir /sys/fs/cgroup/memory/psij_probe_$$
    taskplugin=task/cgroup
    constrain_ram=yes
fi
ports="$(( PORT_BASE + 1 ))"
[ "$NODES" = 1 ] || ports="[$(( PORT_BASE + 1 ))-$(( PORT_BASE + NODES ))]"
if [ "$ACCOUNTING" = 1 ]; then
    accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819"
else
    accounting="AccountingStorageType=accounting_storage/none"
fi

changed=0
# write_if_changed FILE MODE CONTENT: replace FILE only when its content differs.
write_if_changed() {
    if [ ! -f "$1" ] || [ "$(cat "$1")" != "$3" ]; then
        printf '%s\n' "$3" >"$1.new" && chmod "$2" "$1.new" && mv "$1.new" "$1"
        changed=1
    fi
}
write_if_changed "$CONF_DIR/cgroup.conf" 0644 "CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=$constrain_ram
AllowedRAMSpace=100
ConstrainSwapSpace=$constrain_ram
AllowedSwapSpace=0
ConstrainDevices=no"
write_if_changed "$CONF_DIR/slurm.conf" 0644 "# Written by tests/setup/start-slurm.sh: a $NODES-node cluster on one machine, for tests.
ClusterName=psijtest
SlurmctldHost=$node(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/$proctrack
TaskPlugin=$taskplugin
SwitchType=switch/none
PropagateResourceLimits=NONE
$overrides
ReturnToService=2
MailProg=/bin/true
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR/%n
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
Waittime=0
MinJobAge=60
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$def_mem
$accounting
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
NodeName=$NODE_LIST NodeAddr=127.0.0.1 Port=$ports $node_hw RealMemory=$node_mem State=UNKNOWN
PartitionName=debug Nodes=$NODE_LIST Default=YES MaxTime=INFINITE State=UP"
if [ "$ACCOUNTING" = 1 ]; then
    write_if_changed "$CONF_DIR/slurmdbd.conf" 0600 "AuthType=auth/munge
DbdHost=$node
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=$DB_PASSWORD"
    chown slurm:slurm "$CONF_DIR/slurmdbd.conf"
fi
# A one-node setup of an earlier version ran one slurmd with this pid file.
stop_ours slurmd "$RUN_DIR/slurmd.pid"
if [ "$changed" = 1 ]; then
    for n in "${NODE_NAMES[@]}"; do stop_ours "slurmd-$n" "$RUN_DIR/slurmd-$n.pid" slurmd; done
    stop_ours slurmctld "$RUN_DIR/slurmctld.pid"
    stop_ours slurmdbd "$RUN_DIR/slurmdbd.pid"
fi

# ------------------------------------------------------------------ daemons
if ! running munged; then
    say "starting munged"
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2*
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid </dev/null >/dev/null 2>&1 \
        || fail "munged did not start"
    touch "$RUN_DIR/started.munged"
fi
wait_until 10 sh -c 'munge -n | unmunge' || fail "munge does not work"

if [ "$ACCOUNTING" = 1 ]; then
    if ! running mariadbd; then
        say "starting mariadbd"
        install -d -m 0755 -o mysql -g mysql /run/mysqld
        setsid runuser -u mysql -- /usr/sbin/mariadbd --pid-file=/run/mysqld/mysqld.pid \
            --bind-address=127.0.0.1 --innodb-buffer-pool-size=64M \
            </dev/null >>"$LOG_DIR/mariadb.log" 2>&1 &
        touch "$RUN_DIR/started.mariadbd"
    fi
    wait_until 60 mariadb -e 'select 1' || fail "mariadbd does not answer"
    mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" || fail "cannot create the database"
    if ! running slurmdbd; then
        say "starting slurmdbd"
        /usr/sbin/slurmdbd </dev/null >/dev/null 2>&1 || fail "slurmdbd did not start"
        touch "$RUN_DIR/started.slurmdbd"
    fi
    wait_until 30 sacctmgr -n list cluster || fail "slurmdbd does not answer"
fi

if ! running slurmctld; then
    say "starting slurmctld"
    /usr/sbin/slurmctld </dev/null >/dev/null 2>&1 || fail "slurmctld did not start"
    touch "$RUN_DIR/started.slurmctld"
fi
wait_until 30 sh -c 'scontrol ping | grep -q "is UP"' || fail "slurmctld does not answer"

# Each node's slurmd runs in a UTS namespace of its own whose host name is the node's name, so
# that a job's processes on n2 see "n2" as a real cluster's would (hostname, MPI, node files).
own_hostname=0
unshare --uts true 2>/dev/null && own_hostname=1
for n in "${NODE_NAMES[@]}"; do
    if ! alive "$RUN_DIR/slurmd-$n.pid" slurmd; then
        say "starting slurmd -N $n"
        if [ "$own_hostname" = 1 ]; then
            unshare --uts sh -c 'hostname "$1" && exec /usr/sbin/slurmd -N "$1"' sh "$n" \
                </dev/null >/dev/null 2>&1 || fail "slurmd -N $n did not start"
        else
            /usr/sbin/slurmd -N "$n" </dev/null >/dev/null 2>&1 || fail "slurmd -N $n did not start"
        fi
        touch "$RUN_DIR/started.slurmd-$n"
    fi
done

# ------------------------------------------------------------------ ready?
end=$(( $(date +%s) + TIMEOUT ))
resumed=0
while :; do
    states=$(sinfo -h -N -n "$NODE_LIST" -o '%N %T' 2>/dev/null || true)
    usable=$(awk '$2 ~ /^(idle|mixed|allocated|completing)$/' <<<"$states" | wc -l)
    [ "$usable" -ge "$NODES" ] && break
    if [ "$resumed" = 0 ] && grep -Eq ' (down|drain|fail)' <<<"$states"; then
        scontrol update nodename="$NODE_LIST" state=resume >/dev/null 2>&1 || true
        resumed=1
    fi
    [ "$(date +%s)" -lt "$end" ] \
        || fail "nodes $NODE_LIST not all usable after ${TIMEOUT}s: $(tr '\n' ',' <<<"$states")"
    sleep 0.3
done
state="$NODES nodes ($NODE_LIST) up"
if [ "$ACCOUNTING" = 1 ]; then
    wait_until 30 sh -c 'sacctmgr -n -P list cluster format=cluster | grep -qx psijtest' \
        || fail "the cluster did not register with slurmdbd"
fi
[ "$own_hostname" = 1 ] || state="$state, all with this machine's host name"
say "ready: $state (proctrack/$proctrack, $taskplugin, memory enforced: $constrain_ram, accounting=$ACCOUNTING)"
