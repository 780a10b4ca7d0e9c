"""The pilot's pure scheduler and resource pool: how requests are read, where tasks are
placed (cores, nodes, memory, GPUs, custom resources), tasks that can never fit, and the
properties that no placement oversubscribes a node and that a placement is found whenever
one exists, each test feeding the scheduler events through ``step``. The order in which tasks
start is in tests/test_pilot_scheduler_order.py."""

import itertools
from collections import Counter
from typing import Dict, List, Optional, Set, Tuple

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from psij.executors.pilot._task_state import TaskState
from psij.executors.pilot.resources import Amount, NodeSpec, ResourcePool, ResourceRequest
from psij.executors.pilot.scheduler import (
    SCHEDULE,
    CancelAsked,
    NodeLost,
    Placement,
    Scheduler,
    TaskFinished,
    TaskRequest,
    TaskSubmitted,
)
from support.pilot_tasks import FAILED, GIB, QUEUED, RUNNING, WAITING, cores, spec, started, task


def core_ids(placement: Optional[Placement]) -> Dict[str, Tuple[int, ...]]:
    assert placement is not None
    return {share.node: share.cores for share in placement.shares}


# -- requests ---------------------------------------------------------------------------------


def test_qcg_amounts_are_read_with_their_rules() -> None:
    assert Amount.from_qcg("numCores", {"exact": 3}) == Amount(3, 3)
    assert Amount.from_qcg("numCores", {"min": 2, "max": 5}) == Amount(2, 5)
    assert Amount.from_qcg("numCores", {"min": 2}) == Amount(2, None)
    assert Amount.from_qcg("numCores", {"max": 4}) == Amount(1, 4)
    assert Amount.from_qcg("numCores", {"min": 2, "split-into": 4}) == Amount(2, None, 4)
    with pytest.raises(ValueError, match="numCores.*'exact' cannot be combined with 'min'"):
        Amount.from_qcg("numCores", {"exact": 2, "min": 1})
    with pytest.raises(ValueError, match="numNodes: unknown key 'maximum'"):
        Amount.from_qcg("numNodes", {"maximum": 2})
    with pytest.raises(ValueError, match=r"numCores: max \(1\) is less than min \(2\)"):
        Amount.from_qcg("numCores", {"min": 2, "max": 1})
    with pytest.raises(ValueError, match="numCores.min: must be at least 1, got 0"):
        Amount.from_qcg("numCores", {"min": 0})
    with pytest.raises(TypeError, match="numCores.exact: expected int"):
        Amount.from_qcg("numCores", {"exact": "2"})
    with pytest.raises(ValueError, match="numCores: give 'exact' or 'min'/'max'"):
        Amount.from_qcg("numCores", {})


def test_resource_spec_becomes_processes_nodes_and_per_process_needs() -> None:
    spread = spec(process_count=4, cpu_cores_per_process=2, gpu_cores_per_process=1,
                  memory=4 * GIB)
    assert spread.processes == Amount(4, 4) and spread.nodes is None
    assert (spread.cores_per_process, spread.gpus_per_process) == (2, 1)
    assert spread.memory_per_process == GIB
    on_nodes = spec(node_count=2, process_count=6, exclusive_node_use=True)
    assert on_nodes.nodes == Amount(2, 2)
    assert on_nodes.processes_per_node == Amount(3, 3)
    assert on_nodes.exclusive
    by_ppn = spec(process_count=6, processes_per_node=2)
    assert by_ppn.nodes == Amount(3, 3) and by_ppn.processes_per_node == Amount(2, 2)
    assert spec().processes == Amount(1, 1) and spec().cores_per_process == 1
    with pytest.raises(TypeError, match="resource_spec: expected psij.ResourceSpecV1"):
        ResourceRequest.from_resource_spec({"node_count": 1})  # type: ignore[arg-type]


def test_impossible_ranges_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="3 nodes with at least 2 processes each"):
        ResourceRequest(processes=Amount.exact(4), nodes=Amount.exact(3),
                        processes_per_node=Amount.exact(2))
    with pytest.raises(ValueError, match="ResourceRequest.custom\\['lic'\\]: must be at least"):
        ResourceRequest(custom={"lic": -1})
    with pytest.raises(ValueError, match="NodeSpec.cores: must be at least 1, got 0"):
        NodeSpec("n0", 0)
    with pytest.raises(ValueError, match="node name 'a' appears twice"):
        ResourcePool([NodeSpec("a", 1), NodeSpec("a", 2)])
    with pytest.raises(TypeError, match="TaskRequest.priority: expected int or None"):
        TaskRequest("t", priority=True)
    with pytest.raises(TypeError, match="TaskRequest.after: expected a list"):
        TaskRequest("t", after="a")


# -- placement --------------------------------------------------------------------------------


def test_exact_cores_spread_over_nodes_and_take_the_lowest_free_ids() -> None:
    scheduler = Scheduler(ResourcePool.uniform(2, 4))
    scheduler.step(TaskSubmitted(task("a", cores(3))))
    scheduler.step(TaskSubmitted(task("b", cores(3))))
    assert started(scheduler.step(SCHEDULE)) == ["a", "b"]
    assert core_ids(scheduler.placement("a")) == {"node0": (0, 1, 2)}
    assert core_ids(scheduler.placement("b")) == {"node0": (3,), "node1": (0, 1)}
    placement = scheduler.placement("b")
    assert placement is not None
    assert placement.nodes == ("node0", "node1") and placement.process_count == 3
    assert scheduler.pool.usage().free_cores == 2


def test_min_max_takes_the_most_that_is_free_now() -> None:
    scheduler = Scheduler(ResourcePool.uniform(2, 4))
    scheduler.step(TaskSubmitted(task("three", cores(3))))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskSubmitted(task("range", ResourceRequest.from_qcg({"min": 2, "max": 8}))))
    (placement,) = scheduler.step(SCHEDULE)
    assert placement.task_id == "range" and placement.core_count == 5
    # The maximum caps what is taken even on an empty pool.
    fresh = Scheduler(ResourcePool.uniform(2, 4))
    fresh.step(TaskSubmitted(task("capped", ResourceRequest.from_qcg({"min": 1, "max": 3}))))
    assert fresh.step(SCHEDULE)[0].core_count == 3


def test_min_max_waits_below_its_minimum_and_starts_when_enough_is_released() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))
    scheduler.step(TaskSubmitted(task("hog", cores(3))))
    scheduler.step(TaskSubmitted(task("range", ResourceRequest.from_qcg({"min": 2, "max": 4}))))
    assert started(scheduler.step(SCHEDULE)) == ["hog"]
    assert scheduler.state("range") is QUEUED
    scheduler.step(TaskFinished("hog", True))
    assert [p.core_count for p in scheduler.step(SCHEDULE)] == [4]


def test_split_into_caps_each_task_at_the_total_divided() -> None:
    scheduler = Scheduler(ResourcePool.uniform(2, 8))  # 16 cores: chunks of 4
    request = ResourceRequest.from_qcg({"min": 2, "split-into": 4})
    for i in range(5):
        scheduler.step(TaskSubmitted(task(f"chunk{i}", request)))
    placements = scheduler.step(SCHEDULE)
    assert [p.core_count for p in placements] == [4, 4, 4, 4]
    assert scheduler.state("chunk4") is QUEUED
    # With fewer cores free than a chunk but at least the minimum, the chunk shrinks.
    scheduler.step(TaskFinished("chunk0", True))
    hog = Scheduler(ResourcePool.uniform(1, 16))
    hog.step(TaskSubmitted(task("hog", cores(13))))
    hog.step(TaskSubmitted(task("chunk", request)))
    assert [p.core_count for p in hog.step(SCHEDULE)] == [13, 3]


def test_split_into_never_goes_below_the_minimum() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 4))  # 4 / 8 = 0 < min 2
    scheduler.step(TaskSubmitted(task("t", ResourceRequest.from_qcg({"min": 2, "split-into": 8}))))
    assert scheduler.step(SCHEDULE)[0].core_count == 2


def test_split_into_on_nodes_divides_the_node_count() -> None:
    scheduler = Scheduler(ResourcePool.uniform(4, 2))
    request = ResourceRequest.from_qcg(None, {"min": 1, "split-into": 2})
    scheduler.step(TaskSubmitted(task("a", request)))
    scheduler.step(TaskSubmitted(task("b", request)))
    placements = scheduler.step(SCHEDULE)
    assert [p.nodes for p in placements] == [("node0", "node1"), ("node2", "node3")]


def test_qcg_num_nodes_alone_takes_whole_idle_nodes() -> None:
    scheduler = Scheduler(ResourcePool.uniform(3, 4))
    scheduler.step(TaskSubmitted(task("small", cores(1))))
    scheduler.step(TaskSubmitted(task("nodes",
                                      ResourceRequest.from_qcg(None, {"min": 1, "max": 3}))))
    small, nodes = scheduler.step(SCHEDULE)
    assert small.nodes == ("node0",)
    assert nodes.nodes == ("node1", "node2")  # node0 is not idle
    assert all(len(share.cores) == 4 and share.processes == 4 for share in nodes.shares)


def test_qcg_cores_per_node_with_node_range_prefers_the_nodes_with_most_room() -> None:
    scheduler = Scheduler(ResourcePool.uniform(3, 4))
    scheduler.step(TaskSubmitted(task("filler", cores(3))))  # node0 keeps 1 free core
    scheduler.step(SCHEDULE)
    scheduler.step(TaskSubmitted(task("t", ResourceRequest.from_qcg({"min": 1, "max": 4},
                                                                    {"min": 1, "max": 2}))))
    (placement,) = scheduler.step(SCHEDULE)
    assert placement.nodes == ("node1", "node2")
    assert [share.processes for share in placement.shares] == [4, 4]


def test_node_count_and_processes_per_node_are_exact_and_memory_is_split_per_node() -> None:
    scheduler = Scheduler(ResourcePool.uniform(3, 4, memory=8 * GIB))
    scheduler.step(TaskSubmitted(task("mpi", spec(node_count=2, processes_per_node=3,
                                                  memory=6 * GIB))))
    (placement,) = scheduler.step(SCHEDULE)
    assert [(s.node, s.processes, len(s.cores), s.memory) for s in placement.shares] == [
        ("node0", 3, 3, 3 * GIB), ("node1", 3, 3, 3 * GIB)]
    # A total that does not divide evenly is rounded up per process.
    assert spec(process_count=3, memory=10).memory_per_process == 4


def test_a_node_leaves_enough_processes_for_the_nodes_still_needed() -> None:
    scheduler = Scheduler(ResourcePool.uniform(2, 4))
    scheduler.step(TaskSubmitted(task("t", ResourceRequest(processes=Amount.exact(3),
                                                           nodes=Amount.exact(2)))))
    (placement,) = scheduler.step(SCHEDULE)
    assert [(s.node, s.processes) for s in placement.shares] == [("node0", 2), ("node1", 1)]


def test_processes_per_node_alone_fills_nodes_up_to_that_count() -> None:
    scheduler = Scheduler(ResourcePool.uniform(3, 4))
    # ResourceSpecV1 refuses 5 processes at 2 per node; a request can still ask for it.
    scheduler.step(TaskSubmitted(task("t", ResourceRequest(processes=Amount.exact(5),
                                                           nodes=Amount.exact(3),
                                                           processes_per_node=Amount(1, 2)))))
    (placement,) = scheduler.step(SCHEDULE)
    assert [s.processes for s in placement.shares] == [2, 2, 1]


def test_exclusive_nodes_wait_for_an_idle_node_and_hold_all_of_it() -> None:
    pool = ResourcePool.uniform(2, 4, memory=4 * GIB, gpus=2, custom={"lic": 1})
    scheduler = Scheduler(pool)
    scheduler.step(TaskSubmitted(task("a", cores(1))))
    scheduler.step(TaskSubmitted(task("b", spec(process_count=1, node_count=1))))
    scheduler.step(TaskSubmitted(task("c", cores(1))))
    # a on node0, b needs 1 core per node and node0 has room: it goes there too.
    scheduler.step(SCHEDULE)
    scheduler.step(TaskFinished("c", True))
    scheduler.step(TaskFinished("b", True))
    scheduler.step(TaskSubmitted(task("x", spec(process_count=1, exclusive_node_use=True))))
    (placement,) = scheduler.step(SCHEDULE)
    assert placement.nodes == ("node1",)
    (share,) = placement.shares
    assert share.cores == (0, 1, 2, 3) and share.gpus == (0, 1)
    assert share.memory == 4 * GIB and dict(share.custom) == {"lic": 1}
    assert share.processes == 1
    scheduler.step(TaskSubmitted(task("y", spec(process_count=1, exclusive_node_use=True))))
    assert scheduler.step(SCHEDULE) == []  # node0 still runs a
    scheduler.step(TaskFinished("a", True))
    assert started(scheduler.step(SCHEDULE)) == ["y"]


def test_memory_limits_what_shares_a_node() -> None:
    scheduler = Scheduler(ResourcePool.uniform(2, 8, memory=8 * GIB))
    for name in "abc":
        scheduler.step(TaskSubmitted(task(name, spec(process_count=1, memory=6 * GIB))))
    placements = scheduler.step(SCHEDULE)
    assert [(p.task_id, p.nodes) for p in placements] == [("a", ("node0",)),
                                                          ("b", ("node1",))]
    assert scheduler.state("c") is QUEUED and scheduler.pool.usage().free_cores == 14
    scheduler.step(TaskFinished("a", True))
    assert started(scheduler.step(SCHEDULE)) == ["c"]


def test_gpus_are_given_by_id_and_limit_placement() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 8, gpus=3))
    scheduler.step(TaskSubmitted(task("two", spec(process_count=1, gpu_cores_per_process=2))))
    scheduler.step(TaskSubmitted(task("one", spec(process_count=1, gpu_cores_per_process=1))))
    scheduler.step(TaskSubmitted(task("more", spec(process_count=1, gpu_cores_per_process=1))))
    placements = scheduler.step(SCHEDULE)
    assert [(p.task_id, p.shares[0].gpus) for p in placements] == [("two", (0, 1)),
                                                                   ("one", (2,))]
    assert scheduler.state("more") is QUEUED
    scheduler.step(TaskFinished("two", True))
    assert [p.shares[0].gpus for p in scheduler.step(SCHEDULE)] == [(0,)]


def test_custom_resources_are_counted_per_node_used() -> None:
    scheduler = Scheduler(ResourcePool([NodeSpec("a", 4, custom={"lic": 1}),
                                        NodeSpec("b", 4, custom={"lic": 1})]))
    licensed = ResourceRequest(custom={"lic": 1})
    for name in ("x", "y", "z"):
        scheduler.step(TaskSubmitted(task(name, licensed)))
    placements = scheduler.step(SCHEDULE)
    assert [(p.task_id, p.nodes, dict(p.shares[0].custom)) for p in placements] == [
        ("x", ("a",), {"lic": 1}), ("y", ("b",), {"lic": 1})]
    assert scheduler.state("z") is QUEUED
    assert dict(scheduler.pool.node_usage("a").free_custom) == {"lic": 0}
    scheduler.step(TaskFinished("x", True))
    assert started(scheduler.step(SCHEDULE)) == ["z"]


# -- never fitting ----------------------------------------------------------------------------


@pytest.mark.parametrize("resources, asked", [
    (cores(9), "9 processes of 1 core"),
    (spec(node_count=3), "on 3 nodes"),
    (spec(process_count=1, cpu_cores_per_process=5), "1 processes of 5 cores"),
    (spec(process_count=1, memory=16 * GIB), "16 GiB"),
    (spec(process_count=1, gpu_cores_per_process=1), "1 GPU"),
    (ResourceRequest(custom={"lic": 1}), "per node lic=1"),
])
def test_a_task_that_can_never_fit_fails_at_once_saying_why(resources: ResourceRequest,
                                                            asked: str) -> None:
    scheduler = Scheduler(ResourcePool.uniform(2, 4, memory=8 * GIB))
    scheduler.step(TaskSubmitted(task("big", resources)))
    assert scheduler.state("big") is FAILED
    message = scheduler.message("big")
    assert message is not None
    assert "'big'" in message and asked in message and "never fit" in message
    assert "2 nodes: node0 (4 cores, 8 GiB), node1 (4 cores, 8 GiB)" in message
    assert scheduler.step(SCHEDULE) == []
    assert scheduler.counts()[FAILED] == 1 and scheduler.counts()[QUEUED] == 0


def test_a_large_pool_is_summarised_in_the_message() -> None:
    scheduler = Scheduler(ResourcePool([NodeSpec(f"n{i}", 4 + i, custom={"lic": i})
                                        for i in range(6)]))
    scheduler.step(TaskSubmitted(task("big", cores(100))))
    assert scheduler.message("big") == (
        "task 'big' asks for 100 processes of 1 core on any number of nodes, which can never "
        "fit: the pool has 6 nodes, 39 cores in total; the largest is n5 (9 cores, lic=5); "
        "custom at most lic=5 per node")


def test_a_never_fitting_task_fails_even_while_its_dependencies_run() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 2))
    scheduler.step(TaskSubmitted(task("first")))
    scheduler.step(TaskSubmitted(task("huge", cores(3), after=("first",))))
    assert scheduler.state("huge") is FAILED


# -- lost nodes -------------------------------------------------------------------------------


def test_a_lost_node_gets_no_more_tasks_and_keeps_what_its_tasks_held() -> None:
    pool = ResourcePool.uniform(3, 2, gpus=1)
    scheduler = Scheduler(pool)
    for name in ("a", "b", "c"):
        scheduler.step(TaskSubmitted(task(name, cores(2))))
    assert [p.nodes for p in scheduler.step(SCHEDULE)] == [("node0",), ("node1",), ("node2",)]
    assert scheduler.step(NodeLost("node1", "its agent died")) == []
    assert pool.lost_nodes == {"node1": "its agent died"}
    assert pool.free_totals() == (0, 2, 0)  # node1's GPU went with it
    # The task that ran there: its cores are not given back.
    scheduler.step(TaskFinished("b", False))
    assert pool.free_totals() == (0, 2, 0)
    assert pool.node_usage("node1").free_cores == () and not pool.node_usage("node1").idle
    for name in ("d", "e", "f"):
        scheduler.step(TaskSubmitted(task(name, cores(1))))
    scheduler.step(TaskFinished("a", True))
    scheduler.step(TaskFinished("c", True))
    assert pool.free_totals() == (4, 2, 2)
    placed = scheduler.step(SCHEDULE)
    assert [p.nodes for p in placed] == [("node0",), ("node0",), ("node2",)]
    scheduler.step(NodeLost("node1", "again"))  # a second loss changes nothing
    assert pool.lost_nodes == {"node1": "its agent died"}


def test_tasks_that_no_longer_fit_after_a_loss_fail_saying_which_node_is_lost() -> None:
    pool = ResourcePool.uniform(2, 2)
    scheduler = Scheduler(pool)
    scheduler.step(TaskSubmitted(task("busy", cores(4))))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskSubmitted(task("wide", cores(4))))  # queued behind busy
    scheduler.step(TaskSubmitted(task("after", cores(3), after=("busy",))))  # waiting
    scheduler.step(TaskSubmitted(task("then", cores(1), after=("wide",))))
    scheduler.step(TaskSubmitted(task("small", cores(2))))
    ended = scheduler.step(NodeLost("node1", "its agent's connection closed"))
    assert [(t.task_id, t.state) for t in ended] == [
        ("wide", FAILED), ("then", TaskState.OMITTED), ("after", FAILED)]
    message = scheduler.message("wide") or ""
    assert message.startswith("task 'wide' asks for ") and "can no longer fit" in message
    assert message.endswith("node node1 is lost: its agent's connection closed")
    assert scheduler.state("small") is QUEUED and scheduler.shape_count() == 1
    scheduler.step(TaskFinished("busy", True))
    assert started(scheduler.step(SCHEDULE)) == ["small"]
    assert scheduler.placement("small").nodes == ("node0",)  # type: ignore[union-attr]
    # It never fits now, and says why: the submission's action.
    (ended,) = scheduler.step(TaskSubmitted(task("late", cores(3))))
    assert (ended.task_id, ended.state) == ("late", FAILED)
    assert scheduler.state("late") is FAILED and scheduler.message("late") == ended.message
    assert "can never fit" in (scheduler.message("late") or "")
    assert "node node1 is lost: its agent's connection closed" in (scheduler.message("late")
                                                                   or "")
    with pytest.raises(ValueError, match="node: 'node9' is not in this pool"):
        scheduler.step(NodeLost("node9", "why"))


def test_an_exclusive_task_never_takes_a_lost_idle_node() -> None:
    pool = ResourcePool.uniform(2, 1)
    scheduler = Scheduler(pool)
    scheduler.step(NodeLost("node0", "gone"))
    assert pool.free_totals() == (1, 0, 1)
    scheduler.step(TaskSubmitted(task("x", spec(exclusive_node_use=True))))
    assert [p.nodes for p in scheduler.step(SCHEDULE)] == [("node1",)]
    scheduler.step(TaskSubmitted(task("y", spec(exclusive_node_use=True))))
    assert scheduler.state("y") is QUEUED and scheduler.step(SCHEDULE) == []


def test_requests_that_resolve_alike_share_one_queue() -> None:
    scheduler = Scheduler(ResourcePool.uniform(1, 2))
    scheduler.step(TaskSubmitted(task("blocker", cores(2))))
    scheduler.step(SCHEDULE)
    scheduler.step(TaskSubmitted(task("qcg", ResourceRequest.from_qcg({"exact": 2}))))
    scheduler.step(TaskSubmitted(task("psij", spec(process_count=2))))
    split = ResourceRequest.from_qcg({"min": 2, "split-into": 1})
    scheduler.step(TaskSubmitted(task("split", split)))
    assert scheduler.shape_count() == 1
    scheduler.step(TaskSubmitted(task("other", cores(1))))
    assert scheduler.shape_count() == 2


# -- properties -------------------------------------------------------------------------------

REQUESTS = st.one_of(
    st.builds(lambda n: cores(n), st.integers(1, 6)),
    st.builds(lambda lo, extra: ResourceRequest.from_qcg({"min": lo, "max": lo + extra}),
              st.integers(1, 4), st.integers(0, 4)),
    st.builds(lambda lo, k: ResourceRequest.from_qcg({"min": lo, "split-into": k}),
              st.integers(1, 3), st.integers(1, 4)),
    st.builds(lambda n, lo, extra: ResourceRequest.from_qcg({"min": lo, "max": lo + extra},
                                                            {"exact": n}),
              st.integers(1, 3), st.integers(1, 3), st.integers(0, 2)),
    st.builds(lambda n: ResourceRequest.from_qcg(None, {"min": 1, "max": n}),
              st.integers(1, 3)),
    st.builds(lambda p, c, g, m, x: spec(process_count=p, cpu_cores_per_process=c,
                                         gpu_cores_per_process=g or None,
                                         memory=m * GIB or None, exclusive_node_use=x),
              st.integers(1, 4), st.integers(1, 2), st.integers(0, 1), st.integers(0, 3),
              st.booleans()),
    st.builds(lambda n, ppn: spec(node_count=n, processes_per_node=ppn),
              st.integers(1, 3), st.integers(1, 3)),
    st.builds(lambda k: ResourceRequest(custom={"lic": k}), st.integers(1, 2)),
)

NODES = st.lists(st.builds(lambda c, m, g, lic: (c, m * GIB, g, lic), st.integers(1, 4),
                           st.integers(0, 4), st.integers(0, 2), st.integers(0, 1)),
                 min_size=1, max_size=3)

OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("submit"), REQUESTS, st.integers(0, 2), st.lists(st.integers(0, 50),
                                                                       max_size=2)),
    st.tuples(st.just("finish"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
), max_size=40)


def check_books(scheduler: Scheduler, pool: ResourcePool) -> None:
    """No node is oversubscribed and the pool's free counts match the running tasks."""
    used: Dict[str, Counter] = {spec.name: Counter() for spec in pool.nodes}
    cores_seen: Dict[str, Set[int]] = {spec.name: set() for spec in pool.nodes}
    gpus_seen: Dict[str, Set[int]] = {spec.name: set() for spec in pool.nodes}
    for name in scheduler.task_ids():
        if scheduler.state(name) is not RUNNING:
            continue
        placement = scheduler.placement(name)
        assert placement is not None
        for share in placement.shares:
            assert not cores_seen[share.node] & set(share.cores)
            assert not gpus_seen[share.node] & set(share.gpus)
            cores_seen[share.node] |= set(share.cores)
            gpus_seen[share.node] |= set(share.gpus)
            used[share.node]["memory"] += share.memory
            used[share.node].update({f"custom:{k}": v for k, v in share.custom.items()})
    for node in pool.nodes:
        assert cores_seen[node.name] <= set(range(node.cores))
        assert gpus_seen[node.name] <= set(range(node.gpus))
        assert used[node.name]["memory"] <= node.memory
        for name, count in node.custom.items():
            assert used[node.name][f"custom:{name}"] <= count
        usage = pool.node_usage(node.name)
        assert set(usage.free_cores) == set(range(node.cores)) - cores_seen[node.name]
        assert usage.free_memory == node.memory - used[node.name]["memory"]


@settings(max_examples=150, deadline=None)
@given(NODES, OPERATIONS)
def test_random_work_never_oversubscribes_and_an_empty_pool_never_idles(
        nodes: List[Tuple[int, int, int, int]], operations: List[tuple]) -> None:
    pool = ResourcePool([NodeSpec(f"n{i}", c, m, g, {"lic": lic})
                         for i, (c, m, g, lic) in enumerate(nodes)])
    scheduler = Scheduler(pool)
    names: List[str] = []

    def settle() -> None:
        scheduler.step(SCHEDULE)
        check_books(scheduler, pool)
        counts = scheduler.counts()
        if counts[RUNNING] == 0:
            # Every queued task fits the empty pool, and waiting ones wait on unfinished ones.
            assert counts[QUEUED] == 0 and counts[WAITING] == 0

    for operation in operations:
        if operation[0] == "submit":
            _, request, priority, deps = operation
            after = tuple(sorted({names[d % len(names)] for d in deps})) if names else ()
            name = f"t{len(names)}"
            scheduler.step(TaskSubmitted(TaskRequest(name, request, priority=priority,
                                                     after=after)))
            names.append(name)
        elif names and operation[0] == "finish":
            running = [n for n in names if scheduler.state(n) is RUNNING]
            if running:
                scheduler.step(TaskFinished(running[operation[1] % len(running)], operation[2]))
        elif names:
            scheduler.step(CancelAsked(names[operation[1] % len(names)]))
        settle()
    for _ in range(len(names) + 1):
        running = [n for n in names if scheduler.state(n) is RUNNING]
        for name in running:
            scheduler.step(TaskFinished(name, True))
        settle()
    assert all(scheduler.state(n).final for n in names)
    assert pool.usage().free_cores == pool.usage().total_cores


@st.composite
def core_requests(draw: st.DrawFn) -> ResourceRequest:
    def amount(low: int, high: int, open_ended: bool) -> Amount:
        minimum = draw(st.integers(low, high))
        if open_ended and draw(st.booleans()):
            return Amount(minimum, None)
        return Amount(minimum, draw(st.integers(minimum, high)))

    processes = amount(1, 8, True)
    nodes = draw(st.one_of(st.none(), st.builds(lambda: amount(1, 3, True))))
    per_node = amount(1, 4, True)
    try:
        return ResourceRequest(processes=processes, nodes=nodes, processes_per_node=per_node,
                               cores_per_process=draw(st.integers(1, 2)))
    except ValueError:  # ranges that contradict each other are refused when built
        reject()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), core_requests())
def test_placement_is_found_whenever_one_exists_and_takes_the_most(
        node_cores: List[int], request: ResourceRequest) -> None:
    pool = ResourcePool([NodeSpec(f"n{i}", c) for i, c in enumerate(node_cores)])
    shape = pool.resolve(request)
    # Every way of giving each node 0 or between the per-node bounds, by brute force.
    options = [[0, *range(shape.per_node_min,
                          min(c // shape.cores_per_process, shape.per_node_max) + 1)]
               for c in node_cores]
    totals = [sum(choice) for choice in itertools.product(*options)
              if shape.nodes_min <= sum(1 for t in choice if t) <= shape.nodes_max
              and shape.processes_min <= sum(choice) <= shape.processes_max]
    shares = pool.allocate(shape)
    if not totals:
        assert shares is None
        return
    assert shares is not None
    assert sum(share.processes for share in shares) == max(totals)
    assert shape.nodes_min <= len(shares) <= shape.nodes_max
    for share in shares:
        assert shape.per_node_min <= share.processes <= shape.per_node_max
        assert len(share.cores) == share.processes * shape.cores_per_process
