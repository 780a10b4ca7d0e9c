#!/usr/bin/env bash
# Stops the Slurm daemons that start-slurm.sh started, and only those (it leaves a marker per
# daemon). Idempotent; without root there is nothing of ours to stop.
set -uo pipefail

RUN_DIR=/run/psij-test-slurm
say() { printf '[stop-slurm] %s\n' "$*"; }
[ "$(id -u)" = 0 ] || exit 0
[ -d "$RUN_DIR" ] || exit 0

source "$(dirname "$0")/daemons.sh"

for marker in "$RUN_DIR"/started.slurmd-*; do
    [ -e "$marker" ] || continue
    n=${marker##*/started.}
    stop_started "$n" "$RUN_DIR/$n.pid" slurmd
done
stop_started slurmd "$RUN_DIR/slurmd.pid"  # the one slurmd of a one-node setup
stop_started slurmctld "$RUN_DIR/slurmctld.pid"
stop_started slurmdbd "$RUN_DIR/slurmdbd.pid"
stop_started mariadbd /run/mysqld/mysqld.pid
stop_started munged /run/munge/munged.pid
exit $STOP_FAILED
