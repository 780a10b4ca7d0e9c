"""Signals, cancels, job names and directories on the real Slurm and Grid Engine started by
tests/setup (issue 21, items 4 and 18). Without a running scheduler the tests skip.

A job that traps TERM needs 3 s to leave: it writes a file from its trap and exits by itself.
``signal`` (a flow's shrink) and ``cancel`` must give it that time, on both schedulers.
"""

import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Iterator, List

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from real.test_batch_real import _need

WAIT = timedelta(seconds=240)
LINGER = 3


def trapping(folder: Path) -> JobSpec:
    """A job that needs LINGER seconds to leave after a TERM; it writes ``ready`` once its
    trap is set, and ``trapped`` (the time it left) from the trap."""
    script = (f"trap 'sleep {LINGER}; date +%s.%N > \"{folder}/trapped\"; exit 0' TERM; "
              f"echo ready > \"{folder}/ready\"; sleep 300 & wait")
    return JobSpec("/bin/bash", ["-c", script], directory=folder,
                   attributes=JobAttributes(duration=timedelta(minutes=10)))


@pytest.fixture(params=[pytest.param("slurm", marks=pytest.mark.slurm),
                        pytest.param("sge", marks=pytest.mark.sge)])
def ex(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BatchSchedulerExecutor]:
    _need(request.param)
    cfg = BatchSchedulerExecutorConfig(work_directory=tmp_path / "psij", queue_polling_interval=1,
                                       initial_queue_polling_delay=0.5)
    executor = JobExecutor.get_instance(request.param, config=cfg)
    assert isinstance(executor, BatchSchedulerExecutor)
    yield executor
    executor.close()


def started(ex: BatchSchedulerExecutor, folder: Path) -> Job:
    folder.mkdir()
    job = Job(trapping(folder))
    ex.submit(job)
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    deadline = time.monotonic() + 120
    while not (folder / "ready").exists():
        assert time.monotonic() < deadline, "the job did not start its payload"
        time.sleep(0.1)
    return job


def test_signal_gives_the_job_its_time_and_it_ends_by_itself(ex: BatchSchedulerExecutor,
                                                             tmp_path: Path) -> None:
    job = started(ex, tmp_path / "job")
    sent = time.time()
    ex.signal(job, signal.SIGTERM)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED and st.exit_code == 0, st
    left = float((tmp_path / "job" / "trapped").read_text())
    assert left - sent >= LINGER - 0.5, "the job was not given the time it needed"


def test_cancel_gives_the_job_its_time(ex: BatchSchedulerExecutor, tmp_path: Path) -> None:
    job = started(ex, tmp_path / "job")
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    assert (tmp_path / "job" / "trapped").exists(), "the job's trap did not run to its end"


@pytest.mark.slurm
def test_slurm_names_unnamed_jobs_after_their_script_and_shows_the_directory(
        tmp_path: Path) -> None:
    _need("slurm")
    cfg = BatchSchedulerExecutorConfig(work_directory=tmp_path / "psij", queue_polling_interval=1,
                                       initial_queue_polling_delay=0.5)
    ex = JobExecutor.get_instance("slurm", config=cfg)
    try:
        folder = tmp_path / "dir 'q' é"
        folder.mkdir()
        array: List[Job] = []
        unnamed = Job(JobSpec("/bin/sleep", ["30"], directory=folder))
        named = Job(JobSpec("/bin/sleep", ["30"], directory=folder, name="my run"))
        for job in (unnamed, named):
            ex.submit(job)
        # Unnamed jobs still go as one array, named after the first job's script.
        array = [Job(JobSpec("/bin/sleep", ["30"], directory=folder)) for _ in range(3)]
        ex.submit_many(array)
        assert len({str(job.native_id).split("_")[0] for job in array}) == 1
        for job, name in ((unnamed, f"{unnamed.id}.job"), (named, "my run"),
                          (array[2], f"{array[0].id}.job")):
            shown = subprocess.run(["scontrol", "show", "job", str(job.native_id)],
                                   capture_output=True, text=True, timeout=60).stdout
            assert f"JobName={name}" in shown, shown
            assert f"WorkDir={folder}" in shown, shown
    finally:
        for job in (unnamed, named, *array):
            if job.native_id is not None and not job.status.state.final:
                job.cancel()
        ex.close()


def test_a_job_asking_for_a_signal_before_its_end_checkpoints_in_time(
        ex: BatchSchedulerExecutor, tmp_path: Path) -> None:
    # A one-minute job asking for USR1 55 s before its end: Slurm sends it (up to a minute
    # early, by its own resolution), Grid Engine's script from its timer. The handler writes a
    # checkpoint and the job ends by itself; it must have come at least 30 s before the end.
    folder = tmp_path / "job"
    folder.mkdir()
    script = (f"date +%s.%N > \"{folder}/start\"; "
              f"trap 'date +%s.%N > \"{folder}/checkpoint\"; exit 0' USR1; "
              "sleep 300 & wait")
    job = Job(JobSpec("/bin/bash", ["-c", script], directory=folder,
                      attributes=JobAttributes(duration=timedelta(minutes=1), custom_attributes={
                          "psij.signal_before_end": "USR1@55"})))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED and st.exit_code == 0, st
    start = float((folder / "start").read_text())
    checkpoint = float((folder / "checkpoint").read_text())
    assert checkpoint - start <= 60 - 30, "the signal came less than 30 s before the end"
