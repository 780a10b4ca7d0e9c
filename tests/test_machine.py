"""What the state machines share (``psij._machine``): one ``IllegalEvent`` class, defined once
and raised by every machine for an event it cannot accept, and one way to find the rule for an
event (a table from event class to method, made once per machine class by ``StateMachine``
from the methods marked ``@handles``)."""

import ast
import collections
import logging
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

import psij
from psij import JobState, JobStatus
from psij._machine import EventTable, IllegalEvent, StateMachine, handles
from psij.controller import (
    ActionDone,
    JobStatusChanged,
    Log,
    Peer,
    Started,
)
from psij.controller import (
    Connected as ConnectedEvent,
)
from psij.executors.batch import _holding, _tracking
from psij.executors.local import _pool_machine as _local_pool
from psij.executors.pilot import scheduler as _scheduler
from psij.executors.pilot.resources import ResourcePool, ResourceRequest
from psij.flows.machine import FlowConfig, FlowMachine
from psij.supervise import Settings, Supervisor

SRC = Path(psij.__file__).resolve().parent


def test_illegal_event_is_defined_once_in_the_whole_package() -> None:
    defined = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        defined += [str(path.relative_to(SRC)) for node in ast.walk(tree)
                    if isinstance(node, ast.ClassDef) and node.name == "IllegalEvent"]
    assert defined == ["_machine.py"]


def test_the_machine_helper_imports_nothing_of_psij() -> None:
    tree = ast.parse((SRC / "_machine.py").read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)]
    assert not [name for name in imported if name.split(".")[0] == "psij"]


def test_every_machine_raises_the_one_class() -> None:
    for module in (_local_pool, _holding, _tracking, _scheduler):
        assert module.IllegalEvent is IllegalEvent
    pool = _local_pool.LocalPool(_local_pool.Amounts(1, None, None))
    with pytest.raises(IllegalEvent):
        pool.step(_local_pool.Ended("never-arrived"))
    tasks = _scheduler.Scheduler(ResourcePool.uniform(1, 1))
    with pytest.raises(IllegalEvent, match="'ghost' is not a task"):
        tasks.step(_scheduler.TaskFinished("ghost", True))


# -- the helper ------------------------------------------------------------------------------

class _Ping:
    pass


class _Pong:
    pass


class _LoudPing(_Ping):
    pass


class _Counter(StateMachine):
    def __init__(self) -> None:
        self.seen: List[str] = []

    def step(self, event: object) -> str:
        result: str = self.event_handlers[type(event)](self, event)
        return result

    @handles(_Ping)
    def _ping(self, event: _Ping) -> str:
        self.seen.append("ping")
        return "ping"

    @handles(_Pong)
    def _pong(self, event: _Pong) -> str:
        self.seen.append("pong")
        return "pong"


def test_the_table_is_made_once_per_class_from_the_marked_methods() -> None:
    assert isinstance(_Counter.event_handlers, EventTable)
    assert dict(_Counter.event_handlers) == {_Ping: _Counter._ping, _Pong: _Counter._pong}
    counter = _Counter()
    assert counter.event_handlers is _Counter.event_handlers  # not one per machine
    assert [counter.step(_Ping()), counter.step(_Pong())] == ["ping", "pong"]
    assert StateMachine.event_handlers == {}  # the base has no rule of its own


def test_an_unknown_event_raises_illegal_event_naming_its_class_and_changes_nothing() -> None:
    counter = _Counter()
    with pytest.raises(IllegalEvent, match="unknown event int"):
        counter.step(3)
    # The table takes exact classes: a subclass of an event class is an event of its own.
    with pytest.raises(IllegalEvent, match="unknown event _LoudPing"):
        counter.step(_LoudPing())
    assert counter.seen == []
    assert _LoudPing not in _Counter.event_handlers  # a miss adds nothing to the table


def test_a_subclass_inherits_the_table_and_may_add_or_replace_rules() -> None:
    class Louder(_Counter):
        @handles(_Pong, _LoudPing)
        def _loud(self, event: object) -> str:
            return "loud"

    assert Louder.event_handlers == {_Ping: _Counter._ping, _Pong: Louder._loud,
                                     _LoudPing: Louder._loud}
    assert _Counter.event_handlers[_Pong] is _Counter._pong  # the base's table is its own
    assert Louder().step(_Pong()) == "loud"


def test_two_methods_of_one_class_for_one_event_are_refused() -> None:
    with pytest.raises(TypeError, match="_Ping is taken by both _a and _b"):
        class Twice(StateMachine):
            @handles(_Ping)
            def _a(self, event: object) -> None:
                pass

            @handles(_Ping)
            def _b(self, event: object) -> None:
                pass


@pytest.mark.parametrize("events", [(), ("Ping",), (_Ping, 3)])
def test_handles_takes_event_classes_only(events: Tuple[Any, ...]) -> None:
    with pytest.raises(TypeError, match="handles: expected one or more event classes"):
        handles(*events)


# -- every machine goes through the helper ----------------------------------------------------

def _holding_machine() -> _holding.Holding:
    machine = _holding.Holding(1)
    machine.step(_holding.Arrived("a", "small", 1))
    machine.step(_holding.Arrived("b", "small", 2))
    machine.step(_holding.Submitted("a"))
    return machine


def _pool_machine() -> _local_pool.LocalPool:
    machine = _local_pool.LocalPool(_local_pool.Amounts(2, None, None))
    machine.step(_local_pool.Arrived("a", _local_pool.Amounts(2, None, None), 0))
    machine.step(_local_pool.Arrived("b", _local_pool.Amounts(1, None, None), 0))
    return machine


def _supervisor() -> Supervisor:
    machine = Supervisor(Settings({"executable": "/bin/server"}, None, "/out", "unix:/s", 4,
                                  5.0, True, 3, True, 60.0, 30.0),
                         new_token=lambda: "t", marker="m")
    machine.step(Started(), 0.0)
    machine.step(ActionDone(0, "submit", "42"), 0.0)
    machine.step(JobStatusChanged(0, JobStatus(JobState.QUEUED)), 1.0)
    machine.step(ConnectedEvent(1, Peer(-1, -1, -1, ""), "unix"), 1.0)
    return machine


def _task_scheduler() -> _scheduler.Scheduler:
    machine = _scheduler.Scheduler(ResourcePool.uniform(2, 2))
    for name, cores, after in (("a", 2, ()), ("b", 2, ()), ("c", 1, ("a",)), ("d", 4, ())):
        request = ResourceRequest.from_qcg({"exact": cores})
        machine.step(_scheduler.TaskSubmitted(_scheduler.TaskRequest(name, request,
                                                                     after=after)))
    machine.step(_scheduler.SucceededBefore("done", "it"))
    machine.step(_scheduler.SCHEDULE)
    return machine


# (machine class, a machine with some state, its step as a function of one event)
MACHINES: List[Tuple[type, Callable[[], Any], Callable[[Any, Any], Any]]] = [
    (_holding.Holding, _holding_machine, lambda m, e: m.step(e)),
    (_local_pool.LocalPool, _pool_machine, lambda m, e: m.step(e)),
    (Supervisor, _supervisor, lambda m, e: m.step(e, 2.0)),
    (_scheduler.Scheduler, _task_scheduler, lambda m, e: m.step(e)),
]


def _snapshot(value: Any, depth: int = 0, seen: Optional[Dict[int, int]] = None) -> Any:
    """A machine's state as plain values, to compare before and after a step; an object met
    again (the pilot scheduler's queues and tasks point at each other) is shown by the
    order in which it was first met."""
    assert depth < 12
    if seen is None:
        seen = {}
    if type(value).__module__.startswith("psij.") and not isinstance(value, Enum) \
            and not hasattr(value, "_fields"):
        if id(value) in seen:
            return ("seen", seen[id(value)])
        seen[id(value)] = len(seen)
    if isinstance(value, Enum):
        return value
    if isinstance(value, dict):
        return {k: _snapshot(v, depth + 1, seen) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        items = [_snapshot(v, depth + 1, seen) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if callable(value):
        return "callable"
    slots = getattr(type(value), "__slots__", None)
    if slots is not None and not hasattr(value, "__dict__"):
        return (type(value).__name__,
                {s: _snapshot(getattr(value, s), depth + 1, seen) for s in slots})
    if hasattr(value, "__dict__") and type(value).__module__.startswith("psij.") \
            and not hasattr(value, "_fields"):
        return (type(value).__name__, _snapshot(vars(value), depth + 1, seen))
    return value


@pytest.mark.parametrize("cls, make, step", MACHINES, ids=[m[0].__name__ for m in MACHINES])
def test_each_machine_dispatches_through_the_one_table(cls: type, make: Callable[[], Any],
                                                       step: Callable[[Any, Any], Any]) -> None:
    assert issubclass(cls, StateMachine)
    table = cls.__dict__["event_handlers"]
    assert isinstance(table, EventTable) and table
    assert "_handlers" not in vars(make())  # no second table per machine
    # No chain of tests on the event's class is left in ``step``.
    assert "isinstance" not in cls.step.__code__.co_names  # type: ignore[attr-defined]
    assert "type" in cls.step.__code__.co_names  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls, make, step", MACHINES, ids=[m[0].__name__ for m in MACHINES])
@pytest.mark.parametrize("event", [object(), "Arrived", _Ping()], ids=["object", "str", "Ping"])
def test_an_unknown_event_raises_and_leaves_each_machine_unchanged(
        cls: type, make: Callable[[], Any], step: Callable[[Any, Any], Any],
        event: Any) -> None:
    machine = make()
    before = _snapshot(vars(machine))
    with pytest.raises(IllegalEvent, match=f"unknown event {type(event).__qualname__}"):
        step(machine, event)
    assert _snapshot(vars(machine)) == before


def test_the_batch_machines_events_are_exactly_their_tables() -> None:
    for module, cls in ((_holding, _holding.Holding), (_local_pool, _local_pool.LocalPool)):
        assert set(cls.event_handlers) == set(module.Event.__args__)  # type: ignore[attr-defined]


def test_the_flow_machine_dispatches_through_the_table_and_drops_an_unknown_event() -> None:
    # Its step never raises (a rule's bug must not stop the service): an event of a class it
    # does not take is logged and dropped, and changes nothing.
    assert issubclass(FlowMachine, StateMachine)
    assert isinstance(FlowMachine.__dict__["event_handlers"], EventTable)
    assert "event_handlers" in FlowMachine._dispatch.__code__.co_names
    machine = FlowMachine(FlowConfig("/sb"))
    machine.step(Started(), 0.0)
    before = {k: _snapshot(v) for k, v in vars(machine).items() if k != "events"}
    event = _Ping()
    actions = machine.step(event, 1.0)
    assert Log(f"flow machine: ignoring {event!r}", logging.DEBUG) in actions
    after = {k: _snapshot(v) for k, v in vars(machine).items() if k != "events"}
    assert after == before


# Classes with a ``step`` that are no machine of their own, each with its reason.
NOT_MACHINES = {
    "controller/_values.py:Machine": "the protocol the controller loop runs",
    "supervise/_run.py:_Placeholder": "the loop's machine until the address is known",
    "flows/service.py:_ServiceMachine": "runs the flow machine and carries out its file actions",
    "executors/pilot/_elastic_machine.py:ElasticMachine": "the elastic pilot's decisions on "
    "allocations: pure, time only in its events (test_pilot_elastic_machine.py), not yet built "
    "on StateMachine's event table",
}


def test_every_class_with_a_step_is_a_machine_in_the_list_or_said_not_to_be() -> None:
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(item, ast.FunctionDef) and item.name == "step"
                    for item in node.body):
                found.add(f"{path.relative_to(SRC)}:{node.name}")
    machines = {f"{Path(cls.__module__.replace('.', '/')).relative_to('psij')}.py:"
                f"{cls.__name__}" for cls, _, _ in MACHINES}
    machines.add("flows/machine.py:FlowMachine")
    assert found == machines | set(NOT_MACHINES)


def test_the_pilot_schedulers_events_are_exactly_its_table() -> None:
    events = set(_scheduler.Event.__args__)  # type: ignore[attr-defined]
    assert set(_scheduler.Scheduler.event_handlers) == events
    # Every event but Schedule answers with transitions, Schedule with placements.
    machine = _task_scheduler()
    assert machine.step(_scheduler.SCHEDULE) == []  # the pool is full
    assert machine.step(_scheduler.TaskFinished("a", True)) == [
        _scheduler.Transition("a", _scheduler.TaskState.SUCCEEDED)]
    assert [p.task_id for p in machine.step(_scheduler.SCHEDULE)] == ["c"]
