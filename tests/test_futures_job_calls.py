"""The books of one function job: what each of its futures gets when the job ends (a value,
the function's exception, an error for a result changed, removed or never written, with the
job's reason), cancelled calls left alone, and the call directory removed or kept."""

import os
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from psij import Job, JobState, JobStatus
from psij.futures import FunctionJobError, FunctionResultError, _run, _wire
from psij.futures import _job_calls as job_calls_module
from psij.futures._future import FunctionFuture
from psij.futures._job_calls import JobCalls
from support import futures_functions as ff
from support.futures_calls import call_directory


def books(tmp_path: Path, count: int, keep_files: bool = False
          ) -> Tuple[JobCalls, List[FunctionFuture], List[JobCalls]]:
    work, directory = call_directory(tmp_path / "w", [(ff.square, (i,), {})
                                                      for i in range(count)])
    futures = [FunctionFuture("square") for _ in range(count)]
    ended: List[JobCalls] = []
    calls = JobCalls(work, directory, futures, keep_files, ended.append)
    calls.bind(Job())
    return calls, futures, ended


def end(calls: JobCalls, state: JobState, **fields: object) -> None:
    assert calls.job is not None
    calls.status_changed(calls.job, JobStatus(state, **fields))  # type: ignore[arg-type]


def test_a_changed_result_fails_its_call_only_and_the_files_go(tmp_path: Path) -> None:
    calls, futures, ended = books(tmp_path, 3)
    _run.run_directory(calls.directory)
    path = _wire.result_file(calls.directory, 1)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 0x40
    Path(path).write_bytes(bytes(data))
    end(calls, JobState.COMPLETED)
    assert futures[0].result(0) == 0 and futures[2].result(0) == 4
    with pytest.raises(FunctionResultError, match="signature does not match"):
        futures[1].result(0)
    assert not os.path.exists(calls.directory) and ended == [calls]


def test_a_result_removed_or_never_written_says_how_the_job_ended(tmp_path: Path) -> None:
    calls, futures, _ = books(tmp_path, 3, keep_files=True)
    _run.run_directory(calls.directory)
    os.unlink(_wire.result_file(calls.directory, 0))
    os.unlink(_wire.result_file(calls.directory, 2))
    os.unlink(_wire.claim_file(calls.directory, 2))  # as if the job died before it
    with open(os.path.join(calls.directory, "stderr"), "w") as stderr:
        stderr.write("MemoryError: the last words\n")
    end(calls, JobState.FAILED, message="out of memory", exit_code=137,
        metadata={"reason": "OOM"})
    with pytest.raises(FunctionJobError) as started:
        futures[0].result(0)
    text = str(started.value)
    assert "ended FAILED after the call had started" in text
    for part in ("out of memory", "exit code 137", "'reason': 'OOM'", "the last words"):
        assert part in text
    assert futures[1].result(0) == 1
    with pytest.raises(FunctionJobError, match="ended FAILED without a result") as lost:
        futures[2].result(0)
    assert os.path.isdir(calls.directory)  # keep_files
    assert str(lost.value).count("exit code 137") == 1


def test_an_exit_code_the_message_gives_is_not_said_twice(tmp_path: Path) -> None:
    calls, futures, _ = books(tmp_path, 1)
    end(calls, JobState.FAILED, message="killed by SIGTERM (exit code 143)", exit_code=143)
    with pytest.raises(FunctionJobError) as failed:
        futures[0].result(0)
    assert str(failed.value).count("exit code 143") == 1, str(failed.value)


def test_a_completed_job_without_a_result_is_a_result_error(tmp_path: Path) -> None:
    calls, futures, _ = books(tmp_path, 1)
    end(calls, JobState.COMPLETED)
    with pytest.raises(FunctionResultError, match="completed but left no result"):
        futures[0].result(0)


def test_cancel_claims_calls_not_started_and_only_those(tmp_path: Path) -> None:
    calls, futures, _ = books(tmp_path, 3)
    assert _wire.claim(calls.directory, 0, _wire.CLAIM_RUN)  # the runner took call 0
    assert futures[0].cancel() is False and not futures[0].done()
    assert futures[1].cancel() is True and futures[1].cancelled()
    assert futures[1].cancel() is True  # again: still cancelled
    _run.run_directory(calls.directory)  # runs call 2 only: 0 is claimed, 1 cancelled
    assert not os.path.exists(_wire.result_file(calls.directory, 0))
    end(calls, JobState.COMPLETED)
    assert futures[1].cancelled() and futures[2].result(0) == 4
    with pytest.raises(FunctionResultError):
        futures[0].result(0)
    assert futures[2].cancel() is False  # done


def test_the_job_is_cancelled_once_no_call_of_it_is_left(tmp_path: Path) -> None:
    calls, futures, _ = books(tmp_path, 2)
    cancelled: List[str] = []

    class Recorder(Job):
        def cancel(self) -> None:
            cancelled.append(self.id)

    job = Recorder()
    calls.bind(job)
    assert futures[0].cancel()
    assert cancelled == []
    assert futures[1].cancel()
    assert cancelled == [job.id]
    end(calls, JobState.CANCELED)
    assert all(f.cancelled() for f in futures)


def test_on_another_host_a_call_is_cancelled_only_with_its_whole_queued_job(
        tmp_path: Path) -> None:
    # The runner there cannot see a claim made here: cancelling one call of a pack, or a call
    # whose job has started, would let it run while its future says cancelled.
    cancelled: List[str] = []

    class Recorder(Job):
        def cancel(self) -> None:
            cancelled.append(self.id)

    def remote_books(count: int, state: JobState) -> Tuple[JobCalls, List[FunctionFuture]]:
        work, directory = call_directory(tmp_path / f"r{count}{state.name}",
                                         [(ff.square, (i,), {}) for i in range(count)])
        futures = [FunctionFuture("square") for _ in range(count)]
        calls = JobCalls(work, directory, futures, False, lambda _: None, remote=True)
        job = Recorder()
        job._status = JobStatus(state)
        calls.bind(job)
        return calls, futures

    for state in (JobState.NEW, JobState.ACTIVE):
        _, [future] = remote_books(1, state)
        assert future.cancel() is False and not future.done(), state
    _, pair = remote_books(2, JobState.QUEUED)
    assert pair[0].cancel() is False and pair[1].cancel() is False
    assert cancelled == []
    calls, [future] = remote_books(1, JobState.QUEUED)
    assert future.cancel() is True and future.cancelled()
    assert cancelled == [calls.job.id]  # type: ignore[union-attr]


def test_on_another_host_results_are_taken_at_the_jobs_end_only(tmp_path: Path) -> None:
    # They come back with the job's stage-out, just before its remote folder is removed: a
    # future settled then would let the executor be closed before that removal.
    work, directory = call_directory(tmp_path / "w", [(ff.square, (3,), {})])
    futures = [FunctionFuture("square")]
    calls = JobCalls(work, directory, futures, False, lambda _: None, remote=True)
    calls.bind(Job())
    _run.run_directory(directory)  # as if the stage-out had brought the result back
    calls.collect_early()
    assert not futures[0].done()
    end(calls, JobState.COMPLETED)
    assert futures[0].result(0) == 9


def test_a_second_final_status_changes_nothing(tmp_path: Path) -> None:
    calls, futures, ended = books(tmp_path, 1)
    _run.run_directory(calls.directory)
    end(calls, JobState.COMPLETED)
    end(calls, JobState.FAILED)
    assert futures[0].result(0) == 0 and len(ended) == 1


def test_results_written_before_the_job_ends_are_collected_early_and_only_those(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, futures, ended = books(tmp_path, 4, keep_files=True)
    calls.collect_early()  # nothing written yet
    assert not any(f.done() for f in futures)
    _run.run_directory(calls.directory)
    # Call 1's result changed, call 2's still being written (under its other name), call 3's
    # the record of a call that could not run: all three wait for the job's end.
    path = _wire.result_file(calls.directory, 1)
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 0x40
    Path(path).write_bytes(bytes(data))
    written = _wire.result_file(calls.directory, 2)
    os.rename(written, written + ".part")
    os.unlink(_wire.result_file(calls.directory, 3))
    _wire.write_signed(_wire.result_file(calls.directory, 3), calls.work.key,
                       {"format": _wire.FORMAT, "call": f"{calls.name}/3",
                        "python": _wire.python_version(), "outcome": "error",
                        "message": "no such function"}, b"")
    reads = []
    real_load = job_calls_module.load_result

    def counted(*args: Any) -> Any:
        reads.append(args[0])
        return real_load(*args)

    monkeypatch.setattr(job_calls_module, "load_result", counted)
    calls.collect_early()
    assert futures[0].result(0) == 0 and ended == []
    assert not any(f.done() for f in futures[1:])
    assert len(reads) == 3  # calls 0, 1 and 3 (2 is not whole yet)
    calls.collect_early()  # the unusable ones (1 and 3) are not read again before the end
    assert len(reads) == 3
    assert not os.path.exists(written) and os.path.exists(written + ".part")
    end(calls, JobState.FAILED, message="killed", exit_code=137)
    with pytest.raises(FunctionResultError, match="signature does not match"):
        futures[1].result(0)
    with pytest.raises(FunctionJobError, match="ended FAILED after the call had started"):
        futures[2].result(0)
    with pytest.raises(FunctionJobError, match="could not be run: no such function"):
        futures[3].result(0)
    assert ended == [calls]
    calls.collect_early()  # after the end: nothing changes
    assert futures[0].result(0) == 0
