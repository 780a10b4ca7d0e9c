#!/bin/bash
# Called as: bash myrun_launch.sh <7 fixed arguments> <process count> <executable> [arguments...]

# Takes the seven fixed arguments off "$@" and defines the helper functions.
source "$(dirname "$0")/launcher_lib.sh"

require_count "process count" "$1"   # from MyRunLauncher.get_additional_args
command -v myrun >/dev/null || launcher_fail "myrun not found on PATH"
_MYRUN_PROCESSES=$1
shift                                # what is left: the executable and its arguments

pre_launch
launch_job myrun -n "$_MYRUN_PROCESSES" "$@"   # with the job's redirections; sets _PSI_J_EC
post_launch

echo "_PSI_J_LAUNCHER_DONE"
exit "$_PSI_J_EC"
