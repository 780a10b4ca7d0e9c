#!/bin/bash
#BATCH_TEST --job-name="name with 'quotes' \"dq\" \$(rm -rf ~) \`id\` é #not-a-comment"
#BATCH_TEST --time=26:03:04
#BATCH_TEST --queue="debug"
#BATCH_TEST --account="proj-42"
#BATCH_TEST --reservation="resv.1"
#BATCH_TEST --ntasks=6
#BATCH_TEST --export=NONE
#BATCH_TEST --flag
#BATCH_TEST --constraint="a&b"

_PSIJ_NATIVE_ID=$BATCH_TEST_JOB_ID
export PLAIN="v"
export HOSTILE="\$(id) \`id\` \"q\" 'q' \\ \$HOME
line2"
export NUM="7"

# Every process of the job runs on this machine.
PSIJ_NODEFILE="<SCRIPT_DIR>/$_PSIJ_NATIVE_ID.nodefile"
for ((_psij_i = 0; _psij_i < 6; _psij_i++)); do
    hostname
done >"$PSIJ_NODEFILE"
export PSIJ_NODEFILE

_psij_dir="<SCRIPT_DIR>"
exec >>"$_psij_dir/$_PSIJ_NATIVE_ID.out" 2>&1
_psij_launch() {
    cd "/data/it's \"quoted\" \$(whoami) \`id\` é ✓" || return 1
    bash <LAUNCHER_SCRIPT> 00000000-1111-2222-3333-444444444444 '' '/etc/pre launch.sh' post.sh '/in/put file.txt' '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/out.txt' '/err/e r r'"'"'s.txt' 6 '/opt/my app/run $(x).sh' plain 'two words' 'it'"'"'s' '$(touch /tmp/pwned)' '`id`' 'a"b' 'back\slash' 'new
line' 'é ✓' '' 
}
_psij_launch
_psij_ec=$?
printf '%s\n' "$_psij_ec" >"$_psij_dir/$_PSIJ_NATIVE_ID.ec"
exit "$_psij_ec"
