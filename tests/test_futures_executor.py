"""``psij.futures.FunctionExecutor`` on the ``local`` executor, run for real: values,
exceptions with their remote tracebacks, map, large results, files removed or kept, jobs that
end without a result, bad options and values that cannot travel."""

import concurrent.futures
import math
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import pytest

from psij import JobAttributes, JobExecutor, JobExecutorConfig, JobState
from psij.executors.local import LocalJobExecutorConfig
from psij.futures import (
    FunctionExecutor,
    FunctionFuture,
    FunctionJobError,
    RemoteTraceback,
)
from psij.futures._executor import job_name
from support import futures_functions as ff

WAIT = 60


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path / "work"


@pytest.fixture
def ex(work: Path) -> Iterator[FunctionExecutor]:
    config = LocalJobExecutorConfig(work_directory=work, cancel_grace_period=1.0)
    with FunctionExecutor("local", config=config) as executor:
        yield executor


def call_directories(work: Path) -> list:
    return [p for p in (work / "functions").iterdir() if p.is_dir()]


def test_values_of_every_kind_come_back(ex: FunctionExecutor) -> None:
    assert ex.submit(ff.square, 12).result(WAIT) == 144
    assert ex.submit(ff.add, 1, b=2, c=3).result(WAIT) == 6
    values = {"nan": float("nan"), "inf": float("-inf"), "big": 10 ** 400, "neg": -7,
              "text": "caf\u00e9 \ud800 lone", "bytes": bytes(range(256))}
    back = ex.submit(ff.echo, values).result(WAIT)
    assert math.isnan(back["nan"]) and back["inf"] == float("-inf")
    assert {k: v for k, v in back.items() if k != "nan"} == {
        k: v for k, v in values.items() if k != "nan"}
    # A lambda and a closure travel by value.
    offset = 5
    assert ex.submit(lambda x: x + offset, 1).result(WAIT) == 6


def test_the_future_knows_its_job_and_the_job_its_name(ex: FunctionExecutor) -> None:
    future = ex.submit(ff.square, 3)
    assert isinstance(future, FunctionFuture) and isinstance(future, concurrent.futures.Future)
    assert future.result(WAIT) == 9
    assert future.job.id == future.job_id
    assert future.job.spec is not None and future.job.spec.name == "fn:square"
    assert future.job.status.state is JobState.COMPLETED
    assert job_name("f.<locals>.<lambda>\ud800") == "fn:f._locals_._lambda__"


def test_an_exception_keeps_its_type_message_and_remote_traceback(ex: FunctionExecutor
                                                                  ) -> None:
    future = ex.submit(ff.fail, "the message")
    with pytest.raises(ff.Oops, match="the message") as raised:
        future.result(WAIT)
    cause = raised.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fail" in str(cause) and "futures_functions.py" in str(cause)
    assert "Oops: the message" in str(cause)
    # The bare text, set off by quotes only when shown inside the local traceback.
    assert cause.text.startswith("Traceback (most recent call last):")
    assert str(cause) == f'\n"""\n{cause.text}"""'


def test_map_of_500_items_in_order_and_few_jobs(ex: FunctionExecutor, work: Path) -> None:
    start = time.monotonic()
    assert list(ex.map(ff.square, range(500))) == [i * i for i in range(500)]
    assert time.monotonic() - start < WAIT
    # Packed: far fewer jobs than calls, each recorded in the registry.
    import psij.registry

    psij.registry.flush()
    jobs = psij.registry.find(work_directory=work)
    assert 1 < len(jobs) < 100
    assert list(ex.map(ff.add, [1, 2], [10, 20], chunksize=1)) == [11, 22]
    assert list(ex.map(ff.square, [])) == []


def test_a_100_mb_result_comes_back_and_files_are_removed(ex: FunctionExecutor,
                                                         work: Path) -> None:
    size = 100 * 1000 * 1000
    future = ex.submit(ff.big, size)
    value = future.result(WAIT * 2)
    assert len(value) == size and value[:3] == b"ZZZ"
    # The result may be read (by the early result watcher) before the job's end is handled,
    # which removes the files: they are gone once the job has ended.
    assert future.job.wait(WAIT) is not None
    assert call_directories(work) == []


def test_keep_files_keeps_the_call_directory_private(work: Path) -> None:
    config = JobExecutorConfig(work_directory=work)
    with FunctionExecutor("local", config=config, keep_files=True) as ex:
        assert ex.submit(ff.square, 2).result(WAIT) == 4
    [directory] = call_directories(work)
    assert sorted(p.name for p in directory.iterdir()) == [
        "c0.claim", "c0.out", "calls.in", "stderr", "stdout"]
    assert (work / "functions").stat().st_mode & 0o777 == 0o700
    assert directory.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in directory.iterdir()} == {0o600}
    assert (work / "functions" / "key").stat().st_mode & 0o777 == 0o600


def test_a_job_killed_outright_fails_its_future_with_the_exit_code(ex: FunctionExecutor
                                                                   ) -> None:
    future = ex.submit(ff.kill_myself)
    with pytest.raises(FunctionJobError) as raised:
        future.result(WAIT)
    text = str(raised.value)
    assert "ended FAILED after the call had started" in text
    assert raised.value.status is not None and raised.value.status.state is JobState.FAILED
    assert raised.value.job_id == future.job_id
    # Other calls are not hurt.
    assert ex.submit(ff.square, 4).result(WAIT) == 16


def test_a_job_cancelled_while_running_fails_its_future(ex: FunctionExecutor,
                                                        tmp_path: Path) -> None:
    marker = tmp_path / "started"
    future = ex.submit(ff.sleep_then, 60, "never", str(marker))
    deadline = time.monotonic() + WAIT
    while not marker.exists():
        assert time.monotonic() < deadline, "the call did not start"
        time.sleep(0.05)
    assert future.cancel() is False  # it runs: concurrent.futures semantics
    future.job.cancel()
    with pytest.raises(FunctionJobError, match="ended CANCELED"):
        future.result(WAIT)


def test_a_time_limit_fails_the_future_saying_so(work: Path) -> None:
    config = LocalJobExecutorConfig(work_directory=work, enforce_duration=True,
                                    cancel_grace_period=1.0)
    attributes = JobAttributes(duration=timedelta(seconds=1))
    with FunctionExecutor("local", config=config, attributes=attributes) as ex:
        future = ex.submit(ff.sleep_then, 60, "never")
        with pytest.raises(FunctionJobError, match="time limit"):
            future.result(WAIT)


def test_a_python_without_psij_fails_quoting_the_jobs_stderr(work: Path) -> None:
    python = "/usr/bin/python3"
    probe = subprocess.run([python, "-c", "import psij"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("the system Python has psij")
    config = JobExecutorConfig(work_directory=work)
    with FunctionExecutor("local", config=config, python=python) as ex:
        with pytest.raises(FunctionJobError, match="No module named 'psij'"):
            ex.submit(ff.square, 2).result(WAIT)


def test_values_that_cannot_be_pickled_are_refused_at_submit_by_name(ex: FunctionExecutor
                                                                     ) -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"submit: the function \(.*\) cannot be serialized"):
        ex.submit(lambda: lock.locked())
    with pytest.raises(TypeError, match="submit: argument 1 .*_thread.lock"):
        ex.submit(ff.add, 1, lock)
    with pytest.raises(TypeError, match="submit: keyword argument 'b'"):
        ex.submit(ff.add, 1, b=lock)
    with pytest.raises(TypeError, match="map item 2: argument 0"):
        ex.map(ff.echo, [1, 2, lock])
    with pytest.raises(TypeError, match="expected a callable"):
        ex.submit(42)  # type: ignore[arg-type]
    # A value that cannot come back fails its own future only.
    bad = ex.submit(ff.return_a_lock)
    good = ex.submit(ff.square, 5)
    with pytest.raises(FunctionJobError, match="returned a value that cannot be pickled"):
        bad.result(WAIT)
    assert good.result(WAIT) == 25


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"pack": float("nan")}, TypeError, "FunctionExecutor.pack: expected None or an int"),
    ({"pack": 0}, ValueError, "FunctionExecutor.pack: expected None or an int from 1"),
    ({"pack": -3}, ValueError, "FunctionExecutor.pack"),
    ({"pack": 10 ** 30}, ValueError, "FunctionExecutor.pack"),
    ({"pack": True}, TypeError, "FunctionExecutor.pack"),
    ({"python": ""}, ValueError, "FunctionExecutor.python: expected the path"),
    ({"python": "py\ud800"}, ValueError, "FunctionExecutor.python: .* lone surrogate"),
    ({"environment": {"A": "\ud800"}}, ValueError, r"FunctionExecutor.environment\['A'\]"),
    ({"environment": {"A": 1.5}}, TypeError, r"FunctionExecutor.environment\['A'\]"),
    ({"keep_files": "yes"}, TypeError, "FunctionExecutor.keep_files"),
    ({"attributes": {"duration": 1}}, TypeError, "FunctionExecutor.attributes"),
    ({"work_directory": "w\ud800"}, ValueError, "FunctionExecutor.work_directory"),
])
def test_bad_options_are_refused_naming_the_field(work: Path, options: dict,
                                                  error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        FunctionExecutor("local", config=JobExecutorConfig(work_directory=work), **options)


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"timeout": float("nan")}, ValueError, "map timeout"),
    ({"timeout": -1}, ValueError, "map timeout"),
    ({"chunksize": 0}, ValueError, "map chunksize"),
    ({"chunksize": float("inf")}, TypeError, "map chunksize"),
    ({"chunksize": -(10 ** 30)}, ValueError, "map chunksize"),
])
def test_bad_map_options_are_refused_naming_the_field(ex: FunctionExecutor, options: dict,
                                                      error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ex.map(ff.square, [1], **options)
    assert ex.submit(ff.square, 3).result(WAIT) == 9


def test_a_work_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by group or others"):
        FunctionExecutor("local", config=JobExecutorConfig(work_directory=tmp_path / "w"),
                         work_directory=shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(PermissionError, match="symbolic link"):
        FunctionExecutor("local", config=JobExecutorConfig(work_directory=tmp_path / "w"),
                         work_directory=link)


def test_a_lone_surrogate_in_a_function_name_is_harmless(ex: FunctionExecutor) -> None:
    def odd(x: int) -> int:
        return x + 1

    odd.__qualname__ = "odd\ud800name"
    future = ex.submit(odd, 1)
    assert future.result(WAIT) == 2
    assert future.job.spec is not None and future.job.spec.name == "fn:odd_name"


def test_shutdown_refuses_new_calls_and_closes_what_it_made(work: Path) -> None:
    ex = FunctionExecutor("local", config=JobExecutorConfig(work_directory=work))
    futures = [ex.submit(ff.square, i) for i in range(5)]
    ex.shutdown(wait=True)
    assert [f.result(0) for f in futures] == [0, 1, 4, 9, 16]
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(ff.square, 1)
    given = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=work))
    with FunctionExecutor(given) as mine:
        assert mine.submit(ff.square, 2).result(WAIT) == 4
    with pytest.raises(ValueError, match="url and config"):
        FunctionExecutor(given, config=JobExecutorConfig(work_directory=work))
    given.close()


def test_shutdown_cancel_futures_cancels_the_calls_not_started(work: Path,
                                                               tmp_path: Path) -> None:
    ex = FunctionExecutor("local", config=LocalJobExecutorConfig(
        work_directory=work, cancel_grace_period=1.0), pack=1)
    futures = [ex.submit(ff.sleep_then, 0.5, i) for i in range(3)]
    ex.shutdown(wait=True, cancel_futures=True)
    for future in futures:
        assert future.done()
        assert future.cancelled() or isinstance(future.exception(0), FunctionJobError) \
            or future.result(0) in (0, 1, 2)


def test_psij_list_and_status_show_function_jobs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = home / ".psij" / "work"
    with FunctionExecutor("local", config=JobExecutorConfig(work_directory=work)) as ex:
        future = ex.submit(ff.square, 6)
        assert future.result(WAIT) == 36
    import psij.registry

    psij.registry.flush()
    env = dict(os.environ, HOME=str(home))
    psij = [sys.executable, "-m", "psij"]
    listed = subprocess.run([*psij, "list"], env=env, capture_output=True, text=True,
                            timeout=WAIT)
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if future.job_id in line)
    assert "fn:square" in line and "COMPLETED" in line
    status = subprocess.run([*psij, "status", future.job_id], env=env, capture_output=True,
                            text=True, timeout=WAIT)
    assert status.returncode == 0, status.stderr
    assert "fn:square" in status.stdout and "COMPLETED" in status.stdout


def test_as_completed_and_wait_see_every_future(ex: FunctionExecutor) -> None:
    futures = [ex.submit(ff.square, i) for i in range(20)]
    done = {f.result() for f in concurrent.futures.as_completed(futures, timeout=WAIT)}
    assert done == {i * i for i in range(20)}
    finished, pending = concurrent.futures.wait(futures, timeout=WAIT)
    assert len(finished) == 20 and not pending


def test_packed_calls_cancelled_at_once_are_cancelled_or_done_and_none_hangs(
        work: Path) -> None:
    config = LocalJobExecutorConfig(work_directory=work, cancel_grace_period=1.0)
    with FunctionExecutor("local", config=config, pack=8) as ex:
        futures = [ex.submit(ff.square, i) for i in range(40)]
        answers = [future.cancel() for future in futures]
        finished, pending = concurrent.futures.wait(futures, timeout=WAIT)
        assert not pending and len(finished) == 40
        for i, (future, answer) in enumerate(zip(futures, answers)):
            assert future.cancelled() is answer
            if not answer:
                assert future.result(0) == i * i
        assert any(answers)
        assert ex.submit(ff.square, 5).result(WAIT) == 25


def test_import_loads_no_executor_and_cloudpickle_waits_for_a_call(work: Path) -> None:
    code = ("import sys\n"
            "import psij, psij.futures\n"
            "heavy = [m for m in ('cloudpickle', 'psij.job', 'psij.futures._executor') "
            "if m in sys.modules]\n"
            "assert heavy == [], heavy\n"
            "from psij.futures import FunctionExecutor\n"
            "assert 'cloudpickle' not in sys.modules\n"
            "import subprocess\n"
            "probe = subprocess.run([sys.executable, '-c', 'import sys, psij; "
            "print(\"psij.futures\" in sys.modules)'], capture_output=True, text=True)\n"
            "print(probe.stdout.strip())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_an_executor_dropped_without_shutdown_is_collected_and_leaves_no_thread(
        work: Path) -> None:
    import gc
    import weakref

    before = set(threading.enumerate())
    executor = FunctionExecutor("local", config=LocalJobExecutorConfig(work_directory=work))
    assert executor.submit(ff.add, 2, 3).result(WAIT) == 5
    gone = weakref.ref(executor)
    del executor
    deadline = time.monotonic() + WAIT
    while gone() is not None:  # its threads end once it has nothing queued or running
        assert time.monotonic() < deadline, "the executor is still referenced"
        time.sleep(0.05)
        gc.collect()
    names = ("psij-function-packer", "psij-futures-results")
    assert [t for t in set(threading.enumerate()) - before if t.name in names] == []
