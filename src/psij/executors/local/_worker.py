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
from collections import deque
from typing import Callable, Deque, List, Optional

from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger

__all__ = ["STARTS", "WORKER", "Starts", "Worker", "prepare", "settle_starts"]

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


class Starts:
    """Threads that set jobs ACTIVE as their keepers answer. One thread, kept for the life of
    the process, does it while it keeps up; when every thread is in a task (a slow callback
    on ACTIVE, say) another is started for the next task, up to ``most``, and ends once idle
    for ``idle`` seconds. So a slow callback on one job's ACTIVE delays neither the ACTIVE of
    the others nor (see the executor's ``_on_exit``) their ends. A job's own callbacks still
    come in order (:mod:`psij.job`); the ACTIVE of two jobs may come in either order."""

    def __init__(self, name: str, most: int = 16, idle: float = 1.0) -> None:
        self._name = name
        self._most = most
        self._idle = idle
        self._cond = threading.Condition()
        self._tasks: Deque[Callable[[], None]] = deque()
        self._threads: List[threading.Thread] = []
        self._free = 0  # threads waiting for a task
        self._open = 0  # tasks put and not yet done

    def put(self, task: Callable[[], None]) -> None:
        with self._cond:
            self._tasks.append(task)
            self._open += 1
            if self._free > len(self._tasks) - 1:
                self._cond.notify()
            elif len(self._threads) < self._most:
                self._spawn()

    def start(self) -> None:
        """Start the first thread now (``put`` does it too)."""
        with self._cond:
            if not self._threads:
                self._spawn()

    def _spawn(self) -> None:
        # Under the condition's lock.
        first = not self._threads
        t = threading.Thread(target=self._run, args=(first,), daemon=True,
                             name=self._name if first else f"{self._name}-{len(self._threads)}")
        self._threads.append(t)
        t.start()

    def _run(self, first: bool) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._tasks:
                    self._free += 1
                    waited = self._cond.wait(None if first else self._idle)
                    self._free -= 1
                    if not waited and not self._tasks and not first:
                        self._threads.remove(me)
                        return
                task = self._tasks.popleft()
            try:
                task()
            except Exception:
                logger.exception("local executor task failed")
            del task  # not kept while waiting for the next (see Worker)
            with self._cond:
                self._open -= 1
                if self._open == 0:
                    self._cond.notify_all()

    def drain(self, timeout: float) -> bool:
        """Wait until the tasks put so far have run."""
        with self._cond:
            if threading.current_thread() in self._threads:
                return True
            deadline = _CLOCK.now() + timeout
            while self._open:
                left = deadline - _CLOCK.now()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True


WORKER = Worker("psij-local-worker")
# Sets the jobs ACTIVE as their keepers answer.
STARTS = Starts("psij-local-starts")


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
