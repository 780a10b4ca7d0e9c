#!/bin/bash
#PBS -N name_with__quotes___dq____rm_-rf_____id_____not-a-comment
#PBS -b 2
#PBS --cpunum-lhost=6
#PBS --gpunum-lhost=3
#PBS --memsz-lhost=3073M
#PBS --exclusive
#PBS -l elapstim_req=93784
#PBS -q debug
#PBS -A proj-42
#PBS -y resv.1
#PBS -m be
#PBS -M user@example.org
#PBS -X
#PBS -o /dev/null
#PBS -e /dev/null

# PBS_JOBID is "<job number>:<request number>.<batch server>"; the request's script runs in
# each of its jobs, and only job 0 runs the launch command.
_psij_job_number=${PBS_JOBID%%:*}
_PSIJ_NATIVE_ID=${PBS_JOBID#*:}
_PSIJ_NATIVE_ID=${_PSIJ_NATIVE_ID%%.*}
if [ "$_psij_job_number" != "0" ]; then
    exit 0
fi
export PLAIN="v"
export HOSTILE="\$(id) \`id\` \"q\" 'q' \\ \$HOME
line2"
export NUM="7"

# PSIJ_NODEFILE: one line per process, each host of the request once per process on it.
PSIJ_NODEFILE="<SCRIPT_DIR>/$_PSIJ_NATIVE_ID.nodefile"
if [ -n "${PBS_NODEFILE:-}" ] && [ -r "$PBS_NODEFILE" ]; then
    while read -r _psij_host; do
        for ((_psij_i = 0; _psij_i < 3; _psij_i++)); do
            printf '%s\n' "$_psij_host"
        done
    done <"$PBS_NODEFILE" >"$PSIJ_NODEFILE"
else
    for ((_psij_i = 0; _psij_i < 6; _psij_i++)); do
        hostname
    done >"$PSIJ_NODEFILE"
fi
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
_psij_traps() {
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
_psij_run _psij_launch
_psij_now
_psij_record .ec "$_psij_ec $_psij_t $_psij_signal_seen $((_psij_starts + 1))"
exit "$_psij_ec"
