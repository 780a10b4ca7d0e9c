"""The holding machine of ``max_queued_per_shape`` (pure: events in, actions out) and shapes."""

import random
from typing import Dict, List, Tuple

import pytest

from psij import InvalidJobException, JobAttributes, JobSpec, ResourceSpecV1
from psij.executors.batch._holding import (
    Arrived,
    Cancel,
    CancelSubmitted,
    Dropped,
    Hold,
    Holding,
    IllegalEvent,
    LeftQueue,
    Phase,
    Reprioritize,
    Submit,
    SubmitFailed,
    Submitted,
)
from psij.executors.batch._shapes import round_up, shape_of


def submit_all(h: Holding, actions: List[object]) -> List[str]:
    """Feed Submitted for every Submit; the keys submitted."""
    keys = [a.key for a in actions if isinstance(a, Submit)]  # type: ignore[attr-defined]
    for k in keys:
        assert h.step(Submitted(k)) == []
    return keys


def test_cap_per_shape_then_held() -> None:
    h = Holding(2)
    assert h.step(Arrived("a1", "A", 0)) == [Submit("a1")]
    assert h.step(Arrived("a2", "A", 0)) == [Submit("a2")]
    assert h.step(Arrived("a3", "A", 0)) == [Hold("a3", 1)]
    assert h.step(Arrived("a4", "A", 0)) == [Hold("a4", 2)]
    # another shape has its own slots
    assert h.step(Arrived("b1", "B", 0)) == [Submit("b1")]
    assert h.counts("A") == (2, 2) and h.counts("B") == (1, 0)
    assert h.phase("a3") is Phase.HELD and h.phase("a1") is Phase.SUBMITTING
    h.step(Submitted("a1"))
    assert h.phase("a1") is Phase.QUEUED
    # a start frees one slot: the first held job goes
    assert h.step(LeftQueue("a1")) == [Submit("a3")]
    assert h.counts("A") == (2, 1)


def test_priority_order_then_arrival_within_a_shape() -> None:
    h = Holding(1)
    first = h.step(Arrived("x", "S", 0))
    submit_all(h, first)
    prios = {"p1": 1, "p5": 5, "p3": 3, "p5b": 5, "n": -2.5, "p3b": 3.0}
    for key, p in prios.items():
        assert isinstance(h.step(Arrived(key, "S", p))[0], Hold)
    order = []
    last = "x"
    for _ in prios:
        (action,) = h.step(LeftQueue(last))
        assert isinstance(action, Submit)
        last = action.key
        h.step(Submitted(last))
        order.append(last)
    assert order == ["p5", "p5b", "p3", "p3b", "p1", "n"]
    assert h.step(LeftQueue(last)) == []
    assert h.counts("S") == (0, 0)


def test_random_workload_matches_a_model_of_the_rules() -> None:
    rng = random.Random(7)
    cap = 3
    h = Holding(cap)
    queued: Dict[str, List[str]] = {s: [] for s in "ABC"}
    held: Dict[str, List[Tuple[float, int, str]]] = {s: [] for s in "ABC"}  # the model
    for i in range(3000):
        if rng.random() < 0.6 or not any(queued.values()):
            key, shape, p = f"j{i}", rng.choice("ABC"), rng.randint(-5, 5)
            actions = h.step(Arrived(key, shape, p))
            if len(queued[shape]) < cap:
                assert actions == [Submit(key)]
                queued[shape].append(key)
            else:
                held[shape].append((-p, i, key))
                assert actions == [Hold(key, len(held[shape]))]
        else:
            shape = rng.choice([s for s in "ABC" if queued[s]])
            key = queued[shape].pop(rng.randrange(len(queued[shape])))
            actions = h.step(LeftQueue(key))
            if held[shape]:
                best = min(held[shape])
                held[shape].remove(best)
                assert actions == [Submit(best[2])]  # highest priority, then earliest
                queued[shape].append(best[2])
            else:
                assert actions == []
        submit_all(h, actions)
        for s in "ABC":
            assert h.counts(s) == (len(queued[s]), len(held[s]))
            assert len(queued[s]) <= cap


def test_buckets_group_memory_and_tmp_but_keep_exact_amounts() -> None:
    gib = 1 << 30
    assert round_up(int(1.2 * gib), gib) == 2 * gib == round_up(int(1.9 * gib), gib)
    assert round_up(2 * gib, gib) == 2 * gib
    assert round_up(int(1.2 * gib), 0) == int(1.2 * gib)
    assert round_up(None, gib) is None

    def spec(mem: int, tmp: int, **custom: object) -> JobSpec:
        return JobSpec("/bin/true", resources=ResourceSpecV1(memory=mem),
                       attributes=JobAttributes(custom_attributes={"psij.tmp": tmp, **custom}))

    a = spec(int(1.2 * gib), 10 * gib + 1)
    b = spec(int(1.9 * gib), 11 * gib, **{"psij.priority": 9})
    assert shape_of(a, gib, 4 * gib) == shape_of(b, gib, 4 * gib)
    assert shape_of(a, gib, 4 * gib).memory == 2 * gib
    assert shape_of(a, gib, 4 * gib).tmp == 12 * gib
    assert shape_of(a) != shape_of(b)  # exact grouping without buckets
    assert a.resources.memory == int(1.2 * gib)  # type: ignore[union-attr]
    assert shape_of(spec(gib, 0, **{"slurm.constraint": "x"}), gib, gib) != \
        shape_of(spec(gib, 0), gib, gib)
    with pytest.raises(InvalidJobException, match="psij.tmp.*whole number of bytes"):
        shape_of(spec(gib, -1))
    with pytest.raises(InvalidJobException, match="psij.tmp"):
        shape_of(JobSpec("/bin/true", attributes=JobAttributes(
            custom_attributes={"psij.tmp": float("nan")})))


def test_cancel_held_job_drops_it_and_its_slot_goes_on() -> None:
    h = Holding(1)
    submit_all(h, h.step(Arrived("q", "S", 0)))
    h.step(Arrived("h1", "S", 9))
    h.step(Arrived("h2", "S", 1))
    assert h.step(Cancel("h1")) == [Dropped("h1")]
    assert h.phase("h1") is None and h.counts("S") == (1, 1)
    assert h.step(LeftQueue("q")) == [Submit("h2")]  # the cancelled head is skipped
    with pytest.raises(IllegalEvent, match="not known"):
        h.step(Cancel("h1"))


def test_cancel_during_submission_cancels_it_once_submitted() -> None:
    h = Holding(1)
    h.step(Arrived("a", "S", 0))
    assert h.step(Cancel("a")) == []
    assert h.step(Submitted("a")) == [CancelSubmitted("a")]
    with pytest.raises(IllegalEvent, match="queued in the scheduler"):
        h.step(Cancel("a"))
    h2 = Holding(1)
    h2.step(Arrived("b", "S", 0))
    h2.step(Cancel("b"))
    assert h2.step(SubmitFailed("b")) == []
    assert h2.counts("S") == (0, 0)


def test_a_shape_whose_submissions_all_fail_does_not_block_others() -> None:
    h = Holding(2)
    bad = [a for i in range(6) for a in h.step(Arrived(f"bad{i}", "BAD", i))]
    good = [a for i in range(6) for a in h.step(Arrived(f"ok{i}", "OK", i))]
    assert [a.key for a in bad if isinstance(a, Submit)] == ["bad0", "bad1"]
    tried = ["bad0", "bad1"]
    pending = ["bad0", "bad1"]
    while pending:  # every bad submission fails; the next held bad job is tried each time
        key = pending.pop(0)
        for action in h.step(SubmitFailed(key)):
            assert isinstance(action, Submit)
            tried.append(action.key)
            pending.append(action.key)
    assert sorted(tried) == [f"bad{i}" for i in range(6)]
    assert h.counts("BAD") == (0, 0)
    # the good shape went its own way all along
    assert submit_all(h, good) == ["ok0", "ok1"]
    assert h.step(LeftQueue("ok0")) == [Submit("ok5")]


def test_illegal_events_raise_and_change_nothing() -> None:
    h = Holding(1)
    h.step(Arrived("a", "S", 0))
    h.step(Arrived("b", "S", 0))
    before = (h.counts("S"), h.phase("a"), h.phase("b"))
    for event, text in [(Arrived("a", "S", 0), "already known"),
                        (LeftQueue("a"), "submitting, not queued"),
                        (Submitted("b"), "held, not submitting"),
                        (SubmitFailed("zz"), "not known"),
                        (Arrived("c", "S", float("nan")), "expected a number"),
                        (Arrived("c", "S", "high"), "expected a number")]:
        with pytest.raises(IllegalEvent, match=text):
            h.step(event)  # type: ignore[arg-type]
        assert (h.counts("S"), h.phase("a"), h.phase("b")) == before
    with pytest.raises(IllegalEvent, match="unknown event"):
        h.step(object())  # type: ignore[arg-type]
    for bad in (0, -1, True, 2.5, None):
        with pytest.raises(ValueError, match="max_queued_per_shape"):
            Holding(bad)  # type: ignore[arg-type]


# -- new priorities, and the shapes that hold jobs ---------------------------------------------


def test_a_new_priority_moves_a_held_job_at_once() -> None:
    h = Holding(1)
    submit_all(h, h.step(Arrived("x", "S", 0)))
    for key, p in (("a", 1), ("b", 2), ("c", 3)):
        h.step(Arrived(key, "S", p))
    assert h.step(Reprioritize("a", 10)) == []
    assert h.step(Reprioritize("c", -1)) == []
    assert h.step(Reprioritize("b", 50)) == []
    assert h.step(Reprioritize("b", 2)) == []  # and back: its first place counts again
    order = []
    last = "x"
    for _ in range(3):
        (action,) = h.step(LeftQueue(last))
        assert isinstance(action, Submit)
        last = action.key
        h.step(Submitted(last))
        order.append(last)
    assert order == ["a", "b", "c"]
    assert h.step(LeftQueue(last)) == [] and h.counts("S") == (0, 0)


def test_equal_new_priorities_keep_the_order_of_arrival() -> None:
    h = Holding(1)
    submit_all(h, h.step(Arrived("x", "S", 0)))
    for key in "abc":
        h.step(Arrived(key, "S", 0))
    h.step(Reprioritize("c", 5))
    h.step(Reprioritize("a", 5))
    (first,) = h.step(LeftQueue("x"))
    assert first == Submit("a")  # arrived before c


def test_only_held_jobs_take_a_new_priority_here() -> None:
    h = Holding(1)
    h.step(Arrived("a", "S", 0))
    h.step(Arrived("b", "S", 0))
    for event, text in [(Reprioritize("a", 1), "submitting, not held"),
                        (Reprioritize("zz", 1), "not known"),
                        (Reprioritize("b", float("nan")), "expected a number"),
                        (Reprioritize("b", True), "expected a number")]:
        with pytest.raises(IllegalEvent, match=text):
            h.step(event)  # type: ignore[arg-type]
    h.step(Submitted("a"))
    with pytest.raises(IllegalEvent, match="queued, not held"):
        h.step(Reprioritize("a", 1))


def test_random_reprioritized_workload_matches_a_model() -> None:
    rng = random.Random(11)
    cap = 2
    h = Holding(cap)
    queued: Dict[str, List[str]] = {s: [] for s in "AB"}
    held: Dict[str, Dict[str, Tuple[float, int]]] = {s: {} for s in "AB"}  # key -> (-p, i)
    changes = 0
    holding = set()
    for i in range(4000):
        r = rng.random()
        everything_held = [(s, k) for s in "AB" for k in held[s]]
        if r < 0.45 or not (any(queued.values()) or everything_held):
            key, shape, p = f"j{i}", rng.choice("AB"), rng.randint(-3, 3)
            actions = h.step(Arrived(key, shape, p))
            if len(queued[shape]) < cap:
                queued[shape].append(key)
            else:
                held[shape][key] = (-p, i)
        elif r < 0.7 and everything_held:
            shape, key = rng.choice(everything_held)
            p = rng.randint(-3, 3)
            assert h.step(Reprioritize(key, p)) == []
            held[shape][key] = (-p, held[shape][key][1])
            actions = []
        elif r < 0.8 and everything_held:
            shape, key = rng.choice(everything_held)
            assert h.step(Cancel(key)) == [Dropped(key)]
            del held[shape][key]
            actions = []
        elif any(queued.values()):
            shape = rng.choice([s for s in "AB" if queued[s]])
            key = queued[shape].pop(rng.randrange(len(queued[shape])))
            actions = h.step(LeftQueue(key))
            if held[shape]:
                best = min(held[shape], key=lambda k: held[shape][k])
                del held[shape][best]
                assert actions == [Submit(best)]
                queued[shape].append(best)
            else:
                assert actions == []
        else:
            continue
        submit_all(h, actions)
        now = {s for s in "AB" if held[s]}
        changes += now != holding
        holding = now
        assert h.holding() == now and h.holding_changes == changes
        for s in "AB":
            assert h.counts(s) == (len(queued[s]), len(held[s]))
