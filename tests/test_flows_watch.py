"""psij.flows._watch: the ``watch`` request of the flow machine, answered when a handle of the
caller changes (an instance's end above all), at once when a change was made since ``after``;
kept per connection, forgotten when it closes, refused with the field named."""

from typing import Any, List

import pytest

from psij.controller import Disconnected
from psij.flows._watch import MAX_WATCHES
from support.flow_sim import Sim


def _answers_to(sim: Sim, rid: Any) -> List[Any]:
    return [m for _, m in sim.answers if isinstance(m, dict) and m.get("id") == rid]


def _running(sim: Sim, uid: int = 1000) -> str:
    h = sim.create(1, uid=uid)
    sim.run()
    return h


def test_a_watch_is_answered_when_an_instance_of_the_callers_handle_ends() -> None:
    sim = Sim()
    h = _running(sim)
    current = sim.call("watch", handle=h)["change"]  # after 0: the changes made so far
    assert current > 0
    for fields in ({"handle": h}, {}):
        assert sim.call("watch", after=current, **fields) is None  # nothing new: it waits
    waiting = [sim.next_id - 1, sim.next_id]
    (key,) = sim.live(h)
    sim.finish(key, 3)
    for rid in waiting:
        (answer,) = _answers_to(sim, rid)
        assert answer["ok"] is True and answer["change"] > current
    # Answered once: later changes reach only later watches.
    sim.run()
    assert all(len(_answers_to(sim, rid)) == 1 for rid in waiting)


def test_an_earlier_change_is_answered_at_once_and_a_later_after_waits_for_the_next() -> None:
    sim = Sim()
    h = _running(sim)
    first = sim.call("watch", handle=h)["change"]
    (key,) = sim.live(h)
    sim.finish(key, 0)
    assert sim.call("watch", handle=h, after=first)["change"] > first
    assert sim.call("watch", after=10**12) is None


def test_other_users_changes_and_handles_are_not_theirs_to_watch() -> None:
    sim = Sim()
    mine = _running(sim)
    assert sim.call("watch", uid=1001) is None  # waits: user 1001 has no handle
    rid = sim.next_id
    assert sim.call("watch", uid=1001, handle=mine)["error"]["code"] == "unknown_handle"
    (key,) = sim.live(mine)
    sim.finish(key, 0)
    assert _answers_to(sim, rid) == []


def test_a_closed_connection_forgets_its_watches() -> None:
    sim = Sim()
    h = _running(sim)
    watcher = sim.connect(1000)
    current = sim.send(watcher, {"id": "w1", "op": "watch"})["change"]
    assert sim.send(watcher, {"id": "w2", "op": "watch", "after": current}) is None
    sim.step(Disconnected(watcher, "closed"))
    assert sim.machine.watch.waiting == {}
    before = len(sim.answers)
    (key,) = sim.live(h)
    sim.finish(key, 0)
    assert [c for c, _ in sim.answers[before:]] == []


@pytest.mark.parametrize("after", [-1, 1.5, "1", True, float("nan"), float("inf"), 10**30,
                                   [1], {"a": 1}])
def test_a_bad_after_is_refused_naming_it(after: Any) -> None:
    sim = Sim()
    answer = sim.call("watch", after=after)
    assert answer["ok"] is False and answer["error"]["field"] == "after", answer


def test_watches_waiting_on_one_connection_are_bounded() -> None:
    sim = Sim()
    for _ in range(MAX_WATCHES):
        assert sim.call("watch", after=10**12) is None
    answer = sim.call("watch", after=10**12)
    assert answer["error"]["field"] == "after" and str(MAX_WATCHES) in answer["error"]["message"]
    # Another connection of the same user has its own.
    other = sim.connect(1000)
    assert sim.send(other, {"id": "x", "op": "watch", "after": 10**12}) is None


def test_a_handle_destroyed_answers_its_watches() -> None:
    sim = Sim()
    h = _running(sim)
    watcher = sim.connect(1000)
    current = sim.send(watcher, {"id": "w1", "op": "watch", "handle": h})["change"]
    assert sim.send(watcher, {"id": "w2", "op": "watch", "handle": h, "after": current}) \
        is None
    assert sim.call("destroy", handle=h)["ok"] is True
    (answer,) = _answers_to(sim, "w2")
    assert answer["change"] > current


@pytest.mark.parametrize("handle", ["", "f" * 41, 7, ["f1"], "f1\nf2", "f999"])
def test_a_bad_or_unknown_handle_is_refused_naming_it(handle: Any) -> None:
    sim = Sim()
    sim.create(1)
    answer = sim.call("watch", handle=handle)
    error = answer["error"]
    assert error["code"] == "unknown_handle" or error["field"] == "handle", answer
    assert "handle" in error["message"] and sim.machine.watch.waiting == {}
