"""Nodes that join a pilot's pool while it runs (an elastic pilot's allocations): the pool's
books, and the scheduler placing on them what did not fit before."""

import pytest

from psij._machine import IllegalEvent
from psij.executors.pilot.resources import NodeSpec, ResourcePool
from psij.executors.pilot.scheduler import (
    SCHEDULE,
    NodeAdded,
    NodeLost,
    Scheduler,
    TaskFinished,
    TaskSubmitted,
)
from support.pilot_tasks import FAILED, QUEUED, RUNNING, cores, spec, started, task


def test_a_node_added_to_a_full_pool_takes_work() -> None:
    pool = ResourcePool([NodeSpec("local", 1)])
    shape = pool.resolve(cores(1))
    assert pool.allocate(shape) is not None
    assert pool.allocate(shape) is None
    pool.add_node(NodeSpec("a1-0", 2, gpus=1))
    assert pool.usage().total_cores == 3 and pool.usage().free_cores == 2
    assert pool.usage().free_gpus == 1
    assert pool.free_totals() == (2, 1, 1)
    share = pool.allocate(shape)
    assert share is not None and share[0].node == "a1-0" and share[0].cores == (0,)
    assert [n.name for n in pool.nodes] == ["local", "a1-0"]
    assert pool.node_usage("a1-0").free_cores == (1,)


def test_a_node_name_is_never_added_twice() -> None:
    pool = ResourcePool([NodeSpec("local", 1)])
    pool.add_node(NodeSpec("a1-0", 2))
    with pytest.raises(ValueError, match="'a1-0' is in this pool already"):
        pool.add_node(NodeSpec("a1-0", 4))
    pool.lose_node("a1-0", "given back")
    with pytest.raises(ValueError, match="in this pool already"):
        pool.add_node(NodeSpec("a1-0", 4))
    with pytest.raises(TypeError, match="node"):
        pool.add_node("a2-0")  # type: ignore[arg-type]
    assert pool.usage().total_cores == 3


def test_queued_tasks_start_on_a_node_that_joins() -> None:
    scheduler = Scheduler(ResourcePool([NodeSpec("local", 1)]))
    for name in "abc":
        scheduler.step(TaskSubmitted(task(name, cores(1))))
    assert started(scheduler.step(SCHEDULE)) == ["a"]
    assert scheduler.step(SCHEDULE) == []
    assert scheduler.counts()[QUEUED] == 2
    assert scheduler.step(NodeAdded(NodeSpec("a1-0", 2))) == []
    placements = scheduler.step(SCHEDULE)
    assert started(placements) == ["b", "c"]
    assert {p.nodes for p in placements} == {("a1-0",)}
    assert scheduler.counts()[RUNNING] == 3


def test_a_shape_that_fitted_no_node_is_taken_once_a_node_fits_it() -> None:
    scheduler = Scheduler(ResourcePool([NodeSpec("local", 1)]))
    scheduler.step(TaskSubmitted(task("wide", cores(4))))
    assert scheduler.state("wide") is FAILED  # nothing could take it then
    scheduler.step(NodeAdded(NodeSpec("a1-0", 4)))
    scheduler.step(TaskSubmitted(task("wide2", cores(4))))
    assert scheduler.state("wide2") is QUEUED
    assert started(scheduler.step(SCHEDULE)) == ["wide2"]


def test_a_node_that_joins_after_a_lost_one_reopens_its_shape() -> None:
    scheduler = Scheduler(ResourcePool([NodeSpec("local", 1), NodeSpec("a1-0", 4)]))
    scheduler.step(NodeLost("a1-0", "given back"))
    scheduler.step(TaskSubmitted(task("t", spec(process_count=1,
                                                cpu_cores_per_process=4))))
    assert scheduler.state("t") is FAILED
    scheduler.step(NodeAdded(NodeSpec("a2-0", 4)))
    scheduler.step(TaskSubmitted(task("u", spec(process_count=1, cpu_cores_per_process=4))))
    placements = scheduler.step(SCHEDULE)
    assert started(placements) == ["u"] and placements[0].nodes == ("a2-0",)
    scheduler.step(TaskFinished("u", True))


def test_adding_a_known_node_is_refused() -> None:
    scheduler = Scheduler(ResourcePool([NodeSpec("local", 1)]))
    with pytest.raises(IllegalEvent, match="already"):
        scheduler.step(NodeAdded(NodeSpec("local", 2)))
    assert scheduler.pool.usage().total_cores == 1
    with pytest.raises(TypeError, match="NodeAdded.node"):
        NodeAdded("x")  # type: ignore[arg-type]
    with pytest.raises(IllegalEvent):
        scheduler.step("x")  # type: ignore[call-overload]
