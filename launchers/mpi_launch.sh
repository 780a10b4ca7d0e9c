#!/bin/bash
# Runs the job under an MPI implementation's mpirun:
#     bash mpi_launch.sh <7 fixed arguments> <N> <executable> [arguments...]
# With Open MPI it allows more processes than cores (oversubscription) and, for root, running as
# root. A host file named by PSIJ_NODEFILE (when that file exists) is passed as --hostfile to
# Open MPI and as -f to Hydra-based MPIs (MPICH, Intel MPI, MVAPICH2).
# mpirun is looked up after the pre-launch script, which may be what puts it on PATH.

source "${0%/*}/launcher_lib.sh"

if (( $# < 2 )); then
    launcher_fail "expected <process count> before the executable"
fi
require_count "process count" "$1"
_PSI_J_PROCESS_COUNT=$1
shift

pre_launch

if ! hash mpirun 2>/dev/null; then
    launcher_fail "mpirun not found on PATH ($PATH)"
fi
_psij_mpi_version=$(mpirun --version 2>&1) || :
_psij_mpirun=(mpirun)
if [[ $_psij_mpi_version == *"Open MPI"* ]]; then
    # Open MPI 5 (PRRTE) deprecated --oversubscribe in favour of a mapping modifier.
    if [[ $_psij_mpi_version =~ \(Open\ MPI\)\ ([0-9]+) ]] && (( BASH_REMATCH[1] >= 5 )); then
        _psij_mpirun+=(--map-by :OVERSUBSCRIBE)
    else
        _psij_mpirun+=(--oversubscribe)
    fi
    if (( EUID == 0 )); then
        _psij_mpirun+=(--allow-run-as-root)
    fi
    _psij_hostfile_flag=--hostfile
elif [[ $_psij_mpi_version == *HYDRA* || $_psij_mpi_version == *"Intel(R) MPI"* ]]; then
    _psij_hostfile_flag=-f
else
    _psij_hostfile_flag=
fi
if [[ -n ${PSIJ_NODEFILE-} && -f $PSIJ_NODEFILE ]]; then
    if [[ -n $_psij_hostfile_flag ]]; then
        _psij_mpirun+=("$_psij_hostfile_flag" "$PSIJ_NODEFILE")
    else
        log "unknown MPI flavour; not passing the host file $PSIJ_NODEFILE"
    fi
fi
_psij_mpirun+=(-n "$_PSI_J_PROCESS_COUNT")

launch_job "${_psij_mpirun[@]}" "$@"
post_launch
log "launcher done"
echo "_PSI_J_LAUNCHER_DONE"
exit "$_PSI_J_EC"
