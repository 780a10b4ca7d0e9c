# Shared part of the job launcher scripts; each script sources it first:
#
#     source "$(dirname "$0")/launcher_lib.sh"
#
# A launcher script is called as
#
#     bash <script> <job id> <log file|''> <pre-launch|''> <post-launch|''> <stdin> <stdout> \
#         <stderr> [script-specific arguments] <executable> [arguments...]
#
# This file takes the seven fixed arguments off "$@" into _PSI_J_JOB_ID, _PSI_J_LOG_FILE,
# _PSI_J_PRE_LAUNCH, _PSI_J_POST_LAUNCH, _PSI_J_STDIN, _PSI_J_STDOUT and _PSI_J_STDERR and
# defines:
#   log MESSAGE...     append a timestamped line to the log file (nothing without a log file)
#   pre_launch         source the pre-launch script, if any (its exports reach the job)
#   post_launch        source the post-launch script, if any (after the job; sees _PSI_J_EC)
#   launch_job CMD...  run CMD as a child with the job's redirections; sets _PSI_J_EC
#   exec_job CMD...    print the completion marker, then replace this shell by CMD with the job's
#                      redirections (for scripts with nothing left to do after the job)
#   launcher_fail MESSAGE [STATUS]
#                      report a launcher failure on stderr and exit without the marker
# The script then ends with `echo "_PSI_J_LAUNCHER_DONE"` and `exit "$_PSI_J_EC"`; a launcher
# output whose last line is not that marker is a launcher failure.
#
# Must not: evaluate any argument, path or environment value as code (every expansion is
# quoted); start helper processes for logging or timestamps (builtins only); write to the
# launcher's own stdout anything but the marker; leave extra file descriptors open in the job.
# Works with bash 3.2 and later (timestamps in the log need bash 4.2).

if (( $# < 8 )); then
    printf 'psij launcher %s: expected at least 8 arguments (%s), got %d\n' "$0" \
        "job id, log file, pre-launch, post-launch, stdin, stdout, stderr, executable" "$#" >&2
    exit 1
fi

_PSI_J_JOB_ID=$1
_PSI_J_LOG_FILE=$2
_PSI_J_PRE_LAUNCH=$3
_PSI_J_POST_LAUNCH=$4
_PSI_J_STDIN=$5
_PSI_J_STDOUT=$6
_PSI_J_STDERR=$7
shift 7
_PSI_J_EC=

if (( BASH_VERSINFO[0] > 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] >= 2) )); then
    log() {
        if [[ -n $_PSI_J_LOG_FILE ]]; then
            # A log that cannot be written must not fail the job.
            printf '%(%Y-%m-%dT%H:%M:%S%z)T %s %s\n' -1 "$_PSI_J_JOB_ID" "$*" \
                2>/dev/null >>"$_PSI_J_LOG_FILE" || :
        fi
    }
else
    log() {
        if [[ -n $_PSI_J_LOG_FILE ]]; then
            printf '%s %s\n' "$_PSI_J_JOB_ID" "$*" 2>/dev/null >>"$_PSI_J_LOG_FILE" || :
        fi
    }
fi

launcher_fail() {
    printf 'psij launcher: %s\n' "$1" >&2
    log "launcher failure: $1"
    exit "${2:-1}"
}

# Logs a command line, each word shell-quoted so the log shows exactly what ran.
log_command() {
    if [[ -n $_PSI_J_LOG_FILE ]]; then
        local _psij_quoted
        printf -v _psij_quoted ' %q' "$@"
        log "command:$_psij_quoted"
    fi
}

# Sources a pre- or post-launch script. `source name` without a slash would search PATH first,
# so a relative name is anchored to the job's directory.
_psij_source_hook() {
    local _psij_what=$1 _psij_path=$2 _psij_status=0
    if [[ $_psij_path != */* ]]; then
        _psij_path=./$_psij_path
    fi
    if [[ ! -f $_psij_path ]]; then
        launcher_fail "$_psij_what script not found: $2 (in $PWD)"
    fi
    if [[ ! -r $_psij_path ]]; then
        launcher_fail "$_psij_what script not readable: $2"
    fi
    log "$_psij_what: sourcing $2"
    source "$_psij_path" || _psij_status=$?
    if (( _psij_status != 0 )); then
        launcher_fail "$_psij_what script $2 failed with exit status $_psij_status" "$_psij_status"
    fi
}

pre_launch() {
    if [[ -n $_PSI_J_PRE_LAUNCH ]]; then
        _psij_source_hook pre-launch "$_PSI_J_PRE_LAUNCH"
    fi
}

post_launch() {
    if [[ -n $_PSI_J_POST_LAUNCH ]]; then
        _psij_source_hook post-launch "$_PSI_J_POST_LAUNCH"
    fi
}

# True when stdout and stderr name one file: it is then opened once, so the two streams share
# one offset instead of overwriting each other. Two spellings of one path (out.txt, ./out.txt)
# are recognised once stdout exists, so it is created first (its redirection truncates it anyway).
_psij_shared_output() {
    if [[ $_PSI_J_STDOUT == "$_PSI_J_STDERR" ]]; then
        return 0
    fi
    if [[ ! -e $_PSI_J_STDOUT ]]; then
        { : >>"$_PSI_J_STDOUT"; } 2>/dev/null
    fi
    [[ $_PSI_J_STDOUT -ef $_PSI_J_STDERR ]]
}

_psij_streams_failed() {
    launcher_fail "cannot open the job's streams (stdin: $_PSI_J_STDIN, stdout: \
$_PSI_J_STDOUT, stderr: $_PSI_J_STDERR)"
}

# Runs "$@" as one child process. `( exec ... )` forks once like a plain command would, but never
# runs a shell function or builtin that happens to share the executable's name. When a stream
# cannot be opened the group body does not run, which leaves _PSI_J_EC empty. The signals meant
# for the job reach its whole process group (the scheduler or the batch script sends them so):
# this shell lives through them (a trap runs once the child has ended) to report its status.
launch_job() {
    log_command "$@"
    _PSI_J_EC=
    trap : TERM INT HUP USR1 USR2
    if _psij_shared_output; then
        { _PSI_J_EC=0; ( exec "$@" ) || _PSI_J_EC=$?; } \
            <"$_PSI_J_STDIN" >"$_PSI_J_STDOUT" 2>&1
    else
        { _PSI_J_EC=0; ( exec "$@" ) || _PSI_J_EC=$?; } \
            <"$_PSI_J_STDIN" >"$_PSI_J_STDOUT" 2>"$_PSI_J_STDERR"
    fi
    trap - TERM INT HUP USR1 USR2
    if [[ -z $_PSI_J_EC ]]; then
        _psij_streams_failed
    fi
    log "job exited with status $_PSI_J_EC"
}

# The marker goes out once the streams are open (fd 9 keeps the launcher's stdout for that) and
# before exec, since nothing runs afterwards. If exec fails (command not found), bash exits with
# 126/127 and its message lands in the job's stderr, as for launch_job.
exec_job() {
    log_command "$@"
    log "replacing the launcher by the job"
    _PSI_J_EC=
    if _psij_shared_output; then
        { _PSI_J_EC=127; echo "_PSI_J_LAUNCHER_DONE" >&9; exec 9>&-; exec "$@"; _PSI_J_EC=$?; } \
            9>&1 <"$_PSI_J_STDIN" >"$_PSI_J_STDOUT" 2>&1
    else
        { _PSI_J_EC=127; echo "_PSI_J_LAUNCHER_DONE" >&9; exec 9>&-; exec "$@"; _PSI_J_EC=$?; } \
            9>&1 <"$_PSI_J_STDIN" >"$_PSI_J_STDOUT" 2>"$_PSI_J_STDERR"
    fi
    if [[ -z $_PSI_J_EC ]]; then
        _psij_streams_failed
    fi
    # Only reached when a sourced script set `shopt -s execfail` and exec failed.
    exit "$_PSI_J_EC"
}

# Checks that a launcher-specific argument is a positive integer (process counts and the like).
require_count() {
    if [[ ! $2 =~ ^[1-9][0-9]*$ ]]; then
        launcher_fail "$1 must be a positive integer, got '$2'"
    fi
}

log "launcher $0 started in $PWD"
