"""The clocks' waits: a ManualClock's deadlines pass only by advance(), which wakes waiters."""

import threading
import time
from typing import List

import pytest

from psij._clock import ManualClock, MonotonicClock, wall_time


def _start(target: object) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def _blocked(thread: threading.Thread) -> bool:
    thread.join(0.05)
    return thread.is_alive()


def test_sleep_ends_when_advance_passes_its_deadline() -> None:
    clock = ManualClock(100.0)
    woke: List[float] = []
    thread = _start(lambda: (clock.sleep(5.0), woke.append(clock.now())))
    assert _blocked(thread)
    clock.advance(4.0)
    assert _blocked(thread)
    clock.advance(1.0)
    thread.join(5)
    assert woke == [105.0]


def test_wait_on_a_condition_times_out_by_advance() -> None:
    clock = ManualClock()
    cond = threading.Condition()
    results: List[bool] = []

    def waiter() -> None:
        with cond:
            results.append(clock.wait(cond, 10.0))

    thread = _start(waiter)
    assert _blocked(thread)
    clock.advance(10.0)
    thread.join(5)
    assert results == [False]


def test_wait_for_returns_the_predicate_met_before_the_deadline() -> None:
    clock = ManualClock()
    cond = threading.Condition()
    box: List[int] = []
    results: List[object] = []

    def waiter() -> None:
        with cond:
            results.append(clock.wait_for(cond, lambda: box and box[0], 60.0))

    thread = _start(waiter)
    assert _blocked(thread)
    clock.advance(30.0)  # wakes it; the predicate is still false, so it waits again
    assert _blocked(thread)
    with cond:
        box.append(7)
        cond.notify_all()
    thread.join(5)
    assert results == [7]


def test_wait_for_gives_the_false_predicate_at_the_deadline() -> None:
    clock = ManualClock()
    cond = threading.Condition()
    results: List[object] = []

    def waiter() -> None:
        with cond:
            results.append(clock.wait_for(cond, lambda: 0, 2.0))

    thread = _start(waiter)
    assert _blocked(thread)
    clock.advance(2.0)
    thread.join(5)
    assert results == [0]


def test_wait_for_a_true_predicate_does_not_wait() -> None:
    clock = ManualClock()
    cond = threading.Condition()
    with cond:
        assert clock.wait_for(cond, lambda: "yes", 0.0) == "yes"
        assert clock.wait_for(cond, lambda: "", 0.0) == ""


def test_wait_on_an_event_set_before_the_deadline_or_timed_out_by_advance() -> None:
    clock = ManualClock()
    event = threading.Event()
    results: List[bool] = []
    thread = _start(lambda: results.append(clock.wait(event, 10.0)))
    assert _blocked(thread)
    event.set()
    thread.join(5)
    assert results == [True]
    event.clear()
    thread = _start(lambda: results.append(clock.wait(event, 10.0)))
    assert _blocked(thread)
    clock.advance(10.0)
    thread.join(5)
    assert results == [True, False]


def test_poll_checks_until_true_or_the_deadline() -> None:
    clock = ManualClock()
    calls: List[float] = []
    results: List[object] = []

    def ready() -> bool:
        calls.append(clock.now())
        return clock.now() >= 3.0

    thread = _start(lambda: results.append(clock.poll(ready, 10.0, 1.0)))
    for _ in range(3):
        assert _blocked(thread)
        clock.advance(1.0)
    thread.join(5)
    assert results == [True] and calls == [0.0, 1.0, 2.0, 3.0]
    results.clear()
    thread = _start(lambda: results.append(clock.poll(lambda: None, 2.0, 5.0)))
    assert _blocked(thread)
    clock.advance(2.0)  # the last sleep is cut to the deadline
    thread.join(5)
    assert results == [None]


def test_the_monotonic_clock_keeps_the_primitives_results() -> None:
    clock = MonotonicClock()
    event = threading.Event()
    assert clock.wait(event, 0.01) is False
    event.set()
    assert clock.wait(event, 0.0) is True
    cond = threading.Condition()
    with cond:
        assert clock.wait(cond, -1.0) is False  # a deadline already passed
    start = time.monotonic()
    clock.sleep(0.02)
    clock.sleep(-1.0)
    assert time.monotonic() - start >= 0.02
    with cond:
        assert clock.wait_for(cond, lambda: 0, 0.01) == 0
    assert clock.poll(lambda: 5, 1.0, 0.1) == 5


def test_advance_refuses_to_go_back_and_wall_time_is_the_epoch() -> None:
    with pytest.raises(ValueError):
        ManualClock().advance(-1.0)
    assert abs(wall_time() - time.time()) < 5.0


def test_a_manual_clock_refuses_to_move_by_an_absurd_amount() -> None:
    clock = ManualClock(5.0)
    for bad in (-1.0, float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError, match="ManualClock.advance"):
            clock.advance(bad)
    assert clock.now() == 5.0
    assert clock.advance(0.5) == 5.5
