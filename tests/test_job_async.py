"""Awaiting jobs from asyncio: ``Job.wait_async`` and ``Job.status_changes`` on real local
jobs, woken by status notifications (no thread per job)."""

import asyncio
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, List

import pytest

from psij import Job, JobExecutor, JobExecutorConfig, JobSpec, JobState, JobStatus

REPO = Path(__file__).resolve().parent.parent


def local(tmp_path: Path) -> JobExecutor:
    return JobExecutor.get_instance("local",
                                    config=JobExecutorConfig(work_directory=tmp_path / "w"))


def test_many_jobs_are_awaited_without_a_thread_each(tmp_path: Path) -> None:
    ex = local(tmp_path)

    async def run() -> List[Any]:
        jobs = [Job(JobSpec("/bin/sh", ["-c", f"exit {i % 2}"])) for i in range(300)]
        for job in jobs:
            ex.submit(job)
        before = threading.active_count()
        waits = [asyncio.ensure_future(job.wait_async(timeout=timedelta(minutes=5)))
                 for job in jobs]
        await asyncio.sleep(0)
        during = threading.active_count()
        statuses = await asyncio.gather(*waits)
        return [during - before, [(s.state, s.exit_code) for s in statuses]]

    extra, results = asyncio.run(run())
    assert extra <= 0
    assert results == [(JobState.COMPLETED, 0) if i % 2 == 0 else (JobState.FAILED, 1)
                       for i in range(300)]


def test_a_timeout_returns_none_and_target_states_are_honoured(tmp_path: Path) -> None:
    ex = local(tmp_path)
    seen: List[JobState] = []

    async def run() -> List[Any]:
        job = Job(JobSpec("/bin/sleep", ["600"]))
        job.set_job_status_callback(lambda j, s: seen.append(s.state))
        ex.submit(job)
        active = await job.wait_async(target_states=JobState.ACTIVE)
        timed_out = await job.wait_async(timeout=0.1)
        job.cancel()
        final = await job.wait_async(timeout=timedelta(minutes=1))
        return [active.state if active else None, timed_out, final.state if final else None]

    assert asyncio.run(run()) == [JobState.ACTIVE, None, JobState.CANCELED]
    assert seen[-1] is JobState.CANCELED  # the job's own callback still runs


def test_status_changes_yields_each_state_then_stops(tmp_path: Path) -> None:
    ex = local(tmp_path)
    marker = tmp_path / "go"

    async def run() -> List[Any]:
        job = Job(JobSpec("/bin/sh", ["-c", f"while [ ! -e {marker} ]; do sleep 0.05; done; "
                                             "exit 2"]))
        ex.submit(job)
        states = []
        async for status in job.status_changes():
            states.append((status.state, status.exit_code))
            if status.state is JobState.ACTIVE:
                marker.touch()
        return states

    # QUEUED first when the keeper had not started it yet as the iteration began.
    states = asyncio.run(run())
    assert states in ([(JobState.ACTIVE, None), (JobState.FAILED, 2)],
                      [(JobState.QUEUED, None), (JobState.ACTIVE, None), (JobState.FAILED, 2)])


def test_status_changes_of_a_finished_job_yields_its_final_status(tmp_path: Path) -> None:
    ex = local(tmp_path)
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    job.wait()

    async def run() -> List[JobStatus]:
        return [s async for s in job.status_changes()]

    assert [s.state for s in asyncio.run(run())] == [JobState.COMPLETED]


@pytest.mark.parametrize("bad,error", [(float("nan"), ValueError), (-1, ValueError),
                                       ("10", TypeError), (True, TypeError)])
def test_a_bad_timeout_is_refused_naming_it(bad: Any, error: type) -> None:
    job = Job(JobSpec("/bin/true"))
    with pytest.raises(error, match="wait_async timeout"):
        asyncio.run(job.wait_async(timeout=bad))


def test_status_changes_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        Job(JobSpec("/bin/true")).status_changes()


def test_the_documented_example_awaits_1000_jobs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "examples" / "async_wait.py"), "1000"],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "COMPLETED=857 FAILED=143"
    assert lines[:-1] in (["watched job: ACTIVE", "watched job: COMPLETED"],
                          ["watched job: QUEUED", "watched job: ACTIVE", "watched job: COMPLETED"])
