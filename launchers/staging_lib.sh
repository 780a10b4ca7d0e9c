# File staging for jobs whose staging runs inside the job itself: batch submit scripts and pilot
# tasks source this file (deployed next to the launcher scripts) and call, in this order:
#
#   _psij_staging_begin REPORT            start the report file (0600) psij reads afterwards
#   _psij_stage_in MODE SOURCE TARGET     once per StageIn entry
#   _psij_staging_run COMMAND...          run the job (skipped after a failed stage-in or a
#                                         cancellation); sets _psij_ec to its exit status
#   _psij_stage_out FLAGS MODE SHOWN SOURCE TARGET
#                                         once per StageOut entry (SHOWN: the source as given,
#                                         for messages)
#   _psij_cleanup FLAGS PATH              once per cleanup entry
#   _psij_staging_end                     sets _psij_ec to the status the script exits with
#
# MODE is COPY, LINK or MOVE; FLAGS is the number of the normalized psij.staging.StageOutFlags
# (IF_PRESENT 1, ON_SUCCESS 2, ON_ERROR 4, ON_CANCEL 8). Every path is absolute. The semantics
# are those of the local executor: copying a folder merges it into the target, linking makes
# an absolute symbolic link (replacing a file or link already there), moving into an existing
# folder puts the source inside it; missing target folders are created.
#
# What happened goes to REPORT, one "<key> <text>" line each: "stage-in-failed MESSAGE",
# "stage-out-failed MESSAGE", "cleanup-failed MESSAGE", and "job-exit CODE" once the job ran.
# A TERM, INT or USR2 received by the script (a cancel, or the scheduler's warning before a
# kill) marks the job cancelled: the job is not started if it had not been, and the stage-out
# and cleanup entries with ON_CANCEL run once it has ended (within the scheduler's grace period
# before its KILL). A script that handles signals itself (batch scripts whose scheduler can
# signal: psij_signals defines _psij_got, which calls _psij_signalled) passes the signal on as
# its scheduler needs; otherwise (pilot tasks, Flux, Cobalt) the first one is passed on to the
# job as TERM. A script that defines _psij_run has the job run by it.
#
# Must not: evaluate a path as code (every expansion is quoted), write anything but the report
# and the staged files, or signal anything but the script's own process group.

_psij_report=
_psij_stage_in_failed=0
_psij_stage_out_failed=0
_psij_canceled=0
_psij_ran=0
_psij_outcome=0
_psij_ec=
_psij_why=

# Some schedulers signal only the script (Slurm sends a cancelled batch job's TERM to the
# script alone), so the first signal is passed on as TERM to the script's process group: the
# job's processes (schedulers and the pilot start each job in a group of its own). The script
# gets it too and ignores it, being already marked cancelled.
_psij_on_signal() {
    if (( ! _psij_canceled )); then
        _psij_canceled=1
        kill -TERM 0 2>/dev/null
    fi
}

# Called by a script's own signal handling (psij_signals) with the signal's name.
_psij_signalled() {
    case $1 in
        TERM | INT | USR2) _psij_canceled=1 ;;
    esac
}

_psij_staging_begin() {
    _psij_report=$1
    (umask 077 && : >"$_psij_report")
    if ! declare -F _psij_got >/dev/null; then
        trap _psij_on_signal TERM INT USR2
    fi
}

_psij_note() {
    printf '%s %s\n' "$1" "$2" >>"$_psij_report"
}

# Runs "$@" with its output kept in _psij_why (one line) when it fails.
_psij_try() {
    local out
    if out=$("$@" 2>&1); then
        return 0
    fi
    out=${out//$'\n'/; }
    _psij_why=${out:-"$1 failed"}
    return 1
}

_psij_do_transfer() {
    local mode=$1 src=$2 dst=$3
    if [[ ! -e $src && ! -L $src ]]; then
        echo "No such file or directory: '$src'"
        return 1
    fi
    mkdir -p -- "${dst%/*}/" || return 1
    case $mode in
        LINK)
            if [[ -e $dst || -L $dst ]]; then
                rm -f -- "$dst" || return 1
            fi
            ln -s -- "$src" "$dst"
            ;;
        MOVE)
            mv -- "$src" "$dst"
            ;;
        *)
            if [[ -d $src ]]; then
                mkdir -p -- "$dst" && cp -RPp -- "$src/." "$dst"
            else
                cp -p -- "$src" "$dst"
            fi
            ;;
    esac
}

_psij_stage_in() {
    if (( _psij_stage_in_failed || _psij_canceled )); then
        return 0
    fi
    if ! _psij_try _psij_do_transfer "$1" "$2" "$3"; then
        _psij_stage_in_failed=1
        _psij_note stage-in-failed "stage-in failed: $_psij_why"
    fi
}

_psij_staging_run() {
    local child status
    if (( _psij_stage_in_failed || _psij_canceled )); then
        return 0
    fi
    _psij_ran=1
    if declare -F _psij_run >/dev/null; then
        _psij_run "$@"
    else
        # In the background, so that a trapped signal is handled while the job runs.
        "$@" &
        child=$!
        while :; do
            wait "$child"
            status=$?
            # A signal interrupts wait; the job may still be running (or not yet reaped).
            if (( status > 128 )) && kill -0 "$child" 2>/dev/null; then
                continue
            fi
            break
        done
        _psij_ec=$status
    fi
    # From now on cancel signals are ignored, by the script and by the stage-out and cleanup
    # commands (which inherit that), so that a repeated signal cannot cut them short; the
    # scheduler's KILL still ends them after its grace period.
    trap '' TERM INT USR2
    _psij_note job-exit "$_psij_ec"
    # The outcome the ON_* flags are matched against, fixed once the job has ended.
    if (( _psij_canceled )); then
        _psij_outcome=8
    elif (( _psij_ec == 0 )); then
        _psij_outcome=2
    else
        _psij_outcome=4
    fi
}


_psij_stage_out() {
    local flags=$1 mode=$2 shown=$3 src=$4 dst=$5
    if (( ! _psij_ran || (flags & _psij_outcome) == 0 )); then
        return 0
    fi
    if [[ ! -e $src && ! -L $src ]]; then
        if (( ! (flags & 1) )); then
            _psij_stage_out_failed=1
            _psij_note stage-out-failed "stage-out: '$shown' does not exist"
        fi
        return 0
    fi
    if ! _psij_try _psij_do_transfer "$mode" "$src" "$dst"; then
        _psij_stage_out_failed=1
        _psij_note stage-out-failed "stage-out of '$shown' failed: $_psij_why"
    fi
}

_psij_cleanup() {
    if (( ! _psij_ran || ($1 & _psij_outcome) == 0 )); then
        return 0
    fi
    if ! _psij_try rm -rf -- "$2"; then
        _psij_note cleanup-failed "cleanup of $2 failed: $_psij_why"
    fi
}

_psij_staging_end() {
    if (( ! _psij_ran )); then
        if (( _psij_stage_in_failed )); then
            _psij_ec=1
        else
            _psij_ec=143  # cancelled before the job started, as if TERM had ended it
        fi
    elif (( _psij_stage_out_failed && _psij_ec == 0 )); then
        _psij_ec=1
    fi
}
