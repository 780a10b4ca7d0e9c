"""The elastic pilot's decision machine, fed events with explicit times: when it asks for
allocations, gives them back, stops asking, and what it refuses."""

import itertools
import random
from typing import Any, List, Optional

import pytest

from psij._machine import IllegalEvent
from psij.executors.pilot._elastic_machine import (
    DRAINING,
    ENDED,
    PENDING,
    RUNNING,
    SUBMITTING,
    Action,
    AllocationEnded,
    AllocationStarted,
    BacklogChanged,
    Closing,
    ElasticMachine,
    GiveBack,
    StopAsking,
    SubmitAllocation,
    SubmitFailed,
    Submitted,
    TasksChanged,
    Tick,
)
from psij.executors.pilot.allocation_policy import AllocationPolicy


def machine(**kwargs: Any) -> ElasticMachine:
    kwargs.setdefault("retry_delay", 0)
    return ElasticMachine(AllocationPolicy("local", **kwargs))


def submits(actions: List[Action]) -> List[str]:
    return [a.allocation for a in actions if isinstance(a, SubmitAllocation)]


def given_back(actions: List[Action]) -> List[str]:
    return [a.allocation for a in actions if isinstance(a, GiveBack)]


def run(m: ElasticMachine, name: str, now: float, native: Optional[str] = None) -> None:
    """Answer ``name``'s submission and start it."""
    assert m.step(Submitted(name, native or f"job-{name}"), now) == []
    m.step(AllocationStarted(name), now)


def states(m: ElasticMachine) -> List[str]:
    return [a.state for a in m.allocations()]


# -- asking ------------------------------------------------------------------------------------


def test_no_work_no_minimum_asks_for_nothing() -> None:
    m = machine(max_allocations=3)
    assert m.step(Tick(), 0) == []
    assert m.step(BacklogChanged(0), 1) == []
    assert m.next_wake() is None


def test_the_backlog_asks_for_allocations_up_to_the_maximum() -> None:
    m = machine(max_allocations=3, backlog_per_allocation=10)
    out = m.step(BacklogChanged(25), 0)
    assert out == [SubmitAllocation("a1", "backlog of 25 tasks"),
                   SubmitAllocation("a2", "backlog of 25 tasks"),
                   SubmitAllocation("a3", "backlog of 25 tasks")]
    assert m.step(BacklogChanged(2000), 1) == []  # three held: the maximum
    assert states(m) == [SUBMITTING] * 3


def test_the_backlog_asks_for_ceil_of_backlog_over_the_ratio() -> None:
    m = machine(max_allocations=10, backlog_per_allocation=10)
    assert submits(m.step(BacklogChanged(1), 0)) == ["a1"]
    assert submits(m.step(BacklogChanged(10), 0)) == []
    assert submits(m.step(BacklogChanged(11), 0)) == ["a2"]
    assert submits(m.step(BacklogChanged(35), 0)) == ["a3", "a4"]
    # Fewer waiting tasks never cancel an allocation on the way.
    assert m.step(BacklogChanged(0), 1) == []
    assert states(m) == [SUBMITTING] * 4


def test_running_allocations_do_not_count_as_coming() -> None:
    # The backlog is work that does not fit what runs: it wants allocations on the way.
    m = machine(max_allocations=3)
    assert submits(m.step(BacklogChanged(1), 0)) == ["a1"]
    run(m, "a1", 1)
    assert submits(m.step(BacklogChanged(1), 2)) == ["a2"]
    assert m.step(Submitted("a2", "j2"), 3) == []
    assert m.step(BacklogChanged(1), 4) == []  # a2 is on the way
    assert [a.state for a in m.allocations()] == [RUNNING, PENDING]


def test_the_minimum_is_kept_without_work() -> None:
    m = machine(max_allocations=3, min_allocations=2)
    out = m.step(Tick(), 0)
    assert out == [SubmitAllocation("a1", "to keep the minimum of 2"),
                   SubmitAllocation("a2", "to keep the minimum of 2")]
    assert m.step(Tick(), 1) == []


def test_an_allocation_that_ends_is_replaced_while_work_waits() -> None:
    m = machine(max_allocations=1)
    m.step(BacklogChanged(5), 0)
    run(m, "a1", 1)
    assert m.backlog == 0  # the work goes to a1 first
    m.step(TasksChanged("a1", 4), 2)
    assert m.step(BacklogChanged(5), 2) == []  # the most are held
    out = m.step(AllocationEnded("a1", "time limit"), 3)
    assert out == [SubmitAllocation("a2", "backlog of 5 tasks")]
    assert m.allocation("a1").ended_because == "time limit"
    assert m.failures_in_a_row == 0  # it had started: not a failure


def test_the_minimum_is_kept_after_an_end() -> None:
    m = machine(max_allocations=2, min_allocations=1)
    assert submits(m.step(Tick(), 0)) == ["a1"]
    run(m, "a1", 1)
    assert submits(m.step(AllocationEnded("a1", "cancelled by the scheduler"), 2)) == ["a2"]


# -- giving back -------------------------------------------------------------------------------


def test_an_idle_allocation_is_given_back_after_the_timeout() -> None:
    m = machine(max_allocations=2, idle_timeout=60)
    m.step(BacklogChanged(1), 0)
    run(m, "a1", 10)
    m.step(TasksChanged("a1", 1), 11)
    m.step(BacklogChanged(0), 11)
    assert m.next_wake() is None  # busy
    m.step(TasksChanged("a1", 0), 20)
    assert m.next_wake() == 80
    assert m.step(Tick(), 79.9) == []
    out = m.step(Tick(), 80)
    assert out == [GiveBack("a1", "job-a1", "given back: idle for 60 s")]
    assert m.allocation("a1").state == DRAINING
    assert m.next_wake() is None
    assert m.step(Tick(), 200) == []  # once only
    m.step(AllocationEnded("a1", "cancelled"), 201)
    view = m.allocation("a1")
    assert view.state == ENDED
    assert view.ended_because == "given back: idle for 60 s; then cancelled"
    assert m.failures_in_a_row == 0


def test_a_started_allocation_without_tasks_is_idle_from_its_start() -> None:
    m = machine(idle_timeout=5)
    m.step(BacklogChanged(1), 0)
    run(m, "a1", 10)
    m.step(BacklogChanged(0), 10)
    assert m.next_wake() == 15
    assert given_back(m.step(Tick(), 15)) == ["a1"]


def test_a_new_task_restarts_the_idle_clock() -> None:
    m = machine(idle_timeout=10)
    m.step(BacklogChanged(1), 0)
    run(m, "a1", 0)
    m.step(BacklogChanged(0), 0)
    m.step(TasksChanged("a1", 1), 8)
    m.step(TasksChanged("a1", 0), 9)
    assert m.step(Tick(), 10) == []
    assert m.next_wake() == 19
    # A second report of no task does not move the idle time.
    m.step(TasksChanged("a1", 0), 15)
    assert given_back(m.step(Tick(), 19)) == ["a1"]


def test_nothing_is_given_back_while_work_waits() -> None:
    m = machine(idle_timeout=0.5)
    m.step(BacklogChanged(3), 0)
    run(m, "a1", 1)
    m.step(BacklogChanged(3), 1)
    assert m.step(Tick(), 100) == []
    assert m.next_wake() is None
    assert given_back(m.step(BacklogChanged(0), 101)) == ["a1"]


def test_the_minimum_is_never_given_back() -> None:
    m = machine(max_allocations=3, min_allocations=1, idle_timeout=5)
    m.step(BacklogChanged(3), 0)
    for name in ("a1", "a2", "a3"):
        run(m, name, {"a1": 3, "a2": 1, "a3": 2}[name])
    out = m.step(BacklogChanged(0), 100)
    # The longest idle go first; the last one is kept.
    assert given_back(out) == ["a2", "a3"]
    assert m.step(Tick(), 1000) == []
    assert states(m) == [RUNNING, DRAINING, DRAINING]


def test_tasks_on_a_draining_allocation_are_accepted() -> None:
    m = machine(idle_timeout=0.5)
    m.step(BacklogChanged(1), 0)
    run(m, "a1", 0)
    assert given_back(m.step(BacklogChanged(0), 1)) == ["a1"]
    assert m.step(TasksChanged("a1", 1), 1) == []
    assert m.allocation("a1").running_tasks == 1


# -- failures ----------------------------------------------------------------------------------


def test_refused_submissions_stop_asking_after_max_failures() -> None:
    m = machine(max_allocations=2, max_failures=3)
    assert submits(m.step(BacklogChanged(10), 0)) == ["a1", "a2"]
    # a2 is on the way: after a failure, one at a time.
    assert m.step(SubmitFailed("a1", "sbatch: invalid partition"), 1) == []
    assert m.failures_in_a_row == 1
    assert submits(m.step(SubmitFailed("a2", "sbatch: invalid partition"), 2)) == ["a3"]
    out = m.step(SubmitFailed("a3", "sbatch: invalid partition"), 3)
    assert len(out) == 1 and isinstance(out[0], StopAsking)
    assert "after 3 failures in a row" in out[0].why
    assert "sbatch: invalid partition" in out[0].why
    assert m.stopped == out[0].why
    assert m.step(BacklogChanged(100), 4) == []
    assert m.step(Tick(), 10 ** 6) == []
    assert m.next_wake() is None
    assert states(m) == [ENDED] * 3
    assert m.allocation("a1").ended_because == "its submission failed: sbatch: invalid " \
                                               "partition"


def test_after_a_failure_the_next_submission_waits_and_the_wait_doubles() -> None:
    m = machine(max_allocations=1, max_failures=10, retry_delay=10)
    m.step(BacklogChanged(1), 0)
    assert m.step(SubmitFailed("a1", "no"), 0) == []
    assert m.next_wake() == 10
    assert m.step(Tick(), 9) == []
    assert submits(m.step(Tick(), 10)) == ["a2"]
    assert m.next_wake() is None
    m.step(SubmitFailed("a2", "no"), 11)
    assert m.next_wake() == 31
    assert m.step(Tick(), 30) == []
    assert submits(m.step(Tick(), 31)) == ["a3"]
    m.step(SubmitFailed("a3", "no"), 40)
    assert m.next_wake() == 80


def test_the_wait_after_failures_is_at_most_five_minutes() -> None:
    m = machine(max_allocations=1, max_failures=1000, retry_delay=100)
    m.step(BacklogChanged(1), 0)
    now = 0.0
    for i in range(1, 30):
        m.step(SubmitFailed(f"a{i}", "no"), now)
        wake = m.next_wake()
        assert wake is not None and wake - now <= 300
        now = wake
        assert submits(m.step(Tick(), now)) == [f"a{i + 1}"]


def test_an_allocation_that_ends_before_it_starts_is_a_failure() -> None:
    m = machine(max_allocations=1, max_failures=2)
    m.step(BacklogChanged(1), 0)
    m.step(Submitted("a1", "77"), 0)
    out = m.step(AllocationEnded("a1", "FAILED: exit code 1"), 5)
    assert submits(out) == ["a2"]
    assert m.failures_in_a_row == 1
    m.step(Submitted("a2", "78"), 6)
    out = m.step(AllocationEnded("a2", "FAILED: exit code 1"), 7)
    assert len(out) == 1 and isinstance(out[0], StopAsking)
    assert "allocation a2 (78) ended before its agents joined: FAILED: exit code 1" in \
        out[0].why


def test_a_start_ends_the_run_of_failures() -> None:
    m = machine(max_allocations=1, max_failures=2)
    m.step(BacklogChanged(1), 0)
    m.step(SubmitFailed("a1", "busy"), 0)
    assert m.failures_in_a_row == 1
    run(m, "a2", 1)
    assert m.failures_in_a_row == 0
    m.step(AllocationEnded("a2", "time limit"), 2)
    assert submits(m.step(BacklogChanged(1), 2)) == ["a3"]
    assert submits(m.step(SubmitFailed("a3", "busy"), 3)) == ["a4"]
    assert m.failures_in_a_row == 1
    assert m.stopped is None


def test_after_a_failure_allocations_are_asked_one_at_a_time() -> None:
    m = machine(max_allocations=5, max_failures=9)
    assert submits(m.step(BacklogChanged(1), 0)) == ["a1"]
    assert submits(m.step(SubmitFailed("a1", "x"), 0)) == ["a2"]
    assert submits(m.step(BacklogChanged(100), 0)) == []  # a2's answer first
    run(m, "a2", 1)
    assert submits(m.step(BacklogChanged(100), 2)) == ["a3", "a4", "a5", "a6"]


def test_a_pilot_given_back_allocation_that_never_started_is_no_failure() -> None:
    m = machine(max_allocations=1, max_failures=1)
    m.step(BacklogChanged(1), 0)
    m.step(Submitted("a1", "5"), 0)
    assert given_back(m.step(Closing(), 1)) == ["a1"]
    assert m.step(AllocationEnded("a1", "cancelled"), 2) == []
    assert m.stopped is None


# -- closing -----------------------------------------------------------------------------------


def test_closing_gives_everything_back_and_asks_for_nothing() -> None:
    m = machine(max_allocations=4, min_allocations=1)
    m.step(BacklogChanged(3), 0)
    run(m, "a1", 1)
    m.step(Submitted("a2", "j2"), 1)
    out = m.step(Closing(), 2)
    assert out == [GiveBack("a1", "job-a1", "given back: the pilot is closing"),
                   GiveBack("a2", "j2", "given back: the pilot is closing")]
    assert states(m) == [DRAINING, DRAINING, SUBMITTING]
    # The one still submitting is given back once its id is known.
    assert m.step(Submitted("a3", "j3"), 3) == [
        GiveBack("a3", "j3", "given back: the pilot is closing")]
    assert m.step(BacklogChanged(50), 4) == []
    for name in ("a1", "a2", "a3"):
        assert m.step(AllocationEnded(name, "cancelled"), 5) == []
    assert states(m) == [ENDED] * 3
    assert m.step(Closing(), 6) == []
    assert m.next_wake() is None


def test_closing_while_a_submission_fails() -> None:
    m = machine()
    m.step(BacklogChanged(1), 0)
    assert m.step(Closing(), 1) == []
    assert m.step(SubmitFailed("a1", "no"), 2) == []
    assert states(m) == [ENDED]


# -- refused events ----------------------------------------------------------------------------


@pytest.mark.parametrize("event", [
    Submitted("a9", "1"), SubmitFailed("a9", "x"), AllocationStarted("a9"),
    TasksChanged("a9", 1), AllocationEnded("a9", "x"),
])
def test_events_about_unknown_allocations_are_refused(event: Any) -> None:
    m = machine()
    with pytest.raises(IllegalEvent, match="'a9': not known"):
        m.step(event, 0)


def test_events_out_of_order_are_refused_and_change_nothing() -> None:
    m = machine(max_allocations=2)
    m.step(BacklogChanged(1), 0)
    with pytest.raises(IllegalEvent, match="AllocationStarted while submitting"):
        m.step(AllocationStarted("a1"), 0)
    with pytest.raises(IllegalEvent, match="AllocationEnded while submitting"):
        m.step(AllocationEnded("a1", "x"), 0)
    with pytest.raises(IllegalEvent, match="TasksChanged while submitting"):
        m.step(TasksChanged("a1", 1), 0)
    m.step(Submitted("a1", "1"), 0)
    with pytest.raises(IllegalEvent, match="Submitted while pending"):
        m.step(Submitted("a1", "2"), 0)
    assert m.allocation("a1").native_id == "1"
    m.step(AllocationEnded("a1", "x"), 1)
    with pytest.raises(IllegalEvent, match="AllocationStarted while ended"):
        m.step(AllocationStarted("a1"), 2)
    assert m.allocation("a1").state == ENDED


def test_an_event_of_another_class_is_refused() -> None:
    with pytest.raises(IllegalEvent, match="unknown event"):
        machine().step("tick", 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("now", [float("nan"), float("inf"), None, "1", True])
def test_a_time_that_is_no_finite_number_is_refused(now: Any) -> None:
    with pytest.raises(TypeError, match="now"):
        machine().step(Tick(), now)


@pytest.mark.parametrize(("make", "error"), [
    (lambda: BacklogChanged(-1), ValueError), (lambda: BacklogChanged(1.5), TypeError),
    (lambda: BacklogChanged(None), TypeError), (lambda: TasksChanged("a1", -1), ValueError),
    (lambda: Submitted("", "1"), TypeError), (lambda: Submitted("a1", None), TypeError),
    (lambda: SubmitFailed("a1", 3), TypeError), (lambda: AllocationEnded(None, "x"),
                                                TypeError),
])
def test_bad_event_values_are_refused_when_made(make: Any, error: type) -> None:
    with pytest.raises(error):
        make()


def test_the_machine_needs_a_policy() -> None:
    with pytest.raises(TypeError, match="policy"):
        ElasticMachine({"executor": "local"})  # type: ignore[arg-type]


# -- invariants over random event sequences ---------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_random_sequences_keep_the_limits(seed: int) -> None:
    rng = random.Random(seed)
    policy_min = rng.randint(0, 2)
    m = machine(max_allocations=rng.randint(max(1, policy_min), 4), min_allocations=policy_min,
                backlog_per_allocation=rng.randint(1, 5), idle_timeout=rng.choice([0.5, 5, 30]),
                max_failures=rng.randint(1, 4), retry_delay=rng.choice([0, 1, 10]))
    policy = m.policy
    now = 0.0
    asked: List[str] = []
    gave_back: List[str] = []
    stops = 0
    for _ in range(300):
        now += rng.choice([0, 0.5, 3, 20])
        views = {v.allocation: v for v in m.allocations()}
        choices: List[Any] = [Tick(), BacklogChanged(rng.randint(0, 20))]
        for name, v in views.items():
            if v.state == SUBMITTING:
                choices += [Submitted(name, f"n{name}"), SubmitFailed(name, "refused")]
            if v.state == PENDING:
                choices += [AllocationStarted(name), AllocationEnded(name, "gone")]
            if v.state in (RUNNING, DRAINING):
                choices += [TasksChanged(name, rng.randint(0, 3)),
                            AllocationEnded(name, "gone")]
        if rng.random() < 0.01:
            choices.append(Closing())
        out = m.step(rng.choice(choices), now)
        asked += submits(out)
        gave_back += given_back(out)
        stops += sum(isinstance(a, StopAsking) for a in out)
        held = [v for v in m.allocations() if v.state != ENDED]
        assert len(held) <= policy.max_allocations
        for a in out:
            if isinstance(a, GiveBack):
                assert m.allocation(a.allocation).state == DRAINING
        if m.stopped is not None:
            assert not submits(out)
    assert stops <= 1
    assert len(set(asked)) == len(asked)  # names never reused
    assert len(set(gave_back)) == len(gave_back)  # each given back once
    assert [int(n[1:]) for n in asked] == list(range(1, len(asked) + 1))


def test_next_wake_is_never_in_the_past_after_a_step() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        m = machine(max_allocations=3, idle_timeout=rng.choice([0.5, 4]), retry_delay=2,
                    max_failures=50)
        now = 0.0
        for step in itertools.count():
            if step > 200:
                break
            now += rng.choice([0, 1, 5])
            views = m.allocations()
            event: Any = Tick()
            pick = rng.random()
            pending = [v for v in views if v.state in (SUBMITTING, PENDING, RUNNING)]
            if pick < 0.3:
                event = BacklogChanged(rng.randint(0, 5))
            elif pick < 0.7 and pending:
                v = rng.choice(pending)
                if v.state == SUBMITTING:
                    event = rng.choice([Submitted(v.allocation, "x"),
                                        SubmitFailed(v.allocation, "no")])
                elif v.state == PENDING:
                    event = AllocationStarted(v.allocation)
                else:
                    event = TasksChanged(v.allocation, rng.randint(0, 1))
            m.step(event, now)
            wake = m.next_wake()
            # A wake due now would mean the step left undone what a tick does.
            assert wake is None or wake > now, (seed, step, event, wake, now)
