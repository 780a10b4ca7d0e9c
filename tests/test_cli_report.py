"""``psij report`` as users run it (psij.cli._report): the console script on the registry of a
private HOME, choosing jobs as ``psij list`` does, or a pilot run; bad usage is a clear error
with exit status 2, nothing to report exit status 1."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.report_runs import SMALL, T0, demo_jobs, write_pilot_report, write_registry

PSIJ = str(Path(sys.executable).parent / "psij")


def report(home: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PSIJ, "report", *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=300)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    write_registry(h / ".psij" / "work", SMALL, tag="small")
    write_registry(h / ".psij" / "work", demo_jobs(5), executor="slurm", tag="demo")
    return h


def test_jobs_are_chosen_as_psij_list_chooses_them(home: Path) -> None:
    every = report(home)
    assert every.returncode == 0, every.stderr
    assert "runs: 11 (10 ended)" in every.stdout and "(all jobs)" in every.stdout
    small = report(home, "--tag", "small")
    assert "runs: 6 (5 ended)" in small.stdout and "tag 'small'" in small.stdout
    assert "queue wait" in small.stdout and "lowest: job-4 12.5%" in small.stdout
    failed = report(home, "--executor", "local", "--state", "failed")
    assert "runs: 2 (2 ended)" in failed.stdout
    named = report(home, "job-1", "job-3")
    assert "runs: 2 (2 ended)" in named.stdout
    ranged = report(home, "--since", "2025-12-06T05:46:45+00:00",
                    "--until", "2025-12-06T05:46:50+00:00")
    assert ranged.returncode == 0 and "runs: 6" in ranged.stdout  # T0+5 ... T0+10, both tags
    assert T0 == 1_765_000_000.0


def test_a_pilot_run_is_reported_from_its_directory(tmp_path: Path) -> None:
    write_pilot_report(tmp_path / "jobs.report", 50, cores=4, nodes=1)
    done = report(tmp_path, "--pilot", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "pilot run" in done.stdout and "runs: 50 (50 ended)" in done.stdout
    failed = report(tmp_path, "--pilot", str(tmp_path / "jobs.report"), "--state", "FAILED")
    assert "runs: 1 (1 ended)" in failed.stdout
    qcg = report(tmp_path, "--pilot", str(tmp_path), "--state", "SUCCEED")
    assert qcg.returncode == 2 and "accepted: COMPLETED, FAILED" in qcg.stderr


def test_bad_usage_and_nothing_to_report_are_clear_errors(home: Path, tmp_path: Path) -> None:
    mixed = report(home, "--pilot", str(tmp_path), "--tag", "small")
    assert mixed.returncode == 2 and "--tag" in mixed.stderr and "--pilot" in mixed.stderr
    since = report(home, "--since", "yesterday")
    assert since.returncode == 2 and "--since: expected a date" in since.stderr
    state = report(home, "--state", "DONE")
    assert state.returncode == 2 and "COMPLETED" in state.stderr
    unknown = report(home, "no-such-job")
    assert unknown.returncode == 2 and "no-such-job" in unknown.stderr
    nothing = report(home, "--tag", "nobody")
    assert nothing.returncode == 1 and "no job to report on" in nothing.stderr
    missing = report(home, "--pilot", str(tmp_path / "none"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    unwritable = report(home, "--html", str(tmp_path / "no" / "dir" / "r.html"))
    assert unwritable.returncode == 1 and "--html: cannot write" in unwritable.stderr
    for done in (mixed, since, state, unknown, nothing, missing, unwritable):
        assert "Traceback" not in done.stderr


def test_psij_list_takes_the_same_time_range(home: Path) -> None:
    def listed(*args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([PSIJ, "list", "--json", *args], capture_output=True, text=True,
                              env=dict(os.environ, HOME=str(home)), timeout=300)

    import json

    every = listed()
    assert every.returncode == 0, every.stderr
    ranged = listed("--since", "2025-12-06T05:46:45+00:00", "--until", "2025-12-06T05:46:50+00:00")
    assert ranged.returncode == 0, ranged.stderr
    assert len(json.loads(ranged.stdout)) == 6 < len(json.loads(every.stdout))
    tagged = listed("--tag", "small", "--since", "2025-12-06T05:46:45+00:00")
    assert {j["tag"] for j in json.loads(tagged.stdout)} == {"small"}
    assert json.loads(listed("--until", "2000-01-01").stdout) == []
    bad = listed("--since", "yesterday\udcff")
    assert bad.returncode == 2 and "--since" in bad.stderr and "ISO 8601" in bad.stderr
