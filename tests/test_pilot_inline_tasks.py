"""The engine starting its node's tasks itself on a small node (``_inline_tasks``): when it does,
what a task sees, the guard worker that takes the tasks along when the pilot is killed, and a
guard killed outright."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Set

import pytest

import test_pilot_engine as engine_tests
from psij.executors.pilot._inline_tasks import INLINE_MAX_CORES, InlineTasks, inline_fits
from psij.executors.pilot._local_workers import WORKERS_VARIABLE, LocalWorkers
from psij.executors.pilot._task_process import HAS_PIDFD
from psij.executors.pilot.engine import PilotEngine, TaskSpec
from psij.executors.pilot.scheduler import TaskState
from support.process_checks import alive
from test_pilot_local_workers_faults import SLEEPER, pids_of, sleeper, wait_until

make_engine = engine_tests.make_engine  # the fixture, shared
finished = engine_tests.finished
WAIT = 30.0
PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")
SUCCEEDED, FAILED, RUNNING = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.RUNNING

needs_pidfd = pytest.mark.skipif(not HAS_PIDFD, reason="the engine starts tasks itself only "
                                                       "where pidfds exist (Linux 5.3+)")


def test_inline_only_on_a_small_node_with_no_number_of_workers_asked() -> None:
    watch = object()
    assert INLINE_MAX_CORES == 3
    for cores in (1, 2, 3):
        assert inline_fits(cores, None, {}, watch) is HAS_PIDFD  # type: ignore[arg-type]
    assert not inline_fits(4, None, {}, watch)  # type: ignore[arg-type]
    assert not inline_fits(64, None, {}, watch)  # type: ignore[arg-type]
    assert not inline_fits(2, 1, {}, watch)  # type: ignore[arg-type]
    assert not inline_fits(2, None, {WORKERS_VARIABLE: "1"}, watch)  # type: ignore[arg-type]
    # A value the workers' limit ignores still says workers were asked for.
    assert not inline_fits(2, None, {WORKERS_VARIABLE: "many"}, watch)  # type: ignore[arg-type]
    assert not inline_fits(2, None, {}, None)


def parent_of_task(engine: PilotEngine, tmp_path: Path, name: str) -> int:
    path = tmp_path / f"{name}.ppid"
    engine.submit(TaskSpec(name, "/bin/sh", ["-c", f'echo $PPID > "{path}"']))
    assert finished(engine, name)[name].state is SUCCEEDED
    return int(path.read_text())


@needs_pidfd
def test_a_small_node_starts_tasks_in_the_engine_a_larger_or_configured_one_in_workers(
        make_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    small = make_engine(cores=2)
    assert isinstance(small._workers, InlineTasks)
    assert parent_of_task(small, tmp_path, "small") == os.getpid()
    configured = make_engine(cores=2, workers=1)
    assert isinstance(configured._workers, LocalWorkers)
    assert parent_of_task(configured, tmp_path, "configured") != os.getpid()
    large = make_engine(cores=INLINE_MAX_CORES + 1)
    assert isinstance(large._workers, LocalWorkers)
    assert parent_of_task(large, tmp_path, "large") != os.getpid()
    monkeypatch.setenv(WORKERS_VARIABLE, "1")
    by_variable = make_engine(cores=2)
    assert isinstance(by_variable._workers, LocalWorkers)


@needs_pidfd
def test_a_task_started_by_the_engine_sees_what_a_workers_task_sees(
        make_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Same variables, a private TMPDIR, a node file, output where asked, exit codes and
    # failures to start reported as through a worker.
    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    seen: Dict[str, str] = {}
    for mode, config in (("inline", {}), ("worker", {"workers": 1})):
        engine = make_engine(cores=2, **config)
        script = ('echo "$QCG_PM_STEP_ID $(cat "$PSIJ_NODEFILE") $(stat -c %a "$TMPDIR") '
                  '$QCG_PM_NPROCS"; exit 3')
        engine.submit_many([
            TaskSpec(f"{mode}-a", "/bin/sh", ["-c", script], stdout=f"{mode}-a.out",
                     directory=str(tmp_path)),
            TaskSpec(f"{mode}-missing", str(tmp_path / "nothing-here")),
            TaskSpec(f"{mode}-after", "/bin/true")])
        out = finished(engine, f"{mode}-a", f"{mode}-missing", f"{mode}-after")
        assert out[f"{mode}-a"].state is FAILED and out[f"{mode}-a"].exit_code == 3
        missing = out[f"{mode}-missing"]
        assert missing.state is FAILED and missing.exit_code == 127
        assert "could not start the task" in (missing.message or "")
        assert RUNNING not in [s for _, s in missing.history]
        assert out[f"{mode}-after"].state is SUCCEEDED
        text = (tmp_path / f"{mode}-a.out").read_text()
        seen[mode] = text.replace(mode, "MODE")
    assert seen["inline"] == seen["worker"]
    assert seen["inline"].split()[2] == "700"


@needs_pidfd
def test_cancel_and_time_limit_end_a_task_the_engine_started(
        make_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    engine = make_engine(cores=2, cancel_grace_period=0.5)
    assert isinstance(engine._workers, InlineTasks)
    engine.submit_many([sleeper(tmp_path, "cancelled"),
                        TaskSpec("limited", "/bin/sleep", ["600"], time_limit=0.3)])
    pids = pids_of(tmp_path, "cancelled")
    wait_until(lambda: engine.status("cancelled").state is RUNNING, "never ran")
    engine.cancel("cancelled")
    out = finished(engine, "cancelled", "limited")
    assert out["cancelled"].state is TaskState.CANCELED
    assert out["limited"].state is FAILED
    assert "time limit" in (out["limited"].message or "")
    # The task's whole group ended, its child too.
    wait_until(lambda: not any(alive(p) for p in (pids[0], pids[2])),
               "the cancelled task's processes outlived it", timeout=10)


def run_pilot(tmp_path: Path, names: Any, cores: int) -> "subprocess.Popen[bytes]":
    requests = [{"request": "submit", "jobs": [
        {"name": name, "execution": {"exec": "/bin/sh", "args": [
            "-c", SLEEPER.format(name=tmp_path / name)]}} for name in names]},
        {"request": "control", "command": "finishAfterAllTasksDone"}]
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests))
    env = {k: v for k, v in os.environ.items() if k != WORKERS_VARIABLE}
    return subprocess.Popen([PSIJ_SCRIPT, "pilot", "run", str(path), "--cores", str(cores),
                             "--wd", str(tmp_path / "wd")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@needs_pidfd
def test_a_killed_pilot_takes_the_tasks_it_started_itself_along(tmp_path: Path) -> None:
    names = ["t0", "t1"]
    pilot = run_pilot(tmp_path, names, 2)
    try:
        pids = {n: pids_of(tmp_path, n) for n in names}
    finally:
        pilot.kill()
        pilot.wait()
    assert {trio[1] for trio in pids.values()} == {pilot.pid}  # started by the engine
    everyone: Set[int] = {p for trio in pids.values() for p in (trio[0], trio[2])}
    wait_until(lambda: not any(alive(p) for p in everyone),
               "tasks outlived the pilot that started them", timeout=10)


@needs_pidfd
def test_a_guard_killed_outright_harms_no_task_and_is_replaced(
        make_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    engine = make_engine(cores=2)
    tasks = engine._workers
    assert isinstance(tasks, InlineTasks)
    guards = tasks._guard._workers
    wait_until(lambda: len(guards) == 1, "no guard started")
    guard = next(iter(guards.values())).pid
    engine.submit(sleeper(tmp_path, "running"))
    pids = pids_of(tmp_path, "running")
    os.kill(guard, signal.SIGKILL)
    wait_until(lambda: not guards, "the guard's end was never seen")
    # The engine's own task runs on; the next task starts, and a new guard with it.
    assert engine.status("running").state is RUNNING and all(alive(p) for p in pids)
    assert parent_of_task(engine, tmp_path, "next") == os.getpid()
    wait_until(lambda: len(guards) == 1, "no new guard")
    assert next(iter(guards.values())).pid != guard
    engine.cancel("running")
    assert finished(engine, "running")["running"].state is TaskState.CANCELED


@needs_pidfd
def test_a_guard_told_to_stop_kills_nothing_and_one_that_lost_its_engine_kills_only_its_run(
        tmp_path: Path) -> None:
    # The guard alone, on its pipes: two processes marked with its run and one marked with
    # another run; closing its input without "stop" ends the first two only.
    from psij.executors.pilot import _local_workers
    from psij.executors.pilot.journal import RUN_VARIABLE

    path = str(Path(_local_workers.__file__).resolve().parents[3])
    boot = _local_workers._BOOT.format(path=path)
    mine, other = "a" * 16, "b" * 16

    def marked(run: str, task: str) -> "subprocess.Popen[bytes]":
        return subprocess.Popen(["/bin/sleep", "600"], start_new_session=True, env={
            **os.environ, RUN_VARIABLE: run, "QCG_PM_STEP_ID": task})

    def guard() -> "subprocess.Popen[bytes]":
        return subprocess.Popen(
            [sys.executable, "-c", boot, "--parent", str(os.getpid()), "--tmp-root",
             str(tmp_path / "tmp"), "--grace", "1", "--guard", mine],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=tmp_path)

    victims = [marked(mine, "x"), marked(mine, "y")]
    bystander = marked(other, "x")
    try:
        stopped = guard()
        assert stopped.stdin is not None
        stopped.stdin.write(b'{"op": "stop"}\n')
        stopped.stdin.close()
        assert stopped.wait(timeout=WAIT) == 0
        assert all(v.poll() is None for v in victims)
        lost = guard()
        assert lost.stdin is not None
        lost.stdin.close()
        assert lost.wait(timeout=WAIT) == 0
        for victim in victims:
            assert victim.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for process in (*victims, bystander):
            if process.poll() is None:
                process.kill()
                process.wait()


@needs_pidfd
def test_a_guard_that_cannot_start_is_said_once_and_the_tasks_still_run(
        make_engine: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from psij.executors._process import LaunchError

    def refuse(self: Any) -> None:
        raise LaunchError("no interpreter for the guard")

    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    monkeypatch.setattr(LocalWorkers, "_start_worker", refuse)
    caplog.set_level("WARNING")
    engine = make_engine(cores=2)
    names = [f"t{i}" for i in range(6)]
    for name in names:  # one flush each: a retry on every flush would say it every time
        engine.submit(TaskSpec(name, "/bin/true"))
        assert finished(engine, name)[name].state is SUCCEEDED
    assert caplog.text.count("no interpreter for the guard") == 1
