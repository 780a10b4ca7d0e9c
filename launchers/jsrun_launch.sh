#!/bin/bash
# Runs the job with IBM's jsrun (LSF), one resource set per process:
#     bash jsrun_launch.sh <7 fixed arguments> <N> <cores per process|''> \
#         <GPUs per process|''> <executable> [arguments...]
# Empty values are left to jsrun.

source "${0%/*}/launcher_lib.sh"

if (( $# < 4 )); then
    launcher_fail "expected <process count> <cores per process> <GPUs per process> \
before the executable"
fi
require_count "process count" "$1"
_PSI_J_PROCESS_COUNT=$1
_psij_jsrun=(jsrun -n "$1" -a 1)
if [[ -n $2 ]]; then
    require_count "cores per process" "$2"
    _psij_jsrun+=(-c "$2")
fi
if [[ -n $3 ]]; then
    require_count "GPUs per process" "$3"
    _psij_jsrun+=(-g "$3")
fi
shift 3

pre_launch
launch_job "${_psij_jsrun[@]}" "$@"
post_launch
log "launcher done"
echo "_PSI_J_LAUNCHER_DONE"
exit "$_PSI_J_EC"
