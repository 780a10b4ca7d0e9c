#!/usr/bin/env bash
# Runs the whole tests/ tree (make unit) in two chains side by side, to keep the run short on a
# small machine: most of the time of the scheduler tests is spent waiting for Slurm, Grid Engine
# and ssh, while the other tests keep the CPUs busy.
#
#   chain 1: tests/real, tests/benchmarks and the other tests that use the test sshd;
#   chain 2: every other test, then the remaining tests marked slurm or sge (after the others,
#            so that they meet the end of tests/real's scheduler campaigns rather than their
#            start: chain 1 is the longer one).
#
# First the whole tree is collected once, so that a test module that gives no test fails the
# run (tests/conftest.py) as a whole-tree run would. A chain that collects nothing fails (pytest's
# status 5), and the status is the first failure's. Each chain's output is printed when both end.
set -u
PY=${PY:-.venv/bin/python}
PYTEST=("$PY" -m pytest -q -p no:cacheprovider)
WAITING=(tests/real tests/benchmarks tests/integration/test_docs_examples.py
         tests/test_remote_executor.py tests/test_cli_remote.py)
IGNORED=()
for path in "${WAITING[@]}"; do IGNORED+=("--ignore=$path"); done
SCHEDULERS="slurm or sge"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

"${PYTEST[@]}" --collect-only tests >"$logs/collect" 2>&1
rc=$?
if [ $rc != 0 ]; then
    tail -n 40 "$logs/collect"
    [ $rc != 5 ] || echo "run-tests: pytest collected no test under tests/" >&2
    exit $rc
fi
echo "run-tests: $(tail -n 1 "$logs/collect")"

chain1() {
    "${PYTEST[@]}" --durations=15 "${WAITING[@]}" >"$logs/waiting" 2>&1
    echo $? >"$logs/waiting.rc"
}
chain2() {
    "${PYTEST[@]}" --durations=15 -m "not ($SCHEDULERS)" tests "${IGNORED[@]}" \
        >"$logs/rest" 2>&1
    echo $? >"$logs/rest.rc"
    "${PYTEST[@]}" --durations=10 -m "$SCHEDULERS" tests "${IGNORED[@]}" \
        >"$logs/marked" 2>&1
    echo $? >"$logs/marked.rc"
}
start=$SECONDS
chain1 & one=$!
chain2 & two=$!
wait $one $two

status=0
for part in rest waiting marked; do
    echo "===================== run-tests: $part ====================="
    cat "$logs/$part"
    code=$(cat "$logs/$part.rc" 2>/dev/null || echo 1)
    if [ "$code" = 5 ]; then
        echo "run-tests: the $part tests collected nothing" >&2
    fi
    if [ "$code" != 0 ] && [ $status = 0 ]; then
        status=$code
    fi
done
echo "run-tests: all parts took $((SECONDS - start)) s; status $status"
exit $status
