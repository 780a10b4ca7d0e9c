"""Faults of the pilot, run for real: programs that cannot run, values no process can take,
timers out of range, unexpected errors in the engine, children that ignore TERM, executors
dropped without close(), and journals holding garbage; in-process and with ``psij pilot serve``.
"""

import gc
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set

import pytest

import test_pilot_engine as engine_tests
from psij import InvalidJobException, Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.pilot._inline_tasks import InlineTasks
from psij.executors.pilot._local_workers import WORKERS_VARIABLE, LocalWorkers
from psij.executors.pilot._task_process import HAS_PIDFD
from psij.executors.pilot.engine import EngineConfig, PilotEngine, TaskEvent, TaskSpec
from psij.executors.pilot.executor import PilotJobExecutor, PilotJobExecutorConfig
from psij.executors.pilot.scheduler import TaskState
from psij.executors.pilot.service import JOURNAL_NAME, PilotClient, answering, serve_main
from support.process_checks import alive, live_members

make_engine = engine_tests.make_engine  # the fixture, shared
finished = engine_tests.finished
WAIT = 20.0
JOB_WAIT = timedelta(seconds=30)
SUCCEEDED, FAILED, CANCELED = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED

# The leader exits on TERM (bash's wait is interrupted); its child ignores TERM.
STUBBORN_CHILD = ('(trap "" TERM; echo $BASHPID > child.pid; exec sleep 1000) & '
                  'while [ ! -s child.pid ]; do sleep 0.01; done; echo ready > ready; wait')


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + WAIT
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


# -- item: a program that cannot run fails its job with 127 or 126 ----------------------------


def test_a_program_that_cannot_run_fails_its_job_with_127_or_126(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(cores=2))
    try:
        cases = {str(tmp_path / "no" / "such-program"): 127,
                 "psij-no-such-program-on-path": 127, str(plain): 126}
        jobs = {exe: Job(JobSpec(exe)) for exe in cases}
        for job in jobs.values():
            ex.submit(job)  # does not raise, as with a batch executor
        for exe, job in jobs.items():
            st = job.wait(JOB_WAIT)
            assert st is not None and st.state is JobState.FAILED
            assert st.exit_code == cases[exe], (exe, st)
            assert exe in (st.message or "")
    finally:
        ex.close()


# -- item: a bad value never stops an engine -------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2.0 ** 31, 1e300, 0, -1])
def test_time_limits_and_grace_periods_out_of_range_are_refused(value: float) -> None:
    with pytest.raises(ValueError, match="TaskSpec.time_limit"):
        TaskSpec("t", "/bin/true", time_limit=value)
    if value != 0:
        with pytest.raises(ValueError, match="EngineConfig.cancel_grace_period"):
            EngineConfig(cancel_grace_period=value)
        with pytest.raises(ValueError, match="PilotJobExecutorConfig.cancel_grace_period"):
            PilotJobExecutorConfig(cancel_grace_period=value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e12])
def test_a_pilot_time_limit_out_of_range_is_refused_at_submit(value: float) -> None:
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(cores=1))
    try:
        job = Job(JobSpec("/bin/true", attributes=JobAttributes(
            custom_attributes={"pilot.time_limit": value})))
        with pytest.raises(InvalidJobException, match="pilot.time_limit"):
            ex.submit(job)
        assert job.executor is None
        ok = Job(JobSpec("/bin/true"))
        ex.submit(ok)
        assert ok.wait(JOB_WAIT).state is JobState.COMPLETED  # type: ignore[union-attr]
    finally:
        ex.close()


def poison_tasks(tmp_path: Path) -> List[TaskSpec]:
    return [TaskSpec("bad-arg", "/bin/echo", ["ok", "\ud800"]),
            TaskSpec("bad-env", "/bin/true", environment={"BAD": "x\ud800"}),
            TaskSpec("bad-out", "/bin/true", stdout="out-\ud800"),
            TaskSpec("bad-dir", "/bin/true", directory=str(tmp_path / "d\ud800"),
                     create_directories=True)]


def test_lone_surrogates_fail_only_their_own_task(make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(cores=1)
    for task in poison_tasks(tmp_path):
        engine.submit(task)
    engine.submit(TaskSpec("after", "/bin/true"))
    out = finished(engine, "bad-arg", "bad-env", "bad-out", "bad-dir", "after")
    for name in ("bad-arg", "bad-env", "bad-out", "bad-dir"):
        assert out[name].state is FAILED and "surrogate" in (out[name].message or ""), out[name]
    assert "argument 2" in (out["bad-arg"].message or "")
    assert "'BAD'" in (out["bad-env"].message or "")
    assert "stdout" in (out["bad-out"].message or "")
    assert out["after"].state is SUCCEEDED
    assert engine.usage().free_cores == 1


@pytest.mark.parametrize("workers", [None, 1], ids=["started-by-the-engine", "by-a-worker"])
def test_an_unexpected_error_fails_only_its_task(make_engine: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 workers: Optional[int]) -> None:
    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    kind: Any = LocalWorkers if workers or not HAS_PIDFD else InlineTasks
    real_assign = kind.assign

    def assign(self: Any, row: Any) -> None:
        if row[0] == "broken":
            raise RuntimeError("an engine bug")
        real_assign(self, row)

    monkeypatch.setattr(kind, "assign", assign)
    engine = make_engine(cores=1, workers=workers)
    engine.submit(TaskSpec("broken", "/bin/true"))
    engine.submit(TaskSpec("after", "/bin/true"))
    out = finished(engine, "broken", "after")
    assert out["broken"].state is FAILED and "an engine bug" in (out["broken"].message or "")
    assert out["after"].state is SUCCEEDED


def test_resume_skips_a_journaled_task_whose_time_limit_is_infinite(
        make_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Journals written before such values were refused may hold them (JSON's Infinity).
    journal = tmp_path / "journal"
    journal.write_text(
        '{"e":"submit","task":{"name":"poison","executable":"/bin/true",'
        '"time_limit":Infinity}}\n'
        '{"e":"submit","task":{"name":"nan","executable":"/bin/true","time_limit":NaN}}\n'
        '{"e":"submit","task":{"name":"fine","executable":"/bin/true"}}\n')
    caplog.set_level(logging.WARNING)
    engine = make_engine(cores=1, journal=journal, resume=True)
    assert "TaskSpec.time_limit" in caplog.text
    assert finished(engine, "fine")["fine"].state is SUCCEEDED
    assert set(engine.task_ids()) == {"fine"}
    engine.submit(TaskSpec("later", "/bin/true"))
    assert finished(engine, "later")["later"].state is SUCCEEDED


def test_resume_fails_a_journaled_poison_task_again_and_goes_on(
        make_engine: Any, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    first = make_engine(cores=1, journal=journal)
    first.submit(poison_tasks(tmp_path)[0])
    first.submit(TaskSpec("ok", "/bin/true"))
    assert finished(first, "bad-arg", "ok")["bad-arg"].state is FAILED
    first.close()
    for _ in range(2):  # every resume: the poison fails once more, nothing else is held up
        again = make_engine(cores=1, journal=journal, resume=True)
        out = finished(again, "bad-arg", "ok")
        assert out["bad-arg"].state is FAILED and out["ok"].state is SUCCEEDED
        again.submit(TaskSpec(f"new-{time.monotonic_ns()}", "/bin/true"))
        assert again.wait(timeout=WAIT)
        again.close()


# -- the served pilot --------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="pj"))
    yield folder
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def serve(folder: Path, wd: Path, *extra: str) -> "subprocess.Popen[bytes]":
    sock = str(folder / "pilot.sock")
    log = open(folder / f"serve-{time.monotonic_ns()}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "psij", "pilot", "serve", "--socket", sock,
                             "--cores", "1", "--wd", str(wd), *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 30
    while not answering(sock, timeout=1):
        assert proc.poll() is None, "serve exited"
        assert time.monotonic() < deadline, "the pilot did not start"
        time.sleep(0.02)
    return proc


def served_finals(client_events: List[TaskEvent], names: Set[str]) -> Dict[str, TaskEvent]:
    deadline = time.monotonic() + WAIT
    while True:
        finals = {e.task_id: e for e in list(client_events) if e.state.final}
        if names <= set(finals):
            return finals
        assert time.monotonic() < deadline, f"no final state for {names - set(finals)}"
        time.sleep(0.02)


def test_served_pilot_survives_poison_tasks_and_their_resume(short_dir: Path,
                                                             tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    proc = serve(short_dir, wd)
    try:
        events: List[TaskEvent] = []
        client = PilotClient(str(short_dir / "pilot.sock"), on_event=events.append)
        for value in (float("inf"), float("nan"), 1e12):  # JSON's Infinity and NaN
            with pytest.raises(ValueError, match=r"(TaskSpec|tasks\[0\])\.time_limit"):
                client.request("submit", tasks=[{"name": "t", "executable": "/bin/true",
                                                 "time_limit": value}])
        poison = [t.to_json() for t in poison_tasks(tmp_path)[:3]]
        client.request("submit", tasks=[*poison, {"name": "ok", "executable": "/bin/true"}],
                       watch=True)
        finals = served_finals(events, {"bad-arg", "bad-env", "bad-out", "ok"})
        assert {n: e.state for n, e in finals.items()} == {
            "bad-arg": FAILED, "bad-env": FAILED, "bad-out": FAILED, "ok": SUCCEEDED}
        assert "surrogate" in (finals["bad-arg"].message or "")
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "\\ud800" in (wd / JOURNAL_NAME).read_text()
    proc = serve(short_dir, wd, "--resume")
    try:
        events = []
        client = PilotClient(str(short_dir / "pilot.sock"), on_event=events.append)
        client.request("submit", tasks=[{"name": "new", "executable": "/bin/true"}],
                       watch=True)
        assert served_finals(events, {"new"})["new"].state is SUCCEEDED
        deadline = time.monotonic() + WAIT
        while True:
            reply = client.request("status", tasks=["bad-arg", "ok"])
            states = [s["state"] for s in reply["statuses"]]
            if states[0] in ("FAILED", "SUCCEEDED") or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert states == ["FAILED", "SUCCEEDED"]
        assert "surrogate" in reply["statuses"][0]["message"]
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_serve_exits_non_zero_and_fails_waiting_tasks_when_the_engine_cannot_go_on(
        short_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_step(self: PilotEngine) -> bool:
        raise OSError("the engine's loop is broken")

    monkeypatch.setattr(PilotEngine, "_step", broken_step)
    sock = str(short_dir / "pilot.sock")
    seen: Dict[str, Any] = {}

    def client_side() -> None:
        deadline = time.monotonic() + 30
        while not answering(sock, timeout=1) and time.monotonic() < deadline:
            time.sleep(0.02)
        events: List[TaskEvent] = []
        try:
            client = PilotClient(sock, on_event=events.append)
            client.request("submit", tasks=[{"name": "waiting", "executable": "/bin/true"}],
                           watch=True)
            seen["finals"] = served_finals(events, {"waiting"})
        except BaseException as ex:  # reported by the main thread
            seen["error"] = ex
            os.kill(os.getpid(), signal.SIGTERM)  # what ends serve_main when it does not end

    thread = threading.Thread(target=client_side)
    thread.start()
    code = serve_main(sock, cores=1, work_directory=str(tmp_path / "wd"))
    thread.join(30)
    assert code == 1
    assert "error" not in seen, seen.get("error")
    event = seen["finals"]["waiting"]
    assert event.state is FAILED and "the engine's loop is broken" in (event.message or "")


# -- item: cancel kills the whole job; a share is freed when its group is empty -------------


def test_cancel_kills_a_child_that_ignores_term_before_the_task_ends(
        make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(cores=1, cancel_grace_period=1.0)
    engine.submit(TaskSpec("stubborn", "/bin/bash", ["-c", STUBBORN_CHILD],
                           directory=str(tmp_path)))
    wait_for_file(tmp_path / "ready")
    pgid = os.getpgid(int((tmp_path / "child.pid").read_text()))
    engine.cancel("stubborn")
    assert finished(engine, "stubborn")["stubborn"].state is CANCELED
    # Its end (and the release of its core) came only once nothing of its group was left.
    assert live_members(pgid) == []
    assert engine.usage().free_cores == 1


def test_a_task_ends_when_what_its_leader_left_running_is_gone(make_engine: Any,
                                                                tmp_path: Path) -> None:
    engine = make_engine(cores=1, cancel_grace_period=1.0)
    engine.submit(TaskSpec("leaves", "/bin/bash", ["-c", "sleep 1000 & echo $! > bg.pid"],
                           directory=str(tmp_path)))
    status = finished(engine, "leaves")["leaves"]
    assert status.state is SUCCEEDED and status.exit_code == 0
    background = int((tmp_path / "bg.pid").read_text())
    assert not alive(background), "the task ended while a process it started still ran"
    assert engine.usage().free_cores == 1



def test_cancelling_a_job_of_the_executor_kills_its_stubborn_child(tmp_path: Path) -> None:
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(cores=1, cancel_grace_period=1.0))
    try:
        job = Job(JobSpec("/bin/bash", ["-c", STUBBORN_CHILD], directory=tmp_path))
        ex.submit(job)
        wait_for_file(tmp_path / "ready")
        pgid = os.getpgid(int((tmp_path / "child.pid").read_text()))
        job.cancel()
        st = job.wait(JOB_WAIT)
        assert st is not None and st.state is JobState.CANCELED
        assert live_members(pgid) == []
    finally:
        ex.close()


# -- item: dropped executors leave nothing behind -------------------------------------------


def _fds() -> Set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def _pilot_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("psij-pilot")]


def _settle(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"still there: {what}"
        gc.collect()
        time.sleep(0.02)


def test_a_dropped_in_process_executor_leaves_nothing_behind(tmp_path: Path) -> None:
    _settle(lambda: not _pilot_threads(), "threads of earlier tests")
    before = _fds()
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(cores=1))
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    assert job.wait(JOB_WAIT).state is JobState.COMPLETED  # type: ignore[union-attr]
    engine = ex._engine
    assert engine is not None and engine._run_dir is not None
    run_dir = engine._run_dir
    del ex, job, engine
    gc.collect()
    _settle(lambda: not _pilot_threads(), "the engine thread")
    _settle(lambda: not run_dir.exists(), f"the run folder {run_dir}")
    _settle(lambda: _fds() <= before, f"descriptors {_fds() - before}")


def test_close_releases_every_descriptor_of_the_engine(make_engine: Any) -> None:
    _settle(lambda: not _pilot_threads(), "threads of earlier tests")
    before = _fds()
    engine = make_engine(cores=1)
    engine.submit(TaskSpec("t", "/bin/true"))
    assert finished(engine, "t")["t"].state is SUCCEEDED
    engine.close()
    assert _fds() <= before, f"left open: {_fds() - before}"
    assert not _pilot_threads()


def test_a_dropped_client_executor_leaves_nothing_behind(short_dir: Path,
                                                         tmp_path: Path) -> None:
    proc = serve(short_dir, tmp_path / "wd")
    try:
        _settle(lambda: not _pilot_threads(), "threads of earlier tests")
        before = _fds()
        ex = JobExecutor.get_instance("pilot", url=str(short_dir / "pilot.sock"))
        job = Job(JobSpec("/bin/true"))
        ex.submit(job)
        assert job.wait(JOB_WAIT).state is JobState.COMPLETED  # type: ignore[union-attr]
        del ex, job
        gc.collect()
        _settle(lambda: not _pilot_threads(), "the client's thread")
        _settle(lambda: _fds() <= before, f"descriptors {_fds() - before}")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


# -- item: a journal with garbage never stops a resume ----------------------------------------


def test_resume_skips_garbage_journal_records_with_a_warning(
        make_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = tmp_path / "journal"
    lines = [
        json.dumps({"e": "submit", "task": {"name": "ok", "executable": "/bin/true"}}),
        json.dumps({"e": "start", "id": "ok", "pid": "\u00b2", "run": "r"}),
        '{"e":"start","id":"ok","pid":1e400,"run":"r"}',
        json.dumps({"e": "start", "id": "ok", "pid": 10 ** 30, "run": "r"}),
        json.dumps({"e": "start", "id": "ok", "pid": [1], "run": "r"}),
        json.dumps({"e": "end", "id": ["ok"], "state": "FAILED"}),
        json.dumps({"e": "submit", "task": "not a task"}),
        json.dumps({"e": "submit"}),
        json.dumps([1, 2, 3]),
        "\u00b2\u00b3 not json at all",
        json.dumps({"e": "submit", "task": {"name": "also", "executable": "/bin/true",
                                            "priority": "\u00b2"}}),
        json.dumps({"e": "submit", "task": {"name": "second", "executable": "/bin/true"}}),
    ]
    journal.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\x00\n")
    caplog.set_level(logging.WARNING)
    engine = make_engine(cores=1, journal=journal, resume=True)
    out = finished(engine, "ok", "second")
    assert out["ok"].state is SUCCEEDED and out["second"].state is SUCCEEDED
    assert "also" not in engine.task_ids()
    assert "skipped" in caplog.text


@pytest.mark.parametrize("custom,words", [
    ({"psij.signal_before_end": "USR1@30"}, "no time limit (custom attribute pilot.time_limit"),
    ({"psij.signal_before_end": "USR1@30", "pilot.time_limit": 30},
     "30 s before the end is not within"),
    ({"psij.signal_before_end": "BOGUS@3", "pilot.time_limit": 30}, "'BOGUS' is not a signal")])
def test_a_signal_before_the_end_without_room_is_refused_at_submit(custom: Dict[str, Any],
                                                                   words: str) -> None:
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(cores=1))
    try:
        job = Job(JobSpec("/bin/true", attributes=JobAttributes(custom_attributes=custom)))
        with pytest.raises(InvalidJobException, match="psij.signal_before_end") as info:
            ex.submit(job)
        assert words in str(info.value)
        assert job.executor is None
    finally:
        ex.close()
