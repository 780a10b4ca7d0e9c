#!/bin/bash
# Runs N copies of the job side by side:
#     bash multi_launch.sh <7 fixed arguments> <N> <executable> [arguments...]
# Each copy sees _PSI_J_PROCESS_INDEX_ (1 to N, as PSI/J jobs have always seen it) and _PSI_J_PROCESS_COUNT (N). The job's stdout
# and stderr are opened once and shared by all copies, so their output is appended, never
# overwritten; each copy reads stdin from the start. The exit status is the first non-zero
# status in index order, or 0.

source "${0%/*}/launcher_lib.sh"

if (( $# < 2 )); then
    launcher_fail "expected <process count> before the executable"
fi
require_count "process count" "$1"
_PSI_J_PROCESS_COUNT=$1
shift
export _PSI_J_PROCESS_COUNT

pre_launch

_psij_pids=()
_psij_signalled=

# Background copies of a non-interactive shell ignore SIGINT, so every stop request is passed on
# as SIGTERM; the copies' statuses are still collected afterwards.
_psij_stop_copies() {
    _psij_signalled=1
    log "stop requested; sending SIGTERM to ${#_psij_pids[@]} copies"
    kill -TERM "${_psij_pids[@]}" 2>/dev/null || :
}

_psij_start_copies() {
    local _psij_index
    for (( _psij_index = 1; _psij_index <= _PSI_J_PROCESS_COUNT; _psij_index++ )); do
        ( export _PSI_J_PROCESS_INDEX_=$_psij_index; exec "$@" <"$_PSI_J_STDIN" ) &
        _psij_pids+=("$!")
    done
}

log_command "$@"
trap _psij_stop_copies TERM INT HUP
_PSI_J_EC=
if _psij_shared_output; then
    { _PSI_J_EC=0; _psij_start_copies "$@"; } <"$_PSI_J_STDIN" >"$_PSI_J_STDOUT" 2>&1
else
    { _PSI_J_EC=0; _psij_start_copies "$@"; } <"$_PSI_J_STDIN" >"$_PSI_J_STDOUT" 2>"$_PSI_J_STDERR"
fi
if [[ -z $_PSI_J_EC ]]; then
    _psij_streams_failed
fi

for _psij_pid in "${_psij_pids[@]}"; do
    while :; do
        _psij_status=0
        _psij_signalled=
        wait "$_psij_pid" || _psij_status=$?
        # A trapped signal interrupts wait before the copy has ended; wait again for its status.
        if [[ -z $_psij_signalled ]] || (( _psij_status <= 128 )); then
            break
        fi
    done
    if (( _psij_status != 0 )); then
        log "copy with pid $_psij_pid exited with status $_psij_status"
        if (( _PSI_J_EC == 0 )); then
            _PSI_J_EC=$_psij_status
        fi
    fi
done
trap - TERM INT HUP
log "all $_PSI_J_PROCESS_COUNT copies done; status $_PSI_J_EC"

post_launch
log "launcher done"
echo "_PSI_J_LAUNCHER_DONE"
exit "$_PSI_J_EC"
