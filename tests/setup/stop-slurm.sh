#!/usr/bin/env bash
# Stops the Slurm daemons that start-slurm.sh started, and only those (it leaves a marker per
# daemon). Idempotent; without root there is nothing of ours to stop.
set -uo pipefail

RUN_DIR=/run/psij-test-slurm
say() { printf '[stop-slurm] %s\n' "$*"; }
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
        for i in $(seq 75); do
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

stop slurmd "$RUN_DIR/slurmd.pid"
stop slurmctld "$RUN_DIR/slurmctld.pid"
stop slurmdbd "$RUN_DIR/slurmdbd.pid"
stop mariadbd /run/mysqld/mysqld.pid
stop munged /run/munge/munged.pid
exit $rc
