"""bench/batch_ends.py at a tiny size on the ``batch-test`` executor (no scheduler needed): it
measures every job, prints its figures and table, exits 0 whatever the figures and 1 when a job
could not be measured; and its command wrappers count what they should and run the real
command with its arguments intact.

Timing is never asserted: only that each figure is there and consistent with the others.
"""

import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator, List

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPT = BENCH / "batch_ends.py"
NUMBER = r"\d+\.\d\d"


def run_bench(tmp_path: Path, args: List[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, str(SCRIPT), "--executor", "batch-test",
                           "--no-reference", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_tiny_run_measures_every_job_both_ways(tmp_path: Path) -> None:
    done = run_bench(tmp_path, ["--jobs", "2"])
    assert done.returncode == 0, done.stdout + done.stderr
    for way in ("one by one", "submit_many"):
        line = re.search(rf"ours {way} \(psij [^)]+\): 2 of 2 jobs measured; end -> wait\(\) "
                         rf"returned: median ({NUMBER}) s, p90 ({NUMBER}) s, worst ({NUMBER}) s"
                         rf"; the jobs ended within {NUMBER} s of one another; polling every "
                         rf"0.5 s", done.stdout)
        assert line is not None, done.stdout
        median, p90, worst = (float(g) for g in line.groups())
        assert median <= p90 <= worst
        row = re.search(rf"batch-test +ours \S+ +{way} +2/2 +({NUMBER}) +({NUMBER}) +"
                        rf"({NUMBER}) +- +- +{NUMBER}", done.stdout)
        assert row is not None, done.stdout
        assert [float(g) for g in row.groups()] == [median, p90, worst]
    assert re.search(r"^\d+ cores, load average", done.stdout, re.M), done.stdout


def test_a_job_not_measured_fails_the_run(tmp_path: Path) -> None:
    # Jobs of 60 s and a wait of 1 s: no job can be measured, which is an error (exit 1), not
    # a slow figure; the figures still print.
    done = run_bench(tmp_path, ["--jobs", "2", "--modes", "single", "--job-seconds", "60",
                                "--wait-limit", "1"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 of 2 jobs measured" in done.stdout
    assert "ERROR: 2 job(s) not measured: job 0 " in done.stdout
    assert "timed out" in done.stdout


def test_reference_that_cannot_run_fails_the_run_after_ours(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--executor", "batch-test", "--jobs", "1",
                           "--modes", "array", "--reference-python", str(tmp_path / "none")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"ERROR: --reference-python {tmp_path / 'none'}: not executable" in done.stdout
    assert "ours submit_many (psij " in done.stdout and "1 of 1 jobs measured" in done.stdout


@pytest.mark.parametrize("option,value", [("--jobs", "0"), ("--job-seconds", "nan"),
                                          ("--wait-limit", "-1"), ("--interval", "inf"),
                                          ("--modes", "single,bulk")])
def test_bad_option_is_refused_by_name(tmp_path: Path, option: str, value: str) -> None:
    done = run_bench(tmp_path, [option, value])
    assert done.returncode == 2
    assert f"{option}: expected" in done.stderr, done.stderr


@pytest.fixture
def bench_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(BENCH))
    import batch_ends

    yield batch_ends
    for name in ("batch_ends", "run", "_help"):
        sys.modules.pop(name, None)


def test_wrappers_count_client_commands_apart_from_the_jobs(
        tmp_path: Path, bench_module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("JOB_ID", raising=False)
    folder = tmp_path / "bin"
    folder.mkdir()
    log = tmp_path / "commands.log"
    path = os.environ["PATH"]
    found = bench_module.make_wrappers(folder, ["printf", "no-such-command-here"], log, path)
    assert found == ["printf"] and not (folder / "no-such-command-here").exists()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{path}"}
    words = ["two words", "it's", "$HOME", "new\nline", "*", ""]
    got = subprocess.run(["printf", "<%s>", *words], env=env, capture_output=True, text=True,
                         check=True)
    assert got.stdout == "".join(f"<{w}>" for w in words)  # the real printf, args intact
    for job_env in ({"SLURM_JOB_ID": "7"}, {"JOB_ID": "8"}):
        subprocess.run(["printf", ""], env={**env, **job_env}, check=True)
    client, jobs = bench_module.read_commands(log, 0.0, float("inf"))
    assert client == {"printf": 1} and jobs == {"printf": 2}
    # Only the commands started within the run's window count.
    assert bench_module.read_commands(log, 0.0, 1.0) == ({}, {})


def test_percentile_is_the_nearest_rank(bench_module: ModuleType) -> None:
    samples = [float(i) for i in range(1, 11)]
    assert bench_module.percentile(samples, 0.9) == 9.0
    assert bench_module.percentile(list(reversed(samples)), 0.5) == 5.0
    assert bench_module.percentile([3.0], 0.9) == 3.0
