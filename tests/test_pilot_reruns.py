"""Requeue and retries on the ``pilot`` executor (``psij.requeue``, ``psij.retry``): each run
is a new task of the pilot, named ``<job id>.<attempt>``, for the same Job, which is QUEUED
again with its attempt in the status metadata; a task killed at its ``pilot.time_limit`` has
the cause ``time_limit`` and a retry scales that limit; a cancel between or during runs leaves
nothing running; a run that cannot be submitted ends the job with the status of the run
before; the pilot's journal keeps both runs of one job apart. In-process pilots, real
processes and clock, sub-second to two-second payloads."""

import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobSpec,
    JobState,
    JobStatus,
    SubmitException,
)
from psij.executors.pilot.executor import PilotJobExecutor, PilotJobExecutorConfig
from psij.executors.pilot.service import PilotClient
from support.process_checks import alive
from test_local_reruns import (
    CHECKPOINTING,
    COUNTING,
    SLEEPS_IN_RUN_2,
    final,
    meta,
    states,
    wait_for_run_2,
)
from test_pilot_executor import Served

WAIT = 30.0


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[PilotJobExecutor]:
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(
        cores=2, work_directory=tmp_path / "work", cancel_grace_period=0.2))
    yield ex
    ex.close()


def job_of(folder: Path, args: List[str], **custom: Any) -> "tuple[Job, List[JobStatus]]":
    job = Job(JobSpec(sys.executable, args, directory=folder,
                      attributes=JobAttributes(custom_attributes=custom)))
    seen: List[JobStatus] = []
    job.set_job_status_callback(lambda j, st: seen.append(st))
    return job, seen


def test_a_task_killed_at_its_time_limit_has_the_cause(executor: PilotJobExecutor,
                                                       tmp_path: Path) -> None:
    job, _ = job_of(tmp_path, ["-c", "import time; time.sleep(30)"],
                    **{"pilot.time_limit": 0.3})
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and meta(status)["cause"] == "time_limit"
    assert "exceeded its time limit of 0.3 s" in (status.message or "")
    other, _ = job_of(tmp_path, ["-c", "raise SystemExit(3)"])
    executor.submit(other)
    status = final(other)
    assert status.state is JobState.FAILED and status.exit_code == 3
    assert "cause" not in meta(status)


def test_a_retry_after_the_time_limit_runs_longer_and_completes(executor: PilotJobExecutor,
                                                                tmp_path: Path) -> None:
    job, seen = job_of(tmp_path, ["-c", "import time; time.sleep(1.5)"],
                       **{"pilot.time_limit": 1, "psij.retry": "attempts=3,on=time_limit,"
                          "duration=3"})
    executor.submit(job)
    first = job.native_id
    assert first == job.id
    status = final(job)
    assert status.state is JobState.COMPLETED, status
    assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    again = meta(seen[2])
    assert (again["attempt"], again["rerun"], again["cause"]) == (2, "retry", "time_limit")
    assert again["previous"]["native_id"] == first
    assert "time limit" in again["previous"]["message"]
    assert meta(seen[3])["attempt"] == 2 and meta(status)["attempt"] == 2
    assert job.native_id == f"{job.id}.2"
    assert job.spec is not None
    assert job.spec.attributes.custom_attributes is not None
    assert job.spec.attributes.custom_attributes["pilot.time_limit"] == 3.0
    assert job.spec.attributes.duration.total_seconds() == 1800.0  # 10 minutes, times 3
    assert job.spec.environment == {"PSIJ_ATTEMPT": "2"}


def test_a_failing_job_is_retried_until_its_third_run_completes(executor: PilotJobExecutor,
                                                                 tmp_path: Path) -> None:
    job, seen = job_of(tmp_path, ["-c", COUNTING, "3", "3"], **{"psij.retry": "3"})
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.COMPLETED and meta(status)["attempt"] == 3
    assert (status.metadata or {})["run"] == 3  # with the figures of that run
    assert "cpu_seconds" in (status.metadata or {})
    assert (tmp_path / "attempts").read_text().split() == ["1", "2", "3"]
    queued = [st for st in seen if st.state is JobState.QUEUED]
    assert [meta(st).get("attempt") for st in queued] == [None, 2, 3]
    assert [meta(st).get("cause") for st in queued] == [None, "failed", "failed"]
    assert job.native_id == f"{job.id}.3"
    assert sorted(executor.list()) == []


def test_psij_attempt_is_set_in_every_run_of_a_job_that_may_run_again_only(
        executor: PilotJobExecutor, tmp_path: Path) -> None:
    # As on local: PSIJ_ATTEMPT=1 in the first run of a job that may be run again, nothing in
    # a job that may not; the job's spec is left as it was given.
    for i, (custom, seen_as) in enumerate([
            ({}, "-"), ({"psij.requeue": 0}, "-"), ({"psij.retry": "1"}, "-"),
            ({"psij.requeue": 1}, "1"), ({"psij.retry": "attempts=2,on=time_limit"}, "1")]):
        folder = tmp_path / str(i)
        folder.mkdir()
        job, _ = job_of(folder, ["-c", COUNTING, "0", "1"], **custom)
        executor.submit(job)
        assert final(job).state is JobState.COMPLETED
        assert (folder / "attempts").read_text().split() == [seen_as], custom
        assert job.spec is not None and job.spec.environment is None


def test_attempts_exhausted_end_the_job_failed_with_the_last_attempt(
        executor: PilotJobExecutor, tmp_path: Path) -> None:
    job, seen = job_of(tmp_path, ["-c", COUNTING, "4", "99"],
                       **{"psij.retry": "attempts=2,on=failed"})
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 4
    assert meta(status)["attempt"] == 2
    assert (tmp_path / "count").read_text() == "2"
    assert states(seen).count("ACTIVE") == 2


def test_causes_not_named_are_not_retried(executor: PilotJobExecutor, tmp_path: Path) -> None:
    job, _ = job_of(tmp_path, ["-c", COUNTING, "5", "99"],
                    **{"psij.retry": "attempts=3,on=time_limit"})
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 5
    assert "attempt" not in meta(status)
    assert (tmp_path / "count").read_text() == "1"
    timed, _ = job_of(tmp_path, ["-c", "import time; time.sleep(30)"],
                      **{"pilot.time_limit": 0.3,
                         "psij.retry": "attempts=3,on=failed+out_of_memory"})
    executor.submit(timed)
    status = final(timed)
    assert status.state is JobState.FAILED and meta(status)["cause"] == "time_limit"
    assert "attempt" not in meta(status) and timed.native_id == timed.id


def test_a_job_that_checkpoints_on_the_signal_before_its_end_is_requeued(
        executor: PilotJobExecutor, tmp_path: Path) -> None:
    job, seen = job_of(tmp_path, ["-c", CHECKPOINTING],
                       **{"pilot.time_limit": 5, "psij.requeue": 1,  # signal after 2 s
                          "psij.signal_before_end": "USR1@3"})
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.COMPLETED, status
    assert (tmp_path / "checkpoint").read_text() == "work"
    assert (tmp_path / "runs").read_text() == "rr"
    again = meta(seen[2])
    assert seen[2].state is JobState.QUEUED
    assert again["rerun"] == "requeue" and again["cause"] == "checkpoint"
    assert again["previous"]["exit_code"] == 85 and meta(status)["attempt"] == 2
    assert job.spec is not None and job.spec.attributes.custom_attributes is not None
    assert job.spec.attributes.custom_attributes["pilot.time_limit"] == 5  # not scaled


def test_requeues_stop_at_the_limit(executor: PilotJobExecutor, tmp_path: Path) -> None:
    job, seen = job_of(tmp_path, ["-c", COUNTING, "85", "99"], **{"psij.requeue": 2})
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 85
    assert meta(status)["attempt"] == 3
    assert (tmp_path / "count").read_text() == "3"
    assert [meta(st).get("rerun") for st in seen if st.state is JobState.QUEUED] == \
        [None, "requeue", "requeue"]


def test_cancel_during_a_retried_run_leaves_no_process(executor: PilotJobExecutor,
                                                       tmp_path: Path) -> None:
    job, _ = job_of(tmp_path, ["-c", SLEEPS_IN_RUN_2, "3", "99"], **{"psij.retry": "3"})
    executor.submit(job)
    pid = wait_for_run_2(job, tmp_path)
    assert alive(pid) and executor.list() == [f"{job.id}.2"]
    job.cancel()
    status = final(job)
    assert status.state is JobState.CANCELED and meta(status)["attempt"] == 2
    deadline = time.monotonic() + 5
    while alive(pid):
        assert time.monotonic() < deadline, "the second run still runs"
        time.sleep(0.02)
    assert (tmp_path / "count").read_text() == "2"


def test_cancel_while_the_next_run_is_submitted_ends_canceled(
        executor: PilotJobExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, seen = job_of(tmp_path, ["-c", SLEEPS_IN_RUN_2, "3", "99"], **{"psij.retry": "3"})
    task_of = executor._task_of

    def cancel_first(j: Job, name: Any = None) -> Any:
        if name is not None:
            j.cancel()  # reads the native id of the run that ended
        return task_of(j, name)

    monkeypatch.setattr(executor, "_task_of", cancel_first)
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.CANCELED, status
    assert executor.list() == []
    time.sleep(0.3)
    if (tmp_path / "count").read_text() == "2":  # it had started: it was ended
        assert not alive(int((tmp_path / "pid").read_text()))
    assert states(seen)[:3] == ["QUEUED", "ACTIVE", "QUEUED"]


def test_a_cancel_before_the_next_run_keeps_it_from_starting(
        executor: PilotJobExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, seen = job_of(tmp_path, ["-c", COUNTING, "3", "99"], **{"psij.retry": "3"})
    run_again = executor._run_again

    def cancel_first(j: Job, rerun: Any) -> None:
        j.cancel()
        run_again(j, rerun)

    monkeypatch.setattr(executor, "_run_again", cancel_first)
    executor.submit(job)
    assert final(job).state is JobState.CANCELED
    time.sleep(0.3)
    assert (tmp_path / "count").read_text() == "1"
    assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "CANCELED"]
    assert job.native_id == job.id


def test_a_run_that_cannot_be_submitted_ends_the_job_with_the_run_before(
        executor: PilotJobExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = executor._local_engine()
    submit = engine.submit

    def refusing(task: Any) -> str:
        if task.name.endswith(".2"):
            raise RuntimeError("the pilot is full")
        return submit(task)

    monkeypatch.setattr(engine, "submit", refusing)
    job, seen = job_of(tmp_path, ["-c", COUNTING, "7", "99"], **{"psij.retry": "3"})
    executor.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 7
    message = status.message or ""
    assert "running it again (retry after failed) failed" in message
    assert "the pilot is full" in message
    assert job.native_id == job.id  # the run before's
    assert (tmp_path / "count").read_text() == "1"
    assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "FAILED"]


def test_a_resumed_pilot_runs_neither_run_of_a_retried_job_again(tmp_path: Path) -> None:
    journal = tmp_path / "pilot.journal"
    config: Dict[str, Any] = dict(cores=2, work_directory=tmp_path / "work", journal=journal)
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(**config))
    job, _ = job_of(tmp_path, ["-c", COUNTING, "3", "2"], **{"psij.retry": "2"})
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    ex.close()
    again = PilotJobExecutor(config=PilotJobExecutorConfig(resume=True, **config))
    try:
        second = Job()
        again.attach(second, f"{job.id}.2")
        assert final(second).state is JobState.COMPLETED
        with pytest.raises(InvalidJobException):  # the failed run was forgotten
            again.attach(Job(), job.id)
        time.sleep(0.5)
        assert (tmp_path / "count").read_text() == "2"  # not run again
    finally:
        again.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    folder = Path(tempfile.mkdtemp(prefix="pj"))  # a short socket path
    pilot = Served(folder, tmp_path / "wd").start()
    yield pilot
    pilot.stop(signal.SIGTERM)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_served_pilot_retries_a_job_as_a_new_task(served: Served, tmp_path: Path) -> None:
    ex = PilotJobExecutor(url=served.socket)
    try:
        job, seen = job_of(tmp_path, ["-c", COUNTING, "3", "3"], **{"psij.retry": "3"})
        ex.submit(job)
        status = final(job)
        assert status.state is JobState.COMPLETED and meta(status)["attempt"] == 3
        assert job.native_id == f"{job.id}.3"
        assert (tmp_path / "attempts").read_text().split() == ["1", "2", "3"]
        assert states(seen) == ["QUEUED", "ACTIVE"] * 3 + ["COMPLETED"]
        client = PilotClient(served.socket)
        try:
            tasks = [name for name, _ in client.request("list")["tasks"]]
            with pytest.raises(ValueError, match="task: "):
                client.request("forget", task=job.id)  # forgotten already
        finally:
            client.close()
        assert tasks == [f"{job.id}.3"]  # the runs before were forgotten
    finally:
        ex.close()


def test_a_served_pilot_that_refuses_the_next_run_fails_the_job(
        served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = PilotJobExecutor(url=served.socket)
    try:
        send = ex._send

        def refusing(j: Job, task: Any) -> None:
            if task.name.endswith(".2"):
                raise SubmitException("the pilot is full")
            send(j, task)

        monkeypatch.setattr(ex, "_send", refusing)
        job, seen = job_of(tmp_path, ["-c", COUNTING, "7", "99"],
                           **{"psij.retry": "attempts=3,on=failed"})
        ex.submit(job)
        status = final(job)
        assert status.state is JobState.FAILED and status.exit_code == 7
        assert "running it again (retry after failed) failed: the pilot is full" in \
            (status.message or "")
        assert meta(status) == {"attempt": 2}
        assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "FAILED"]
        time.sleep(0.3)
        assert (tmp_path / "count").read_text() == "1"
    finally:
        ex.close()


def test_a_late_queued_of_its_own_is_not_taken_for_a_requeue(executor: PilotJobExecutor,
                                                             tmp_path: Path) -> None:
    job, seen = job_of(tmp_path, ["-c", "import time; time.sleep(30)"],
                       **{"psij.requeue": 3})
    executor.submit(job)
    assert job.wait(timeout=WAIT, target_states=JobState.ACTIVE) is not None
    # The pilot's RUNNING may come before the QUEUED the submit sets: not a requeue here.
    executor._set_job_status(job, JobStatus(JobState.QUEUED))
    assert job.status.state is JobState.ACTIVE and "attempt" not in meta(job.status)
    job.cancel()
    assert final(job).state is JobState.CANCELED
    assert states(seen) == ["QUEUED", "ACTIVE", "CANCELED"]
