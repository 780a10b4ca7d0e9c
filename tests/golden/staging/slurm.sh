#!/bin/bash
#SBATCH --job-name="name with 'quotes' \"dq\" \$(rm -rf ~) \`id\` é #not-a-comment"
#SBATCH --chdir="/data/it's \"quoted\" \$(whoami) \`id\` é ✓"
#SBATCH --nodes=2
#SBATCH --ntasks=6
#SBATCH --ntasks-per-node=3
#SBATCH --cpus-per-task=2
#SBATCH --gpus-per-task=1
#SBATCH --mem=3145729K
#SBATCH --exclusive
#SBATCH --time=1-02:03:04
#SBATCH --partition="debug"
#SBATCH --account="proj-42"
#SBATCH --reservation="resv.1"
#SBATCH --flag
#SBATCH --constraint="a&b"
#SBATCH --output=/dev/null
#SBATCH --error=/dev/null
#SBATCH --export=NONE

_PSIJ_NATIVE_ID=$SLURM_JOB_ID
export PLAIN="v"
export HOSTILE="\$(id) \`id\` \"q\" 'q' \\ \$HOME
line2"
export NUM="7"
export SLURM_EXPORT_ENV=ALL

# PSIJ_NODEFILE: one line per process, each naming the node that runs it. Slurm lists each
# node once and gives the processes per node as in "2(x3),1".
PSIJ_NODEFILE="<SCRIPT_DIR>/$_PSIJ_NATIVE_ID.nodefile"
# A list without brackets ("node1" or "a,b") is read here; only a compressed one ("n[1-4]")
# needs scontrol, which costs a process and a call to the controller.
if [[ ${SLURM_JOB_NODELIST:-} == *[[]* ]]; then
    mapfile -t _psij_nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null)
else
    IFS=, read -ra _psij_nodes <<<"${SLURM_JOB_NODELIST:-}"
fi
[ ${#_psij_nodes[@]} -gt 0 ] || _psij_nodes=("$(hostname)")
_psij_counts=()
IFS=, read -ra _psij_groups <<<"${SLURM_TASKS_PER_NODE:-1}"
for _psij_group in "${_psij_groups[@]}"; do
    if [[ $_psij_group =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
        for ((_psij_i = 0; _psij_i < BASH_REMATCH[2]; _psij_i++)); do
            _psij_counts+=("${BASH_REMATCH[1]}")
        done
    else
        _psij_counts+=("$_psij_group")
    fi
done
for _psij_i in "${!_psij_nodes[@]}"; do
    for ((_psij_j = 0; _psij_j < ${_psij_counts[_psij_i]:-1}; _psij_j++)); do
        printf '%s\n' "${_psij_nodes[_psij_i]}"
    done
done >"$PSIJ_NODEFILE"
export PSIJ_NODEFILE

_psij_dir="<SCRIPT_DIR>"
exec >>"$_psij_dir/$_PSIJ_NATIVE_ID.out" 2>&1
_psij_now() {
    _psij_t=${EPOCHREALTIME:-}
    [[ -n $_psij_t ]] || _psij_t=$(date +%s)
}
# Writes $2 to <native id>$1 through a temporary file renamed into place.
_psij_record() {
    printf '%s\n' "$2" >"$_psij_dir/$_PSIJ_NATIVE_ID$1.$$" \
        && mv -f "$_psij_dir/$_PSIJ_NATIVE_ID$1.$$" "$_psij_dir/$_PSIJ_NATIVE_ID$1"
}
_psij_starts=0
_psij_signal_seen=-
_psij_now
_psij_record .starts "$((_psij_starts + 1)) $_psij_t"
_psij_launch() {
    cd "/data/it's \"quoted\" \$(whoami) \`id\` é ✓" || return 1
    exec bash <LAUNCHER_SCRIPT> 00000000-1111-2222-3333-444444444444 '' '/etc/pre launch.sh' post.sh '/in/put file.txt' '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/out.txt' '/err/e r r'"'"'s.txt' 6 '/opt/my app/run $(x).sh' plain 'two words' 'it'"'"'s' '$(touch /tmp/pwned)' '`id`' 'a"b' 'back\slash' 'new
line' 'é ✓' '' 
}
_psij_got() {
    local sig=$2
    _psij_signal_seen=$1
    if [[ $sig == request ]]; then
        sig=TERM
        if read -r _psij_sig 2>/dev/null <"$_psij_dir/$_PSIJ_NATIVE_ID.signal" \
                && [[ $_psij_sig =~ ^[1-9][0-9]?$ ]]; then
            sig=$_psij_sig
        fi
    fi
    if declare -F _psij_signalled >/dev/null; then
        _psij_signalled "$1"
    fi
    if [[ $sig != - ]]; then
        trap '' "$sig"
        kill -"$sig" 0 2>/dev/null
        _psij_traps
    fi
}
_psij_traps() {
    trap '_psij_got TERM TERM' TERM
    trap '_psij_got INT INT' INT
    trap '_psij_got HUP HUP' HUP
    trap '_psij_got USR1 USR1' USR1
    trap '_psij_got USR2 USR2' USR2
    :
}
_psij_traps
# Runs "$@" (which ends in exec) in the background and sets _psij_ec to its exit status.
_psij_run() {
    local child status
    { "$@"; } &
    child=$!
    while :; do
        wait "$child"
        _psij_ec=$?
        # A trapped signal ends wait early (> 128) while the job may still run.
        (( _psij_ec > 128 )) && kill -0 "$child" 2>/dev/null || break
    done
    if (( _psij_ec > 128 )); then
        # The job may have ended during the trap: bash keeps its status for one more wait.
        wait "$child" 2>/dev/null
        status=$?
        (( status == 127 )) || _psij_ec=$status
    fi
}
source <STAGING_LIB>
_psij_staging_begin "$_psij_dir/$_PSIJ_NATIVE_ID.staging"
_psij_stage_in COPY '/data/in '"'"'q'"'"' "d" $(touch PWNED) `id` é ✓/a.txt' '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/a.txt'
_psij_stage_in LINK '/data/in '"'"'q'"'"' "d" $(touch PWNED) `id` é ✓/b' '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/sub dir/b'"'"''
_psij_stage_in MOVE /srv/c '/data/in '"'"'q'"'"' "d" $(touch PWNED) `id` é ✓/c'
_psij_staging_run _psij_launch
_psij_stage_out 14 COPY 'out $(x).txt' '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/out $(x).txt' '/data/in '"'"'q'"'"' "d" $(touch PWNED) `id` é ✓/out.txt'
_psij_stage_out 15 MOVE log '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/log' /results/log
_psij_stage_out 8 LINK part '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/part' /results/part
_psij_cleanup 10 '/data/it'"'"'s "quoted" $(whoami) `id` é ✓/scratch '"'"'x'"'"''
_psij_cleanup 10 '/tmp/psij scratch'
_psij_staging_end
_psij_now
_psij_record .ec "$_psij_ec $_psij_t $_psij_signal_seen $((_psij_starts + 1))"
exit "$_psij_ec"
