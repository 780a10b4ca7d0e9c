"""``psij.futures.FunctionExecutor`` on a batch executor (``batch-test``, the real batch code
path against the fake scheduler): one call per job, ``map`` as one ``submit_many``, and a
job killed by a signal reported with the scheduler's reason."""

from pathlib import Path
from typing import Iterator

import pytest

from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.futures import FunctionExecutor, FunctionJobError
from support import futures_functions as ff

WAIT = 120


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[FunctionExecutor]:
    config = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=0.1)
    with FunctionExecutor("batch-test", config=config) as executor:
        yield executor


def test_each_call_is_a_job_and_map_goes_in_one_submit_many(ex: FunctionExecutor,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    batches = []
    submit_many = ex.executor.submit_many

    def recorded(jobs: object) -> None:
        listed = list(jobs)  # type: ignore[call-overload]
        batches.append(len(listed))
        submit_many(listed)

    monkeypatch.setattr(ex.executor, "submit_many", recorded)
    first, second = ex.submit(ff.square, 5), ex.submit(ff.square, 6)
    assert first.job_id != second.job_id
    assert [first.result(WAIT), second.result(WAIT)] == [25, 36]
    assert list(ex.map(ff.square, range(6), timeout=WAIT)) == [0, 1, 4, 9, 16, 25]
    assert batches == [6]


def test_a_job_killed_by_a_signal_reports_the_schedulers_reason(ex: FunctionExecutor) -> None:
    future = ex.submit(ff.kill_myself)
    with pytest.raises(FunctionJobError) as raised:
        future.result(WAIT)
    text = str(raised.value)
    assert "ended FAILED after the call had started" in text and "exit code 137" in text
    assert "SIGKILL" in text
    assert raised.value.status is not None and raised.value.status.metadata


def test_results_come_when_written_not_when_a_poll_sees_the_job_end(tmp_path: Path) -> None:
    # Polls every 600 s and no look at the jobs' end files: only the result watcher can settle
    # the calls in time. The function's exception comes early as well; the job's own end is
    # told by the poll, later.
    config = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=600,
                                     initial_queue_polling_delay=600, watch_files=False)
    with FunctionExecutor("batch-test", config=config) as ex:
        futures = [ex.submit(ff.square, 7), ex.submit(ff.fail, "early")]
        assert futures[0].result(WAIT) == 49
        with pytest.raises(ff.Oops, match="early"):
            futures[1].result(WAIT)
        assert all(not f.job.status.state.final for f in futures)  # no poll has seen them end
        assert list(ex.map(ff.square, range(4), timeout=WAIT)) == [0, 1, 4, 9]
        ex.shutdown(wait=False)  # the jobs' ends are still to be seen by a poll

