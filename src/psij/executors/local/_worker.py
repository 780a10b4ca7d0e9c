"""The local executor's worker thread, and what it waits for when the process exits.

One daemon thread per process runs, in order, what follows a local job's exit (its status,
callbacks, staging), another what follows its start by a keeper (ACTIVE), so that the process
watch never runs user code. Jobs handed to a
keeper start after ``submit`` returns; at a normal exit of the process, :func:`drain_at_exit`
has every start still queued sent and answered, and their statuses recorded in the job
registry, so that a job submitted just before the exit is known there (a ``kill -9`` gives no
such chance: a job whose start was not sent yet never runs). ``psij.registry.flush`` does the
same for the starts (:func:`settle_starts`).

It must not start processes nor set job states itself.
"""

import atexit
import queue
import sys
import threading
from typing import Callable, List, Optional

from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger

__all__ = ["STARTS", "WORKER", "Worker", "prepare", "settle_starts"]

logger = LazyLogger("psij.executors.local")

_EXIT_WAIT_SECONDS = 30.0
_AT_EXIT: List[bool] = []
_CLOCK: Clock = MonotonicClock()  # what the waits at exit and before a flush are measured on


class Worker:
    """One daemon thread per process that runs queued tasks in order."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def put(self, task: Callable[[], None]) -> None:
        if self._thread is None:
            self.start()
        self._queue.put(task)

    def start(self) -> None:
        """Start the thread now (``put`` does it too)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    t = threading.Thread(target=self._run, name=self._name,
                                         daemon=True)
                    t.start()
                    self._thread = t

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            try:
                task()
            except Exception:
                logger.exception("local executor task failed")
            # Not kept while waiting for the next: it holds its job, and through the job's
            # callbacks what the job belongs to (an executor dropped since, say).
            del task

    def drain(self, timeout: float) -> bool:
        """Wait until the tasks queued so far have run."""
        if self._thread is None or threading.current_thread() is self._thread:
            return True
        done = threading.Event()
        self._queue.put(done.set)
        return _CLOCK.wait(done, timeout)


WORKER = Worker("psij-local-worker")
# Sets the jobs ACTIVE as their keepers answer: a slow callback on ACTIVE delays neither the
# ends of other jobs nor their stage-out (a job's callbacks still come in order, see psij.job).
STARTS = Worker("psij-local-starts")


def prepare() -> None:
    """Before handing the first job to a keeper: start both threads (not later, on the watch
    thread, in the midst of the jobs), and have :func:`drain_at_exit` run at exit, before the
    registry's own last write (exit functions run last registered first: the registry
    registers its own on its first record, so this is called after a job's first status)."""
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        STARTS.start()
        WORKER.start()
        atexit.register(drain_at_exit)
        from psij._registry.recorder import before_flush

        before_flush(settle_starts)


def settle_starts(timeout: float) -> None:
    """Before ``psij.registry.flush``: the starts queued with keepers are sent and answered,
    the keepers' records of their jobs committed, and the ACTIVE statuses that follow set
    (``timeout`` seconds at most), so that a flush after ``submit`` records each job with its
    native id, and ``attach`` finds it from any process even if this one is killed next."""
    from psij.executors.local._keeper_client import drain_keepers, flush_keepers

    deadline = _CLOCK.now() + timeout
    drain_keepers(timeout)
    flush_keepers()
    STARTS.drain(max(0.0, deadline - _CLOCK.now()))


def drain_at_exit() -> None:
    """At exit: the starts still queued with keepers are sent and answered, the statuses that
    follow set, and the job registry written."""
    from psij.executors.local._keeper_client import drain_keepers

    deadline = _CLOCK.now() + _EXIT_WAIT_SECONDS
    try:
        drain_keepers(_EXIT_WAIT_SECONDS)
        STARTS.drain(max(0.0, deadline - _CLOCK.now()))
        WORKER.drain(max(0.0, deadline - _CLOCK.now()))
        recorder = sys.modules.get("psij._registry.recorder")
        if recorder is not None:
            recorder.flush(max(0.0, deadline - _CLOCK.now()))
    except Exception:
        logger.exception("local jobs: waiting for the last starts at exit failed")
