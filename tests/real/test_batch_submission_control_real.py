"""Submission control on the real Slurm and Grid Engine of this machine (run under
``flock -s /tmp/psij-test-schedulers.lock``): a string no process can take is refused at
submit, before anything is held or queued, while a byte that is not UTF-8 reaches the job
as that byte; and a job held back by ``max_queued_per_shape`` goes out within seconds of its
slot freeing, not at the next full poll."""

import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import List

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig

WAIT = timedelta(seconds=180)
SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]


def queued_names(name: str) -> List[str]:
    """The names of this user's jobs in the scheduler's queue."""
    argv = (["squeue", "--me", "-h", "-o", "%j"] if name == "slurm"
            else ["qstat", "-r"])
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
    if name == "slurm":
        return out.split()
    return [line.split(":", 1)[1].strip() for line in out.splitlines()
            if line.strip().startswith("Full jobname:")]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_lone_surrogates_are_refused_before_the_queue_and_escaped_bytes_arrive(
        name: str, tmp_path: Path) -> None:
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work", queue_polling_interval=1,
        initial_queue_polling_delay=0.2, max_queued_per_shape=1))
    out = tmp_path / "out.bin"
    marker = f"psijsur{time.monotonic_ns() % 10**9}"
    # Takes the one slot of its shape: a job of that shape submitted next would be held.
    first = Job(JobSpec("/bin/sh", ["-c", "printf '%s\\n' \"$1\" > \"$2\"", "sh", "a\udcffb",
                                    str(out)], name=f"{marker}-ok", directory=tmp_path))
    bad = [Job(JobSpec("/bin/echo", ["x\ud800"], name=f"{marker}-arg")),
           Job(JobSpec("/bin/echo", name=f"{marker}-env", environment={"V": "\udbff"})),
           Job(JobSpec("/bin/echo", name=f"{marker}-\ud800"))]
    try:
        ex.submit(first)
        for job, field in zip(bad, ("arguments", "environment", "name")):
            with pytest.raises(InvalidJobException, match=f"{field}.*lone surrogate"):
                ex.submit(job)
            assert job.status.state is JobState.NEW and job.native_id is None
        assert ex._held._machine.held() == 0  # type: ignore[attr-defined]
        assert [n for n in queued_names(name) if n.startswith(marker) and n != f"{marker}-ok"] \
            == []
        status = first.wait(WAIT)
        assert status is not None and status.state is JobState.COMPLETED, status
        assert out.read_bytes() == b"a\xffb\n"
    finally:
        if not first.status.final:
            first.cancel()
        ex.close()


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_freed_slot_is_used_within_seconds_not_at_the_next_poll(name: str,
                                                                   tmp_path: Path) -> None:
    # The full poll every 300 s: before the fix, the held job went out only then (the first
    # job, queued, is looked at once after its submission, and next at the full poll).
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work", queue_polling_interval=300,
        initial_queue_polling_delay=1, max_queued_per_shape=1))
    jobs = [Job(JobSpec("/bin/sleep", ["3"], name=f"psij-slot-{n}", attributes=JobAttributes(
        duration=timedelta(minutes=2)))) for n in range(2)]
    try:
        for job in jobs:
            ex.submit(job)
        submitted = time.monotonic()
        assert jobs[1].native_id is None  # held behind the first
        while jobs[1].native_id is None:
            assert time.monotonic() - submitted < 60, \
                "the held job did not go out within 60 s (the first starts within seconds)"
            time.sleep(0.05)
    finally:
        for job in jobs:
            if not job.status.final:
                job.cancel()
        ex.close()
