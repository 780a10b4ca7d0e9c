"""An ended batch job's final status waits a moment for the scheduler's record of its run
(psij.executors.batch._figures_wait): the rules by themselves, then end to end with the
batch-test scheduler made to keep figures, whose end is seen from the job's own files."""

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

from psij import Job, JobSpec, JobState
from psij.executors.batch._figures_wait import OFF_AFTER, WAITS, AwaitingFigures
from psij.executors.batch._poller import _with_figures
from psij.executors.batch._tracking import Observation
from psij.executors.batch.batch_test import BatchTestExecutorConfig, BatchTestJobExecutor
from psij.job_status import JobStatus

WAIT = timedelta(seconds=60)

# --------------------------------------------------------------------------- the rules


def test_a_job_is_asked_about_after_the_first_wait_and_finished_with_its_figures() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    waits.add("1", "job 1", 100.0)
    assert waits.due_at() == 100.0 + WAITS[0]
    assert waits.take_due(100.5) == []
    asked = waits.take_due(101.0)
    assert asked == ["1"]
    done = waits.settle(asked, {"1": {"cpu_seconds": 2.0, "ended_at": 99.0}}, 101.0)
    assert done == [("job 1", {"cpu_seconds": 2.0, "ended_at": 99.0})]
    assert len(waits) == 0 and waits.due_at() is None


def test_one_ask_covers_every_waiting_job_and_asks_are_a_second_apart() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    waits.add("1", "a", 100.0)
    waits.add("2", "b", 100.6)
    waits.add("3", "c", 100.7, at_once=True)  # the scheduler told its end
    assert waits.take_due(100.7) == ["1", "2", "3"]
    done = waits.settle(["1", "2", "3"], {"3": {"ended_at": 1.0}}, 100.7)
    assert [payload for payload, _ in done] == ["c"]
    # Not again before a second has passed, whatever is due.
    waits.add("4", "d", 100.8, at_once=True)
    assert waits.due_at() == pytest.approx(101.7)


def test_a_job_not_due_before_the_next_ask_is_not_asked_early() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    waits.add("1", "a", 100.0)
    assert waits.settle(waits.take_due(101.0), {}, 101.0) == []  # "1" is due at 102 now
    waits.add("2", "b", 101.0)  # due at 102 too
    waits.add("3", "c", 101.5)  # due at 102.5: within a second of 102
    waits.add("4", "d", 102.5)  # due at 103.5
    assert waits.take_due(102.0) == ["1", "2", "3"]


def test_a_record_not_whole_is_asked_again_and_given_up_with_what_it_had() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    waits.add("1", "a", 0.0)
    times = []
    partial = {"queued_at": 1.0, "cpu_seconds": 0.5}  # no end yet
    done: List[Any] = []
    while not done:
        at = waits.due_at()
        assert at is not None
        times.append(at)
        done = waits.settle(waits.take_due(at), {"1": partial} if at < 3 else {}, at)
    assert times == list(WAITS)
    assert done == [("a", partial)]


def test_a_record_of_the_end_without_any_figure_ends_the_wait() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    waits.add("1", "a", 0.0)
    assert waits.settle(waits.take_due(1.0), {"1": {}}, 1.0) == [("a", {})]


def test_a_job_the_record_does_not_know_ends_without_figures_after_the_last_wait() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    waits.add("1", "a", 0.0)
    for at in WAITS[:-1]:
        assert waits.settle(waits.take_due(at), {}, at) == []
    assert waits.settle(waits.take_due(WAITS[-1]), {}, WAITS[-1]) == [("a", {})]


def test_a_failed_ask_ends_the_wait_and_failures_in_a_row_stop_waiting_a_while() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    now = 0.0
    for i in range(OFF_AFTER):
        assert waits.wanted(now)
        waits.add(str(i), f"job {i}", now, at_once=True)
        now = max(now, waits.due_at() or now)
        assert waits.settle(waits.take_due(now), None, now) == [(f"job {i}", {})]
    assert not waits.wanted(now) and not waits.wanted(now + 500)
    assert waits.wanted(now + 601)


def test_the_wait_stops_at_its_limit() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures(3.0)
    waits.add("1", "a", 0.0)
    times = []
    done: List[Any] = []
    while not done:
        at = waits.due_at()
        assert at is not None
        times.append(at)
        done = waits.settle(waits.take_due(at), {}, at)
    assert times == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), 601, "8", True, None])
def test_accounting_wait_refuses_nonsense(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="accounting_wait"):
        BatchTestExecutorConfig(accounting_wait=value)


def test_drain_gives_back_every_waiting_job() -> None:
    waits: AwaitingFigures[str] = AwaitingFigures()
    waits.add("1", "a", 0.0)
    waits.add("1", "again", 0.0)  # (one wait per job)
    waits.add("2", "b", 0.0)
    assert sorted(waits.drain()) == ["a", "b"]
    assert waits.due_at() is None


# --------------------------------------------------------------------------- end to end


class FiguresExecutor(BatchTestJobExecutor):
    """The batch-test scheduler with a record of each run's figures (one ask per call)."""

    FIGURES_FROM = "accounting"
    fail = False
    whole = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: List[Sequence[str]] = []
        self.lock = threading.Lock()

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        with self.lock:
            self.asked.append(tuple(native_ids))
        if self.fail:
            return [["false"]]
        return super().get_accounting_commands(native_ids)

    def parse_accounting_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        found = super().parse_accounting_output(exit_code, out)
        for status in found.values():
            if status.state.final and status.metadata is not None:
                status.metadata.update({"cpu_seconds": 1.5, "cores": 1, "queued_at": 10.0})
                if self.whole:
                    status.metadata["ended_at"] = 12.0
        return found


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[FiguresExecutor]:
    # A status poll every 300 s: only the job's files tell its end.
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=300,
                                  initial_queue_polling_delay=300, keep_finished=30)
    executor = FiguresExecutor(config=cfg)
    yield executor
    executor.close()


def _run(ex: FiguresExecutor, n: int = 1, code: int = 0) -> List[JobStatus]:
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"exit {code}"])) for _ in range(n)]
    for job in jobs:
        ex.submit(job)
    finals: List[JobStatus] = []
    for job in jobs:
        status: Optional[JobStatus] = job.wait(WAIT)
        assert status is not None, f"job {job.native_id} did not end"
        finals.append(status)
    return finals


def test_an_end_seen_from_the_jobs_files_gets_the_records_figures(ex: FiguresExecutor) -> None:
    [status] = _run(ex)
    assert status.state is JobState.COMPLETED and status.exit_code == 0
    meta = status.metadata or {}
    assert meta["source"] == "job file"
    assert meta["cpu_seconds"] == 1.5 and meta["cores"] == 1 and meta["queued_at"] == 10.0
    # The start and end the job's files told (the record's end is whole seconds).
    assert meta["ended_at"] != 12.0 and meta["started_at"] <= meta["ended_at"]


def test_no_wait_at_all_with_accounting_wait_0(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=300,
                                  initial_queue_polling_delay=300, keep_finished=30,
                                  accounting_wait=0)
    ex = FiguresExecutor(config=cfg)
    try:
        [status] = _run(ex)
    finally:
        ex.close()
    assert status.state is JobState.COMPLETED
    assert "cpu_seconds" not in (status.metadata or {}) and ex.asked == []


def test_jobs_ending_together_are_asked_about_together(ex: FiguresExecutor) -> None:
    finals = _run(ex, 4)
    assert all((s.metadata or {}).get("cpu_seconds") == 1.5 for s in finals)
    assert sum(len(ids) for ids in ex.asked) >= 4
    assert len(ex.asked) < 4 * len(WAITS)


def test_a_failing_record_loses_the_figures_not_the_end(ex: FiguresExecutor) -> None:
    ex.fail = True
    [status] = _run(ex, code=0)
    assert status.state is JobState.COMPLETED and status.exit_code == 0
    assert "cpu_seconds" not in (status.metadata or {})
    assert len(ex.asked) == 1  # the end was not held for more asks


def test_a_record_that_never_shows_the_end_gives_what_it_has(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=300,
                                  initial_queue_polling_delay=300, keep_finished=30,
                                  accounting_wait=3)
    ex = FiguresExecutor(config=cfg)
    ex.whole = False
    try:
        [status] = _run(ex)
    finally:
        ex.close()
    assert status.state is JobState.COMPLETED
    meta = status.metadata or {}
    assert meta["cpu_seconds"] == 1.5 and meta["ended_at"] != 12.0  # the file's end time
    assert len(ex.asked) == 3  # 1, 2 and 3 s after the end


def test_a_failed_job_gets_its_figures_too(ex: FiguresExecutor) -> None:
    [status] = _run(ex, code=3)
    assert status.state is JobState.FAILED and status.exit_code == 3
    assert (status.metadata or {}).get("cpu_seconds") == 1.5


def test_closing_the_executor_ends_the_jobs_that_wait(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=300,
                                  initial_queue_polling_delay=300, keep_finished=30,
                                  accounting_wait=600)
    ex = FiguresExecutor(config=cfg)
    ex.whole = False  # the record never shows the end: the job would wait 600 s
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    deadline = time.monotonic() + 60
    while not ex.asked and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ex.asked and not job.status.final
    ex.close()
    status = job.wait(WAIT)
    assert status is not None and status.state is JobState.COMPLETED


def test_the_files_times_are_kept_and_an_end_is_never_before_the_start() -> None:
    last = JobStatus(JobState.ACTIVE, metadata={"source": "job file", "started_at": 100.2})
    record = {"queued_at": 99.0, "started_at": 100.0, "ended_at": 100.0, "cpu_seconds": 0.5}
    from_file = Observation(JobState.COMPLETED, None, 0, {"source": "job file",
                                                          "ended_at": 100.9})
    meta = _with_figures(from_file, record, last).metadata
    assert (meta["queued_at"], meta["started_at"], meta["ended_at"]) == (99.0, 100.2, 100.9)
    # An end the queue told: the record's (whole seconds), but not before the file's start.
    from_queue = Observation(JobState.COMPLETED, None, 0, {"native_state": "COMPLETED"})
    assert _with_figures(from_queue, record, last).metadata["ended_at"] == 100.2
    assert _with_figures(from_queue, record, None).metadata["started_at"] == 100.0
    assert _with_figures(from_queue, None, None) is from_queue
