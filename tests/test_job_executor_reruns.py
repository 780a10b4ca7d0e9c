"""JobExecutor running a job again (psij.job_executor with psij._retry): the same Job enters
QUEUED again with its attempt, the executor's _run_again starts the run, and what happens when
it cannot, when the executor does not run jobs again, or when its backend does."""

import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
)
from psij._retry import Rerun

Seen = Tuple[str, Optional[int], Optional[str]]


class _Fake(JobExecutor):
    """Runs nothing: each run's statuses are what the test tells it to report."""

    _RERUNS = "submits"

    def __init__(self, endings: List[JobStatus], fail_rerun: bool = False) -> None:
        super().__init__()
        self.endings = endings
        self.fail_rerun = fail_rerun
        self.runs: List[Tuple[Optional[int], float, Optional[str]]] = []

    def submit(self, job: Job) -> None:
        self._check_job(job)
        self._start(job)

    def _start(self, job: Job) -> None:
        assert job.spec is not None
        memory = getattr(job.spec.resources, "memory", None)
        attempt = (job.spec.environment or {}).get("PSIJ_ATTEMPT")
        self.runs.append((memory, job.spec.attributes.duration.total_seconds(), attempt))
        job._native_id = f"run-{len(self.runs)}"
        self._set_job_status(job, JobStatus(JobState.QUEUED))
        self._set_job_status(job, JobStatus(JobState.ACTIVE))
        self._set_job_status(job, self.endings.pop(0))

    def _run_again(self, job: Job, rerun: Rerun) -> None:
        if self.fail_rerun:
            raise OSError("no room on the scheduler")
        self._start(job)

    def cancel(self, job: Job) -> None:
        self._set_job_status(job, JobStatus(JobState.CANCELED))

    def list(self) -> List[str]:
        return []

    def attach(self, job: Job, native_id: str) -> None:
        raise NotImplementedError


def _executor(cls: Any, *args: Any, **kw: Any) -> Any:
    ex = cls.__new__(cls)
    ex.__dict__["_psij_plugin"] = ("fake", "0.1")
    ex.__init__(*args, **kw)
    return ex


def _job(custom: Dict[str, Any], memory: Optional[int] = 1000) -> Tuple[Job, List[Seen]]:
    job = Job(JobSpec("/bin/true", resources=ResourceSpecV1(memory=memory),
                      attributes=JobAttributes(duration=60, custom_attributes=custom)))
    seen: List[Seen] = []
    job.set_job_status_callback(lambda j, st: seen.append(
        (st.state.name, (st.metadata or {}).get("attempt"), (st.metadata or {}).get("cause"))))
    return job, seen


def _failed(cause: Optional[str], exit_code: int = 1) -> JobStatus:
    return JobStatus(JobState.FAILED, exit_code=exit_code, message="the run failed",
                     metadata=None if cause is None else {"cause": cause})


def test_a_retried_job_is_the_same_job_queued_again_with_its_attempt() -> None:
    ex = _executor(_Fake, [_failed("out_of_memory", 137), _failed("out_of_memory", 137),
                           JobStatus(JobState.COMPLETED, exit_code=0)])
    job, seen = _job({"psij.retry": "attempts=3,on=out_of_memory,memory=2,max_memory=3000,"
                                    "duration=1.5"})
    first_spec = job.spec
    ex.submit(job)
    final = job.wait(timeout=5)
    assert final is not None and final.state is JobState.COMPLETED
    assert final.metadata == {"attempt": 3}
    assert seen == [("QUEUED", None, None), ("ACTIVE", None, None),
                    ("QUEUED", 2, "out_of_memory"), ("ACTIVE", 2, None),
                    ("QUEUED", 3, "out_of_memory"), ("ACTIVE", 3, None),
                    ("COMPLETED", 3, None)]
    assert ex.runs == [(1000, 60.0, None), (2000, 90.0, "2"), (3000, 135.0, "3")]
    assert job.spec is not first_spec and job.native_id == "run-3"
    assert first_spec is not None and first_spec.resources.memory == 1000  # type: ignore


def test_attempts_used_up_end_the_job_with_the_last_failure_and_its_attempt() -> None:
    ex = _executor(_Fake, [_failed(None), _failed(None), _failed("time_limit")])
    job, seen = _job({"psij.retry": "attempts=3,on=failed"})
    ex.submit(job)
    final = job.wait(timeout=5)
    assert final is not None and final.state is JobState.FAILED
    # the second failure is retried; the third has a cause the policy leaves alone
    assert len(ex.runs) == 3 and [s for s in seen if s[0] == "QUEUED"] == [
        ("QUEUED", None, None), ("QUEUED", 2, "failed"), ("QUEUED", 3, "failed")]
    assert final.metadata == {"cause": "time_limit", "attempt": 3}


def test_a_checkpointed_job_is_requeued_up_to_its_count() -> None:
    ex = _executor(_Fake, [_failed(None, 85), _failed("preempted"), _failed(None, 85)])
    job, seen = _job({"psij.requeue": 2})
    ex.submit(job)
    final = job.wait(timeout=5)
    assert final is not None and final.state is JobState.FAILED and final.exit_code == 85
    assert [s for s in seen if s[0] == "QUEUED"] == [
        ("QUEUED", None, None), ("QUEUED", 2, "checkpoint"), ("QUEUED", 3, "preempted")]
    assert [r[0] for r in ex.runs] == [1000, 1000, 1000]  # a requeue keeps the resources


def test_a_run_that_cannot_start_ends_the_job_with_the_failure_before_and_why() -> None:
    ex = _executor(_Fake, [_failed("out_of_memory", 137)], fail_rerun=True)
    job, seen = _job({"psij.retry": "attempts=2,memory=2"})
    ex.submit(job)
    final = job.wait(timeout=5)
    assert final is not None and final.state is JobState.FAILED and final.exit_code == 137
    assert final.message == ("the run failed; running it again (retry after out_of_memory) "
                             "failed: no room on the scheduler")
    assert seen[-2:] == [("QUEUED", 2, "out_of_memory"), ("FAILED", 2, "out_of_memory")]


def test_a_cancelled_job_is_not_run_again() -> None:
    ex = _executor(_Fake, [])
    job, _ = _job({"psij.retry": "attempts=5,on=failed"})
    ex._check_job(job)
    ex._set_job_status(job, JobStatus(JobState.QUEUED))
    job.cancel()
    ex._set_job_status(job, _failed(None))  # the backend's late word on the killed run
    assert job.status.state is JobState.CANCELED and ex.runs == []


def test_without_a_policy_nothing_changes() -> None:
    ex = _executor(_Fake, [_failed("out_of_memory", 137)])
    job, seen = _job({})
    ex.submit(job)
    assert job.status.state is JobState.FAILED and len(ex.runs) == 1
    ex._set_job_status(job, JobStatus(JobState.QUEUED))
    assert [s[0] for s in seen] == ["QUEUED", "ACTIVE", "FAILED"]
    active, _ = _job({})
    ex._check_job(active)
    ex._set_job_status(active, JobStatus(JobState.ACTIVE))
    ex._set_job_status(active, JobStatus(JobState.QUEUED))  # not greater: ignored, as before
    assert active.status.state is JobState.ACTIVE


def test_a_scheduler_requeue_of_a_running_job_counts_as_a_requeue() -> None:
    ex = _executor(_Fake, [])
    job, seen = _job({"psij.requeue": 1})
    ex._check_job(job)
    job._native_id = "42"
    for state in (JobState.QUEUED, JobState.ACTIVE, JobState.QUEUED, JobState.ACTIVE,
                  JobState.QUEUED):
        ex._set_job_status(job, JobStatus(state))
    ex._set_job_status(job, JobStatus(JobState.COMPLETED, exit_code=0))
    assert seen == [("QUEUED", None, None), ("ACTIVE", None, None), ("QUEUED", 2, "requeued"),
                    ("ACTIVE", 2, None), ("COMPLETED", 2, None)]
    assert ex.runs == []  # in place: nothing submitted again
    assert job.status.metadata is not None and job.status.metadata["attempt"] == 2


class _Told(_Fake):
    _RERUNS = "told"


def test_an_executor_whose_backend_reruns_enters_the_runs_it_is_told_of() -> None:
    ex = _executor(_Told, [])
    job, seen = _job({"psij.retry": "attempts=2"})
    ex._check_job(job)
    ex._set_job_status(job, JobStatus(JobState.QUEUED))
    ex._set_job_status(job, JobStatus(JobState.ACTIVE))
    ex._set_job_status(job, JobStatus(JobState.QUEUED))  # no attempt: not a new run
    ex._set_job_status(job, JobStatus(JobState.QUEUED, metadata={"attempt": 2, "cause": "x"}))
    ex._set_job_status(job, JobStatus(JobState.ACTIVE, metadata={"attempt": 2}))
    ex._set_job_status(job, _failed(None))  # the backend decided: final
    assert seen == [("QUEUED", None, None), ("ACTIVE", None, None), ("QUEUED", 2, "x"),
                    ("ACTIVE", 2, None), ("FAILED", 2, None)]
    assert ex.runs == []


class _Plain(_Fake):
    _RERUNS = ""


def test_an_executor_that_does_not_run_jobs_again_refuses_them_at_submit() -> None:
    ex = _executor(_Plain, [])
    job, _ = _job({"psij.requeue": 1})
    with pytest.raises(InvalidJobException, match="the fake executor does not run a job again: "
                       "custom attributes psij.requeue and psij.retry"):
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None
    plain, _ = _job({"psij.requeue": 0})
    ok = _executor(_Plain, [JobStatus(JobState.COMPLETED, exit_code=0)])
    ok.submit(plain)  # a policy that allows no rerun is no policy
    assert plain.status.state is JobState.COMPLETED


@pytest.mark.parametrize("custom", [{"psij.retry": "attempts=0"}, {"psij.requeue": -1},
                                    {"psij.retry": "attempts=2,memory=nan"}])
def test_a_bad_policy_leaves_the_job_new_and_unbound(custom: Dict[str, Any]) -> None:
    ex = _executor(_Fake, [])
    job, _ = _job(custom)
    with pytest.raises(InvalidJobException, match="custom attribute psij"):
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None and ex.runs == []


def test_waiters_see_only_the_final_run() -> None:
    gate = threading.Event()

    class _Slow(_Fake):
        def _run_again(self, job: Job, rerun: Rerun) -> None:
            def later() -> None:
                gate.wait(5)
                self._start(job)

            threading.Thread(target=later).start()

    ex = _executor(_Slow, [_failed(None), JobStatus(JobState.COMPLETED, exit_code=0)])
    job, _ = _job({"psij.retry": "attempts=2"})
    ex.submit(job)
    assert job.wait(timeout=0.2) is None  # QUEUED again, not final
    assert job.status.state is JobState.QUEUED
    gate.set()
    final = job.wait(timeout=5)
    assert final is not None and final.state is JobState.COMPLETED


def test_states_skipped_by_a_later_run_still_say_which_run_they_are() -> None:
    ex = _executor(_Fake, [])
    job, seen = _job({"psij.requeue": 1})
    ex._check_job(job)
    ex._set_job_status(job, JobStatus(JobState.ACTIVE))  # QUEUED skipped: the first run
    ex._set_job_status(job, JobStatus(JobState.QUEUED))  # requeued by the scheduler
    ex._set_job_status(job, JobStatus(JobState.COMPLETED, exit_code=0))  # ACTIVE unseen
    assert seen == [("QUEUED", None, None), ("ACTIVE", None, None), ("QUEUED", 2, "requeued"),
                    ("ACTIVE", 2, None), ("COMPLETED", 2, None)]


def test_a_rerun_that_cannot_be_decided_lets_the_status_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import psij._retry

    def broken(*_: Any) -> None:
        raise RuntimeError("no copy of this spec")

    monkeypatch.setattr(psij._retry, "next_run", broken)
    ex = _executor(_Fake, [_failed("out_of_memory", 137)])
    job, seen = _job({"psij.retry": "attempts=2"})
    ex.submit(job)  # reported from the executor's own thread in a real one: it must not raise
    assert job.status.state is JobState.FAILED and job.status.exit_code == 137
    assert [s[0] for s in seen] == ["QUEUED", "ACTIVE", "FAILED"] and len(ex.runs) == 1
