#!/usr/bin/env bash
# Stops sge_execd and sge_qmaster if start-sge.sh started them (it leaves a marker per daemon),
# and nothing else. Idempotent; without root there is nothing of ours to stop.
set -uo pipefail

RUN_DIR=/run/psij-test-sge
SPOOL=/var/spool/gridengine
say() { printf '[stop-sge] %s\n' "$*"; }
[ "$(id -u)" = 0 ] || exit 0
[ -d "$RUN_DIR" ] || exit 0

source "$(dirname "$0")/daemons.sh"

stop_started sge_execd "$(ls "$SPOOL"/execd/*/execd.pid 2>/dev/null | head -n1)"
stop_started sge_qmaster "$SPOOL/qmaster/qmaster.pid"
exit $STOP_FAILED
