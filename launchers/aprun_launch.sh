#!/bin/bash
# Runs the job with Cray ALPS's aprun:
#     bash aprun_launch.sh <7 fixed arguments> <N> <processes per node|''> \
#         <cores per process|''> <executable> [arguments...]
# Empty values are left to aprun.

source "${0%/*}/launcher_lib.sh"

if (( $# < 4 )); then
    launcher_fail "expected <process count> <processes per node> <cores per process> \
before the executable"
fi
require_count "process count" "$1"
_PSI_J_PROCESS_COUNT=$1
_psij_aprun=(aprun -n "$1")
if [[ -n $2 ]]; then
    require_count "processes per node" "$2"
    _psij_aprun+=(-N "$2")
fi
if [[ -n $3 ]]; then
    require_count "cores per process" "$3"
    _psij_aprun+=(-d "$3")
fi
shift 3

pre_launch
launch_job "${_psij_aprun[@]}" "$@"
post_launch
log "launcher done"
echo "_PSI_J_LAUNCHER_DONE"
exit "$_PSI_J_EC"
