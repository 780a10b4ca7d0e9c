#!/bin/bash
# bash launcher.sh <7 fixed arguments> <process count> <nodes> <per node> <executable> [args...]
# Runs <per node> copies for each node; /bin/hostname is replaced by the deployed helper,
# which is run directly (it must be executable).

source "$(dirname "$0")/launcher_lib.sh"

pre_launch
_count=$1
_nodes=$2
_per_node=$3
shift 3
_exe=$1
shift
if [ "$_exe" == "/bin/hostname" ]; then
    _exe=$(dirname "$0")/hostname
fi

_pids=()
for ((_node = 1; _node <= _nodes; _node++)); do
    for ((_proc = 1; _proc <= _per_node; _proc++)); do
        _PSI_J_NODE_INDEX_=$_node _PSI_J_PROCESS_INDEX_=$(((_node - 1) * _per_node + _proc)) \
            "$_exe" "$@" >>"$_PSI_J_STDOUT" 2>>"$_PSI_J_STDERR" <"$_PSI_J_STDIN" &
        _pids+=("$!")
    done
done
_ec=0
for _pid in "${_pids[@]}"; do
    wait "$_pid" || _ec=$?
done
log "ran $_count copies; status $_ec"

post_launch
echo "_PSI_J_LAUNCHER_DONE"
exit "$_ec"
