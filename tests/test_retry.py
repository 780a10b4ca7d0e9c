"""psij.requeue and psij.retry (psij._retry): the forms read, hostile values refused with an
error naming the attribute, the decision of the next run, and the scaled spec."""

from datetime import timedelta
from typing import Any, Dict, Optional

import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
)
from psij._declared_attributes import check_declared, from_text
from psij._retry import (
    ATTEMPT_VARIABLE,
    MAX_RUNS,
    REQUEUE_ATTRIBUTE,
    REQUEUE_EXIT_CODE,
    RETRY_ATTRIBUTE,
    RETRY_CAUSES,
    Rerun,
    RetryPolicy,
    Runs,
    cause_of,
    check_job,
    counted,
    next_run,
    parse_requeue,
    parse_retry,
    rerun_status,
    run_attempt,
    run_environment,
    scheduler_requeue,
    spec_for,
)


@pytest.mark.parametrize("value,expected", [
    (0, 0), (3, 3), (MAX_RUNS, MAX_RUNS), (2.0, 2), (" 7 ", 7), ("+1", 1)])
def test_requeue_counts_read(value: object, expected: int) -> None:
    assert parse_requeue(REQUEUE_ATTRIBUTE, value) == expected


@pytest.mark.parametrize("value", [
    -1, MAX_RUNS + 1, 10 ** 30, float("nan"), float("inf"), -float("inf"), 1.5, True, False,
    "three", "1e3", "9" * 5000, "\ud800", "3\n4", [3], {"n": 3}, b"3"])
def test_hostile_requeue_counts_are_refused_naming_the_attribute(value: object) -> None:
    with pytest.raises(InvalidJobException) as info:
        check_declared({REQUEUE_ATTRIBUTE: value})  # every executor's check at submit
    assert str(info.value).startswith(f"custom attribute {REQUEUE_ATTRIBUTE}: ")
    assert "from 0 to 1000" in str(info.value)


@pytest.mark.parametrize("value,expected", [
    (3, RetryPolicy(3)),
    ("3", RetryPolicy(3)),
    ({"attempts": 2}, RetryPolicy(2)),
    ({"attempts": 4, "on": ["out_of_memory"], "memory": 2, "max_memory": 2 ** 33},
     RetryPolicy(4, ("out_of_memory",), 2.0, 1.0, 2 ** 33, None)),
    ("attempts=3,on=out_of_memory+time_limit,memory=2,duration=1.5,max_memory=1024,"
     "max_duration=7200", RetryPolicy(3, ("out_of_memory", "time_limit"), 2.0, 1.5, 1024,
                                      7200.0)),
    (" Attempts = 2 , ON = Failed , ", RetryPolicy(2, ("failed",))),
    ({"attempts": "5", "on": "time_limit failed time_limit", "duration": "2"},
     RetryPolicy(5, ("time_limit", "failed"), 1.0, 2.0)),
    (RetryPolicy(2, ("failed",)), RetryPolicy(2, ("failed",))),
])
def test_retry_policies_read(value: object, expected: RetryPolicy) -> None:
    assert parse_retry(RETRY_ATTRIBUTE, value) == expected
    assert RetryPolicy(1).on == RETRY_CAUSES


@pytest.mark.parametrize("value,words", [
    ({}, "attempts is required"),
    ({"on": ["failed"]}, "attempts is required"),
    ("", "attempts is required"),
    (0, "attempts must be a whole number from 1 to 1000, got 0"),
    (-3, "attempts must be a whole number from 1 to 1000, got -3"),
    ("attempts=1001", "from 1 to 1000, got 1001"),
    ("attempts=" + "9" * 5000, "attempts must be a whole number"),
    ({"attempts": float("nan")}, "attempts must be a whole number"),
    ({"attempts": float("inf")}, "attempts must be a whole number"),
    ({"attempts": True}, "attempts must be a whole number"),
    ({"attempts": 2, "memory": float("nan")}, "memory (a factor) must be a number from 1 to 1000"),
    ({"attempts": 2, "memory": float("inf")}, "memory (a factor) must be a number from 1 to"),
    ({"attempts": 2, "memory": 0.5}, "memory (a factor) must be a number from 1 to 1000"),
    ({"attempts": 2, "memory": -2}, "memory (a factor) must be a number from 1"),
    ({"attempts": 2, "duration": 1e9}, "duration (a factor) must be a number from 1 to 1000"),
    ("attempts=2,duration=nan", "duration (a factor) must be a number"),
    ("attempts=2,duration=x2", "duration (a factor) must be a number"),
    ({"attempts": 2, "max_memory": 0}, "max_memory (bytes) must be a whole number"),
    ({"attempts": 2, "max_memory": 2 ** 70}, "max_memory (bytes) must be a whole number"),
    ({"attempts": 2, "max_memory": "1G"}, "max_memory (bytes) must be a whole number"),
    ({"attempts": 2, "max_duration": -1}, "max_duration (seconds) must be a number"),
    ({"attempts": 2, "max_duration": float("nan")}, "max_duration (seconds) must be a number"),
    ({"attempts": 2, "on": ["preempted"]}, "psij.requeue's"),
    ({"attempts": 2, "on": ["cosmic_rays"]}, "'cosmic_rays' is not a cause retried"),
    ({"attempts": 2, "on": []}, "at least one cause"),
    ({"attempts": 2, "on": 5}, "on must name causes"),
    ({"attempts": 2, "on": [None]}, "None is not a cause retried"),
    ("attempts=2,on=", "at least one cause"),
    ({"attempts": 2, "when": "always"}, "'when' is not a key of the retry policy"),
    ("attempts=2,attempts=3", "attempts is given twice"),
    ("attempts=2,colour=red", "expected attempts=N"),
    ("attempts=2;rm -rf ~", "attempts must be a whole number"),
    ("attempts=2\non=failed", "attempts must be a whole number"),
    ("\ud800", "expected attempts=N"),
    ("attempts=\ud800", "attempts must be a whole number"),
    (2.5, "expected attempts=N"),
    (True, "expected attempts=N"),
    ([3], "expected attempts=N"),
])
def test_hostile_retry_policies_are_refused_naming_the_attribute(value: object,
                                                                 words: str) -> None:
    with pytest.raises(InvalidJobException) as info:
        check_declared({RETRY_ATTRIBUTE: value})
    assert str(info.value).startswith(f"custom attribute {RETRY_ATTRIBUTE}: ")
    assert words in str(info.value)


def test_text_from_the_command_line() -> None:
    assert from_text(REQUEUE_ATTRIBUTE, " 2 ") == 2
    assert from_text(RETRY_ATTRIBUTE, " attempts=2,on=failed ") == "attempts=2,on=failed"
    with pytest.raises(ValueError, match=f"custom attribute {REQUEUE_ATTRIBUTE}: "):
        from_text(REQUEUE_ATTRIBUTE, "nan")
    with pytest.raises(ValueError, match=f"custom attribute {RETRY_ATTRIBUTE}: "):
        from_text(RETRY_ATTRIBUTE, "attempts=0")


def _spec(custom: Dict[str, Any], memory: Optional[int] = 1000, duration: float = 60
          ) -> JobSpec:
    resources = ResourceSpecV1(memory=memory) if memory is not None else None
    return JobSpec("/bin/true", resources=resources,
                   attributes=JobAttributes(duration=duration, custom_attributes=custom))


def test_a_job_without_a_policy_has_no_runs() -> None:
    assert check_job(_spec({})) is None
    assert check_job(JobSpec("/bin/true")) is None
    assert check_job(_spec({REQUEUE_ATTRIBUTE: 0, RETRY_ATTRIBUTE: 1})) is None
    runs = check_job(_spec({REQUEUE_ATTRIBUTE: 2}))
    assert runs is not None and (runs.requeue, runs.retry, runs.attempt) == (2, None, 1)


def test_a_memory_factor_needs_the_job_to_set_its_memory() -> None:
    for spec in (_spec({RETRY_ATTRIBUTE: "attempts=2,memory=2"}, memory=None),
                 JobSpec("/bin/true", attributes=JobAttributes(
                     custom_attributes={RETRY_ATTRIBUTE: "attempts=2,memory=2"}))):
        with pytest.raises(InvalidJobException, match="memory=2 scales the job's memory, "
                           r"which it does not set \(ResourceSpecV1.memory\)"):
            check_job(spec)
    assert check_job(_spec({RETRY_ATTRIBUTE: "attempts=2,duration=2"}, memory=None)) \
        is not None


def _failed(cause: Optional[str] = None, exit_code: Optional[int] = 1) -> JobStatus:
    return JobStatus(JobState.FAILED, exit_code=exit_code, message="it failed",
                     metadata=None if cause is None else {"cause": cause})


@pytest.mark.parametrize("status,cause", [
    (_failed("out_of_memory", 137), "out_of_memory"),
    (_failed("preempted", None), "preempted"),
    (_failed(None, 1), "failed"),
    (_failed(None, REQUEUE_EXIT_CODE), "checkpoint"),
    (_failed("time_limit", REQUEUE_EXIT_CODE), "checkpoint"),
    (_failed("out_of_memory", REQUEUE_EXIT_CODE), "out_of_memory"),
    (_failed("launch_failure", 1), "launch_failure"),
])
def test_the_cause_of_a_failed_run(status: JobStatus, cause: str) -> None:
    assert cause_of(status) == cause


def _job(custom: Dict[str, Any], **kw: Any) -> "tuple[Job, Runs]":
    job = Job(_spec(custom, **kw))
    assert job.spec is not None
    runs = check_job(job.spec)
    assert runs is not None
    return job, runs


def test_requeues_cover_preemption_node_failures_and_checkpoints_up_to_their_count() -> None:
    job, runs = _job({REQUEUE_ATTRIBUTE: 2})
    for cause in ("preempted", "node_failure", "boot_failure"):
        assert next_run(job, runs, _failed(cause)) == Rerun("requeue", cause, 2, 1000, 60.0)
    rerun = next_run(job, runs, _failed(None, REQUEUE_EXIT_CODE))
    assert rerun == Rerun("requeue", "checkpoint", 2, 1000, 60.0)
    counted(runs, rerun)
    assert next_run(job, runs, _failed("out_of_memory")) is None  # no retry policy
    assert next_run(job, runs, _failed(None, 1)) is None
    counted(runs, next_run(job, runs, _failed("preempted")))  # type: ignore[arg-type]
    assert (runs.attempt, runs.requeues, runs.retries) == (3, 2, 0)
    assert next_run(job, runs, _failed("preempted")) is None  # both used
    assert next_run(job, runs, JobStatus(JobState.COMPLETED, exit_code=0)) is None
    assert next_run(job, runs, JobStatus(JobState.CANCELED)) is None


def test_retries_scale_memory_and_duration_per_attempt_up_to_the_caps() -> None:
    job, runs = _job({RETRY_ATTRIBUTE: "attempts=4,on=out_of_memory+time_limit,memory=2,"
                                       "duration=1.5,max_memory=3000,max_duration=120"})
    assert next_run(job, runs, _failed("preempted")) is None  # psij.requeue's, not set
    assert next_run(job, runs, _failed(None, 1)) is None  # "failed" is not in on
    seen = []
    for cause in ("out_of_memory", "time_limit", "out_of_memory"):
        rerun = next_run(job, runs, _failed(cause))
        assert rerun is not None and rerun.kind == "retry" and rerun.cause == cause
        seen.append((rerun.attempt, rerun.memory, rerun.duration))
        assert job.spec is not None
        job.spec = spec_for(job.spec, rerun)
        counted(runs, rerun)
    assert seen == [(2, 2000, 90.0), (3, 3000, 120.0), (4, 3000, 120.0)]
    assert next_run(job, runs, _failed("out_of_memory")) is None  # 4 attempts made
    assert runs.retries == 3 and runs.attempt == 4


def test_a_cap_below_the_first_run_does_not_shrink_it() -> None:
    job, runs = _job({RETRY_ATTRIBUTE: "attempts=2,memory=2,max_memory=10,duration=2,"
                                       "max_duration=1"})
    assert next_run(job, runs, _failed(None)) == Rerun("retry", "failed", 2, 1000, 60.0)


def test_the_spec_of_the_next_run_is_a_copy_with_its_values_and_attempt() -> None:
    job, runs = _job({RETRY_ATTRIBUTE: "attempts=2,memory=3,duration=2",
                      "pilot.time_limit": 30}, memory=4096)
    before = job.spec
    assert before is not None
    rerun = next_run(job, runs, _failed("out_of_memory"))
    assert rerun is not None
    spec = spec_for(before, rerun)
    assert spec is not before and spec.resources is not before.resources
    assert spec.resources.memory == 3 * 4096  # type: ignore[union-attr]
    assert spec.attributes.duration == timedelta(seconds=120)
    custom = spec.attributes.custom_attributes
    assert custom is not None and custom["pilot.time_limit"] == 60
    assert spec.environment == {ATTEMPT_VARIABLE: "2"}
    assert before.resources.memory == 4096  # type: ignore[union-attr]
    assert before.attributes.duration == timedelta(seconds=60) and before.environment is None
    requeue = spec_for(before, Rerun("requeue", "preempted", 2, 4096, 60.0))
    assert requeue.resources.memory == 4096  # type: ignore[union-attr]


def test_the_status_of_a_new_run_says_why_and_what_ran_before() -> None:
    job, runs = _job({REQUEUE_ATTRIBUTE: 1, RETRY_ATTRIBUTE: "attempts=3,memory=2"})
    failed = JobStatus(JobState.FAILED, exit_code=137, message="out of memory",
                       metadata={"cause": "out_of_memory"})
    rerun = next_run(job, runs, failed)
    assert rerun is not None
    status = rerun_status(rerun, runs, failed, "123")
    assert status.state is JobState.QUEUED
    assert status.metadata == {"attempt": 2, "rerun": "retry", "cause": "out_of_memory",
                               "previous": {"native_id": "123", "exit_code": 137,
                                            "message": "out of memory"}}
    assert status.message == ("retried after out_of_memory: attempt 2 of 3, memory 2000 "
                              "bytes, duration 60 s")
    counted(runs, rerun)
    requeue = next_run(job, runs, _failed(None, REQUEUE_EXIT_CODE))
    assert requeue is not None
    said = rerun_status(requeue, runs, _failed(None, REQUEUE_EXIT_CODE), "124")
    assert said.message == "requeued (it exited with 85 to be run again): run 3, at most 3"
    assert said.metadata is not None and said.metadata["attempt"] == 3


def test_a_pilot_job_s_retry_names_the_limit_the_pilot_enforces() -> None:
    job, runs = _job({RETRY_ATTRIBUTE: "attempts=2,on=time_limit,duration=2",
                      "pilot.time_limit": 30})
    failed = _failed("time_limit")
    rerun = next_run(job, runs, failed)
    assert rerun is not None and job.spec is not None
    said = rerun_status(rerun, runs, failed, "t1", spec_for(job.spec, rerun))
    assert said.message == ("retried after time_limit: attempt 2 of 2, memory 1000 bytes, "
                            "duration 120 s, pilot.time_limit 60 s")


def test_a_scheduler_requeue_counts_as_one() -> None:
    _, runs = _job({REQUEUE_ATTRIBUTE: 1})
    queued = JobStatus(JobState.QUEUED)
    rerun = scheduler_requeue(runs, queued)
    assert rerun == Rerun("requeue", "requeued", 2, None, 0.0)
    counted(runs, rerun)
    assert scheduler_requeue(runs, queued) is None
    _, more = _job({REQUEUE_ATTRIBUTE: 3})
    said = scheduler_requeue(more, JobStatus(JobState.QUEUED, metadata={"cause": "preempted"}))
    assert said is not None and said.cause == "preempted"


@pytest.mark.parametrize("custom,attempt", [
    ({}, None), ({REQUEUE_ATTRIBUTE: 0}, None), ({RETRY_ATTRIBUTE: 1}, None),
    ({REQUEUE_ATTRIBUTE: 1}, 1), ({RETRY_ATTRIBUTE: "attempts=2"}, 1),
    ({REQUEUE_ATTRIBUTE: 0, RETRY_ATTRIBUTE: 3}, 1)])
def test_psij_attempt_is_given_to_every_run_of_a_job_that_may_run_again_only(
        custom: Dict[str, Any], attempt: Optional[int]) -> None:
    own = {"A": "b", ATTEMPT_VARIABLE: "its own"}
    job = Job(JobSpec("/bin/true", environment=dict(own),
                      attributes=JobAttributes(custom_attributes=custom)))
    # Not submitted yet (a script shown): read from the spec, as a submission would.
    assert run_attempt(job) == attempt
    job.__dict__["_runs"] = check_job(job.spec)  # type: ignore[arg-type]  # as submit does
    assert run_attempt(job) == attempt
    given = run_environment(job, job.spec.environment)  # type: ignore[union-attr]
    if attempt is None:
        assert given == own  # the job's own variable, untouched
    else:
        assert given == {"A": "b", ATTEMPT_VARIABLE: "1"}
        runs = job.__dict__["_runs"]
        runs.attempt = 3
        assert run_environment(job, None) == {ATTEMPT_VARIABLE: "3"}
    assert job.spec is not None and job.spec.environment == own  # never changed
    assert run_environment(job, None) == ({} if attempt is None else {ATTEMPT_VARIABLE: "3"})


def test_a_job_followed_for_its_scheduler_s_requeues_only_gets_no_attempt_variable() -> None:
    # A job attached again from the registry without a policy is followed, never run here.
    job = Job(JobSpec("/bin/true"))
    job.__dict__["_runs"] = Runs(0, None, attempt=2)
    assert run_attempt(job) is None and run_environment(job, None) == {}
