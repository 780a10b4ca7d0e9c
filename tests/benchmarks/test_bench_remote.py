"""The remote executors benchmark (bench/remote.py) in its quick form, over the test sshd with a
user it makes: it prints every figure with a number, its goal judged, its JSON line, and takes
its user away again; on the real Slurm, the Slurm figures too. Without the test sshd it says why
and exits 0.

Timing is never asserted: only that each figure is there, with a number (every job of the run
completed, or the run would end with status 1).
"""

import json
import pwd
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Set, Tuple

import pytest

from real.test_batch_real import _scheduler_problem
from support.ssh_server import remote_psij_reason, sshd_reason

BENCH = Path(__file__).resolve().parents[2] / "bench" / "remote.py"
NUMBER = r"-?\d+\.\d+"
REASON = sshd_reason() or remote_psij_reason()
needs_sshd = pytest.mark.skipif(REASON is not None, reason=REASON or "")

# bench/remote.py run where support.ssh_server says there is no sshd to use.
WITHOUT_SSHD = """
import runpy, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import support.ssh_server as ssh_server
ssh_server.sshd_reason = lambda: "the test sshd is not running (a stand-in reason)"
def no_user(*args, **kwargs):
    raise AssertionError("a user was made")
ssh_server.make_ssh_user = no_user
sys.argv = [sys.argv[3], *sys.argv[4:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

LOCAL_FIGURES = [
    ("connect (get_instance with url)", "ms"),
    ("one 'ssh HOST psij status --all'", "ms"),
    ("one request on the open connection", "ms"),
    ("local submit over SSH (20 one by one)", "ms"),
    ("local submit direct (20 one by one)", "ms"),
    ("overhead per submit (difference of means)", "ms"),
    ("20 over SSH: all final after", "s"),
    ("20 direct: all final after", "s"),
    ("submit_many of 20 over SSH", "ms"),
    ("submit_many of 20: all final after", "s"),
]
SLURM_FIGURES = [
    ("slurm submit over SSH (5 one by one)", "ms"),
    ("slurm submit direct (5 one by one)", "ms"),
    ("slurm overhead per submit", "ms"),
]


def bench_users() -> Set[str]:
    return {entry.pw_name for entry in pwd.getpwall() if entry.pw_name.startswith("psijbench")}


def run_bench(tmp_path: Path, *args: str) -> Tuple[str, Dict[str, Any]]:
    before = bench_users()
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert bench_users() - before == set(), "the benchmark's user was left behind"
    figures: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return done.stdout, figures


def figure(stdout: str, name: str, unit: str) -> float:
    match = re.search(rf"^ +{re.escape(name)} +({NUMBER}) {unit}$", stdout, re.M)
    assert match, f"no figure {name!r} in {unit} in:\n{stdout}"
    return float(match.group(1))


@needs_sshd
def test_quick_run_prints_the_figures_over_ssh_and_direct(tmp_path: Path) -> None:
    out, figures = run_bench(tmp_path, "--no-slurm")
    for name, unit in LOCAL_FIGURES:
        value = figure(out, name, unit)
        if "overhead" not in name:
            assert value > 0, name
    for name, _ in SLURM_FIGURES:
        assert re.search(rf"^ +{re.escape(name)} +-$", out, re.M), name
    assert "== Slurm figures skipped: --no-slurm" in out
    assert re.search(rf"^   (PASS|FAIL)  the connection adds under 5 ms per submit once "
                     rf"connected  \({NUMBER} ms\)$", out, re.M), out
    assert figures["overhead_ms"] == pytest.approx(
        figures["ssh_submit_mean_ms"] - figures["direct_submit_mean_ms"])
    assert figure(out, "local submit over SSH (20 one by one)", "ms") == pytest.approx(
        figures["ssh_submit_ms"], abs=0.01)
    assert "slurm_ssh_submit_ms" not in figures


@needs_sshd
@pytest.mark.slurm
def test_quick_run_prints_the_slurm_figures(tmp_path: Path) -> None:
    problem = _scheduler_problem("slurm")
    if problem is not None:
        pytest.skip(problem)
    out, figures = run_bench(tmp_path)
    for name, unit in SLURM_FIGURES[:2]:
        assert figure(out, name, unit) > 0, name
    assert figure(out, SLURM_FIGURES[2][0], "ms") == pytest.approx(
        figures["slurm_overhead_ms"], abs=0.01)
    assert re.search(r"^   over SSH \d+\.\d ms, direct \d+\.\d ms per submit \(medians\)$",
                     out, re.M), out


def test_without_the_sshd_it_says_why_and_exits_0(tmp_path: Path) -> None:
    tests = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", WITHOUT_SSHD, str(tests), str(BENCH.parent),
                           str(BENCH), "--quick", "--json"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("Remote executors benchmark: not run here: the test sshd is not running "
                        "(a stand-in reason)")
    assert lines[1] == "NOTE: no figure taken (the benchmark needs root and the test sshd)"
    assert json.loads(lines[-1]) == {
        "skipped": "the test sshd is not running (a stand-in reason)"}
    assert "== Summary" not in done.stdout
