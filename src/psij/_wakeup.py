"""The one shape of a loop that sleeps in ``select`` and can be woken by other threads, and the
one timer heap.

A :class:`Wakeup` is a selector with a non-blocking self-pipe registered in it: any thread calls
:meth:`Wakeup.wake` to end the loop's current ``select`` at once, and :meth:`Wakeup.select`
drains the pipe and returns only the loop's own events. :class:`TimerHeap` orders what is due
by its due time (the times are the caller's: a machine's ``now``, or a clock's); every timer of
the package is kept in one. :class:`Timers` keeps a loop's timed actions in one on a
:class:`~psij._clock.Clock`, so that tests can move time with a ``ManualClock`` instead of
sleeping; the loop sleeps at most :meth:`Timers.next_timeout` and then runs what
:meth:`Timers.pop_due` returns.

Used by the process watch, the pilot's engine and its service, the controller's loop and the
flow machine. It owns no thread and runs no action itself: the loop that uses it decides what
an event or a due action does. Queues ordered by anything but a due time (job priorities,
turns) are not timers and do not belong here.
"""

import heapq
import os
import selectors
import threading
from typing import Any, Callable, Dict, Generic, Hashable, List, Optional, Tuple, TypeVar

from psij._clock import Clock, MonotonicClock

__all__ = ["TimerHeap", "Timers", "Wakeup", "timer_delay"]

T = TypeVar("T")

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
    ``close``: a wake-up that is already pending is enough. ``close`` may be called from any
    thread, also while others wake: none writes to a descriptor number closed (and perhaps
    given to another file) meanwhile.
    """

    def __init__(self, selector: Optional[selectors.BaseSelector] = None) -> None:
        self.selector: selectors.BaseSelector = (selector if selector is not None
                                                 else selectors.DefaultSelector())
        self._lock = threading.Lock()  # a write never meets the pipe's close
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self.selector.register(self._read, selectors.EVENT_READ, _WAKE)

    def wake(self) -> None:
        """End the current (or next) ``select`` of the loop; safe from any thread."""
        with self._lock:
            fd = self._write
            if fd < 0:
                return  # closed: the loop no longer runs
            try:
                os.write(fd, b"x")
            except OSError:
                pass  # a wake-up is already pending (full pipe)

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
        """Close the pipe and the selector (once the loop no longer runs; from any thread,
        more than once)."""
        with self._lock:
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


_UNKEYED = object()  # the key of an entry that nothing replaces or cancels


class TimerHeap(Generic[T]):
    """Items due at given times, earliest first (ties: in the order they were added).

    An item added under a key (:meth:`set`) replaces the one added before under that key, and
    :meth:`cancel` drops it; replaced and cancelled entries leave the heap lazily. Not locked:
    one thread owns it (:class:`Timers` adds the lock where several threads share one).
    """

    __slots__ = ("_heap", "_keys", "_seq")

    def __init__(self) -> None:
        self._heap: List[Tuple[float, int, Any, T]] = []
        self._keys: Dict[Hashable, int] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, when: float, item: T) -> None:
        """``item`` is due at ``when``."""
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, _UNKEYED, item))

    def set(self, key: Hashable, when: float, item: T) -> None:
        """``item`` is due at ``when``, instead of what was set under ``key`` before."""
        self._seq += 1
        self._keys[key] = self._seq
        heapq.heappush(self._heap, (when, self._seq, key, item))

    def cancel(self, key: Hashable) -> None:
        """Drop what was set under ``key`` (nothing happens when nothing is)."""
        self._keys.pop(key, None)

    def _drop_stale(self) -> None:
        heap, keys = self._heap, self._keys
        while heap:
            _, seq, key, _ = heap[0]
            if key is _UNKEYED or keys.get(key) == seq:
                return
            heapq.heappop(heap)

    def next_due(self) -> Optional[float]:
        """When the earliest item is due; None when there is none."""
        heap = self._heap
        if heap and heap[0][2] is not _UNKEYED:
            self._drop_stale()
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> Optional[Tuple[float, T]]:
        """Remove and return the earliest item due at ``now`` (or before) with its due time;
        None when none is due."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, seq, key, item = heapq.heappop(heap)
            if key is not _UNKEYED:
                if self._keys.get(key) != seq:
                    continue  # replaced or cancelled
                del self._keys[key]
            return when, item
        return None


class Timers:
    """Timed actions of one loop, due at times of a :class:`~psij._clock.Clock`.

    Safe to use from several threads: an action may be added from any thread (then wake the
    loop), and the loop takes the due ones with :meth:`pop_due` and runs them itself.
    """

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._lock = threading.Lock()
        self._heap: TimerHeap[Callable[[], object]] = TimerHeap()

    def __len__(self) -> int:
        return len(self._heap)

    def call_later(self, delay: float, action: Callable[[], object]) -> None:
        """Have ``action`` returned by :meth:`pop_due` once ``delay`` seconds have passed
        (NaN or negative: at once; more than a day: a day)."""
        when = self.clock.now() + timer_delay(delay)
        with self._lock:
            self._heap.push(when, action)

    def next_timeout(self) -> Optional[float]:
        """Seconds until the next action is due (0 when one is due); None when there is none."""
        with self._lock:
            first = self._heap.next_due()
        return None if first is None else timer_delay(first - self.clock.now())

    def pop_due(self) -> List[Callable[[], object]]:
        """Remove and return the actions that are due, earliest first."""
        heap = self._heap
        if not len(heap):
            return []
        now = self.clock.now()
        due: List[Callable[[], object]] = []
        with self._lock:
            while True:
                entry = heap.pop_due(now)
                if entry is None:
                    return due
                due.append(entry[1])
