"""The pilot's pure scheduler: the order in which tasks start (priorities, dependencies,
iteration groups), cancel, finish and forget, the pool's books, and the work per
scheduling decision, each test feeding the machine events through ``step``. Where tasks are
placed is in tests/test_pilot_scheduler_placement.py."""

import json
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from psij._machine import IllegalEvent
from psij.executors.pilot.resources import NodeShare, ResourcePool, ResourceRequest
from psij.executors.pilot.scheduler import (
    SCHEDULE,
    CancelAsked,
    Forgotten,
    Scheduler,
    SucceededBefore,
    TaskFinished,
    TaskRequest,
    TaskSubmitted,
    Transition,
    expand_iterations,
)
from support.pilot_tasks import (
    CANCELED,
    FAILED,
    OMITTED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    WAITING,
    cores,
    spec,
    started,
    task,
)

# -- order ------------------------------------------------------------------------------------


def test_higher_priority_first_then_arrival_order() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 1))
    for name, priority in (("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5), ("mid", 2)):
        scheduler.step(TaskSubmitted(task(name, priority=priority)))
    order = []
    running = started(scheduler.step(SCHEDULE))
    while running:
        order.extend(running)
        scheduler.step(TaskFinished(running[0], True))
        running = started(scheduler.step(SCHEDULE))
    assert order == ["high1", "high2", "mid", "low1", "low2"]


def test_priority_orders_tasks_across_different_shapes() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 2))
    scheduler.step(TaskSubmitted(task("one-core", cores(1), priority=1)))
    scheduler.step(TaskSubmitted(task("two-cores", cores(2), priority=3)))
    assert started(scheduler.step(SCHEDULE)) == ["two-cores"]


def test_within_a_priority_a_task_that_does_not_fit_does_not_hold_back_others() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("hog", cores(3))))
    scheduler.step(TaskSubmitted(task("wide", cores(4))))
    scheduler.step(TaskSubmitted(task("small", cores(1))))
    assert started(scheduler.step(SCHEDULE)) == ["hog", "small"]
    assert scheduler.state("wide") is QUEUED


def test_a_waiting_higher_priority_task_holds_back_lower_priorities() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("hog", cores(3))))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskSubmitted(task("wide", cores(4), priority=1)))
    scheduler.step(TaskSubmitted(task("small", cores(1))))
    assert scheduler.step(SCHEDULE) == []  # the pool drains for "wide"
    scheduler.step(TaskFinished("hog", True))
    assert started(scheduler.step(SCHEDULE)) == ["wide"]
    scheduler.step(TaskFinished("wide", True))
    assert started(scheduler.step(SCHEDULE)) == ["small"]


def test_the_barrier_rises_when_a_higher_priority_joins_a_queue() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("hog", cores(3))))
    scheduler.step(TaskSubmitted(task("pair", cores(2))))
    assert started(scheduler.step(SCHEDULE)) == ["hog"]
    scheduler.step(TaskSubmitted(task("wide", cores(4), priority=1)))
    scheduler.step(TaskSubmitted(task("small", cores(1))))
    assert scheduler.step(SCHEDULE) == []
    scheduler.step(CancelAsked("wide"))
    assert started(scheduler.step(SCHEDULE)) == ["small"]


# -- dependencies -----------------------------------------------------------------------------


def test_a_dependent_waits_and_starts_after_its_dependency_succeeds() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(TaskSubmitted(task("b", after=("a",))))
    assert scheduler.state("b") is WAITING
    assert started(scheduler.step(SCHEDULE)) == ["a"]
    assert scheduler.step(TaskFinished("a", True)) == [Transition("a", SUCCEEDED)]
    assert scheduler.state("b") is QUEUED
    assert started(scheduler.step(SCHEDULE)) == ["b"]


def test_a_failed_dependency_omits_the_whole_chain() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(TaskSubmitted(task("b", after=("a",))))
    scheduler.step(TaskSubmitted(task("c", after=("b",))))
    scheduler.step(TaskSubmitted(task("d", after=("c", "a"))))
    scheduler.step(TaskSubmitted(task("free")))
    scheduler.step(SCHEDULE)
    transitions = scheduler.step(TaskFinished("a", False))
    assert transitions[0] == Transition("a", FAILED, "the task reported failure")
    assert {t.task_id: t.state for t in transitions[1:]} == {"b": OMITTED, "c": OMITTED,
                                                             "d": OMITTED}
    assert scheduler.message("c") == "omitted: dependency 'b' ended OMITTED"
    assert scheduler.state("free") is RUNNING
    assert scheduler.counts()[OMITTED] == 3


def test_depending_on_an_already_failed_or_canceled_task_omits_at_submission() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskFinished("a", False))
    assert scheduler.step(TaskSubmitted(task("b", after=("a",)))) == [
        Transition("b", OMITTED, "omitted: dependency 'a' ended FAILED")]  # at once
    assert scheduler.state("b") is OMITTED
    scheduler.step(TaskSubmitted(task("c")))
    scheduler.step(CancelAsked("c"))
    scheduler.step(TaskSubmitted(task("d", after=("c",))))
    assert scheduler.state("d") is OMITTED
    assert scheduler.message("d") == "omitted: dependency 'c' ended CANCELED"


def test_depending_on_an_already_succeeded_task_is_eligible_at_once() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskFinished("a", True))
    scheduler.step(TaskSubmitted(task("b", after=("a",))))
    assert scheduler.state("b") is QUEUED


def test_an_unknown_dependency_is_refused_and_nothing_is_added() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    with pytest.raises(IllegalEvent, match="TaskRequest.after: 'ghost' is neither a task nor"):
        scheduler.step(TaskSubmitted(task("b", after=("ghost",))))
    assert scheduler.task_ids() == [] and sum(scheduler.counts().values()) == 0
    scheduler.step(TaskSubmitted(task("b")))  # the name is still free


def test_canceling_a_waiting_task_omits_its_dependents() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 1))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(TaskSubmitted(task("b", after=("a",))))
    scheduler.step(TaskSubmitted(task("c", after=("b",))))
    assert scheduler.step(CancelAsked("b")) == [
        Transition("b", CANCELED, "canceled before it started"),
        Transition("c", OMITTED, "omitted: dependency 'b' ended CANCELED")]
    scheduler.step(SCHEDULE)
    assert scheduler.step(TaskFinished("a", True)) == [Transition("a", SUCCEEDED)]


def test_an_ended_dependent_stays_ended_when_its_dependency_succeeds() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(TaskSubmitted(task("b")))
    scheduler.step(TaskSubmitted(task("canceled", after=("a",))))
    scheduler.step(TaskSubmitted(task("omitted", after=("a", "b"))))
    scheduler.step(CancelAsked("canceled"))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskFinished("b", False))
    assert scheduler.step(TaskFinished("a", True)) == [Transition("a", SUCCEEDED)]
    assert scheduler.step(SCHEDULE) == []
    assert (scheduler.state("canceled"), scheduler.state("omitted")) == (CANCELED, OMITTED)


# -- iterations -------------------------------------------------------------------------------


def test_iterations_expand_to_named_members_of_a_group() -> None:
    request = TaskRequest("sim", cores(2), priority=3, after=("prep:${it}", "setup"))
    members = expand_iterations(request, 1, 4)
    assert [m.name for m in members] == ["sim:1", "sim:2", "sim:3"]
    assert [m.after for m in members] == [("prep:1", "setup"), ("prep:2", "setup"),
                                         ("prep:3", "setup")]
    assert all(m.group == "sim" and m.priority == 3 and m.resources == cores(2)
               for m in members)
    assert expand_iterations(TaskRequest("x", after=("p:${ it }",)), 0, 1)[0].after == ("p:0",)
    with pytest.raises(ValueError, match=r"stop \(2\) must be greater than start \(2\)"):
        expand_iterations(request, 2, 2)
    with pytest.raises(ValueError, match="cannot be nested"):
        expand_iterations(members[0], 0, 2)


def test_per_iteration_dependencies_and_a_dependency_on_all_iterations() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 8))
    for member in expand_iterations(TaskRequest("prep"), 0, 3):
        scheduler.step(TaskSubmitted(member))
    for member in expand_iterations(TaskRequest("sim", after=("prep:${it}",)), 0, 3):
        scheduler.step(TaskSubmitted(member))
    scheduler.step(TaskSubmitted(TaskRequest("report", after=("sim",))))
    assert scheduler.group_members("sim") == ("sim:0", "sim:1", "sim:2")
    assert started(scheduler.step(SCHEDULE)) == ["prep:0", "prep:1", "prep:2"]
    scheduler.step(TaskFinished("prep:1", True))
    assert started(scheduler.step(SCHEDULE)) == ["sim:1"]  # only its own iteration
    omitted = scheduler.step(TaskFinished("prep:2", False))[1:]
    assert [(t.task_id, t.state) for t in omitted] == [("sim:2", OMITTED),
                                                        ("report", OMITTED)]
    assert scheduler.state("sim:0") is WAITING


def test_a_dependency_on_a_group_waits_for_every_iteration() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 8))
    for member in expand_iterations(TaskRequest("it"), 0, 2):
        scheduler.step(TaskSubmitted(member))
    scheduler.step(TaskSubmitted(TaskRequest("after-all", after=("it",))))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskFinished("it:0", True))
    assert scheduler.state("after-all") is WAITING
    scheduler.step(TaskFinished("it:1", True))
    assert started(scheduler.step(SCHEDULE)) == ["after-all"]


def test_group_and_task_names_do_not_collide() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 8))
    for member in expand_iterations(TaskRequest("it"), 0, 2):
        scheduler.step(TaskSubmitted(member))
    with pytest.raises(IllegalEvent, match="'it' is already the name of an iteration group"):
        scheduler.step(TaskSubmitted(TaskRequest("it")))
    scheduler.step(TaskSubmitted(TaskRequest("plain")))
    with pytest.raises(IllegalEvent, match="TaskRequest.group: 'plain' is already the name"):
        scheduler.step(TaskSubmitted(expand_iterations(TaskRequest("plain"), 0, 1)[0]))


# -- cancel, finish, forget -------------------------------------------------------------------


def test_cancel_of_a_queued_task_ends_it_and_it_never_starts() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 1))
    scheduler.step(TaskSubmitted(task("run")))
    scheduler.step(TaskSubmitted(task("queued")))
    scheduler.step(TaskSubmitted(task("next")))
    scheduler.step(SCHEDULE)
    assert scheduler.step(CancelAsked("queued")) == [Transition("queued", CANCELED,
                                                     "canceled before it started")]
    scheduler.step(TaskFinished("run", True))
    assert started(scheduler.step(SCHEDULE)) == ["next"]
    assert scheduler.step(CancelAsked("queued")) == []  # already ended: nothing to do


def test_cancel_of_the_only_queued_task_of_a_shape_empties_it() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 1))
    scheduler.step(TaskSubmitted(task("blocker")))
    scheduler.step(TaskSubmitted(task("two", cores(1), priority=2)))
    scheduler.step(CancelAsked("two"))
    assert started(scheduler.step(SCHEDULE)) == ["blocker"]
    assert scheduler.shape_count() == 0


def test_cancel_of_a_running_task_ends_it_canceled_when_it_stops() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 2))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(TaskSubmitted(task("b")))
    scheduler.step(SCHEDULE)
    assert scheduler.step(CancelAsked("a")) == [] and scheduler.state("a") is RUNNING
    assert scheduler.step(TaskFinished("a", False)) == [Transition("a", CANCELED,
                                                         "canceled while running")]
    scheduler.step(CancelAsked("b"))
    assert scheduler.step(TaskFinished("b", True))[0].state is SUCCEEDED  # it ended before the kill


def test_illegal_calls_raise_and_change_nothing() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 2))
    scheduler.step(TaskSubmitted(task("a")))
    with pytest.raises(IllegalEvent, match="finished: task 'a' is QUEUED, not RUNNING"):
        scheduler.step(TaskFinished("a", True))
    with pytest.raises(IllegalEvent, match="'a' is already a task of this scheduler"):
        scheduler.step(TaskSubmitted(task("a", cores(2))))
    with pytest.raises(ValueError, match="task_id: 'nope' is not a task"):
        scheduler.state("nope")
    with pytest.raises(IllegalEvent, match="forget: task 'a' is QUEUED"):
        scheduler.step(Forgotten("a"))
    for event in (TaskFinished("nope", True), CancelAsked("nope"), Forgotten("nope")):
        with pytest.raises(IllegalEvent, match="task_id: 'nope' is not a task"):
            scheduler.step(event)
    assert scheduler.state("a") is QUEUED and scheduler.counts()[QUEUED] == 1
    scheduler.step(SCHEDULE)
    with pytest.raises(TypeError, match="succeeded: expected bool"):
        scheduler.step(TaskFinished("a", 0))  # type: ignore[arg-type]
    assert scheduler.state("a") is RUNNING and scheduler.counts()[RUNNING] == 1
    assert scheduler.pool.usage().free_cores == 1


def test_forget_frees_the_name_of_an_ended_task() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 2))
    scheduler.step(TaskSubmitted(task("a")))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskFinished("a", True))
    scheduler.step(Forgotten("a"))
    assert scheduler.task_ids() == [] and scheduler.counts()[SUCCEEDED] == 0
    scheduler.step(TaskSubmitted(task("a")))
    assert scheduler.state("a") is QUEUED


def test_a_task_recorded_as_succeeded_elsewhere_satisfies_dependencies_without_resources(
        ) -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 1))
    scheduler.step(SucceededBefore("done"))
    scheduler.step(SucceededBefore("it:0", group="it"))
    assert scheduler.state("done") is SUCCEEDED and scheduler.counts()[SUCCEEDED] == 2
    assert scheduler.placement("done") is None and scheduler.is_group("it")
    assert scheduler.pool.usage().free_cores == 1  # nothing taken, nothing to give back
    scheduler.step(TaskSubmitted(task("after", after=("done", "it"))))
    assert scheduler.state("after") is QUEUED
    assert started(scheduler.step(SCHEDULE)) == ["after"]
    # It is ended like any other task: nothing to cancel, and it can be forgotten.
    assert scheduler.step(CancelAsked("done")) == []
    with pytest.raises(IllegalEvent, match="not RUNNING"):
        scheduler.step(TaskFinished("done", True))
    scheduler.step(Forgotten("done"))
    assert "done" not in scheduler.task_ids()
    for name, group, error, kind in (
            ("after", None, "already a task", IllegalEvent), ("it", None, "group", IllegalEvent),
            ("x", "after", "already the name of a task", IllegalEvent),
            ("", None, "non-empty", ValueError), ("y", "", "empty group", ValueError)):
        with pytest.raises(kind, match=error):
            scheduler.step(SucceededBefore(name, group))
    with pytest.raises(TypeError, match="task_id"):
        scheduler.step(SucceededBefore(3))  # type: ignore[arg-type]
    assert scheduler.task_ids() == ["it:0", "after"]


def test_the_pool_refuses_to_take_back_what_it_does_not_hold() -> None:
    pool = ResourcePool.uniform(1, 4)
    shape = pool.resolve(cores(2))
    shares = pool.allocate(shape)
    assert shares is not None
    forged = NodeShare("node0", 0, 2, (2, 3))
    with pytest.raises(ValueError, match="is not held from this pool"):
        pool.release([forged])
    with pytest.raises(ValueError, match="is not held from this pool"):
        pool.release([shares[0], forged])
    assert pool.usage().free_cores == 2  # the legal share was not released either
    with pytest.raises(ValueError, match="given back twice"):
        pool.release([shares[0], shares[0]])
    pool.release(shares)
    assert pool.usage().free_cores == 4 and pool.node_usage("node0").idle
    with pytest.raises(ValueError, match="released already"):
        pool.release(shares)


def test_usage_reports_totals_like_qcg_resources_info() -> None:
    scheduler = Scheduler(ResourcePool.uniform(2, 4, gpus=1))
    scheduler.step(TaskSubmitted(task("a", cores(3))))
    scheduler.step(SCHEDULE)
    usage = scheduler.pool.usage()
    assert (usage.total_nodes, usage.total_cores, usage.used_cores, usage.free_cores) == (
        2, 8, 3, 5)
    assert (usage.idle_nodes, usage.total_gpus, usage.free_gpus) == (1, 2, 2)


# -- cost -------------------------------------------------------------------------------------


SHAPES = [cores(1), cores(2), cores(3), spec(node_count=2, processes_per_node=2),
          ResourceRequest.from_qcg({"min": 1, "max": 4})]


def steady_state_work(waiting: int, cycles: int) -> List[Tuple[int, int, int]]:
    """Per scheduling pass: (heads examined, fit checks, tasks started)."""
    scheduler = Scheduler(ResourcePool.uniform(4, 8))
    for i in range(waiting):
        # Three priority levels, the same for the first tasks whatever the queue's length.
        priority = 2 if i < 60 else 1 if i < 120 else 0
        request = TaskRequest(f"t{i}", SHAPES[i % len(SHAPES)], priority=priority)
        scheduler.step(TaskSubmitted(request))
    running = started(scheduler.step(SCHEDULE))
    work = []
    for _ in range(cycles):
        scheduler.step(TaskFinished(running.pop(0), True))
        before = (scheduler.stats.heads_examined, scheduler.stats.fit_checks)
        placed = started(scheduler.step(SCHEDULE))
        running.extend(placed)
        work.append((scheduler.stats.heads_examined - before[0],
                     scheduler.stats.fit_checks - before[1], len(placed)))
    assert scheduler.shape_count() <= len(SHAPES)
    return work


def test_work_per_decision_is_bounded_by_the_shapes_not_the_waiting_tasks() -> None:
    work = steady_state_work(10_000, 300)
    for heads, checks, placed in work:
        assert heads <= len(SHAPES) + placed
        assert checks <= len(SHAPES) + placed
    assert sum(placed for _, _, placed in work) >= 300
    # Identical work whether 400 or 10 000 tasks wait behind the ones that run.
    assert steady_state_work(400, 300) == work


def test_the_scheduler_benchmark_runs_and_reports_its_figures() -> None:
    script = Path(__file__).resolve().parent.parent / "bench" / "pilot_scheduler.py"
    done = subprocess.run([sys.executable, str(script), "--tasks", "600", "--cycles", "60",
                           "--chunks", "2", "--naive-cycles", "3", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["workload"] == "pilot_scheduler" and result["shapes"] == 20
    for priorities in ("priorities_1", "priorities_3"):
        figures = result[priorities]
        assert figures["schedule_us_per_decision"] > 0
        assert figures["naive_us_per_decision"] > 0
