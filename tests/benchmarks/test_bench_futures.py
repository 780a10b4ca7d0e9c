"""The futures benchmark (bench/futures.py), in its quick form and without submitit, prints
every figure of this package and the goals it cannot judge alone; on the real Slurm, its
``map`` figure too, from one job array.

Timing is never asserted: only that each figure is there, with a number, and that every call
gave its own result (a round with a wrong or missing result fails the run).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from real.test_batch_real import _scheduler_problem

BENCH = Path(__file__).resolve().parents[2] / "bench" / "futures.py"
NUMBER = r"\d+(\.\d+)?"


def run_bench(tmp_path: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--ours-only", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def figure(stdout: str, name: str, unit: str) -> float:
    match = re.search(rf"^ +{re.escape(name)} +({NUMBER}) {re.escape(unit)}$", stdout, re.M)
    assert match, f"no figure {name!r} in {unit} in:\n{stdout}"
    return float(match.group(1))


def test_quick_run_prints_local_and_pilot_figures(tmp_path: Path) -> None:
    out = run_bench(tmp_path, "--no-slurm")
    for side in ("ours/local", "ours/pilot"):
        assert figure(out, f"{side}, 40 calls", "calls/s") > 0
        assert figure(out, f"{side}, first result", "s") > 0
        assert re.search(rf"^   round 1 {side} +: {NUMBER} calls/s \(40 calls in ", out, re.M)
    assert "submitit" not in out.split("== Summary")[1].split("== Goals")[0]
    goals = out.split("== Goals (informational)")[1]
    # submitit left out: neither goal can be judged, and each says so.
    assert re.search(r"^   N/A +ours through the pilot at least 10x submitit's", goals, re.M)
    assert re.search(r"^   N/A +ours' Slurm map \(one array\) at least submitit's", goals, re.M)
    assert "== Slurm figures skipped: --no-slurm" in out


def test_worker_gives_every_call_its_own_result(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "worker", "local", "--side", "ours",
                           "--calls", "7", "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["workload"] == "local" and result["calls"] == 7
    assert result["wrong_results"] == 0
    assert 0 < result["first_result_s"] <= result["seconds"]


@pytest.mark.slurm
def test_quick_run_maps_through_one_slurm_array(tmp_path: Path) -> None:
    problem = _scheduler_problem("slurm")
    if problem is not None:
        pytest.skip(problem)
    out = run_bench(tmp_path)
    assert figure(out, "ours/slurm, map of 40", "calls/s") > 0
    assert figure(out, "ours/slurm, first result in order", "s") > 0
    assert re.search(rf"^   round 1 ours/slurm +: {NUMBER} calls/s \(40 calls in .*, 1 "
                     r"array\(s\)", out, re.M), out
