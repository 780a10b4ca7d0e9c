"""Where every time-dependent rule gets the time from.

Polling intervals, retry backoff, outage tolerance, grace periods, time limits and timers are
measured on a ``Clock`` so that the state machines and loops that apply them can be driven in
tests by a ``ManualClock`` that moves only when told to, instead of by sleeping. This module
only reads time; it never sleeps or waits.
"""

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    """A source of seconds that never goes backwards (the origin is arbitrary)."""

    def now(self) -> float:
        """The current time in seconds."""
        ...


class MonotonicClock:
    """The system's monotonic clock (unaffected by changes of the wall clock)."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock for tests: it starts at ``start`` and moves only by :meth:`advance`."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Moves the clock forward by ``seconds`` (not backwards) and returns the new time."""
        if seconds < 0:
            raise ValueError(f"ManualClock.advance: seconds must not be negative, got {seconds}")
        with self._lock:
            self._now += seconds
            return self._now
