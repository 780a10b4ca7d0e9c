#!/usr/bin/env bash
# Installs the system packages the tests use (OpenMPI for the mpirun launcher and its headers for
# the MPI program the multi-node tests build with mpicc, tmux for the
# terminal that shows `psij wait`'s live progress) when this
# machine lets us: root and apt-get. Otherwise it says what is missing and the tests that need
# it are skipped with that reason.
set -euo pipefail
want=()
command -v mpirun >/dev/null 2>&1 || want+=(openmpi-bin)
printf '#include <mpi.h>\n' | mpicc -E -x c - >/dev/null 2>&1 || want+=(libopenmpi-dev)
command -v tmux >/dev/null 2>&1 || want+=(tmux)
if [ ${#want[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: not root or no apt-get; missing: ${want[*]} (tests needing them skip)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
echo "system-deps: installed ${want[*]}"
