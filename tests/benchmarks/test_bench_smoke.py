"""The benchmark workloads run against this package at a tiny size and report sane figures.

Timing is never asserted here: only that each workload finishes, prints its JSON result line
with the keys the driver reads, and that every job ended COMPLETED.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

WORKLOADS_SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "workloads.py"


def run_workload(tmp_path: Path, args: List[str]) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, str(WORKLOADS_SCRIPT), *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    result: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["workload"] == args[0]
    return result


def test_import_reports_interleaved_samples(tmp_path: Path) -> None:
    result = run_workload(tmp_path, ["import", "--runs", "2"])
    assert len(result["baseline_s"]) == len(result["import_s"]) == 2
    assert all(s > 0 for s in result["baseline_s"] + result["import_s"])
    assert isinstance(result["import_ms"], float)


def test_throughput_runs_every_job_to_completion(tmp_path: Path) -> None:
    result = run_workload(tmp_path, ["throughput", "--jobs", "20"])
    assert result["jobs"] == 20
    assert result["not_completed"] == 0
    assert result["seconds"] > 0
    assert result["jobs_per_s"] == pytest.approx(20 / result["seconds"])


def test_throughput_runs_through_the_pilot_executor_too(tmp_path: Path) -> None:
    # What bench/pilot.py compares with the local executor's figure in the same run.
    result = run_workload(tmp_path, ["throughput", "--jobs", "20", "--executor", "pilot"])
    assert result["jobs"] == 20 and result["not_completed"] == 0


def test_latency_reports_one_sample_per_job(tmp_path: Path) -> None:
    result = run_workload(tmp_path, ["latency", "--jobs", "5"])
    assert result["not_completed"] == 0
    assert len(result["samples_s"]) == 5
    assert all(s > 0 for s in result["samples_s"])
    assert result["median_ms"] > 0


def test_rss_keeps_both_batches_and_reads_vmrss(tmp_path: Path) -> None:
    result = run_workload(tmp_path, ["rss", "--batch", "20", "--chunk", "10"])
    assert result["not_completed"] == 0
    assert result["jobs_kept"] == 40
    assert result["rss_before_bytes"] > 0
    assert result["rss_after_bytes"] > 0
    # Growth over 20 tiny jobs may be zero or negative; only its consistency is checked.
    assert result["bytes_per_job"] == pytest.approx(
        (result["rss_after_bytes"] - result["rss_before_bytes"]) / 20)


def test_bad_size_is_refused_with_the_value(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(WORKLOADS_SCRIPT), "throughput", "--jobs", "0"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "'0'" in done.stderr


def test_spawn_ceiling_prints_one_rate_per_level(tmp_path: Path) -> None:
    script = WORKLOADS_SCRIPT.parent / "spawn_ceiling.py"
    done = subprocess.run([sys.executable, str(script), "--tasks", "30", "--at-once", "1", "3"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "/bin/true" in line]
    assert [line.split(" at once")[0].split()[-1] for line in lines] == ["1", "3"]
    assert all(float(line.split(": ")[1].split()[0]) > 0 for line in lines)


@pytest.mark.slurm
def test_sbatch_floor_prints_cold_and_warm_and_leaves_no_job(tmp_path: Path) -> None:
    script = WORKLOADS_SCRIPT.parent / "sbatch_floor.py"
    done = subprocess.run([sys.executable, str(script), "--jobs", "3", "--rounds", "1"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    medians = [line for line in done.stdout.splitlines() if line.startswith("medians")]
    assert len(medians) == 1 and "cold" in medians[0] and "warm" in medians[0]
    name = next(line.split()[-1] for line in done.stdout.splitlines()
                if line.startswith("jobs named"))
    left = subprocess.run(["squeue", "--noheader", "--name", name], capture_output=True,
                          text=True, timeout=60).stdout.strip()
    assert left == ""


def test_pilot_cpu_prints_the_coordinating_process_cpu_per_task(tmp_path: Path) -> None:
    script = WORKLOADS_SCRIPT.parent / "pilot_cpu.py"
    done = subprocess.run([sys.executable, str(script), "--tasks", "10", "--cores", "1",
                           "--rounds", "1"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "coordinating process CPU per task" in done.stdout
    assert "10 tasks of /bin/true on 1 core(s)" in done.stdout


def test_the_local_cpu_benchmark_runs_every_job_over_two_keepers() -> None:
    script = WORKLOADS_SCRIPT.with_name("local_cpu.py")
    done = subprocess.run([sys.executable, str(script), "--jobs", "30", "--rounds", "1",
                           "--keepers", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("local executor, 30 /bin/true jobs per round")
    rounds = [line for line in lines if "registry on :" in line or "registry off:" in line]
    assert len(rounds) == 4 and all(line.endswith(" 0 failed") for line in rounds[:2])
