"""Where every time-dependent rule gets the time from, and the one way to wait for time to pass.

Polling intervals, retry backoff, outage tolerance, grace periods, time limits and timers are
measured on a ``Clock`` so that the state machines and loops that apply them can be driven in
tests by a ``ManualClock`` that moves only when told to, instead of by sleeping. A clock also
waits: :meth:`Clock.sleep`, :meth:`Clock.wait` (an ``Event`` or a ``Condition`` whose lock the
caller holds), :meth:`Clock.wait_for` (a ``Condition`` and a predicate, with a deadline) and
:meth:`Clock.poll` (a predicate checked every so often until a deadline). On a ``ManualClock``
those deadlines pass only through :meth:`ManualClock.advance`, which wakes the waiters.

:func:`wall_time` is the one reader of the wall clock, for timestamps that people read (status
times, registry rows, report lines); no rule may measure a duration with it. This module owns
no thread and decides nothing: callers say what they wait for and for how long.
"""

import threading
import time
from typing import Callable, Optional, Protocol, Set, TypeVar, Union

__all__ = ["Clock", "ManualClock", "MonotonicClock", "Waitable", "wall_time"]

T = TypeVar("T")

Waitable = Union[threading.Event, threading.Condition]

_SLICE = 0.01  # a ManualClock looks at an Event this often (real seconds): set() cannot wake it


def wall_time() -> float:
    """Seconds since the Unix epoch, for timestamps that people read (not for durations)."""
    return time.time()


class Clock(Protocol):
    """A source of seconds that never goes backwards (the origin is arbitrary), and waits
    measured on it."""

    def now(self) -> float:
        """The current time in seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...

    def wait(self, waitable: Waitable, timeout: Optional[float]) -> bool:
        """``Event.wait`` or ``Condition.wait`` (the caller holds the condition's lock) with
        ``timeout`` measured on this clock (None: no limit); the same return value."""
        ...

    def wait_for(self, condition: threading.Condition, predicate: Callable[[], T],
                 timeout: Optional[float]) -> T:
        """``Condition.wait_for`` with ``timeout`` measured on this clock."""
        ...

    def poll(self, predicate: Callable[[], T], timeout: float, interval: float) -> T:
        """Call ``predicate`` every ``interval`` seconds until it returns a true value or
        ``timeout`` seconds have passed; return its last value."""
        ...


class _Waits:
    """The waits written once over ``now``, ``sleep`` and ``wait`` (shared by both clocks)."""

    def now(self) -> float:
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def wait(self, waitable: Waitable, timeout: Optional[float]) -> bool:
        raise NotImplementedError

    def wait_for(self, condition: threading.Condition, predicate: Callable[[], T],
                 timeout: Optional[float]) -> T:
        result = predicate()
        if result:
            return result
        deadline = None if timeout is None else self.now() + timeout
        while not result:
            if deadline is None:
                self.wait(condition, None)
            else:
                left = deadline - self.now()
                if left <= 0:
                    break
                self.wait(condition, left)
            result = predicate()
        return result

    def poll(self, predicate: Callable[[], T], timeout: float, interval: float) -> T:
        deadline = self.now() + timeout
        while True:
            result = predicate()
            if result:
                return result
            left = deadline - self.now()
            if left <= 0:
                return result
            self.sleep(min(interval, left))


class MonotonicClock(_Waits):
    """The system's monotonic clock (unaffected by changes of the wall clock)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, waitable: Waitable, timeout: Optional[float]) -> bool:
        if timeout is not None:
            # A very long limit is waited for in pieces the primitives accept.
            timeout = min(max(0.0, timeout), threading.TIMEOUT_MAX)
        return waitable.wait(timeout)


class ManualClock(_Waits):
    """A clock for tests: it starts at ``start`` and moves only by :meth:`advance`, which
    wakes every wait whose deadline it passes."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._moved = threading.Condition(self._lock)
        self._conditions: Set[threading.Condition] = set()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Moves the clock forward by ``seconds`` (not backwards) and returns the new time."""
        if not 0 <= seconds < float("inf"):  # NaN too
            raise ValueError(f"ManualClock.advance: seconds must be a finite number, not "
                             f"negative, got {seconds}")
        with self._lock:
            self._now += seconds
            now = self._now
            conditions = list(self._conditions)
            self._moved.notify_all()
        for condition in conditions:
            with condition:
                condition.notify_all()
        return now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            until = self._now + seconds
            while self._now < until:
                self._moved.wait()

    def wait(self, waitable: Waitable, timeout: Optional[float]) -> bool:
        deadline = None if timeout is None else self.now() + max(0.0, timeout)
        if isinstance(waitable, threading.Event):
            while True:
                if waitable.wait(_SLICE):
                    return True
                if deadline is not None and self.now() >= deadline:
                    return waitable.is_set()
        with self._lock:
            if deadline is not None and self._now >= deadline:
                return False
            self._conditions.add(waitable)
        try:
            notified = waitable.wait()
        finally:
            with self._lock:
                self._conditions.discard(waitable)
        return notified and (deadline is None or self.now() < deadline)
