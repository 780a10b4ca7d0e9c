"""The wake-up loop helper: a selector woken through a self-pipe, and timers on a Clock."""

import math
import os
import selectors
import threading

from psij._clock import ManualClock
from psij._wakeup import TimerHeap, Timers, Wakeup, timer_delay


def test_wake_from_another_thread_ends_select_without_events() -> None:
    wakeup = Wakeup()
    try:
        threading.Thread(target=wakeup.wake).start()
        assert wakeup.select(None) == []  # would block forever without the wake-up
        wakeup.wake()
        wakeup.wake()
        assert wakeup.select(None) == []
        assert wakeup.select(0) == []  # both wake-ups were drained at once
    finally:
        wakeup.close()


def test_select_returns_the_loops_own_events_only() -> None:
    wakeup = Wakeup()
    r, w = os.pipe()
    try:
        wakeup.register(r, selectors.EVENT_READ, "mine")
        os.write(w, b"1")
        wakeup.wake()
        events = wakeup.select(None)
        assert [(key.data, mask) for key, mask in events] == [("mine", selectors.EVENT_READ)]
        wakeup.unregister(r)
        assert wakeup.select(0) == []
    finally:
        wakeup.close()
        os.close(r)
        os.close(w)


def test_wake_after_close_and_many_wakes_never_raise() -> None:
    wakeup = Wakeup()
    for _ in range(100_000):  # far more than the pipe holds
        wakeup.wake()
    assert wakeup.select(0) == []
    wakeup.close()
    wakeup.close()
    wakeup.wake()


def test_hostile_timeouts_are_made_safe() -> None:
    wakeup = Wakeup()
    try:
        assert wakeup.select(-5) == []
        assert wakeup.select(math.nan) == []
    finally:
        wakeup.close()
    assert timer_delay(math.nan) == 0.0
    assert timer_delay(-1.0) == 0.0
    assert timer_delay(math.inf) == 86400.0
    assert timer_delay(1e300) == 86400.0
    assert timer_delay(2.5) == 2.5


def test_timers_follow_a_manual_clock() -> None:
    clock = ManualClock(100.0)
    timers = Timers(clock)
    ran = []
    assert timers.next_timeout() is None
    timers.call_later(5.0, lambda: ran.append("b"))
    timers.call_later(1.0, lambda: ran.append("a"))
    timers.call_later(math.nan, lambda: ran.append("now"))
    assert len(timers) == 3
    for action in timers.pop_due():
        action()
    assert ran == ["now"]
    assert timers.next_timeout() == 1.0
    clock.advance(0.5)
    assert timers.pop_due() == []
    assert timers.next_timeout() == 0.5
    clock.advance(10.0)
    assert timers.next_timeout() == 0.0
    for action in timers.pop_due():
        action()
    assert ran == ["now", "a", "b"]
    assert timers.next_timeout() is None and len(timers) == 0


def test_timer_heap_gives_what_is_due_earliest_first_ties_in_order() -> None:
    heap: TimerHeap[str] = TimerHeap()
    heap.push(5.0, "b")
    heap.push(1.0, "a")
    heap.push(5.0, "c")
    assert heap.next_due() == 1.0
    assert heap.pop_due(0.5) is None
    assert [heap.pop_due(5.0), heap.pop_due(5.0), heap.pop_due(5.0), heap.pop_due(5.0)] \
        == [(1.0, "a"), (5.0, "b"), (5.0, "c"), None]
    assert heap.next_due() is None


def test_timer_heap_keys_replace_and_cancel() -> None:
    heap: TimerHeap[str] = TimerHeap()
    heap.set("t", 1.0, "first")
    heap.set("t", 3.0, "second")  # replaces the first, even though it is later
    heap.set("u", 2.0, "u")
    heap.cancel("u")
    heap.cancel("never set")
    assert heap.next_due() == 3.0
    assert heap.pop_due(10.0) == (3.0, "second")
    assert heap.pop_due(10.0) is None
    heap.set("t", 4.0, "again")  # a key is free again once its item was given
    assert heap.pop_due(4.0) == (4.0, "again")
