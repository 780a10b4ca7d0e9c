"""Calls gathered into jobs (``psij.futures._packer``): a lone call goes at once, calls made
while a job is being submitted go together in groups of at most ``cap``, a failed submission
fails its calls only, and calls not yet handed over can be taken back."""

import threading
from typing import Callable, List

import pytest

from psij.futures._packer import CallPacker

WAIT = 10


def test_calls_made_during_a_submission_gather_for_the_next_one() -> None:
    groups: List[List[int]] = []
    release = threading.Event()
    first_taken = threading.Event()

    def submit(batch: List[List[int]]) -> None:
        groups.extend(batch)
        first_taken.set()
        release.wait(WAIT)

    packer: CallPacker[int] = CallPacker(submit, lambda items, error: None, cap=3)
    packer.add(0)
    assert first_taken.wait(WAIT)
    for item in range(1, 8):
        packer.add(item)
    release.set()
    packer.close()
    assert groups == [[0], [1, 2, 3], [4, 5, 6], [7]]


def test_a_failed_submission_fails_its_calls_and_the_packer_goes_on() -> None:
    failed: List[int] = []
    done: List[int] = []
    gate = threading.Event()

    def submit(batch: List[List[int]]) -> None:
        gate.wait(WAIT)
        items = [item for group in batch for item in group]
        if 13 in items:
            raise RuntimeError("bad luck")
        done.extend(items)

    packer: CallPacker[int] = CallPacker(submit, lambda items, error: failed.extend(items),
                                         cap=10)
    packer.add(13)
    gate.set()
    packer.add(14)
    packer.close()
    assert 13 in failed and 14 in done + failed
    with pytest.raises(RuntimeError, match="after shutdown"):
        packer.add(15)


def test_calls_not_handed_over_can_be_taken_back() -> None:
    release = threading.Event()
    taken: List[int] = []

    def submit(batch: List[List[int]]) -> None:
        taken.extend(item for group in batch for item in group)
        release.wait(WAIT)

    packer: CallPacker[int] = CallPacker(submit, lambda items, error: None, cap=5)
    packer.add(1)
    for _ in range(100):
        if taken:
            break
        threading.Event().wait(0.01)
    packer.add(2)
    packer.add(3)
    packer.add(4)
    assert packer.withdraw(lambda item: item == 3) is True
    assert packer.withdraw(lambda item: item == 1) is False  # handed over already
    assert packer.drain() == [2, 4]
    release.set()
    packer.close()
    assert taken == [1]


def settle(check: Callable[[], bool]) -> bool:
    for _ in range(500):
        if check():
            return True
        threading.Event().wait(0.01)
    return False


def test_while_the_executor_is_busy_calls_gather_until_cap_a_poke_or_the_linger_time(
        ) -> None:
    from psij._clock import ManualClock

    clock = ManualClock()
    busy = [True]
    groups: List[List[int]] = []
    packer: CallPacker[int] = CallPacker(groups.extend, lambda items, error: None, cap=3,
                                         may_submit=lambda: not busy[0], linger=1.0,
                                         clock=clock)
    packer.add(1)
    threading.Event().wait(0.1)
    assert groups == []  # held: the executor is busy and the call is young
    clock.advance(1.0)
    assert settle(lambda: groups == [[1]])  # held no longer than the linger time
    for item in (2, 3, 4):
        packer.add(item)
    assert settle(lambda: groups == [[1], [2, 3, 4]])  # a full job goes at once
    packer.add(5)
    threading.Event().wait(0.1)
    assert groups == [[1], [2, 3, 4]]
    busy[0] = False
    packer.poke()  # a job ended
    assert settle(lambda: groups == [[1], [2, 3, 4], [5]])
    packer.close()


def test_the_thread_ends_when_nothing_is_queued_and_the_next_call_starts_another() -> None:
    groups: List[List[int]] = []
    packer: CallPacker[int] = CallPacker(groups.extend, lambda items, error: None, cap=3)
    for item in (1, 2):
        packer.add(item)
        thread = packer._thread
        assert thread is not None
        thread.join(WAIT)  # ends on its own (after IDLE_SECONDS with nothing queued)
        assert not thread.is_alive() and packer._thread is None
        assert groups[-1] == [item]
    assert groups == [[1], [2]]
    packer.close()
