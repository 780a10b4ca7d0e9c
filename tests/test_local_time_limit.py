"""The opt-in time limit of ``local`` (``enforce_duration``), on a manual clock: off by default
as in psij-python; when on, a job past its duration is ended and FAILED with a time-limit
message, one that ignores TERM is killed after the grace period, and a job that ends in time
is left alone."""

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

import pytest

from process_checks import alive
from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij._clock import ManualClock
from psij.executors._process_watch import ProcessWatch
from psij.executors.local import LocalJobExecutorConfig

HOUR = 3600.0
DAY = 86400.0
LIMIT = 30.0  # only against a hang: no result depends on it
IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "open('ready', 'w').close(); time.sleep(600)")


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not predicate():
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.01)


def executor(tmp_path: Path, enforce: bool, grace: float = HOUR):
    clock = ManualClock()
    watch = ProcessWatch(clock)
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", cancel_grace_period=grace, enforce_duration=enforce))
    ex._watch = watch
    return ex, watch, clock


def started(ex, spec: JobSpec) -> Job:
    job = Job(spec)
    ex.submit(job)
    assert job.wait(timeout=LIMIT, target_states=JobState.ACTIVE) is not None
    return job


def test_duration_is_not_enforced_by_default(tmp_path: Path) -> None:
    assert LocalJobExecutorConfig().enforce_duration is False
    ex, watch, clock = executor(tmp_path, enforce=False, grace=0)
    job = started(ex, JobSpec("/bin/sleep", ["600"], attributes=JobAttributes(duration=60)))
    assert watch._timers.next_timeout() is None  # nothing armed
    clock.advance(10 * DAY)
    watch.wake()
    assert job.status.state is JobState.ACTIVE and alive(int(job.native_id))
    job.cancel()
    clock.advance(1.0)
    watch.wake()
    assert job.wait(timeout=LIMIT).state is JobState.CANCELED


def test_a_job_past_its_duration_ends_failed_with_a_time_limit_message(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True)
    job = started(ex, JobSpec("/bin/sleep", ["600"], attributes=JobAttributes(duration=60)))
    assert watch._timers.next_timeout() == 60.0
    clock.advance(59.0)
    watch.wake()
    wait_until(lambda: watch._timers.next_timeout() == 1.0, "re-armed timer")
    assert job.status.state is JobState.ACTIVE
    clock.advance(1.0)
    watch.wake()
    status = job.wait(timeout=LIMIT)
    assert status is not None and status.state is JobState.FAILED
    assert "time limit (0:01:00)" in status.message
    assert "enforce_duration" in status.message


def test_a_job_ignoring_term_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True, grace=HOUR)
    job = started(ex, JobSpec(sys.executable, ["-c", IGNORE_TERM], directory=tmp_path,
                              attributes=JobAttributes(duration=timedelta(seconds=10))))
    wait_until(lambda: (tmp_path / "ready").exists(), "start of the job")
    clock.advance(10.0)
    watch.wake()
    wait_until(lambda: watch._timers.next_timeout() == HOUR, "KILL timer")
    assert job.status.state is JobState.ACTIVE and alive(int(job.native_id))
    clock.advance(HOUR)
    watch.wake()
    status = job.wait(timeout=LIMIT)
    assert status is not None and status.state is JobState.FAILED
    assert "time limit" in status.message


def test_a_limit_longer_than_a_timer_wait_is_kept(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True, grace=0)
    job = started(ex, JobSpec("/bin/sleep", ["600"],
                              attributes=JobAttributes(duration=timedelta(days=2, hours=1))))
    assert watch._timers.next_timeout() == DAY  # timers wait at most a day at a time
    clock.advance(DAY)
    watch.wake()
    wait_until(lambda: watch._timers.next_timeout() == DAY, "second day's timer")
    clock.advance(DAY)
    watch.wake()
    wait_until(lambda: watch._timers.next_timeout() == HOUR, "last hour's timer")
    assert job.status.state is JobState.ACTIVE
    clock.advance(HOUR)
    watch.wake()
    status = job.wait(timeout=LIMIT)
    assert status is not None and status.state is JobState.FAILED
    assert "time limit (49:00:00)" in status.message


def test_a_job_ending_in_time_is_left_alone(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True, grace=0)
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(duration=60)))
    ex.submit(job)
    assert job.wait(timeout=LIMIT).state is JobState.COMPLETED
    clock.advance(60.0)
    watch.wake()
    wait_until(lambda: watch._timers.next_timeout() is None, "timer to run")
    assert job.status.state is JobState.COMPLETED


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_enforce_duration_must_be_a_bool(bad) -> None:
    with pytest.raises(TypeError, match="LocalJobExecutorConfig.enforce_duration"):
        LocalJobExecutorConfig(enforce_duration=bad)
