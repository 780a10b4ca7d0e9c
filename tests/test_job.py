"""Job: status transitions, callbacks, waiting and cancelling, without any real executor."""

import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import List, Tuple

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, JobStatus, JobStatusCallback, SubmitException

S = JobState


class RecordingExecutor(JobExecutor):
    """An executor that runs nothing and remembers what it was asked to do."""

    def __init__(self, url=None, config=None):
        super().__init__(url=url, config=config)
        self.cancelled: List[Job] = []

    def submit(self, job):
        self._check_job(job)
        job.status = JobStatus(S.QUEUED)

    def cancel(self, job):
        self.cancelled.append(job)
        job.status = JobStatus(S.CANCELED)

    def list(self):
        return []

    def attach(self, job, native_id):
        job.executor = self


class Recorder(JobStatusCallback):
    def __init__(self, tag: str, log: List[Tuple[str, JobState]]):
        self.tag = tag
        self.log = log

    def job_status_changed(self, job, job_status):
        self.log.append((self.tag, job_status.state))


def states_of(job_log):
    return [state for _, state in job_log]


# ---- basics --------------------------------------------------------------------------------


def test_new_job():
    j = Job()
    assert j.status.state is S.NEW
    assert j.spec is None and j.executor is None and j.native_id is None
    assert uuid.UUID(j.id).version == 4
    assert Job().id != j.id
    spec = JobSpec(executable="/bin/true")
    assert Job(spec).spec is spec
    j.spec = spec
    assert j.spec is spec


def test_status_setter_needs_a_status():
    with pytest.raises(TypeError, match=r"Job\.status"):
        Job().status = S.ACTIVE  # type: ignore[assignment]


# ---- transitions ---------------------------------------------------------------------------


def test_jump_fills_skipped_states_in_order():
    j = Job()
    seen: List[JobStatus] = []
    j.set_job_status_callback(lambda job, st: seen.append(st))
    final = JobStatus(S.COMPLETED, time=100.0, exit_code=0)
    j.status = final
    assert [st.state for st in seen] == [S.QUEUED, S.ACTIVE, S.COMPLETED]
    assert seen[-1] is final
    assert j.status is final


def test_jump_from_queued_fills_only_active():
    j = Job()
    seen: List[JobState] = []
    j.set_job_status_callback(lambda job, st: seen.append(st.state))
    j.status = JobStatus(S.QUEUED)
    j.status = JobStatus(S.COMPLETED)
    assert seen == [S.QUEUED, S.ACTIVE, S.COMPLETED]


@pytest.mark.parametrize("final", [S.FAILED, S.CANCELED])
def test_failed_and_canceled_do_not_fill(final):
    j = Job()
    seen: List[JobState] = []
    j.set_job_status_callback(lambda job, st: seen.append(st.state))
    j.status = JobStatus(final, message="why")
    assert seen == [final]
    assert j.status.message == "why"


def test_updates_that_do_not_advance_are_ignored():
    j = Job()
    seen: List[JobState] = []
    j.set_job_status_callback(lambda job, st: seen.append(st.state))
    j.status = JobStatus(S.ACTIVE)
    active = j.status
    j.status = JobStatus(S.ACTIVE)
    j.status = JobStatus(S.QUEUED)
    j.status = JobStatus(S.NEW)
    assert j.status is active
    assert j._set_status(JobStatus(S.QUEUED)) is False
    j.status = JobStatus(S.FAILED, exit_code=2)
    j.status = JobStatus(S.COMPLETED)
    j.status = JobStatus(S.CANCELED)
    assert j.status.state is S.FAILED and j.status.exit_code == 2
    assert seen == [S.QUEUED, S.ACTIVE, S.FAILED]


def test_job_callback_runs_before_executor_callback():
    log: List[Tuple[str, JobState]] = []
    ex = RecordingExecutor()
    ex.set_job_status_callback(Recorder("executor", log))
    j = Job(JobSpec(executable="/bin/true"))
    j.set_job_status_callback(Recorder("job", log))
    ex.submit(j)
    assert j.executor is ex
    j.status = JobStatus(S.COMPLETED)
    assert log == [("job", S.QUEUED), ("executor", S.QUEUED),
                   ("job", S.ACTIVE), ("executor", S.ACTIVE),
                   ("job", S.COMPLETED), ("executor", S.COMPLETED)]


def test_executor_callback_without_job_callback_and_plain_function():
    seen: List[Tuple[str, JobState]] = []
    ex = RecordingExecutor()
    ex.set_job_status_callback(lambda job, st: seen.append((job.id, st.state)))
    j = Job(JobSpec(executable="/bin/true"))
    ex.submit(j)
    j.status = JobStatus(S.FAILED)
    assert seen == [(j.id, S.QUEUED), (j.id, S.FAILED)]


def test_replacing_and_clearing_callbacks():
    first: List[JobState] = []
    second: List[JobState] = []
    j = Job()
    j.set_job_status_callback(lambda job, st: first.append(st.state))
    j.status = JobStatus(S.QUEUED)
    j.set_job_status_callback(lambda job, st: second.append(st.state))
    j.status = JobStatus(S.ACTIVE)
    j.set_job_status_callback(None)
    j.status = JobStatus(S.COMPLETED)
    assert first == [S.QUEUED]
    assert second == [S.ACTIVE]


def test_bad_callback_is_refused():
    with pytest.raises(TypeError, match="set_job_status_callback"):
        Job().set_job_status_callback(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="set_job_status_callback"):
        RecordingExecutor().set_job_status_callback("not callable")  # type: ignore[arg-type]


def test_raising_callback_is_logged_not_propagated(caplog):
    seen: List[JobState] = []

    def broken(job, st):
        raise RuntimeError("callback broke")

    ex = RecordingExecutor()
    ex.set_job_status_callback(lambda job, st: seen.append(st.state))
    j = Job(JobSpec(executable="/bin/true"))
    j.set_job_status_callback(broken)
    with caplog.at_level(logging.ERROR, logger="psij"):
        ex.submit(j)
        j.status = JobStatus(S.COMPLETED)
    assert j.status.state is S.COMPLETED
    assert seen == [S.QUEUED, S.ACTIVE, S.COMPLETED]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 3
    assert all(r.exc_info and "callback broke" in str(r.exc_info[1]) for r in errors)


def test_raising_executor_callback_is_logged_not_propagated(caplog):
    def broken(job, st):
        raise ValueError("executor callback broke")

    ex = RecordingExecutor()
    ex.set_job_status_callback(broken)
    j = Job(JobSpec(executable="/bin/true"))
    with caplog.at_level(logging.ERROR, logger="psij"):
        ex.submit(j)
    assert j.status.state is S.QUEUED
    assert any("executor callback broke" in str(r.exc_info[1]) for r in caplog.records
               if r.exc_info)


def test_callback_setting_status_is_delivered_after_it_returns():
    j = Job()
    seen: List[Tuple[str, JobState]] = []

    def advance(job, st):
        seen.append(("enter", st.state))
        if st.state is S.QUEUED:
            job.status = JobStatus(S.ACTIVE)
        seen.append(("leave", st.state))

    j.set_job_status_callback(advance)
    j.status = JobStatus(S.QUEUED)
    assert seen == [("enter", S.QUEUED), ("leave", S.QUEUED),
                    ("enter", S.ACTIVE), ("leave", S.ACTIVE)]
    assert j.status.state is S.ACTIVE


def test_concurrent_setters_keep_callbacks_ordered_and_serial():
    jobs = [Job() for _ in range(20)]
    seen = {j.id: [] for j in jobs}
    busy = {j.id: False for j in jobs}
    overlaps: List[str] = []

    def record(job, st):
        if busy[job.id]:
            overlaps.append(job.id)
        busy[job.id] = True
        time.sleep(0.0005)  # widen the window in which a second delivery would overlap
        seen[job.id].append(st.state)
        busy[job.id] = False

    for j in jobs:
        j.set_job_status_callback(record)
    orders = [[S.QUEUED, S.ACTIVE, S.COMPLETED], [S.COMPLETED, S.ACTIVE, S.QUEUED],
              [S.ACTIVE, S.QUEUED, S.COMPLETED], [S.QUEUED, S.COMPLETED, S.ACTIVE]]
    start = threading.Barrier(len(orders))

    def setter(order):
        start.wait()
        for j in jobs:
            for state in order:
                j.status = JobStatus(state)

    threads = [threading.Thread(target=setter, args=(o,)) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # wait() returns only once the final state's callbacks have run, whichever thread ran them.
    for j in jobs:
        assert j.wait(timedelta(seconds=10)) is not None
    assert overlaps == []
    for j in jobs:
        assert seen[j.id] == [S.QUEUED, S.ACTIVE, S.COMPLETED]


# ---- wait ----------------------------------------------------------------------------------


def test_wait_returns_final_status():
    j = Job()
    j.status = JobStatus(S.COMPLETED, exit_code=0)
    assert j.wait() is j.status
    assert j.wait(timedelta(0)) is j.status


def test_wait_zero_timeout_checks_once():
    j = Job()
    t0 = time.monotonic()
    assert j.wait(timedelta(0)) is None
    assert j.wait(timedelta(0), target_states=[S.QUEUED]) is None
    assert time.monotonic() - t0 < 1.0
    j.status = JobStatus(S.QUEUED)
    assert j.wait(timedelta(0), target_states=[S.QUEUED]) is j.status


def test_wait_times_out():
    j = Job()
    t0 = time.monotonic()
    assert j.wait(timedelta(milliseconds=100)) is None
    elapsed = time.monotonic() - t0
    assert 0.09 <= elapsed < 5


def test_wait_target_states():
    j = Job()
    j.status = JobStatus(S.ACTIVE)
    assert j.wait(timedelta(0), target_states=[S.QUEUED]) is j.status  # gone past it
    assert j.wait(timedelta(0), target_states=[S.ACTIVE]) is j.status
    assert j.wait(timedelta(0), target_states=S.ACTIVE) is j.status
    assert j.wait(timedelta(0), target_states=[S.STAGE_OUT]) is None
    assert j.wait(timedelta(0), target_states=[]) is None


def test_wait_for_a_final_state_returns_any_final_state():
    j = Job()
    j.status = JobStatus(S.FAILED)
    assert j.wait(timedelta(0), target_states=[S.COMPLETED]) is j.status


def test_wait_is_woken_from_another_thread():
    j = Job()

    def finish():
        time.sleep(0.1)
        j.status = JobStatus(S.ACTIVE)
        time.sleep(0.1)
        j.status = JobStatus(S.COMPLETED, exit_code=0)

    t = threading.Thread(target=finish)
    t0 = time.monotonic()
    t.start()
    active = j.wait(timedelta(seconds=10), target_states=[S.ACTIVE])
    assert active is not None and active.state is S.ACTIVE
    done = j.wait(timedelta(seconds=10))
    elapsed = time.monotonic() - t0
    t.join()
    assert done is not None and done.state is S.COMPLETED
    assert elapsed < 5


def test_wait_returns_after_the_callbacks_ran():
    j = Job()
    seen: List[JobState] = []
    entered = threading.Event()

    def slow(job, st):
        if st.state is S.COMPLETED:
            entered.set()
            time.sleep(0.2)
        seen.append(st.state)

    j.set_job_status_callback(slow)
    t = threading.Thread(target=lambda: setattr(j, "status", JobStatus(S.COMPLETED)))
    t.start()
    assert entered.wait(10)
    assert j.status.state is S.COMPLETED  # entered, but its callback is still running
    done = j.wait(timedelta(seconds=10))
    assert done is not None and done.state is S.COMPLETED
    assert seen == [S.QUEUED, S.ACTIVE, S.COMPLETED]
    t.join()


def test_callback_waiting_on_its_own_job_is_answered_at_once():
    j = Job()
    answers: List[object] = []

    def cb(job, st):
        answers.append(job.wait(timedelta(seconds=5), target_states=[st.state]))

    j.set_job_status_callback(cb)
    t0 = time.monotonic()
    j.status = JobStatus(S.ACTIVE)
    assert time.monotonic() - t0 < 4
    assert [a.state for a in answers] == [S.ACTIVE, S.ACTIVE]  # type: ignore[attr-defined]


def test_many_waiters_are_all_woken():
    j = Job()
    results: List[object] = []

    def waiter():
        results.append(j.wait(timedelta(seconds=10)))

    threads = [threading.Thread(target=waiter) for _ in range(5)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    j.status = JobStatus(S.CANCELED)
    for t in threads:
        t.join(10)
    assert len(results) == 5
    assert all(r is j.status for r in results)


def test_wait_rejects_bad_arguments():
    j = Job()
    with pytest.raises(TypeError, match="timeout"):
        j.wait("5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="target_states"):
        j.wait(timedelta(0), target_states=["ACTIVE"])  # type: ignore[list-item]


# ---- cancel --------------------------------------------------------------------------------


def test_cancel_without_executor():
    with pytest.raises(SubmitException):
        Job().cancel()


def test_cancel_calls_executor():
    ex = RecordingExecutor()
    j = Job(JobSpec(executable="/bin/true"))
    ex.submit(j)
    j.cancel()
    assert ex.cancelled == [j]
    assert j.status.state is S.CANCELED


def test_cancel_of_final_job_is_a_no_op():
    ex = RecordingExecutor()
    j = Job(JobSpec(executable="/bin/true"))
    ex.submit(j)
    j.status = JobStatus(S.COMPLETED)
    j.cancel()
    assert ex.cancelled == []
    assert j.status.state is S.COMPLETED
    Job().status = JobStatus(S.FAILED)
    orphan = Job()
    orphan.status = JobStatus(S.FAILED)
    orphan.cancel()  # final: no executor needed


def test_job_identity():
    a, b = Job(), Job()
    assert a == a and a != b
    assert len({a, b, a}) == 2
    assert a.id in str(a)
