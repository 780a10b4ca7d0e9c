"""The one shape of a loop that sleeps in ``select`` and can be woken by other threads.

A :class:`Wakeup` is a selector with a non-blocking self-pipe registered in it: any thread calls
:meth:`Wakeup.wake` to end the loop's current ``select`` at once, and :meth:`Wakeup.select`
drains the pipe and returns only the loop's own events. :class:`Timers` keeps the loop's timed
actions on a :class:`~psij._clock.Clock`, so that tests can move time with a ``ManualClock``
instead of sleeping; the loop sleeps at most :meth:`Timers.next_timeout` and then runs what
:meth:`Timers.pop_due` returns.

Used by the process watch, the pilot's engine and its service. It owns no thread and runs no
action itself: the loop that uses it decides what an event or a due action does.
"""

import heapq
import os
import selectors
import threading
from typing import Any, Callable, List, Optional, Tuple

from psij._clock import Clock, MonotonicClock

__all__ = ["Timers", "Wakeup", "timer_delay"]

_LONGEST_WAIT = 86400.0  # a timer further away wakes the loop once a day, harmlessly


def timer_delay(delay: float) -> float:
    """``delay`` made safe for a timer: NaN and negative give 0, more than a day gives a day
    (``select`` refuses timeouts beyond 2**31 ms, and a loop that raised would stop)."""
    if not delay >= 0.0:
        return 0.0
    return delay if delay < _LONGEST_WAIT else _LONGEST_WAIT


class Wakeup:
    """A selector that any thread can wake through a self-pipe.

    Register the loop's own files in :attr:`selector` (or through :meth:`register`); their
    ``data`` is the loop's business. ``wake`` never blocks and never raises, also after
    ``close``: a wake-up that is already pending is enough.
    """

    def __init__(self, selector: Optional[selectors.BaseSelector] = None) -> None:
        self.selector: selectors.BaseSelector = (selector if selector is not None
                                                 else selectors.DefaultSelector())
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.selector.register(self._read, selectors.EVENT_READ, _WAKE)

    def wake(self) -> None:
        """End the current (or next) ``select`` of the loop; safe from any thread."""
        fd = self._write
        if fd < 0:
            return
        try:
            os.write(fd, b"x")
        except OSError:
            pass  # a wake-up is already pending (full pipe), or the loop closed it

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.selector.register(fileobj, events, data)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.selector.modify(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.selector.unregister(fileobj)

    def select(self, timeout: Optional[float] = None
               ) -> List[Tuple[selectors.SelectorKey, int]]:
        """Wait at most ``timeout`` seconds (None: until an event or a wake-up) and return
        the loop's events; a wake-up alone returns an empty list."""
        try:
            events = self.selector.select(None if timeout is None else timer_delay(timeout))
        except InterruptedError:
            return []
        ready = []
        for key, mask in events:
            if key.data is _WAKE:
                self._drain()
            else:
                ready.append((key, mask))
        return ready

    def _drain(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Close the pipe and the selector (call it once the loop no longer runs)."""
        read, write = self._read, self._write
        if write < 0:
            return
        self._read = self._write = -1
        os.close(write)
        os.close(read)
        self.selector.close()


class _WakeMarker:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<wake-up pipe>"


_WAKE = _WakeMarker()


class Timers:
    """Timed actions of one loop, due at times of a :class:`~psij._clock.Clock`.

    Safe to use from several threads: an action may be added from any thread (then wake the
    loop), and the loop takes the due ones with :meth:`pop_due` and runs them itself.
    """

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._lock = threading.Lock()
        self._heap: List[Tuple[float, int, Callable[[], object]]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def call_later(self, delay: float, action: Callable[[], object]) -> None:
        """Have ``action`` returned by :meth:`pop_due` once ``delay`` seconds have passed
        (NaN or negative: at once; more than a day: a day)."""
        when = self.clock.now() + timer_delay(delay)
        with self._lock:
            self._seq += 1
            heapq.heappush(self._heap, (when, self._seq, action))

    def next_timeout(self) -> Optional[float]:
        """Seconds until the next action is due (0 when one is due); None when there is none."""
        with self._lock:
            if not self._heap:
                return None
            first = self._heap[0][0]
        return timer_delay(first - self.clock.now())

    def pop_due(self) -> List[Callable[[], object]]:
        """Remove and return the actions that are due, earliest first."""
        heap = self._heap
        if not heap:
            return []
        now = self.clock.now()
        due: List[Callable[[], object]] = []
        with self._lock:
            while heap and heap[0][0] <= now:
                due.append(heapq.heappop(heap)[2])
        return due
