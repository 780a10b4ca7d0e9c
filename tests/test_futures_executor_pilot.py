"""``psij.futures.FunctionExecutor`` on an in-process ``pilot``: values, map, a call cancelled
while its job waits for a core, a killed job, the pilot's time limit, and calls of one job whose
result files are changed or removed."""

import time
from pathlib import Path
from typing import Iterator

import pytest

from psij import JobAttributes, JobState
from psij.executors.pilot.executor import PilotJobExecutorConfig
from psij.futures import FunctionExecutor, FunctionJobError, FunctionResultError
from psij.futures import _executor as futures_executor
from support import futures_functions as ff

WAIT = 60


def pilot(work: Path, cores: int = 2, **options: object) -> FunctionExecutor:
    config = PilotJobExecutorConfig(cores=cores, work_directory=work, cancel_grace_period=1.0)
    return FunctionExecutor("pilot", config=config, **options)  # type: ignore[arg-type]


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[FunctionExecutor]:
    with pilot(tmp_path / "work") as executor:
        yield executor


def test_values_exceptions_and_map_of_500(ex: FunctionExecutor) -> None:
    assert ex.submit(ff.add, 2, b=3).result(WAIT) == 5
    with pytest.raises(ff.Oops, match="pilot says no"):
        ex.submit(ff.fail, "pilot says no").result(WAIT)
    assert list(ex.map(ff.square, range(500), timeout=WAIT)) == [i * i for i in range(500)]
    assert ex.executor.name == "pilot"


def test_a_call_waiting_for_a_core_is_cancelled_with_its_job(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with pilot(tmp_path / "work", cores=1, pack=1) as ex:
        running = ex.submit(ff.sleep_then, 5, "first", str(marker))
        waiting = ex.submit(ff.square, 3)
        deadline = time.monotonic() + WAIT
        while not marker.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert waiting.cancel() is True
        assert waiting.cancelled()
        assert running.cancel() is False
        assert running.result(WAIT) == "first"
        assert waiting.job.wait(timeout=WAIT).state is JobState.CANCELED  # type: ignore


def test_a_killed_job_and_a_time_limit_fail_their_futures_only(ex: FunctionExecutor,
                                                                tmp_path: Path) -> None:
    killed = ex.submit(ff.kill_myself)
    with pytest.raises(FunctionJobError, match="ended FAILED") as raised:
        killed.result(WAIT)
    assert raised.value.native_id == killed.job.native_id
    limited_attributes = JobAttributes(custom_attributes={"pilot.time_limit": 1})
    with pilot(tmp_path / "work2", attributes=limited_attributes) as limited:
        slow = limited.submit(ff.sleep_then, 60, "never")
        with pytest.raises(FunctionJobError, match="time limit"):
            slow.result(WAIT)
    assert ex.submit(ff.square, 9).result(WAIT) == 81


@pytest.mark.parametrize("action", ["tamper", "remove"])
def test_a_result_file_changed_or_removed_fails_that_call_only(
        ex: FunctionExecutor, action: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Results are read when their job ends: the result watcher, which reads them as soon as
    # they are written, could take call 0's before the next call of its job changes it.
    monkeypatch.setattr(futures_executor, "RESULT_WATCH", 3600.0)
    other = ex.submit(ff.square, 2)
    results = ex.map(ff.hostile, ["first", action, "third"], chunksize=3)
    expected = "signature does not match" if action == "tamper" else "missing"
    with pytest.raises(FunctionResultError, match=expected):
        next(results)
    assert other.result(WAIT) == 4


def test_map_chunks_follow_the_cores_the_pilot_was_given(tmp_path: Path) -> None:
    import psij.registry

    work = tmp_path / "work"
    with pilot(work, cores=1) as ex:
        assert list(ex.map(ff.square, range(40))) == [i * i for i in range(40)]
    psij.registry.flush()
    assert len(psij.registry.find(work_directory=work)) == 4  # 1 core: 4 jobs of 10 calls
