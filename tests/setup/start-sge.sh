#!/usr/bin/env bash
# Starts a single-host Son of Grid Engine on this machine for the tests that need one.
#
# Idempotent: installs the Debian gridengine packages when missing (apt-get, as root, with the
# answers their configuration asks for), configures one queue "all.q" with a parallel
# environment "smp", starts sge_qmaster and sge_execd directly (the packaged init scripts watch
# the wrong pid files) and waits until the queue accepts jobs. Daemons it starts get a marker in
# $RUN_DIR so that stop-sge.sh stops only those. Without root or apt-get it says why and exits 0:
# the Grid Engine tests then skip with a reason.
#
# Clients need SGE_ROOT=/var/lib/gridengine SGE_CELL=default (the Debian wrappers default to them).
set -euo pipefail
source "$(dirname "$0")/daemons.sh"

export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
COMMON=$SGE_ROOT/$SGE_CELL/common
SPOOL=/var/spool/gridengine
RUN_DIR=/run/psij-test-sge
TIMEOUT=${PSIJ_SGE_TIMEOUT:-60}
slots=${PSIJ_SGE_SLOTS:-8}
[ "$slots" -ge "$(nproc)" ] || slots=$(nproc)
host=$(hostname -s)

say() { printf '[start-sge] %s\n' "$*"; }
fail() {
    printf '[start-sge] ERROR: %s\n' "$*" >&2
    tail -n 10 "$SPOOL/qmaster/messages" "$SPOOL"/execd/*/messages 2>/dev/null >&2 || true
    exit 1
}
if [ "$(id -u)" != 0 ]; then
    say "not root: a local Grid Engine cannot be installed or started here; SGE tests will skip"
    exit 0
fi
cleanup=()
trap 'rm -rf "${cleanup[@]}"' EXIT

# ------------------------------------------------------------------ packages
if [ ! -x /usr/lib/gridengine/sge_qmaster ] || [ ! -x /usr/lib/gridengine/sge_execd ] \
        || ! command -v qsub >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        say "apt-get not found: cannot install gridengine; SGE tests will skip"
        exit 0
    fi
    say "installing gridengine-master gridengine-exec gridengine-client"
    # Without these answers the packages leave the cell unconfigured.
    debconf-set-selections <<EOF
gridengine-common shared/gridengineconfig boolean true
gridengine-common shared/gridenginecell string $SGE_CELL
gridengine-common shared/gridenginemaster string $host
EOF
    export DEBIAN_FRONTEND=noninteractive
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        cleanup+=(/usr/sbin/policy-rc.d)
    fi
    apt-get update -qq || { sleep 3; apt-get update -qq; } || fail "apt-get update failed"
    apt-get install -y -qq --no-install-recommends gridengine-master gridengine-exec \
        gridengine-client >/dev/null || fail "apt-get install gridengine-* failed"
fi
[ -f "$COMMON/bootstrap" ] || fail "$COMMON/bootstrap missing: the cell was not configured"
install -d -m 0755 "$RUN_DIR"
install -d -o sgeadmin -g sgeadmin "$SPOOL/execd" /run/gridengine

# 127.0.0.1 resolves back to "localhost"; without the alias the qmaster refuses its own host.
echo "$host" >"$COMMON/act_qmaster"
if [ "$host" != localhost ]; then
    echo "$host localhost" >"$COMMON/host_aliases"
fi
chown sgeadmin:sgeadmin "$COMMON/act_qmaster" "$COMMON/host_aliases" 2>/dev/null || true

# ------------------------------------------------------------------ qmaster
if ! running sge_qmaster; then
    say "starting sge_qmaster"
    /usr/lib/gridengine/sge_qmaster </dev/null >/dev/null 2>&1 || fail "sge_qmaster did not start"
    touch "$RUN_DIR/started.sge_qmaster"
fi
wait_until 30 qconf -sh || fail "sge_qmaster does not answer"

# ------------------------------------------------------------------ cluster configuration
qconf -sh | grep -qx "$host" || qconf -ah "$host" >/dev/null
qconf -ss | grep -qx "$host" || qconf -as "$host" >/dev/null
work=$(mktemp -d)
cleanup+=("$work")
# Root may run jobs (tests run as root); accounting records are written at once so that qacct
# sees a job as soon as it leaves the queue. Job shells are not login shells: a login bash reads
# the user's profile, and an interactive set-up there (root's pyenv rehash, which waits up to 60 s
# on a lock a killed job left behind) would slow or break every job.
qconf -sconf global | sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' \
    -e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/' \
    -e 's/^login_shells .*/login_shells NONE/' \
    -e 's/^reporting_params .*/reporting_params accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00 accounting_flush_time=00:00:00/' \
    >"$work/global"
(cd "$work" && qconf -Mconf global >/dev/null 2>&1) || fail "cannot change the global configuration"
# The scheduler runs every second rather than every 15 s, so short jobs start at once.
qconf -ssconf | sed -e 's/^schedule_interval .*/schedule_interval 0:0:1/' \
    -e 's/^flush_submit_sec .*/flush_submit_sec 1/' \
    -e 's/^flush_finish_sec .*/flush_finish_sec 1/' >"$work/sched"
qconf -Msconf "$work/sched" >/dev/null 2>&1 || fail "cannot change the scheduler configuration"
if ! qconf -spl 2>/dev/null | grep -qx smp; then
    cat >"$work/smp" <<EOF
pe_name smp
slots 9999
user_lists NONE
xuser_lists NONE
start_proc_args NONE
stop_proc_args NONE
allocation_rule \$pe_slots
control_slaves TRUE
job_is_first_task TRUE
urgency_slots min
accounting_summary FALSE
qsort_args NONE
EOF
    qconf -Ap "$work/smp" >/dev/null 2>&1 || fail "cannot add the parallel environment smp"
fi
if ! qconf -sql 2>/dev/null | grep -qx all.q; then
    {
        printf '%s\n' "qname all.q" "hostlist $host" "seq_no 0" "load_thresholds NONE" \
            "suspend_thresholds NONE" "nsuspend 1" "suspend_interval 00:05:00" "priority 0" \
            "min_cpu_interval 00:05:00" "processors UNDEFINED" "qtype BATCH INTERACTIVE" \
            "ckpt_list NONE" "pe_list smp" "rerun FALSE" "slots $slots" "tmpdir /tmp" \
            "shell /bin/bash" "prolog NONE" "epilog NONE" "shell_start_mode posix_compliant" \
            "starter_method NONE" "suspend_method NONE" "resume_method NONE" \
            "terminate_method NONE" "notify 00:00:60" "owner_list NONE" "user_lists NONE" \
            "xuser_lists NONE" "subordinate_list NONE" "complex_values NONE" "projects NONE" \
            "xprojects NONE" "calendar NONE" "initial_state default"
        for limit in s_rt h_rt s_cpu h_cpu s_fsize h_fsize s_data h_data s_stack h_stack \
                s_core h_core s_rss h_rss s_vmem h_vmem; do
            echo "$limit INFINITY"
        done
    } >"$work/allq"
    qconf -Aq "$work/allq" >/dev/null 2>&1 || fail "cannot add the queue all.q"
fi

# The test jobs are tiny: the queue offers at least $slots slots so that tests run side by side.
qconf -sq all.q | awk -v want="$slots" '$1 == "slots" && $2 != want { exit 1 }' \
    || qconf -mattr queue slots "$slots" all.q >/dev/null 2>&1 || fail "cannot set the slots of all.q"

# ------------------------------------------------------------------ execd (reads the global
# configuration when it starts, so it starts after the changes above)
if ! running sge_execd; then
    say "starting sge_execd"
    /usr/lib/gridengine/sge_execd </dev/null >/dev/null 2>&1 || fail "sge_execd did not start"
    touch "$RUN_DIR/started.sge_execd"
fi

# The queue instance is usable once its state column is empty ("u" means execd unknown).
end=$(( $(date +%s) + TIMEOUT ))
until qstat -f -q "all.q@$host" 2>/dev/null \
        | awk -v q="all.q@$host" '$1 == q && NF == 5 { ok = 1 } END { exit !ok }'; do
    if [ "$(date +%s)" -ge "$end" ]; then
        qstat -f >&2 || true
        fail "all.q@$host not usable after ${TIMEOUT}s"
    fi
    sleep 0.5
done
say "ready: all.q@$host"
