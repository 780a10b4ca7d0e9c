"""The batch benchmark's workers run against this package at a tiny size.

Timing is never asserted: only that the status-command count comes from one command per poll
for all tracked jobs, and that the fake-scheduler set-up leaves every job QUEUED.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

BATCH_BENCH = Path(__file__).resolve().parents[2] / "bench" / "batch.py"


def run_worker(tmp_path: Path, args: List[str]) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, str(BATCH_BENCH), "worker", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    result: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["workload"] == args[0]
    return result


@pytest.mark.parametrize("measure", ["status-batch-test", "status-slurm-fake"])
def test_every_status_command_asks_for_all_tracked_jobs(tmp_path: Path, measure: str) -> None:
    result = run_worker(tmp_path, [measure, "--jobs", "40", "--interval", "0.5",
                                   "--intervals", "3"])
    assert result["states"] == {"QUEUED": 40}
    # One command per poll, naming all 40 jobs: never one per job.
    assert result["ids_per_command"] == [40]
    assert result["polls"] >= 2
    assert result["status_commands"] == result["polls"]
    assert result["per_interval"] == result["max_per_interval"] == 1


@pytest.mark.slurm
def test_submit_many_worker_sends_one_array(tmp_path: Path) -> None:
    from real.test_batch_real import _scheduler_problem

    problem = _scheduler_problem("slurm")
    if problem is not None:
        pytest.skip(problem)
    result = run_worker(tmp_path, ["slurm-submit-many", "--jobs", "5", "--work",
                                   str(tmp_path / "work")])
    try:
        assert result["arrays"] == 1 and result["jobs"] == 5
        array = result["native_ids"][0].split("_")[0]
        assert result["native_ids"] == [f"{array}_{i}" for i in range(5)]
    finally:
        subprocess.run(["scancel", result["native_ids"][0].split("_")[0]], check=False)


@pytest.mark.slurm
@pytest.mark.parametrize("extra,via", [([], "slurmrestd"), (["--sbatch-only"], "sbatch")])
def test_submit_worker_says_which_way_its_jobs_went(tmp_path: Path, extra: List[str],
                                                     via: str) -> None:
    from real.test_batch_real import _scheduler_problem

    problem = _scheduler_problem("slurm")
    if problem is not None:
        pytest.skip(problem)
    result = run_worker(tmp_path, ["slurm-submit", "--jobs", "3", "--defer", "--work",
                                   str(tmp_path / "work"), *extra])
    try:
        assert result["jobs"] == 3 and len(set(result["native_ids"])) == 3
        assert result["via"] == via
    finally:
        subprocess.run(["scancel", *result["native_ids"]], check=False)
