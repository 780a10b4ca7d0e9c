#!/bin/bash
# Runs one copy of the job: bash single_launch.sh <7 fixed arguments> <executable> [arguments...]
# (the fixed arguments are described in launcher_lib.sh). Without a post-launch script the
# launcher process becomes the job (exec), so no shell waits around for it.

# $0 is the absolute path of the deployed script, so its folder holds the library.
source "${0%/*}/launcher_lib.sh"

pre_launch

if [[ -z $_PSI_J_POST_LAUNCH ]]; then
    exec_job "$@"
fi

launch_job "$@"
post_launch
log "launcher done"
echo "_PSI_J_LAUNCHER_DONE"
exit "$_PSI_J_EC"
