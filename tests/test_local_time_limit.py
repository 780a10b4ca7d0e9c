"""The opt-in time limit of ``local`` (``enforce_duration``), on a manual clock: off by default
as in psij-python; when on, a job past its duration is ended and FAILED with a time-limit
message, one that ignores TERM is killed after the grace period, and a job that ends in time
is left alone."""

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij._clock import ManualClock
from psij.executors._process_watch import ProcessWatch
from psij.executors.local import LocalJobExecutorConfig
from support.process_checks import alive
from test_executors_process import HOUR, IGNORE_TERM, LIMIT, wait_until

DAY = 86400.0


def executor(tmp_path: Path, enforce: bool, grace: float = HOUR):
    clock = ManualClock()
    watch = ProcessWatch(clock)
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", cancel_grace_period=grace, enforce_duration=enforce))
    ex._watch = watch
    return ex, watch, clock


def tick(clock: ManualClock, watch: ProcessWatch, seconds: float) -> None:
    clock.advance(seconds)
    watch.wake()


def ended_by_time_limit(job: Job) -> str:
    status = job.wait(timeout=LIMIT)
    assert status is not None and status.state is JobState.FAILED, status
    assert "time limit" in status.message
    return status.message


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
    tick(clock, watch, 10 * DAY)
    assert job.status.state is JobState.ACTIVE and alive(int(job.native_id))
    job.cancel()
    tick(clock, watch, 1.0)
    assert job.wait(timeout=LIMIT).state is JobState.CANCELED


def test_a_job_past_its_duration_ends_failed_with_a_time_limit_message(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True)
    job = started(ex, JobSpec("/bin/sleep", ["600"], attributes=JobAttributes(duration=60)))
    assert watch._timers.next_timeout() == 60.0
    tick(clock, watch, 59.0)
    wait_until(lambda: watch._timers.next_timeout() == 1.0, "re-armed timer")
    assert job.status.state is JobState.ACTIVE
    tick(clock, watch, 1.0)
    message = ended_by_time_limit(job)
    assert "time limit (0:01:00)" in message
    assert "enforce_duration" in message


def test_a_job_ignoring_term_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True, grace=HOUR)
    job = started(ex, JobSpec(sys.executable, ["-c", IGNORE_TERM], directory=tmp_path,
                              attributes=JobAttributes(duration=timedelta(seconds=10))))
    wait_until(lambda: (tmp_path / "ready").exists(), "start of the job")
    tick(clock, watch, 10.0)
    wait_until(lambda: watch._timers.next_timeout() == HOUR, "KILL timer")
    assert job.status.state is JobState.ACTIVE and alive(int(job.native_id))
    tick(clock, watch, HOUR)
    ended_by_time_limit(job)


def test_a_limit_longer_than_a_timer_wait_is_kept(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True, grace=0)
    job = started(ex, JobSpec("/bin/sleep", ["600"],
                              attributes=JobAttributes(duration=timedelta(days=2, hours=1))))
    assert watch._timers.next_timeout() == DAY  # timers wait at most a day at a time
    tick(clock, watch, DAY)
    wait_until(lambda: watch._timers.next_timeout() == DAY, "second day's timer")
    tick(clock, watch, DAY)
    wait_until(lambda: watch._timers.next_timeout() == HOUR, "last hour's timer")
    assert job.status.state is JobState.ACTIVE
    tick(clock, watch, HOUR)
    message = ended_by_time_limit(job)
    assert "time limit (49:00:00)" in message


def test_a_job_ending_in_time_is_left_alone(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True, grace=0)
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(duration=60)))
    ex.submit(job)
    assert job.wait(timeout=LIMIT).state is JobState.COMPLETED
    tick(clock, watch, 60.0)
    wait_until(lambda: watch._timers.next_timeout() is None, "timer to run")
    assert job.status.state is JobState.COMPLETED


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_enforce_duration_must_be_a_bool(bad) -> None:
    with pytest.raises(TypeError, match="LocalJobExecutorConfig.enforce_duration"):
        LocalJobExecutorConfig(enforce_duration=bad)


# Writes "ready", then on USR1 a checkpoint and exits 0; without it, it would sleep on.
CHECKPOINT_ON_USR1 = (
    "import signal, sys, time\n"
    "def handler(signum, frame):\n"
    "    open('checkpoint', 'w').write(signal.Signals(signum).name)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, handler)\n"
    "open('ready', 'w').close()\n"
    "time.sleep(300)\n")


def test_a_job_asking_for_a_signal_gets_it_before_its_end(tmp_path: Path) -> None:
    ex, watch, clock = executor(tmp_path, enforce=True, grace=HOUR)
    attrs = JobAttributes(duration=60, custom_attributes={"psij.signal_before_end": "USR1@20"})
    job = started(ex, JobSpec(sys.executable, ["-c", CHECKPOINT_ON_USR1], directory=tmp_path,
                              attributes=attrs))
    wait_until(lambda: (tmp_path / "ready").exists(), "start of the job")
    assert watch._timers.next_timeout() == 40.0
    tick(clock, watch, 39.0)
    wait_until(lambda: watch._timers.next_timeout() == 1.0, "re-armed signal timer")
    assert not (tmp_path / "checkpoint").exists()
    tick(clock, watch, 1.0)
    status = job.wait(timeout=LIMIT)
    assert status is not None and status.state is JobState.COMPLETED, status
    assert (tmp_path / "checkpoint").read_text() == "SIGUSR1"


def test_a_signal_before_the_end_needs_an_enforced_duration(tmp_path: Path) -> None:
    ex, _, _ = executor(tmp_path, enforce=False)
    attrs = JobAttributes(duration=60, custom_attributes={"psij.signal_before_end": "USR1@20"})
    with pytest.raises(InvalidJobException, match="psij.signal_before_end.*enforce_duration"):
        ex.submit(Job(JobSpec("/bin/true", attributes=attrs)))


@pytest.mark.parametrize("lead", ["USR1@60", "USR1@61"])
def test_a_signal_before_the_end_must_fit_in_the_duration(tmp_path: Path, lead: str) -> None:
    ex, _, _ = executor(tmp_path, enforce=True)
    attrs = JobAttributes(duration=60, custom_attributes={"psij.signal_before_end": lead})
    with pytest.raises(InvalidJobException, match="psij.signal_before_end.*JobAttributes.dura"):
        ex.submit(Job(JobSpec("/bin/true", attributes=attrs)))
