#!/usr/bin/env bash
# The oldest and the newest Python that psij supports, checked as a user installs psij: the
# oldest is requires-python's minimum in pyproject.toml, the newest its newest "Programming
# Language :: Python :: 3.X" classifier. For each, side by side: a throwaway virtual
# environment, `pip install <checkout>` (not editable: the wheel pip builds, with its data
# files, is what runs; pip's cache is reused), tests/setup/python_smoke.py (every module
# imports, local jobs, the psij command) and a few unit test modules run against the installed
# copy. Called by `make test` (target `pythons`).
#
# Each Python is looked for as PYTHON_3_9 (the variable named after the version, a path),
# then python3.9 on PATH, then pyenv's versions (${PYENV_ROOT:-~/.pyenv}/versions/3.9.*,
# newest first), then /usr/bin and /usr/local/bin; a candidate counts only if it runs and
# says it is that version. A Python not found fails the check, saying where it looked, unless
# PYTHONS_MISSING=warn: then the others are checked and the missing one is reported as NOT
# CHECKED. With --versions it prints the two versions and does nothing else.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
MISSING=${PYTHONS_MISSING:-fail}
# Fast unit modules that reach most of the package: the model, reruns, the script templates
# of every scheduler, site defaults, the import rules.
UNIT=(tests/test_job.py tests/test_retry.py tests/test_import.py
      tests/test_scripts_generator.py tests/test_batch_sites_scripts.py tests/test_site_config.py)

case "$MISSING" in fail|warn) ;; *)
    echo "pythons: PYTHONS_MISSING must be fail or warn, got '$MISSING'" >&2; exit 2 ;;
esac

oldest=$(sed -n 's/^requires-python *= *">= *\(3\.[0-9][0-9]*\)".*/\1/p' pyproject.toml)
newest=$(sed -n 's/.*"Programming Language :: Python :: \(3\.[0-9][0-9]*\)".*/\1/p' \
    pyproject.toml | sort -V | tail -n 1)
if [ -z "$oldest" ] || [ -z "$newest" ]; then
    echo "pythons: pyproject.toml gives no requires-python \">=3.X\" or no Python 3.X" \
        "classifier" >&2
    exit 1
fi
if [ "${1:-}" = --versions ]; then  # the two versions checked, and nothing else
    echo "$oldest $newest"
    exit 0
fi

# find_python X.Y: print a working interpreter of version X.Y, or nothing (status 1).
find_python() {
    local version=$1 var candidate got
    local candidates=()
    var="PYTHON_${version//./_}"
    [ -n "${!var:-}" ] && candidates+=("${!var}")
    candidate=$(command -v "python$version" 2>/dev/null) && candidates+=("$candidate")
    while IFS= read -r candidate; do
        [ -n "$candidate" ] && candidates+=("$candidate/bin/python$version")
    done < <(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".[0-9]* 2>/dev/null \
             | sort -rV)
    candidates+=("/usr/bin/python$version" "/usr/local/bin/python$version")
    for candidate in "${candidates[@]}"; do
        [ -x "$candidate" ] || continue
        got=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' \
              2>/dev/null) || continue
        if [ "$got" = "$version" ]; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    return 1
}

# check X.Y PYTHON DIR: the checks of one Python, in DIR; its output goes to DIR/log.
check() {
    local version=$1 python=$2 dir=$3
    local venv="$dir/venv" home="$dir/home"
    mkdir -p "$home" || return 1
    echo "== Python $version: $python"
    timeout 300 "$python" -m venv "$venv" \
        || { echo "FAILED: $python -m venv (is the venv module installed?)"; return 1; }
    # One resolution for psij and what the unit tests need (pytest and hypothesis, as in the
    # test extra; the extra itself would bring the linters and Sphinx too).
    timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$ROOT" "pytest>=7" "hypothesis>=6" \
        || { echo "FAILED: pip install $ROOT (with pytest and hypothesis)"; return 1; }
    (cd "$home" && HOME="$home" timeout 300 "$venv/bin/python" \
        "$ROOT/tests/setup/python_smoke.py" "$version" "$ROOT") || return 1
    HOME="$home" timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        "${UNIT[@]}" || { echo "FAILED: unit tests on Python $version"; return 1; }
}

work=$(mktemp -d "${TMPDIR:-/tmp}/psij-pythons.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
started=$SECONDS
# Parallel lists: the versions checked, their interpreters and the checks' process ids.
checked=() pythons=() pids=() not_checked=()
for version in $(printf '%s\n' "$oldest" "$newest" | sort -uV); do
    if python=$(find_python "$version"); then
        mkdir -p "$work/$version"
        check "$version" "$python" "$work/$version" >"$work/$version/log" 2>&1 &
        checked+=("$version") pythons+=("$python") pids+=("$!")
    else
        not_checked+=("$version")
    fi
done

rc=0
for i in "${!checked[@]}"; do
    version=${checked[$i]}
    if wait "${pids[$i]}"; then
        # pip's notes about the extra package indexes are left out when all went well.
        grep -E '^(== |ok: )|[0-9]+ passed' "$work/$version/log"
        echo "Python $version: passed"
    else
        cat "$work/$version/log"
        echo "Python $version (${pythons[$i]}): FAILED"
        rc=1
    fi
done

for version in "${not_checked[@]}"; do
    which=newest
    [ "$version" = "$oldest" ] && which=oldest
    if [ "$MISSING" = fail ]; then
        rc=1
        what="Install it (pyenv install $version) or name it (PYTHON_${version//./_}=/path);
PYTHONS_MISSING=warn goes on without this check."
    else
        what="PYTHONS_MISSING=warn: going on without this check."
    fi
    cat <<EOF
********************************************************************************
NOT CHECKED: Python $version, the $which supported Python (pyproject.toml),
was not found. Looked at \$PYTHON_${version//./_}, python$version on PATH,
${PYENV_ROOT:-$HOME/.pyenv}/versions/$version.*, /usr/bin and /usr/local/bin.
$what
********************************************************************************
EOF
done
echo "pythons: supported $oldest to $newest; checked: ${checked[*]:-none};" \
    "not found: ${not_checked[*]:-none}; $((SECONDS - started)) s;" \
    "$(if [ "$rc" != 0 ]; then echo FAILED; elif [ "${#not_checked[@]}" -gt 0 ]; then
           echo "passed in part (NOT CHECKED: ${not_checked[*]})"; else echo passed; fi)"
exit "$rc"
