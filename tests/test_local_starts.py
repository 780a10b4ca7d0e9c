"""The threads that set local jobs ACTIVE (``_worker.Starts``): a task that blocks does not
hold the tasks put after it; ``drain`` waits for every task put before it; a spare ends once
idle."""

import threading
import time
from typing import List

from psij.executors.local._worker import Starts


def test_a_blocked_task_does_not_hold_the_next_and_drain_waits_for_both() -> None:
    starts = Starts("test-starts", most=4, idle=0.2)
    release = threading.Event()
    done: List[str] = []
    starts.put(lambda: (release.wait(30), done.append("slow")))
    second = threading.Event()
    starts.put(lambda: (done.append("quick"), second.set()))
    assert second.wait(30), "the second task waited for the blocked one"
    assert done == ["quick"]
    assert not starts.drain(0.1)  # the blocked one is still running
    release.set()
    assert starts.drain(30)
    assert sorted(done) == ["quick", "slow"]


def test_spares_end_when_idle_and_the_first_thread_stays() -> None:
    starts = Starts("test-idle", most=3, idle=0.1)
    release = threading.Event()
    for _ in range(3):
        starts.put(lambda: release.wait(30))
    names = {t.name for t in threading.enumerate() if t.name.startswith("test-idle")}
    assert names == {"test-idle", "test-idle-1", "test-idle-2"}
    release.set()
    assert starts.drain(30)
    for _ in range(300):
        names = {t.name for t in threading.enumerate() if t.name.startswith("test-idle")}
        if names == {"test-idle"}:
            break
        time.sleep(0.05)
    assert names == {"test-idle"}


def test_a_task_that_raises_fails_only_itself() -> None:
    starts = Starts("test-raise", most=2, idle=0.1)
    ran = threading.Event()

    def bad() -> None:
        raise RuntimeError("boom")

    starts.put(bad)
    starts.put(ran.set)
    assert ran.wait(30)
    assert starts.drain(30)
