# Shell functions shared by the scripts that start and stop the test schedulers' daemons.
# Sourced, never run. The caller sets RUN_DIR (where "started.NAME" markers live) and defines
# say() for its messages.

# zombie /proc/PID: the process has exited but was not reaped yet (daemons that fork leave such
# a parent behind when their starter does not wait for it).
zombie() {
    grep -q '^State:[[:space:]]*Z' "$1/status" 2>/dev/null
}

# alive PIDFILE NAME: the pid in PIDFILE is a live (not zombie) process named NAME.
alive() {
    local pid
    pid=$(tr -dc '0-9' 2>/dev/null <"$1") || return 1
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && ! zombie "/proc/$pid"
}

# running NAME: some live process is named NAME (a daemon started by someone else counts).
running() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = "$1" ] && ! zombie "$p" && return 0
    done
    return 1
}

# wait_until SECONDS CMD...: retry CMD every 0.2 s until it succeeds or SECONDS have passed.
wait_until() {
    local end=$(( $(date +%s) + $1 )); shift
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        sleep 0.2
    done
}

# stop_started NAME PIDFILE [COMMAND]: stop NAME if this project's start script started it (its
# marker is in RUN_DIR): TERM, up to 20 s, then KILL. Sets STOP_FAILED=1 if it still runs.
# COMMAND is the process's name when it is not NAME (several slurmd, one marker each).
STOP_FAILED=0
stop_started() {
    local name=$1 pidfile=$2 comm=${3:-$1} i
    [ -f "$RUN_DIR/started.$name" ] || return 0
    if alive "$pidfile" "$comm"; then
        say "stopping $name (pid $(tr -dc '0-9' <"$pidfile"))"
        kill -TERM "$(tr -dc '0-9' <"$pidfile")" 2>/dev/null
        for i in $(seq 100); do
            alive "$pidfile" "$comm" || break
            sleep 0.2
        done
        if alive "$pidfile" "$comm"; then
            kill -KILL "$(tr -dc '0-9' <"$pidfile")" 2>/dev/null
            sleep 0.5
        fi
        if alive "$pidfile" "$comm"; then
            say "ERROR: $name is still running"
            STOP_FAILED=1
            return 0
        fi
    fi
    rm -f "$RUN_DIR/started.$name"
}
