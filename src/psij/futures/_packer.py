"""Calls submitted close together, put into jobs together ("group commit").

:meth:`CallPacker.add` queues a call and returns. One thread, started by a call when there is
none and ended by :meth:`close` or after :data:`IDLE_SECONDS` with nothing queued (so that an
executor dropped without ``shutdown()`` leaves no thread; the next call starts another), takes
every queued call at once (in jobs of at most ``cap`` calls) and
hands them to the executor: while it submits one job, the calls made meanwhile gather for the
next, so a lone call is submitted at once and a burst of calls goes in few jobs. While
``may_submit()`` says the executor has enough jobs to run (its cores are busy), calls gather
until there are ``cap`` of them, a job ends (:meth:`poke`) or the oldest has waited ``linger``
seconds on the clock: fewer, fuller jobs, and no call held back for long. A failure to submit
fails those calls' futures only; the thread logs it and goes on. Nothing here polls: the thread
waits on a condition until there is work or the linger time is up.
"""

import threading
from typing import Callable, Generic, List, Optional, TypeVar

from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger

__all__ = ["IDLE_SECONDS", "CallPacker"]

_log = LazyLogger(__name__)
T = TypeVar("T")
IDLE_SECONDS = 0.5  # the thread ends after this long with nothing queued


class CallPacker(Generic[T]):
    """Gathers items and gives them to ``submit`` in groups of at most ``cap``; ``failed``
    is told of the items of a group whose ``submit`` raised."""

    def __init__(self, submit: Callable[[List[List[T]]], None],
                 failed: Callable[[List[T], BaseException], None], cap: int,
                 may_submit: Callable[[], bool] = lambda: True, linger: float = 0.05,
                 clock: Optional[Clock] = None) -> None:
        self._submit = submit
        self._failed = failed
        self._cap = cap
        self._may_submit = may_submit
        self._linger = linger
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._since = 0.0  # when the oldest queued call was queued
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: List[T] = []
        self._closing = False
        self._thread: Optional[threading.Thread] = None

    def add(self, item: T) -> None:
        with self._lock:
            if self._closing:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if not self._pending:
                self._since = self._clock.now()
            self._pending.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="psij-function-packer",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def withdraw(self, which: Callable[[T], bool]) -> bool:
        """Take back the first item ``which`` picks among those not yet handed to
        ``submit``; False when there is none."""
        with self._lock:
            for i, pending in enumerate(self._pending):
                if which(pending):
                    del self._pending[i]
                    return True
        return False

    def drain(self) -> List[T]:
        """Take back every item not yet handed to ``submit``."""
        with self._lock:
            taken, self._pending = self._pending, []
        return taken

    def poke(self) -> None:
        """The executor may take more jobs now (one ended)."""
        with self._lock:
            self._wake.notify()

    def _held_for(self) -> Optional[float]:
        """With the lock held: how long to wait before the queued calls go (None: until
        woken; 0: now)."""
        if self._closing:
            return 0.0
        if not self._pending:
            return None
        if len(self._pending) >= self._cap or self._may_submit():
            return 0.0
        return max(0.0, self._since + self._linger - self._clock.now())

    def close(self) -> None:
        """Submit what is queued, then end the thread (waits for it)."""
        with self._lock:
            self._closing = True
            self._wake.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                wait = self._held_for()
                idle_until: Optional[float] = None
                while wait != 0.0:
                    if wait is None:  # nothing queued: the thread ends after a while so
                        now = self._clock.now()
                        idle_until = now + IDLE_SECONDS if idle_until is None else idle_until
                        if now >= idle_until:
                            self._thread = None  # the next add starts another
                            return
                        wait = idle_until - now
                    self._clock.wait(self._wake, wait)
                    wait = self._held_for()
                if not self._pending:
                    self._thread = None
                    return
                taken, self._pending = self._pending, []
            groups = [taken[i:i + self._cap] for i in range(0, len(taken), self._cap)]
            try:
                self._submit(groups)
            except BaseException as ex:  # fails these calls, not the thread
                _log.exception("function calls could not be submitted")
                self._failed(taken, ex)
