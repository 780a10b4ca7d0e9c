"""Durations as plain seconds: every duration parameter takes a number of seconds or a
timedelta, and a bad value gets an error naming the parameter."""

import math
from datetime import timedelta

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.local import LocalJobExecutorConfig
from psij.executors.pilot.engine_config import EngineConfig
from psij.executors.pilot.executor import PilotJobExecutorConfig
from psij.serialize import JSONSerializer

BAD_SECONDS = [(-1, ValueError), (math.nan, ValueError), (True, TypeError),
               ("60", TypeError), (1e300, ValueError)]


def test_wait_takes_a_number_of_seconds(tmp_path):
    ex = JobExecutor.get_instance(
        "local", config=LocalJobExecutorConfig(work_directory=tmp_path / "w"))
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    status = job.wait(timeout=60)
    assert status is not None and status.state is JobState.COMPLETED
    # Already final: a zero or an infinite limit both return the status at once.
    assert job.wait(timeout=0).state is JobState.COMPLETED
    assert job.wait(timeout=math.inf).state is JobState.COMPLETED
    assert job.wait(timeout=0.5, target_states=JobState.ACTIVE) is not None


def test_wait_limits_that_pass_return_none():
    job = Job(JobSpec("/bin/true"))
    assert job.wait(timeout=0) is None
    assert job.wait(timeout=0.0) is None
    assert job.wait(timeout=timedelta(seconds=-5)) is None  # as psij-python: checks once


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (math.nan, ValueError),
                                     (True, TypeError), ("60", TypeError)])
def test_wait_refuses_bad_limits(bad, exc):
    with pytest.raises(exc, match="Job.wait timeout"):
        Job(JobSpec("/bin/true")).wait(timeout=bad)


def test_duration_takes_seconds_and_stays_a_timedelta():
    attrs = JobAttributes(duration=90)
    assert attrs.duration == timedelta(seconds=90)
    attrs.duration = 1.5
    assert attrs.duration == timedelta(seconds=1.5)
    attrs.duration = timedelta(hours=2)
    assert attrs.duration == timedelta(hours=2)
    # It serializes as the timedelta it became.
    spec = JobSpec("/bin/true", attributes=JobAttributes(duration=3600))
    back = JSONSerializer().loads(JSONSerializer().dumps(spec))
    assert back.attributes.duration == timedelta(hours=1)


@pytest.mark.parametrize("bad,exc", [*[(v, e) for v, e in BAD_SECONDS if v != "60"],
                                     (math.inf, ValueError), ("60 minutes", ValueError),
                                     ("-5m", ValueError), ("1:2:3:4", ValueError),
                                     (b"60", TypeError), ([60], TypeError)])
def test_duration_refuses_bad_values(bad, exc):
    with pytest.raises(exc, match="JobAttributes.duration"):
        JobAttributes(duration=bad)


def test_duration_takes_the_walltime_text_the_command_line_takes():
    # As `psij run --attr duration=...`: bare digits are minutes there, a number is seconds.
    for text, expected in [("10m", timedelta(minutes=10)), ("1:30:00", timedelta(hours=1.5)),
                           ("2:05", timedelta(hours=2, minutes=5)), ("90", timedelta(minutes=90)),
                           ("45 s", timedelta(seconds=45))]:
        assert JobAttributes(duration=text).duration == expected
        attrs = JobAttributes()
        attrs.duration = text
        assert attrs.duration == expected
        assert JobAttributes.parse_walltime(text) == expected


@pytest.mark.parametrize("make,field", [
    (lambda v: LocalJobExecutorConfig(cancel_grace_period=v),
     "LocalJobExecutorConfig.cancel_grace_period"),
    (lambda v: PilotJobExecutorConfig(cancel_grace_period=v),
     "PilotJobExecutorConfig.cancel_grace_period"),
    (lambda v: EngineConfig(agent_connect_timeout=v), "EngineConfig.agent_connect_timeout"),
    (lambda v: EngineConfig(cancel_grace_period=v), "EngineConfig.cancel_grace_period"),
    (lambda v: BatchSchedulerExecutorConfig(queue_polling_interval=v),
     "BatchSchedulerExecutorConfig.queue_polling_interval"),
    (lambda v: BatchSchedulerExecutorConfig(initial_queue_polling_delay=v),
     "BatchSchedulerExecutorConfig.initial_queue_polling_delay"),
    (lambda v: BatchSchedulerExecutorConfig(command_timeout=v),
     "BatchSchedulerExecutorConfig.command_timeout"),
])
def test_config_durations_take_seconds_or_timedelta(make, field):
    attr = field.split(".")[1]
    assert getattr(make(timedelta(seconds=7)), attr) == 7.0
    assert getattr(make(7), attr) == 7.0
    for bad, exc in [*BAD_SECONDS, (math.inf, ValueError),
                     (timedelta(seconds=-1), ValueError)]:
        with pytest.raises(exc, match=field):
            make(bad)
