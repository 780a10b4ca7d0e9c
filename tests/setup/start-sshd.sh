#!/usr/bin/env bash
# Starts an OpenSSH server on 127.0.0.1 for the tests that submit over ssh (a client running
# `ssh ... psij remote serve` as another local user): its own host key, configuration, pid file
# and log in $RUN_DIR, key authentication only, no forwarding. The system's sshd, if any, is
# neither used nor touched.
#
# Idempotent: starts sshd when the one it started before is not running (or restarts it when its
# configuration changed) and waits until the port answers with an SSH banner. The daemon it
# starts gets a marker in $RUN_DIR so that stop-sshd.sh stops only that one. Without root or
# without /usr/sbin/sshd (tests/setup/system-deps.sh installs it) it says why and exits 0: the
# ssh tests then skip with a reason.
#
# What clients need, in $RUN_DIR (root's, 0700):
#   known_hosts   the host key line "[127.0.0.1]:PORT ssh-ed25519 ..."
#   port          the port it listens on
#
# Environment:
#   PSIJ_SSHD_PORT=60022     the port on 127.0.0.1
#   PSIJ_SSHD_TIMEOUT=30     seconds to wait for the port to answer
set -euo pipefail
source "$(dirname "$0")/daemons.sh"

RUN_DIR=/run/psij-test-sshd
SSHD=/usr/sbin/sshd
PORT=${PSIJ_SSHD_PORT:-60022}
TIMEOUT=${PSIJ_SSHD_TIMEOUT:-30}
CONFIG=$RUN_DIR/sshd_config
HOST_KEY=$RUN_DIR/ssh_host_ed25519_key
PID_FILE=$RUN_DIR/sshd.pid
LOG=$RUN_DIR/sshd.log

say() { printf '[start-sshd] %s\n' "$*"; }
fail() {
    printf '[start-sshd] ERROR: %s\n' "$*" >&2
    [ -s "$LOG" ] && tail -n 12 "$LOG" >&2
    exit 1
}

case "$PORT" in
    [1-9] | [1-9][0-9] | [1-9][0-9][0-9] | [1-9][0-9][0-9][0-9] | [1-5][0-9][0-9][0-9][0-9] \
        | 6[0-4][0-9][0-9][0-9] | 65[0-4][0-9][0-9] | 655[0-2][0-9] | 6553[0-5]) ;;
    *) printf '[start-sshd] ERROR: PSIJ_SSHD_PORT=%q: a port from 1 to 65535 is accepted\n' \
           "$PORT" >&2
       exit 1 ;;
esac
if [ "$(id -u)" != 0 ]; then
    say "not root: a test sshd cannot be started here; ssh tests will skip"
    exit 0
fi
if [ ! -x "$SSHD" ] || ! command -v ssh-keygen >/dev/null 2>&1; then
    say "$SSHD or ssh-keygen not found (tests/setup/system-deps.sh installs them); ssh tests will skip"
    exit 0
fi

# ------------------------------------------------------------------ the run directory
# Made here, 0700 root; one that is there already is used only when it is exactly that (a real
# directory, not a link, owned by root, nobody else may enter or write it).
umask 077
if [ ! -e "$RUN_DIR" ] && [ ! -L "$RUN_DIR" ]; then
    mkdir -m 0700 "$RUN_DIR"
fi
[ -d "$RUN_DIR" ] && [ ! -L "$RUN_DIR" ] || fail "$RUN_DIR is not a directory (a link?): remove it"
[ "$(stat -c '%u %a' "$RUN_DIR")" = "0 700" ] \
    || fail "$RUN_DIR is not root's with mode 0700 ($(stat -c '%U %a' "$RUN_DIR")): remove it"
for f in "$CONFIG" "$HOST_KEY" "$HOST_KEY.pub" "$PID_FILE" "$LOG" "$RUN_DIR/known_hosts" \
        "$RUN_DIR/port"; do
    [ ! -L "$f" ] || fail "$f is a link: remove $RUN_DIR"
done

# sshd's privilege separation directory (an empty root-owned directory it chroots into).
if [ ! -d /run/sshd ]; then
    install -d -m 0755 -o root -g root /run/sshd
fi

# ------------------------------------------------------------------ host key and configuration
if [ ! -s "$HOST_KEY" ] || [ ! -s "$HOST_KEY.pub" ]; then
    rm -f "$HOST_KEY" "$HOST_KEY.pub"
    ssh-keygen -q -t ed25519 -N '' -C psij-test-sshd -f "$HOST_KEY" || fail "ssh-keygen failed"
fi
chmod 0600 "$HOST_KEY" "$HOST_KEY.pub"

# UsePAM: Debian's useradd leaves new accounts with a locked password ("!"), which sshd without
# PAM takes for a locked account and refuses even with a key; through PAM only the key counts.
new_config=$(cat <<EOF
# Written by tests/setup/start-sshd.sh: the psij tests' sshd, 127.0.0.1 only.
Port $PORT
ListenAddress 127.0.0.1
AddressFamily inet
HostKey $HOST_KEY
PidFile $PID_FILE
LogLevel VERBOSE
PubkeyAuthentication yes
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
GSSAPIAuthentication no
PermitRootLogin no
PermitEmptyPasswords no
AuthorizedKeysFile .ssh/authorized_keys
StrictModes yes
UsePAM yes
X11Forwarding no
AllowAgentForwarding no
AllowTcpForwarding no
AllowStreamLocalForwarding no
PermitTunnel no
PermitUserEnvironment no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 64:30:128
MaxSessions 32
ClientAliveInterval 30
Subsystem sftp internal-sftp
EOF
)
changed=0
if [ ! -f "$CONFIG" ] || [ "$(cat "$CONFIG")" != "$new_config" ]; then
    printf '%s\n' "$new_config" >"$CONFIG.new"
    chmod 0600 "$CONFIG.new"
    if ! check=$("$SSHD" -t -f "$CONFIG.new" 2>&1); then
        rm -f "$CONFIG.new"
        fail "sshd -t rejects the configuration: $check"
    fi
    mv -f "$CONFIG.new" "$CONFIG"
    changed=1
fi
printf '[127.0.0.1]:%s %s\n' "$PORT" "$(cut -d' ' -f1,2 "$HOST_KEY.pub")" >"$RUN_DIR/known_hosts"
printf '%s\n' "$PORT" >"$RUN_DIR/port"
chmod 0600 "$RUN_DIR/known_hosts" "$RUN_DIR/port"

# ------------------------------------------------------------------ the daemon
# answers: the port gives an SSH banner (what a client reads first).
answers() {
    local banner
    banner=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && head -c 8 <&3' _ "$PORT" \
        2>/dev/null) || return 1
    [ "${banner#SSH-}" != "$banner" ]
}

# gone PID: the process has exited (a zombie nobody reaped counts as gone).
gone() {
    [ ! -d "/proc/$1" ] || zombie "/proc/$1"
}

if [ -f "$RUN_DIR/started.sshd" ] && alive "$PID_FILE" sshd; then
    if [ "$changed" = 1 ]; then
        say "configuration changed: restarting sshd"
        pid=$(tr -dc '0-9' <"$PID_FILE")
        kill -TERM "$pid" 2>/dev/null || true
        wait_until 15 gone "$pid" || fail "sshd (pid $pid) did not stop"
        rm -f "$RUN_DIR/started.sshd"
    elif answers; then
        say "ready: 127.0.0.1:$PORT (already running)"
        exit 0
    fi
fi
if ! { [ -f "$RUN_DIR/started.sshd" ] && alive "$PID_FILE" sshd; }; then
    rm -f "$RUN_DIR/started.sshd"
    answers && fail "127.0.0.1:$PORT already answers: another sshd (set PSIJ_SSHD_PORT)"
    say "starting sshd on 127.0.0.1:$PORT"
    # sshd needs its absolute path (it re-executes itself for each connection).
    "$SSHD" -f "$CONFIG" -E "$LOG" </dev/null >/dev/null 2>&1 || fail "sshd did not start"
    wait_until 10 alive "$PID_FILE" sshd || fail "sshd wrote no pid file"
    touch "$RUN_DIR/started.sshd"
fi
wait_until "$TIMEOUT" answers || fail "127.0.0.1:$PORT gives no SSH banner after ${TIMEOUT}s"
say "ready: 127.0.0.1:$PORT"
