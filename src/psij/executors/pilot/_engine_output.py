"""What the pilot engine hands out: events to its listeners, lines to its journal, and the
moments when those who keep files of their own (``psij pilot run``'s report and log) write them.

Nothing here is written once per task. Events are delivered once per turn of the engine's
loop, each turn's events together; journal lines and the listeners' files are written when the
engine is about to sleep, and while it stays busy at most every :data:`OUTPUT_INTERVAL`
seconds of its clock, with one exception: the end of a task that others wait for (a task with
dependents, or a member of an iteration group) is written before any other task starts, so
that a crash never leaves a started dependent behind an end the journal does not hold.

What a crash of the pilot can lose: the journal lines and listeners' entries of at most the
last :data:`OUTPUT_INTERVAL` seconds (a resume then runs those tasks again); a crash of the
machine, what the journal had not fsync'd (at most a second, see ``journal``).

This class is the base of :class:`~psij.executors.pilot.engine.PilotEngine` and runs on its
thread; it decides nothing about tasks and starts nothing.
"""

from pathlib import Path
from typing import Callable, List

from psij import _check
from psij._clock import Clock
from psij.executors.pilot._task_books import TaskBooks, logger
from psij.executors.pilot.resources import ResourcePool
from psij.executors.pilot.tasks import Listener

__all__ = ["OUTPUT_INTERVAL", "EngineOutput"]

OUTPUT_INTERVAL = 0.005
"""Seconds, at most, between two writes of the journal and the listeners' files while the
engine is busy."""


class EngineOutput(TaskBooks):
    """Listeners, flush hooks and the journal's timing (see the module documentation)."""

    _clock: Clock

    def __init__(self, pool: ResourcePool, work_directory: Path) -> None:
        super().__init__(pool, work_directory)
        self._listeners: List[Listener] = []
        self._flush_hooks: List[Callable[[], object]] = []
        self._output_due = 0.0  # on the engine's clock

    def add_listener(self, listener: Listener) -> None:
        if not callable(listener):
            raise _check.fail_type("listener", listener, "a callable taking a TaskEvent")
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def add_flush_hook(self, hook: Callable[[], object]) -> None:
        """Have ``hook`` called on the engine thread whenever the journal is written (see the
        module documentation): a listener that writes a file flushes it there, once for many
        events. An exception in it is logged."""
        if not callable(hook):
            raise _check.fail_type("hook", hook, "a callable without arguments")
        with self._lock:
            self._flush_hooks = [*self._flush_hooks, hook]

    def _write_output(self, sleeping: bool) -> None:
        """Write the journal's lines and have the hooks flush, if it is time to."""
        now = self._clock.now()
        if not sleeping and now < self._output_due:
            return
        self._output_due = now + OUTPUT_INTERVAL
        self._write_journal()
        for hook in self._flush_hooks:
            try:
                hook()
            except Exception:
                logger.exception("pilot flush hook %r raised", hook)

    def _write_journal(self) -> None:
        self._journal_urgent = False
        if self._journal is None or not self._journal_records:
            return
        with self._lock:
            lines, self._journal_records = self._journal_records, []
        self._journal.write(lines)

    def _deliver(self) -> None:
        with self._lock:
            events, self._outbox = self._outbox, []
            listeners = self._listeners
        if not events:
            return
        for event in events:
            for listener in listeners:
                try:
                    listener(event)
                except Exception:
                    logger.exception("pilot listener %r raised on %s", listener, event)
        with self._changed:
            for event in events:
                task = self._tasks.get(event.task_id)
                if task is not None and (task.reported is None or not task.reported.final):
                    task.reported = event.state
                    if event.state.final:
                        self._delivered_finals += 1
            self._changed.notify_all()
