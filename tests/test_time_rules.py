"""Where time is read and timers are kept: rules over the source of psij, checked with ``ast``.

Every rule that depends on time reads it from a :class:`psij._clock.Clock` (or from the
``now`` of an event) and waits through one; the wall clock for timestamps is read through
``psij._clock.wall_time``. Only the modules below call ``time.monotonic``, ``time.time``,
``time.sleep`` or ``time.perf_counter``, each for the reason given. Likewise the one timer
heap is ``psij._wakeup.TimerHeap``; the other modules that use ``heapq`` keep queues ordered
by something else than a due time.
"""

import ast
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import psij

SRC = Path(psij.__file__).parent
_TIME_CALLS = {"monotonic", "time", "sleep", "perf_counter"}

TIME_ALLOWED: Dict[str, str] = {
    "_clock.py": "the one reader of the clocks and the one place that sleeps",
    "executors/local/_keeper.py": "the keeper program runs on its own and imports nothing of "
                                  "psij (its timestamps and kill timers are its process's own)",
    "executors/local/_keeper_rows.py": "the keeper's writing of the registry, loaded by the "
                                       "keeper from its file (it imports nothing of psij)",
    "executors/local/_keeper_kills.py": "the keeper's KILL timers, loaded by the keeper from "
                                        "its file (it imports nothing of psij)",
    "executors/batch/batch_test_tool.py": "the fake scheduler's commands, a program run on its "
                                          "own that imports nothing of psij's package",
}

HEAPQ_ALLOWED: Dict[str, str] = {
    "_wakeup.py": "the one timer heap (TimerHeap, and Timers on it)",
    "flows/_throttle.py": "TurnLine: who waits longest for a turn at a shared limit, by the "
                          "time each joined; a queue of handles, not of due times",
    "executors/local/_pool_machine.py": "the pool's waiting jobs by priority, then arrival",
    "executors/batch/_holding.py": "the held jobs of a shape by priority, then arrival",
    "executors/pilot/scheduler.py": "the shapes' head tasks by priority in one scheduling pass",
    "executors/pilot/_shape_queue.py": "the priority levels present in a shape's queue",
    "report/_shapes.py": "the free cores of each node, lowest first, as a report lays out a "
                         "pilot run's tasks on core rows",
}


def _modules() -> Iterator[Tuple[str, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        yield name, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _time_uses(tree: ast.Module) -> Set[str]:
    """``time.<call>`` in the module (also through ``import time as t`` and ``from time
    import ...``), for the calls that the rule is about."""
    aliases = {"time"}
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "time":
                    aliases.add(alias.asname or "time")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found.update(f"from time import {a.name}" for a in node.names
                         if a.name in _TIME_CALLS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _TIME_CALLS \
                and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and _imports_time(tree, node.value.id):
            found.add(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return found


def _imports_time(tree: ast.Module, name: str) -> bool:
    return any(isinstance(node, ast.Import)
               and any(a.name == "time" and (a.asname or "time") == name for a in node.names)
               for node in ast.walk(tree))


def _uses_heapq(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "heapq" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "heapq":
            return True
    return False


def test_time_is_read_only_through_the_clock_outside_the_allowed_modules() -> None:
    offenders = {name: sorted(uses) for name, tree in _modules()
                 if name not in TIME_ALLOWED and (uses := _time_uses(tree))}
    assert offenders == {}, "read time through psij._clock (a Clock, or wall_time)"


def test_every_module_allowed_to_read_time_still_does() -> None:
    trees = dict(_modules())
    assert {name for name in TIME_ALLOWED if not _time_uses(trees[name])} == set()


def test_heapq_is_used_only_by_the_timer_heap_and_the_priority_queues() -> None:
    users = {name for name, tree in _modules() if _uses_heapq(tree)}
    assert users - set(HEAPQ_ALLOWED) == set(), "a timer goes into psij._wakeup.TimerHeap"
    assert set(HEAPQ_ALLOWED) - users == set(), "an allowed module no longer uses heapq"


def test_the_allowed_modules_give_reasons() -> None:
    for reason in (*TIME_ALLOWED.values(), *HEAPQ_ALLOWED.values()):
        assert len(reason) > 20
