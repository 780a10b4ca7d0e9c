"""What the pilot engine hands out: events to its listeners, lines to its journal, and the
moments when those who keep files of their own (``psij pilot run``'s report and log) write them.

Nothing here is written once per task:

- events are delivered once per turn of the engine's loop, each turn's events together;
- the journal's lines of a turn go in one write, before that turn's events are delivered (so
  that no listener, and no client of a served pilot, ever sees a start or an end that a crash
  could take back), and the end of a task that others wait for (a task with dependents, or a
  member of an iteration group) before any other task starts (so that a crash never leaves a
  started dependent behind an end the journal does not hold);
- the listeners' own files are flushed by their flush hooks at most every
  :data:`OUTPUT_INTERVAL` seconds, and at most that long after an event was delivered.

What a crash of the pilot can lose: the entries that listeners wrote in the last
:data:`OUTPUT_INTERVAL` seconds (``jobs.report``, ``service.log``), never a journal line of an
event that was delivered; a crash of the machine, what the journal had not fsync'd (at most a
second, see ``journal``). The interval batches writes and decides nothing about tasks, so it is
measured on a monotonic clock of its own (``_FLUSH_CLOCK``) whatever the engine's clock
is.

This class is the base of :class:`~psij.executors.pilot.engine.PilotEngine` and runs on its
thread; it decides nothing about tasks and starts nothing.
"""

from pathlib import Path
from typing import Callable, List, Optional

from psij import _check
from psij._clock import Clock, MonotonicClock
from psij.executors.pilot._task_books import TaskBooks, logger
from psij.executors.pilot.resources import ResourcePool
from psij.executors.pilot.tasks import Listener

__all__ = ["OUTPUT_INTERVAL", "EngineOutput"]

OUTPUT_INTERVAL = 0.005
"""Seconds, at most, between the delivery of an event and the flush of the listeners' files."""

_FLUSH_CLOCK = MonotonicClock()  # not the engine's: a ManualClock must not hold files back


class EngineOutput(TaskBooks):
    """Listeners, flush hooks and the journal's timing (see the module documentation)."""

    _clock: Clock

    def __init__(self, pool: ResourcePool, work_directory: Path) -> None:
        super().__init__(pool, work_directory)
        self._listeners: List[Listener] = []
        self._flush_hooks: List[Callable[[], object]] = []
        self._flush_due: Optional[float] = None  # on _FLUSH_CLOCK; None: nothing to flush

    def add_listener(self, listener: Listener) -> None:
        if not callable(listener):
            raise _check.fail_type("listener", listener, "a callable taking a TaskEvent")
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: Listener) -> None:
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def add_flush_hook(self, hook: Callable[[], object]) -> None:
        """Have ``hook`` called on the engine thread at most :data:`OUTPUT_INTERVAL` seconds
        after events were delivered (see the module documentation): a listener that writes a
        file flushes it there, once for many events. An exception in it is logged."""
        if not callable(hook):
            raise _check.fail_type("hook", hook, "a callable without arguments")
        with self._lock:
            self._flush_hooks = [*self._flush_hooks, hook]

    def _flush_in(self) -> Optional[float]:
        """Seconds until the flush hooks are due (None: nothing waits for them)."""
        due = self._flush_due
        return None if due is None else max(0.0, due - _FLUSH_CLOCK.now())

    def _flush(self, force: bool = False) -> None:
        """Have the hooks flush, if they are due (or ``force``)."""
        due = self._flush_due
        if due is None or (not force and _FLUSH_CLOCK.now() < due):
            return
        self._flush_due = None
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
        if self._journal_records:
            self._write_journal()  # what a listener is told is in the journal first
        with self._lock:
            events, self._outbox = self._outbox, []
            listeners = self._listeners
        if not events:
            return
        if self._flush_due is None and self._flush_hooks:
            self._flush_due = _FLUSH_CLOCK.now() + OUTPUT_INTERVAL
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
