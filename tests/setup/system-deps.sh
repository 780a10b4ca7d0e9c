#!/usr/bin/env bash
# Installs the system packages the tests use (OpenMPI for the mpirun launcher and its headers for
# the MPI program the multi-node tests build with mpicc, Chromium for the tests that open the HTML
# report of `psij report --html` in a headless browser, tmux for the
# terminal that shows `psij wait`'s live progress, the OpenSSH server and client for the tests
# that submit over ssh to a test sshd of tests/setup/start-sshd.sh) when this
# machine lets us: root and apt-get. Otherwise it says what is missing and the tests that need
# it are skipped with that reason.
set -euo pipefail
want=()
command -v mpirun >/dev/null 2>&1 || want+=(openmpi-bin)
printf '#include <mpi.h>\n' | mpicc -E -x c - >/dev/null 2>&1 || want+=(libopenmpi-dev)
command -v tmux >/dev/null 2>&1 || want+=(tmux)
[ -x /usr/sbin/sshd ] || want+=(openssh-server)
command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1 || want+=(openssh-client)
command -v chromium >/dev/null 2>&1 || want+=(chromium)
if [ ${#want[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: not root or no apt-get; missing: ${want[*]} (tests needing them skip)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# openssh-server's maintainer scripts would start the system's sshd: a policy-rc.d that refuses
# keeps it stopped (the tests run their own, tests/setup/start-sshd.sh).
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
echo "system-deps: installed ${want[*]}"
