#!/usr/bin/env bash
# Stops the test sshd if start-sshd.sh started it (it leaves a marker), and nothing else: the
# system's sshd and the sessions the test sshd opened (each its own process, see
# tests/support/ssh_server.py) are left alone. Idempotent; without root there is nothing of ours
# to stop.
set -uo pipefail

RUN_DIR=/run/psij-test-sshd
say() { printf '[stop-sshd] %s\n' "$*"; }
[ "$(id -u)" = 0 ] || exit 0
[ -d "$RUN_DIR" ] && [ ! -L "$RUN_DIR" ] || exit 0

source "$(dirname "$0")/daemons.sh"

stop_started sshd "$RUN_DIR/sshd.pid"
exit $STOP_FAILED
