"""The batch job-tracking state machine, driven by events and a manual clock (no I/O, no sleep)."""

from typing import List

import pytest

from psij import JobState
from psij._clock import ManualClock
from psij.executors.batch._tracking import (
    CancelAsked,
    CancelFailed,
    Finish,
    Hurry,
    IllegalEvent,
    JobAdded,
    JobTracker,
    MissingResolved,
    Observation,
    Phase,
    PollFailed,
    PollSucceeded,
    ReportState,
    ResolveMissing,
    Restate,
    RunStatusCommand,
    Settings,
    Tick,
)

SETTINGS = Settings(interval=10, initial_delay=2, error_threshold=2, outage_tolerance=300,
                    max_backoff=60, missing_grace=3, cancel_poll_delay=1)


def make() -> "tuple[JobTracker, ManualClock]":
    clock = ManualClock(1000.0)
    return JobTracker(SETTINGS, clock), clock


def poll(t: JobTracker) -> RunStatusCommand:
    actions = t.feed(Tick())
    assert len(actions) == 1 and isinstance(actions[0], RunStatusCommand), actions
    return actions[0]


def obs(state: JobState, **kw: object) -> Observation:
    return Observation(state, **kw)  # type: ignore[arg-type]


def test_first_poll_after_initial_delay_then_every_interval() -> None:
    t, clock = make()
    assert t.feed(Tick()) == []
    t.feed(JobAdded("1"))
    assert t.next_deadline() == 1002.0
    clock.advance(1.9)
    assert t.feed(Tick()) == []
    clock.advance(0.1)
    assert poll(t).native_ids == ("1",)
    assert t.feed(Tick()) == []  # a poll is in flight: no second command
    t.feed(PollSucceeded({"1": obs(JobState.QUEUED)}))
    assert t.next_deadline() == 1012.0
    clock.advance(9.99)
    assert t.feed(Tick()) == []
    clock.advance(0.01)
    assert poll(t).native_ids == ("1",)


def test_one_status_command_covers_all_jobs() -> None:
    t, clock = make()
    for i in range(1000):
        t.feed(JobAdded(str(i)))
    clock.advance(2)
    cmd = poll(t)
    assert len(cmd.native_ids) == 1000
    assert t.feed(Tick()) == []


def test_states_move_forward_and_final_finishes() -> None:
    t, clock = make()
    t.feed(JobAdded("7"))
    clock.advance(2)
    poll(t)
    actions = t.feed(PollSucceeded({"7": obs(JobState.ACTIVE, metadata={"native_state": "R"})}))
    assert actions == [ReportState("7", obs(JobState.ACTIVE, metadata={"native_state": "R"}))]
    clock.advance(10)
    poll(t)
    # A state that is not ahead of the current one is not reported again.
    assert t.feed(PollSucceeded({"7": obs(JobState.QUEUED)})) == []
    assert t.state.jobs["7"].state is JobState.ACTIVE
    clock.advance(10)
    poll(t)
    done = obs(JobState.COMPLETED, exit_code=0)
    assert t.feed(PollSucceeded({"7": done})) == [Finish("7", done, False)]
    assert not t.is_tracked("7")
    assert t.state.phase is Phase.IDLE and t.next_deadline() is None


def test_missing_job_is_resolved_never_assumed_completed() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    t.feed(JobAdded("2"))
    clock.advance(2)
    poll(t)
    actions = t.feed(PollSucceeded({"2": obs(JobState.ACTIVE)}))
    assert ResolveMissing(("1",)) in actions
    assert not any(isinstance(a, Finish) for a in actions)
    assert t.state.phase is Phase.RESOLVING
    done = obs(JobState.FAILED, exit_code=3)
    assert t.feed(MissingResolved({"1": done})) == [Finish("1", done, False)]
    assert t.state.phase is Phase.WAITING


def test_missing_without_trace_fails_after_grace_polls() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    clock.advance(2)
    for attempt in range(SETTINGS.missing_grace):
        poll(t)
        assert t.feed(PollSucceeded({})) == [ResolveMissing(("1",))]
        actions = t.feed(MissingResolved({}))
        clock.advance(10)
        if attempt < SETTINGS.missing_grace - 1:
            assert actions == []
            assert t.state.jobs["1"].misses == attempt + 1
    assert len(actions) == 1 and isinstance(actions[0], Finish)
    final = actions[0].observation
    assert final.state is JobState.FAILED
    assert final.message is not None and "without an exit code" in final.message
    assert not t.is_tracked("1")


def test_reappearing_job_resets_misses() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    clock.advance(2)
    poll(t)
    t.feed(PollSucceeded({}))
    t.feed(MissingResolved({}))
    assert t.state.jobs["1"].misses == 1
    clock.advance(10)
    poll(t)
    t.feed(PollSucceeded({"1": obs(JobState.ACTIVE)}))
    assert t.state.jobs["1"].misses == 0


def test_missing_after_cancel_is_canceled() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    t.feed(CancelAsked("1"))
    clock.advance(2)
    poll(t)
    t.feed(PollSucceeded({}))
    actions = t.feed(MissingResolved({}))
    assert len(actions) == 1 and isinstance(actions[0], Finish)
    assert actions[0].observation.state is JobState.CANCELED and actions[0].cancel_requested


def test_cancel_brings_the_next_poll_forward_and_cancel_failed_clears_it() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    clock.advance(2)
    poll(t)
    t.feed(PollSucceeded({"1": obs(JobState.ACTIVE)}))
    assert t.next_deadline() == 1012.0
    t.feed(CancelAsked("1"))
    assert t.next_deadline() == 1003.0
    t.feed(CancelFailed("1"))
    assert t.state.jobs["1"].cancel_requested is False


def test_poll_failures_change_no_state_and_back_off() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    clock.advance(2)
    delays: List[float] = []
    for _ in range(6):
        poll(t)
        assert t.feed(PollFailed("squeue: error: slurm_load_jobs error")) == []
        assert t.state.jobs["1"].state is JobState.QUEUED
        deadline = t.next_deadline()
        assert deadline is not None
        delays.append(deadline - clock.now())
        clock.advance(deadline - clock.now())
    assert delays == [10, 20, 40, 60, 60, 60]


def test_outage_fails_jobs_only_past_threshold_and_tolerance() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    t.feed(JobAdded("2"))
    clock.advance(2)
    start = clock.now()
    finished: List[Finish] = []
    while not finished:
        poll(t)
        actions = t.feed(PollFailed("`squeue` did not finish within 30 s and was killed"))
        finished = [a for a in actions if isinstance(a, Finish)]
        if not finished:
            deadline = t.next_deadline()
            assert deadline is not None
            clock.advance(deadline - clock.now())
    assert clock.now() - start >= SETTINGS.outage_tolerance
    assert [f.native_id for f in finished] == ["1", "2"]
    for f in finished:
        assert f.observation.state is JobState.FAILED
        assert f.observation.message is not None
        assert "did not finish within 30 s" in f.observation.message
    assert t.state.phase is Phase.IDLE


def test_success_resets_the_failure_count() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    clock.advance(2)
    poll(t)
    t.feed(PollFailed("boom"))
    assert t.state.failures == 1
    clock.advance(10)
    poll(t)
    t.feed(PollSucceeded({"1": obs(JobState.QUEUED)}))
    assert t.state.failures == 0 and t.state.outage_since is None


def test_threshold_alone_does_not_fail_jobs_before_tolerance() -> None:
    clock = ManualClock(0)
    t = JobTracker(Settings(interval=1, initial_delay=0, error_threshold=0, outage_tolerance=5,
                            max_backoff=1), clock)
    t.feed(JobAdded("1"))
    for _ in range(5):
        poll(t)
        assert t.feed(PollFailed("x")) == []
        clock.advance(1)
    poll(t)
    actions = t.feed(PollFailed("x"))
    assert len(actions) == 1 and actions[0].observation.state is JobState.FAILED  # type: ignore


def test_jobs_added_during_a_poll_are_not_judged_missing() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    clock.advance(2)
    poll(t)
    t.feed(JobAdded("2"))
    assert t.feed(PollSucceeded({"1": obs(JobState.QUEUED)})) == []
    assert t.is_tracked("2")
    assert t.next_deadline() == min(1004.0, 1012.0)


def test_attach_polls_at_once() -> None:
    t, _ = make()
    t.feed(JobAdded("9", state=JobState.NEW, poll_soon=True))
    assert poll(t).native_ids == ("9",)
    actions = t.feed(PollSucceeded({"9": obs(JobState.ACTIVE)}))
    assert actions == [ReportState("9", obs(JobState.ACTIVE))]


@pytest.mark.parametrize("event", [
    PollSucceeded({}), PollFailed("x"), MissingResolved({}), CancelAsked("nope"),
    CancelFailed("nope"),
])
def test_illegal_events_raise_and_leave_state_unchanged(event: object) -> None:
    t, _ = make()
    t.feed(JobAdded("1"))
    before = t.state
    with pytest.raises(IllegalEvent):
        t.feed(event)  # type: ignore[arg-type]
    assert t.state is before


def test_duplicate_and_final_job_added_are_illegal() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    before = t.state
    with pytest.raises(IllegalEvent):
        t.feed(JobAdded("1"))
    with pytest.raises(IllegalEvent):
        t.feed(JobAdded("2", state=JobState.COMPLETED))
    assert t.state is before
    clock.advance(2)
    poll(t)
    with pytest.raises(IllegalEvent):
        t.feed(MissingResolved({}))


def test_state_objects_are_immutable() -> None:
    t, _ = make()
    t.feed(JobAdded("1"))
    with pytest.raises(TypeError):
        t.state.jobs["2"] = t.state.jobs["1"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        t.state.phase = Phase.IDLE  # type: ignore[misc]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="interval"):
        Settings(interval=0)
    with pytest.raises(ValueError, match="error_threshold"):
        Settings(error_threshold=-1)


# -- holds by the scheduler: said again in the same state --------------------------------------

HELD = {"native_state": "PENDING", "reason": "JobHeldUser", "held_by": "scheduler"}


def test_a_hold_and_its_release_are_restated_once_each() -> None:
    t, clock = make()
    t.feed(JobAdded("1"))
    clock.advance(2)
    poll(t)
    [restated] = t.feed(PollSucceeded({"1": obs(JobState.QUEUED, metadata=HELD)}))
    assert isinstance(restated, Restate) and restated.observation.metadata == HELD
    for _ in range(3):  # still held: nothing more to say
        clock.advance(10)
        poll(t)
        assert t.feed(PollSucceeded({"1": obs(JobState.QUEUED, metadata=HELD)})) == []
    clock.advance(10)
    poll(t)
    [released] = t.feed(PollSucceeded({"1": obs(JobState.QUEUED)}))
    assert isinstance(released, Restate) and "held_by" not in released.observation.metadata
    clock.advance(10)
    poll(t)
    [active] = t.feed(PollSucceeded({"1": obs(JobState.ACTIVE)}))
    assert isinstance(active, ReportState)


def test_an_attached_job_seen_held_first_is_reported_not_restated() -> None:
    t, _ = make()
    t.feed(JobAdded("1", JobState.NEW, poll_soon=True))
    poll(t)
    [first] = t.feed(PollSucceeded({"1": obs(JobState.QUEUED, metadata=HELD)}))
    assert isinstance(first, ReportState)
    assert t.state.jobs["1"].held


# -- hurried groups: the queued jobs of shapes that hold jobs back -----------------------------


def _rounds(t: JobTracker, clock: ManualClock, seconds: float, seen: "dict[str, JobState]",
            step: float = 0.5) -> "list[tuple[float, tuple[str, ...]]]":
    """Advance the clock ``seconds`` by ``step``, answering each poll with ``seen``."""
    rounds = []
    end = clock.now() + seconds
    while clock.now() < end - 1e-9:
        clock.advance(step)
        actions = t.feed(Tick())
        if actions:
            [cmd] = actions
            assert isinstance(cmd, RunStatusCommand)
            rounds.append((clock.now(), cmd.native_ids))
            t.feed(PollSucceeded({n: obs(seen[n]) for n in cmd.native_ids}))
    return rounds


def test_queued_jobs_of_hurried_groups_are_polled_at_the_short_interval() -> None:
    t, clock = make()
    seen = {"a1": JobState.QUEUED, "a2": JobState.ACTIVE, "b1": JobState.QUEUED}
    t.feed(JobAdded("a1", group="a"))
    t.feed(JobAdded("a2", group="a"))
    t.feed(JobAdded("b1", group="b"))
    t.feed(Hurry(frozenset({"a"})))
    rounds = _rounds(t, clock, 12, seen)
    # the first round covers all (initial delay); then a1, the only queued job of "a", every
    # initial_delay (2 s); the full round still every interval (10 s)
    assert rounds[0] == (1002.0, ("a1", "a2", "b1"))
    assert rounds[1:5] == [(1004.0, ("a1",)), (1006.0, ("a1",)), (1008.0, ("a1",)),
                           (1010.0, ("a1",))]
    assert rounds[5] == (1012.0, ("a1", "a2", "b1"))
    # a1 starts: no queued job of "a" is left, so nothing is polled sooner any more
    seen["a1"] = JobState.ACTIVE
    rounds = _rounds(t, clock, 25, seen)
    assert [ids for _, ids in rounds] == [("a1",), ("a1", "a2", "b1"), ("a1", "a2", "b1")]


def test_without_hurried_groups_nothing_is_polled_sooner() -> None:
    t, clock = make()
    seen = {"a1": JobState.QUEUED}
    t.feed(JobAdded("a1", group="a"))
    t.feed(Hurry(frozenset({"a"})))
    t.feed(Hurry(frozenset()))  # the shape holds nothing any more
    assert [when for when, _ in _rounds(t, clock, 25, seen)] == [1002.0, 1012.0, 1022.0]
    # no group at all (a job of an executor without max_queued_per_shape)
    t2, clock2 = make()
    t2.feed(JobAdded("x"))
    t2.feed(Hurry(frozenset({None})))
    assert [when for when, _ in _rounds(t2, clock2, 25, {"x": JobState.QUEUED})] == \
        [1002.0, 1012.0, 1022.0]


def test_hurry_while_waiting_brings_the_next_look_forward() -> None:
    t, clock = make()
    t.feed(JobAdded("a1", group="a"))
    clock.advance(2)
    poll(t)
    t.feed(PollSucceeded({"a1": obs(JobState.QUEUED)}))
    assert t.next_deadline() == 1012.0
    clock.advance(1)
    t.feed(Hurry(frozenset({"a"})))
    assert t.next_deadline() == 1005.0
    clock.advance(2)
    assert poll(t).native_ids == ("a1",)


def test_a_failed_poll_keeps_its_backoff_even_for_hurried_jobs() -> None:
    t, clock = make()
    t.feed(JobAdded("a1", group="a"))
    t.feed(Hurry(frozenset({"a"})))
    clock.advance(2)
    poll(t)
    t.feed(PollFailed("squeue: timed out"))
    assert t.next_deadline() == 1012.0  # the backoff (interval), not initial_delay
    clock.advance(10)
    poll(t)
    t.feed(PollSucceeded({"a1": obs(JobState.QUEUED)}))
    assert t.next_deadline() == 1014.0  # working again: hurried again
