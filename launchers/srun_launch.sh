#!/bin/bash
# Runs the job as a Slurm job step:
#     bash srun_launch.sh <7 fixed arguments> <N> <nodes|''> <processes per node|''> \
#         <cores per process|''> <executable> [arguments...]
# Empty values are left to srun (it takes them from the allocation).

source "${0%/*}/launcher_lib.sh"

if (( $# < 5 )); then
    launcher_fail "expected <process count> <nodes> <processes per node> <cores per process> \
before the executable"
fi
require_count "process count" "$1"
_PSI_J_PROCESS_COUNT=$1
_psij_srun=(srun -n "$1")
if [[ -n $2 ]]; then
    require_count "node count" "$2"
    _psij_srun+=(-N "$2")
fi
if [[ -n $3 ]]; then
    require_count "processes per node" "$3"
    _psij_srun+=(--ntasks-per-node "$3")
fi
if [[ -n $4 ]]; then
    require_count "cores per process" "$4"
    _psij_srun+=(--cpus-per-task "$4")
fi
shift 4

pre_launch
launch_job "${_psij_srun[@]}" "$@"
post_launch
log "launcher done"
echo "_PSI_J_LAUNCHER_DONE"
exit "$_PSI_J_EC"
