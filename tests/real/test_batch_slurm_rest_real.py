"""Submissions through ``slurmrestd`` (``rest_submit``) on the real Slurm: the job is the one
sbatch makes.

The ``sbatch`` on PATH is a wrapper that logs each run and runs the real one; the real
``slurmrestd`` is linked beside it, so that it is the one used. Each test reads from the log
which jobs went which way.
"""

import os
import shutil
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1, SubmitException
from psij.executors.batch.slurm import SlurmExecutorConfig

pytestmark = pytest.mark.slurm
LIMIT = 240.0
_OWN = ("JobId", "AllocNode:Sid", "SubmitTime", "LastSchedEval", "EligibleTime", "AccrueTime")


def _wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {LIMIT} s"
        time.sleep(0.2)


@pytest.fixture
def wrapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        pytest.skip("Slurm is not installed (tests/setup/start-slurm.sh)")
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "UP" not in ping.stdout:
        pytest.skip(f"Slurm is not running: {ping.stdout.strip()!r}")
    restd = Path(sbatch).resolve().parent.parent / "sbin" / "slurmrestd"
    assert restd.exists(), "tests/setup/start-slurm.sh installs slurmrestd with Slurm"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho run >> "{log}"\nexec {sbatch} "$@"\n')
    (bin_dir / "sbatch").chmod(0o755)
    (bin_dir / "slurmrestd").symlink_to(restd)
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    yield log


def _executor(tmp_path: Path, rest: bool) -> JobExecutor:
    return JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(
        work_directory=tmp_path / "w", queue_polling_interval=0.5,
        initial_queue_polling_delay=0.2, spare_submit_commands=0, rest_submit=rest))


def _show(native_id: str) -> Dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", native_id], capture_output=True,
                         text=True, timeout=60).stdout
    return dict(item.partition("=")[::2] for item in out.split())


def test_a_job_submitted_through_slurmrestd_is_the_one_sbatch_makes(
        wrapped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSIJ_REST_TEXT", "ünïcode and spaces")
    monkeypatch.chdir(tmp_path)
    tag = "rest" + uuid.uuid4().hex[:8]

    def spec(out: str) -> JobSpec:
        return JobSpec("/bin/sh", ["-c", "env | sort; umask; pwd"], name=tag,
                       directory=tmp_path, stdout_path=tmp_path / out,
                       resources=ResourceSpecV1(node_count=1, process_count=1,
                                                memory=3 * 1024 * 1024 + 5),
                       attributes=JobAttributes(
                           duration=timedelta(seconds=90), queue_name="debug",
                           custom_attributes={"slurm.hold": True, "slurm.comment": "a b",
                                              "slurm.qos": "normal", "slurm.nice": "3"}))

    jobs: Dict[str, List[Job]] = {}
    shown: Dict[str, Dict[str, str]] = {}
    for way, rest in (("sbatch", False), ("rest", True)):
        ex = _executor(tmp_path, rest)
        jobs[way] = [Job(spec(f"{way}{i}.out")) for i in range(2)]
        try:
            for job in jobs[way]:
                ex.submit(job)
            # the first job of an executor goes to sbatch; the second through slurmrestd
            assert wrapped.read_text().count("run") == (3 if rest else 2)
            by_rest = str(jobs[way][1].native_id)
            shown[way] = _show(by_rest)
            subprocess.run(["scontrol", "release", by_rest], check=True, timeout=60)
            status = jobs[way][1].wait(timedelta(seconds=LIMIT))
            assert status is not None and status.state == JobState.COMPLETED, status
            jobs[way][0].cancel()
        finally:
            ex.close()

    # All the controller holds is the same but the id, session and times.
    assert {k: v for k, v in shown["rest"].items() if k not in _OWN} \
        == {k: v for k, v in shown["sbatch"].items() if k not in _OWN}
    assert shown["rest"]["MinMemoryNode"] == "4M" and shown["rest"]["Nice"] == "3"

    def lines(way: str) -> List[str]:
        job_id = str(jobs[way][1].native_id)
        return [line for line in (tmp_path / f"{way}1.out").read_text().splitlines()
                if job_id not in line and not line.startswith("SLURM_TASK_PID=")]

    assert "PSIJ_REST_TEXT=ünïcode and spaces" in lines("rest")
    assert lines("rest") == lines("sbatch")  # environment, umask and directory


def test_each_job_has_the_environment_and_directory_of_its_own_submission(
        wrapped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = "rest" + uuid.uuid4().hex[:8]
    ex = _executor(tmp_path, True)
    places = {name: tmp_path / name for name in "ab"}
    for place in places.values():
        place.mkdir()
    plan = [("one", "a"), ("one", "a"), ("two", "a"), ("two", "b"), ("three", "b")]
    jobs: List[Job] = []
    try:
        for i, (mark, place) in enumerate(plan):
            monkeypatch.setenv("PSIJ_REST_MARK", mark)
            monkeypatch.chdir(places[place])
            job = Job(JobSpec("/bin/sh", ["-c", 'echo "$PSIJ_REST_MARK $SLURM_SUBMIT_DIR"'],
                              name=tag, directory=tmp_path, stdout_path=tmp_path / f"{i}.out",
                              attributes=JobAttributes(duration=timedelta(minutes=2))))
            ex.submit(job)
            jobs.append(job)
        assert wrapped.read_text().count("run") == 1  # only the first went to sbatch
        for job in jobs:
            status = job.wait(timedelta(seconds=LIMIT))
            assert status is not None and status.state == JobState.COMPLETED, status
        said = [(tmp_path / f"{i}.out").read_text().split() for i in range(len(plan))]
        assert said == [[mark, str(places[place].resolve())] for mark, place in plan]

        def listed() -> List[str]:  # only these five jobs were made
            return subprocess.run(
                ["sacct", "--noheader", "--allocations", "--parsable2", "--name", tag,
                 "--starttime", "now-1hour", "--format=JobID"],
                capture_output=True, text=True, timeout=60).stdout.split()

        _wait(lambda: len(listed()) >= len(jobs), "accounting records")
        assert sorted(listed()) == sorted(str(job.native_id) for job in jobs)
    finally:
        ex.close()


def test_a_job_slurmrestd_refuses_gets_sbatchs_own_error(
        wrapped: Path, tmp_path: Path) -> None:
    ex = _executor(tmp_path, True)
    try:
        first = Job(JobSpec("/bin/true", attributes=JobAttributes(
            custom_attributes={"slurm.hold": True})))
        ex.submit(first)
        bad = Job(JobSpec("/bin/true", attributes=JobAttributes(queue_name="nosuchqueue")))
        with pytest.raises(SubmitException, match="(?i)invalid partition"):
            ex.submit(bad)
        assert wrapped.read_text().count("run") == 2  # refused by slurmrestd, then sbatch
        assert bad.native_id is None and bad.status.state == JobState.NEW
        good = Job(JobSpec("/bin/true", attributes=JobAttributes(
            custom_attributes={"slurm.hold": True})))
        ex.submit(good)  # the child still serves
        assert wrapped.read_text().count("run") == 2
        for job in (first, good):
            assert _show(str(job.native_id))["JobState"] == "PENDING"
            job.cancel()
    finally:
        ex.close()
