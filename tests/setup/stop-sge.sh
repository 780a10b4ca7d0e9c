#!/usr/bin/env bash
# Stops sge_execd and sge_qmaster if start-sge.sh started them (it leaves a marker per daemon),
# and nothing else. Idempotent; without root there is nothing of ours to stop.
set -uo pipefail

RUN_DIR=/run/psij-test-sge
SPOOL=/var/spool/gridengine
say() { printf '[stop-sge] %s\n' "$*"; }
[ "$(id -u)" = 0 ] || exit 0
[ -d "$RUN_DIR" ] || exit 0

rc=0
# live PID NAME: the process exists, has that name and has not exited (a zombie has).
live() {
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] \
        && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}
# stop NAME PIDFILE
stop() {
    local name=$1 pidfile=$2 pid i
    [ -f "$RUN_DIR/started.$name" ] || return 0
    pid=$(tr -dc '0-9' 2>/dev/null <"$pidfile")
    if [ -n "$pid" ] && live "$pid" "$name"; then
        say "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null
        for i in $(seq 100); do
            live "$pid" "$name" || break
            sleep 0.2
        done
        if live "$pid" "$name"; then
            kill -KILL "$pid" 2>/dev/null
            sleep 0.5
        fi
        if live "$pid" "$name"; then
            say "ERROR: $name (pid $pid) is still running"
            rc=1
            return 0
        fi
    fi
    rm -f "$RUN_DIR/started.$name"
}

stop sge_execd "$(ls "$SPOOL"/execd/*/execd.pid 2>/dev/null | head -n1)"
stop sge_qmaster "$SPOOL/qmaster/qmaster.pid"
exit $rc
