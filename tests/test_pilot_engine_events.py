"""The engine acts on typed events: each kind by its type, and an error while acting on one
about a task fails that task alone."""

from pathlib import Path
from typing import Any

import pytest

from psij.executors.pilot._engine_events import (
    TASK_EVENTS,
    AgentLauncherExited,
    CloseRequested,
    EndSignalDue,
    KillTask,
    StopRequested,
    TaskExited,
    TimeLimitReached,
)
from psij.executors.pilot.allocation import local_allocation
from psij.executors.pilot.engine import EngineConfig, PilotEngine, TaskSpec
from psij.executors.pilot.scheduler import TaskState

WAIT = 30.0  # a cap on waiting for real processes, never a measure


def test_events_are_values() -> None:
    assert TaskExited("a", 3) == TaskExited("a", 3, None) != TaskExited("a", 4)
    assert hash(TimeLimitReached("a", 2)) == hash(TimeLimitReached("a", 2))
    assert CloseRequested() == CloseRequested() and StopRequested() != CloseRequested()
    assert repr(AgentLauncherExited("n1", 1)) == "AgentLauncherExited(node='n1', code=1)"
    with pytest.raises(AttributeError, match="immutable"):
        KillTask("a").task_id = "b"  # type: ignore[misc]
    assert all(hasattr(kind("a", 1), "task_id")
               for kind in (TaskExited, TimeLimitReached, EndSignalDue))
    # The signal before a time limit is about one task: an error sending it fails that task.
    assert set(TASK_EVENTS) == {TaskExited, KillTask, TimeLimitReached, EndSignalDue}


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    made = PilotEngine(local_allocation(2), EngineConfig(work_directory=tmp_path,
                                                         tmp_root=tmp_path,
                                                         cancel_grace_period=1.0))
    made.start()
    yield made
    made.close()


def _running(engine: PilotEngine, *names: str) -> None:
    import time

    deadline = time.monotonic() + WAIT
    while any(engine.status(n).state is not TaskState.RUNNING for n in names):
        assert time.monotonic() < deadline, "tasks did not start"
        time.sleep(0.01)


def test_a_posted_kill_stops_that_task_only(engine: PilotEngine) -> None:
    engine.submit_many([TaskSpec("a", "/bin/sleep", ["60"]), TaskSpec("b", "/bin/sleep", ["60"])])
    _running(engine, "a", "b")
    engine._post(KillTask("a"))
    assert engine.wait(["a"], timeout=WAIT)
    assert engine.status("a").state is TaskState.FAILED and engine.status("a").exit_code == 143
    assert engine.status("b").state is TaskState.RUNNING
    engine.cancel("b")
    assert engine.wait(["b"], timeout=WAIT)
    assert engine.status("b").state is TaskState.CANCELED


def test_an_error_acting_on_a_task_event_fails_that_task_alone(
        engine: PilotEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: PilotEngine, task_id: str, run: int) -> None:
        raise RuntimeError(f"no time limit rule for {task_id}")

    monkeypatch.setattr(PilotEngine, "_on_time_limit", broken)
    engine.submit_many([TaskSpec("a", "/bin/sleep", ["60"]), TaskSpec("b", "/bin/sleep", ["60"])])
    _running(engine, "a", "b")
    engine._post(TimeLimitReached("a", 1))
    assert engine.wait(["a"], timeout=WAIT)
    status = engine.status("a")
    assert status.state is TaskState.FAILED
    assert "unexpected error" in (status.message or "") and "no time limit rule for a" in (
        status.message or "")
    assert engine.status("b").state is TaskState.RUNNING and engine.failure is None
    engine.cancel("b")
    assert engine.wait(["b"], timeout=WAIT)
