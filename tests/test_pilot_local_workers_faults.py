"""The pilot's worker processes (``_worker``, ``_local_workers``) under faults: a worker killed
outright, the pilot killed outright, a burst of tasks; and how many workers an engine starts."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Set

import pytest

import test_pilot_engine as engine_tests
from psij.executors.pilot._local_workers import WORKERS_VARIABLE, worker_limit
from psij.executors.pilot.engine import PilotEngine, TaskSpec
from psij.executors.pilot.engine_config import EngineConfig
from psij.executors.pilot.scheduler import TaskState
from support.process_checks import alive

make_engine = engine_tests.make_engine  # the fixture, shared
finished = engine_tests.finished
WAIT = 30.0
PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")
SUCCEEDED, FAILED, RUNNING = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.RUNNING

# Each task leaves its pid, its worker's pid and the pid of a child of its own (in its group),
# then waits.
SLEEPER = 'sleep 600 & echo "$$ $PPID $!" > "{name}.pids"; wait'


def sleeper(tmp_path: Path, name: str) -> TaskSpec:
    return TaskSpec(name, "/bin/sh", ["-c", SLEEPER.format(name=tmp_path / name)])


def pids_of(tmp_path: Path, name: str) -> List[int]:
    path = tmp_path / f"{name}.pids"
    deadline = time.monotonic() + WAIT
    while True:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return [int(p) for p in text.split()]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def wait_until(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def state(engine: PilotEngine, name: str) -> TaskState:
    return engine.status(name).state


def test_a_worker_killed_fails_its_tasks_and_ends_their_processes_only(
        make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(cores=4, workers=2)
    names = ["a", "b", "c", "d"]
    engine.submit_many([sleeper(tmp_path, n) for n in names])
    pids = {n: pids_of(tmp_path, n) for n in names}
    workers = {n: p[1] for n, p in pids.items()}
    assert len(set(workers.values())) == 2  # busy with its share, the first got a second
    victim = workers["a"]
    doomed = [n for n in names if workers[n] == victim]
    spared = [n for n in names if workers[n] != victim]
    wait_until(lambda: all(state(engine, n) is RUNNING for n in names), "tasks never ran")
    os.kill(victim, signal.SIGKILL)
    assert engine.wait(doomed, timeout=WAIT)
    for name in doomed:
        status = engine.status(name)
        assert status.state is FAILED
        assert f"worker process {victim} ended, killed by signal 9" in (status.message or "")
    orphans = [p for n in doomed for p in (pids[n][0], pids[n][2])]
    wait_until(lambda: not any(alive(p) for p in orphans),
               "the processes of its tasks outlived the worker", timeout=10)
    # The other worker's tasks run on, undisturbed.
    for name in spared:
        assert state(engine, name) is RUNNING
        assert all(alive(p) for p in pids[name])
    # The next task goes to a new worker.
    engine.submit(TaskSpec("next", "/bin/sh", ["-c", f'echo $PPID > {tmp_path / "next.ppid"}']))
    assert finished(engine, "next")["next"].state is SUCCEEDED
    worker = int((tmp_path / "next.ppid").read_text())
    assert worker not in workers.values() and alive(worker)
    for name in spared:
        engine.cancel(name)
    assert engine.wait(spared, timeout=WAIT)
    assert all(state(engine, n) is TaskState.CANCELED for n in spared)


def test_a_killed_pilot_takes_its_workers_and_their_tasks_along(tmp_path: Path) -> None:
    names = [f"t{i}" for i in range(3)]
    requests = [{"request": "submit", "jobs": [
        {"name": name, "execution": {"exec": "/bin/sh", "args": [
            "-c", SLEEPER.format(name=tmp_path / name)]}} for name in names]},
        {"request": "control", "command": "finishAfterAllTasksDone"}]
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests))
    pilot = subprocess.Popen([PSIJ_SCRIPT, "pilot", "run", str(path), "--cores", "3",
                              "--wd", str(tmp_path / "wd")], env={
        **os.environ, WORKERS_VARIABLE: "2"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        pids = {n: pids_of(tmp_path, n) for n in names}
    finally:
        pilot.kill()
        pilot.wait()
    everyone: Set[int] = {p for trio in pids.values() for p in trio}
    assert len({trio[1] for trio in pids.values()}) == 2  # two workers
    wait_until(lambda: not any(alive(p) for p in everyone),
               "workers or tasks outlived the pilot", timeout=10)


def test_a_burst_of_2000_tasks_all_end_with_exit_code_0(make_engine: Any) -> None:
    engine = make_engine(cores=4, workers=2)
    engine.submit_many([TaskSpec(f"t{i}", "/bin/true") for i in range(2000)])
    assert engine.wait(timeout=120)
    codes: Dict[Any, int] = {}
    for status in engine.statuses():
        key = (status.state, status.exit_code)
        codes[key] = codes.get(key, 0) + 1
    assert codes == {(SUCCEEDED, 0): 2000}


def test_workers_start_on_demand_up_to_the_limit(make_engine: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKERS_VARIABLE, "3")
    engine = make_engine(cores=6)
    engine.submit(sleeper(tmp_path, "first"))
    first = pids_of(tmp_path, "first")[1]
    names = [f"s{i}" for i in range(5)]
    engine.submit_many([sleeper(tmp_path, n) for n in names])
    workers = {pids_of(tmp_path, n)[1] for n in names} | {first}
    assert len(workers) == 3
    for name in ["first", *names]:
        engine.cancel(name)
    assert engine.wait(timeout=WAIT)


def test_the_number_of_workers_follows_the_config_the_variable_then_the_cores(
        caplog: pytest.LogCaptureFixture) -> None:
    assert worker_limit(16, 5, {WORKERS_VARIABLE: "2"}) == 5
    assert worker_limit(16, None, {WORKERS_VARIABLE: "2"}) == 2
    assert worker_limit(16, None, {}) == 5
    assert worker_limit(2, None, {}) == 1
    for bad in ("0", "-1", "many", "1.5", "nan", "inf", "1025", "9" * 400, "\u0663",
                "\ud800", "2\n3"):
        assert worker_limit(9, None, {WORKERS_VARIABLE: bad}) == 3
    assert "PSIJ_PILOT_WORKERS" in caplog.text and "from 1 to 1024" in caplog.text
    assert worker_limit(9, None, {WORKERS_VARIABLE: " 1024 "}) == 1024
    for bad_config in (0, -1, 1025, 10 ** 30):
        with pytest.raises(ValueError, match="EngineConfig.workers"):
            EngineConfig(workers=bad_config)
    for wrong in (1.5, "2", True, float("nan")):
        with pytest.raises(TypeError, match="EngineConfig.workers"):
            EngineConfig(workers=wrong)


def test_a_task_that_cannot_start_fails_with_the_shells_code_through_a_worker(
        make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(cores=1, workers=1)
    engine.submit_many([TaskSpec("missing", str(tmp_path / "nothing-here")),
                        TaskSpec("after", "/bin/true")])
    out = finished(engine, "missing", "after")
    assert out["missing"].state is FAILED and out["missing"].exit_code == 127
    assert "could not start the task" in (out["missing"].message or "")
    assert [s for _, s in out["missing"].history].count(RUNNING) == 0
    assert out["after"].state is SUCCEEDED


def test_a_worker_skips_what_it_cannot_follow_and_reports_in_batches(tmp_path: Path) -> None:
    # The worker alone, on its pipes: a line that is not JSON, a request of an unknown shape
    # and a task it cannot start harm nothing else; two tasks come back in one report.
    from psij.executors.pilot import _local_workers

    path = str(Path(_local_workers.__file__).resolve().parents[3])
    boot = _local_workers._BOOT.format(path=path)
    worker = subprocess.Popen(
        [sys.executable, "-c", boot, "--parent", str(os.getpid()), "--tmp-root",
         str(tmp_path / "tmp"), "--grace", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=tmp_path)
    assert worker.stdin is not None and worker.stdout is not None

    def row(name: str, argv: List[str]) -> List[Any]:
        return [name, argv, str(tmp_path), {"QCG_PM_STEP_ID": name}, True, None, f"{name}.out",
                None, "here\n", False]

    requests = [b"not json\n", b'{"op": "signal", "tasks": 5}\n', json.dumps(
        {"op": "spawn", "tasks": [
            ["bad"],
            row("missing", [str(tmp_path / "nothing")]),
            row("a", ["/bin/sh", "-c", 'echo "$QCG_PM_STEP_ID $(cat "$PSIJ_NODEFILE")"']),
            row("b", ["/bin/sh", "-c", "exit 3"])]}).encode() + b"\n"]
    worker.stdin.write(b"".join(requests))
    worker.stdin.flush()
    ended: Dict[str, Any] = {}
    use: Dict[str, Any] = {}  # the figures of each end: CPU seconds and peak bytes, if any
    reports = 0
    while len(ended) < 4:
        line = worker.stdout.readline()
        assert line, "the worker stopped"
        report = json.loads(line)
        reports += 1
        ended.update({task_id: (code, message) for task_id, code, message, *_ in report["ended"]})
        use.update({entry[0]: entry[3:] for entry in report["ended"]})
    worker.stdin.close()
    assert worker.wait(timeout=WAIT) == 0
    worker.stdout.close()
    assert worker.stderr is not None
    with worker.stderr:
        complaints = worker.stderr.read()
    assert reports <= 3  # one per turn of its loop, not one per task
    assert ended["bad"][0] is None and "unexpected error" in ended["bad"][1]
    assert ended["missing"][0] == 127 and "could not start the task" in ended["missing"][1]
    assert ended["a"] == (0, None)
    assert ended["b"][0] == 3
    # A task it reaped comes with its process's use; one that never started with none.
    assert use["bad"] == use["missing"] == []
    for name in ("a", "b"):
        cpu, rss = use[name]
        assert isinstance(cpu, float) and 0 <= cpu < 60 and isinstance(rss, int) and rss > 0
    assert (tmp_path / "a.out").read_text() == "a here\n"
    assert b"cannot be read" in complaints and b"cannot be followed" in complaints
    assert not (tmp_path / "tmp").exists()  # its TMPDIRs go with it
