"""The pilot engine's time rules on a manual clock: task time limits, the journal's fsync
interval and agents' connect deadlines, with no sleeping."""

import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from psij._clock import ManualClock
from psij.executors.pilot.allocation import configured_allocation, local_allocation
from psij.executors.pilot.engine import EngineConfig, PilotEngine, TaskEvent, TaskSpec
from psij.executors.pilot.journal import Journal
from psij.executors.pilot.resources import NodeSpec
from psij.executors.pilot.scheduler import TaskState

WAIT = 30.0  # a cap on waiting for real processes, never a measure


class _States:
    """A listener that lets a test wait for a task to reach a state."""

    def __init__(self) -> None:
        self.seen: Dict[str, List[TaskState]] = {}
        self._changed = threading.Condition()

    def __call__(self, event: TaskEvent) -> None:
        with self._changed:
            self.seen.setdefault(event.task_id, []).append(event.state)
            self._changed.notify_all()

    def reached(self, task_id: str, state: TaskState) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: state in self.seen.get(task_id, []), WAIT)


def test_the_engine_kills_a_task_when_its_clock_passes_the_time_limit(tmp_path: Path) -> None:
    clock = ManualClock()
    engine = PilotEngine(local_allocation(2),
                         EngineConfig(work_directory=tmp_path, tmp_root=tmp_path,
                                      cancel_grace_period=1.0), clock=clock)
    states = _States()
    engine.add_listener(states)
    engine.start()
    try:
        engine.submit(TaskSpec("slow", "/bin/sleep", ["60"], time_limit=5.0))
        assert states.reached("slow", TaskState.RUNNING)
        clock.advance(4.9)
        # A task submitted after the clock moved ends only after the engine has looked at
        # its timers again: the slow task must then still run.
        engine.submit(TaskSpec("probe", "/bin/true"))
        assert engine.wait(["probe"], timeout=WAIT)
        assert engine.status("slow").state is TaskState.RUNNING
        clock.advance(0.2)
        engine._wake()  # a manual clock tells nobody that it moved
        assert engine.wait(["slow"], timeout=WAIT)
        status = engine.status("slow")
        assert status.state is TaskState.FAILED and status.exit_code == 143
        assert "exceeded its time limit of 5 s" in (status.message or "")
    finally:
        engine.close()


def test_the_journal_fsyncs_at_most_once_a_second_of_its_clock(tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    import psij.executors.pilot.journal as journal_module

    synced: List[int] = []
    monkeypatch.setattr(journal_module.os, "fsync", lambda fd: synced.append(fd))
    clock = ManualClock()
    journal = Journal(tmp_path / "j" / "journal", clock)
    assert journal.due() is None
    journal.write(['{"e":"cancel","id":"a"}\n'])
    assert journal.due() == 1.0
    clock.advance(0.5)
    journal.sync()
    assert synced == [] and journal.due() == 0.5
    clock.advance(0.5)
    journal.sync()
    assert len(synced) == 1 and journal.due() is None
    journal.close()
    assert (tmp_path / "j" / "journal").read_text() == '{"e":"cancel","id":"a"}\n'


def test_an_agent_that_does_not_connect_in_time_loses_its_node(tmp_path: Path) -> None:
    clock = ManualClock()
    # The launcher starts nothing that connects: the agent never says hello.
    allocation = configured_allocation([NodeSpec("far", 1)],
                                       agent_launcher=["/bin/sh", "-c", "exec sleep 30", "--"])
    engine = PilotEngine(allocation, EngineConfig(work_directory=tmp_path, tmp_root=tmp_path,
                                                  agent_connect_timeout=10.0), clock=clock)
    engine.start()
    try:
        engine.submit(TaskSpec("remote", "/bin/true"))
        assert engine.status("remote").state in (TaskState.QUEUED, TaskState.RUNNING)
        clock.advance(10.5)
        engine._wake()
        assert engine.wait(["remote"], timeout=WAIT)
        status = engine.status("remote")
        assert status.state is TaskState.FAILED
        assert "its agent did not connect within 10 s" in (status.message or "")
    finally:
        engine.close()


def test_the_served_pilot_pauses_accepting_by_its_clock(tmp_path: Path) -> None:
    import errno
    import socket

    from psij.executors.pilot.service import PilotService

    clock = ManualClock()
    engine = PilotEngine(local_allocation(1), EngineConfig(work_directory=tmp_path))
    service = PilotService(engine, str(tmp_path / "p.sock"), clock=clock)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(tmp_path / "p.sock"))
        listener.listen(1)
        service._listener = listener
        service._selector.register(listener, 1, None)
        full = OSError(errno.EMFILE, "Too many open files")
        service._pause_accepting(full)
        assert listener not in service._selector.get_map()
        assert service._resume_accepting() == 0.05
        clock.advance(0.04)
        assert service._resume_accepting() == pytest.approx(0.01)
        clock.advance(0.02)
        assert service._resume_accepting() is None
        assert listener in service._selector.get_map()
        service._pause_accepting(full)  # failing again: twice as long
        assert service._resume_accepting() == 0.1
    finally:
        listener.close()
        service._selector.close()


# On USR1 it writes a checkpoint and exits 0; without it, it would sleep on.
_CHECKPOINT_ON_USR1 = ("trap 'echo USR1 > checkpoint; exit 0' USR1; echo ready > ready; "
                       "sleep 60 & wait")


def test_the_engine_sends_the_signal_asked_for_before_the_time_limit(tmp_path: Path) -> None:
    clock = ManualClock()
    engine = PilotEngine(local_allocation(2),
                         EngineConfig(work_directory=tmp_path, tmp_root=tmp_path,
                                      cancel_grace_period=1.0), clock=clock)
    states = _States()
    engine.add_listener(states)
    engine.start()
    try:
        engine.submit(TaskSpec("warned", "/bin/bash", ["-c", _CHECKPOINT_ON_USR1],
                               directory=str(tmp_path), time_limit=60.0,
                               end_signal="SIGUSR1@20"))
        assert states.reached("warned", TaskState.RUNNING)
        cap = time.monotonic() + WAIT
        while not (tmp_path / "ready").exists():  # its trap is set
            assert time.monotonic() < cap
            time.sleep(0.02)
        clock.advance(39.9)
        engine.submit(TaskSpec("probe", "/bin/true"))  # the engine has looked at its timers
        assert engine.wait(["probe"], timeout=WAIT)
        assert engine.status("warned").state is TaskState.RUNNING
        assert not (tmp_path / "checkpoint").exists()
        clock.advance(0.2)
        engine._wake()
        assert engine.wait(["warned"], timeout=WAIT)
        status = engine.status("warned")
        assert status.state is TaskState.SUCCEEDED and status.exit_code == 0, status
        assert (tmp_path / "checkpoint").read_text() == "USR1\n"
    finally:
        engine.close()


@pytest.mark.parametrize("value,limit,words", [
    ("USR1@60", 60.0, "TaskSpec.end_signal: 60 s before the end is not within"),
    ("USR1@5", None, "TaskSpec.end_signal: the job has no time limit (TaskSpec.time_limit"),
    ("KILL@5", 60.0, "TaskSpec.end_signal: 'KILL' is not a signal"),
    (float("nan"), 60.0, "TaskSpec.end_signal: expected SIGNAL@SECONDS")])
def test_a_task_signal_that_cannot_be_sent_is_refused(value: Any, limit: Any,
                                                      words: str) -> None:
    with pytest.raises(ValueError) as info:
        TaskSpec("t", "/bin/true", time_limit=limit, end_signal=value)
    assert words in str(info.value)


def test_a_task_signal_goes_through_json() -> None:
    spec = TaskSpec("t", "/bin/true", time_limit=60.0, end_signal="usr2@ 10")
    assert spec.end_signal == "USR2@10"
    assert TaskSpec.from_json(spec.to_json()) == spec
