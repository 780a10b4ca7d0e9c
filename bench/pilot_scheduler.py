"""Scheduler-only benchmark of the pilot: microseconds per scheduling decision with 100 000
queued tasks in 20 distinct shapes, against a naive scan of the whole queue.

A decision is one task started. The pool is 16 nodes of 32 cores, 4 GPUs and 128 GiB; the
queue is filled first, the pool is then kept full by ending the oldest running task and
scheduling again, as a pilot does when tasks finish one by one. Prints figures only; nothing
here asserts a time. Run: ``.venv/bin/python bench/pilot_scheduler.py [--tasks N]``.
"""

import argparse
import gc
import json
import random
import statistics
import time
from collections import deque
from typing import Deque, Dict, List, Tuple

from _help import description

from psij import ResourceSpecV1
from psij.executors.pilot.resources import (
    Amount,
    NodeShare,
    ResourcePool,
    ResourceRequest,
    Shape,
)
from psij.executors.pilot.scheduler import (
    SCHEDULE,
    Scheduler,
    TaskFinished,
    TaskRequest,
    TaskSubmitted,
)

GIB = 1 << 30


def shapes() -> List[ResourceRequest]:
    """Twenty distinct requests of the kinds a pilot sees."""
    spec = ResourceRequest.from_resource_spec
    qcg = ResourceRequest.from_qcg
    return [
        *(qcg({"exact": n}) for n in (1, 2, 3, 4, 6, 8, 12, 16)),
        qcg({"min": 2, "max": 8}),
        qcg({"min": 4, "max": 32}),
        qcg({"min": 1, "split-into": 64}),
        qcg({"min": 2, "split-into": 32}),
        spec(ResourceSpecV1(node_count=2, processes_per_node=4)),
        spec(ResourceSpecV1(node_count=2, processes_per_node=16)),
        spec(ResourceSpecV1(process_count=1, gpu_cores_per_process=1)),
        spec(ResourceSpecV1(process_count=2, gpu_cores_per_process=2)),
        spec(ResourceSpecV1(process_count=1, memory=16 * GIB)),
        spec(ResourceSpecV1(process_count=4, memory=64 * GIB)),
        qcg(None, {"exact": 1}),
        ResourceRequest(processes=Amount.exact(1), custom={"licence": 1}),
    ]


def pool() -> ResourcePool:
    return ResourcePool.uniform(16, 32, memory=128 * GIB, gpus=4, custom={"licence": 2})


def workload(tasks: int, priorities: int, seed: int = 7) -> List[TaskRequest]:
    rng = random.Random(seed)
    kinds = shapes()
    return [TaskRequest(f"t{i}", rng.choice(kinds), priority=rng.randrange(priorities))
            for i in range(tasks)]


def run_ours(requests: List[TaskRequest], cycles: int, chunks: int) -> Dict[str, float]:
    scheduler = Scheduler(pool())
    gc.collect()
    start = time.perf_counter()
    for request in requests:
        scheduler.step(TaskSubmitted(request))
    submit_s = time.perf_counter() - start

    start = time.perf_counter()
    running: Deque[str] = deque(p.task_id for p in scheduler.step(SCHEDULE))
    fill_s = time.perf_counter() - start
    filled = len(running)

    stats = scheduler.stats
    calls_before, heads_before, checks_before = (stats.schedule_calls, stats.heads_examined,
                                                 stats.fit_checks)
    # The steady phase is timed in chunks; the machine's other load shows as slow chunks, so
    # the median and the best chunk are both printed.
    per_decision: List[float] = []
    per_cycle: List[float] = []
    decisions = 0
    clock = time.perf_counter
    for _ in range(chunks):
        schedule_s = finish_s = 0.0
        placed_in_chunk = 0
        for _ in range(cycles // chunks):
            t0 = clock()
            scheduler.step(TaskFinished(running.popleft(), True))
            t1 = clock()
            placed = scheduler.step(SCHEDULE)
            t2 = clock()
            finish_s += t1 - t0
            schedule_s += t2 - t1
            placed_in_chunk += len(placed)
            running.extend(p.task_id for p in placed)
        decisions += placed_in_chunk
        placed_in_chunk = max(placed_in_chunk, 1)
        per_decision.append(schedule_s / placed_in_chunk * 1e6)
        per_cycle.append((schedule_s + finish_s) / placed_in_chunk * 1e6)
    calls = stats.schedule_calls - calls_before
    waiting = len(requests) - filled - decisions

    print(f"  submit:           {submit_s / len(requests) * 1e6:7.2f} us per task")
    print(f"  initial fill:     {fill_s / max(filled, 1) * 1e6:7.2f} us per decision "
          f"({filled} tasks started on the empty pool)")
    print(f"  Schedule:         {statistics.median(per_decision):7.2f} us per decision "
          f"(median of {chunks} chunks; best {min(per_decision):.2f})")
    print(f"  TaskFinished+Schedule: {statistics.median(per_cycle):7.2f} us per task "
          f"(best {min(per_cycle):.2f}; {decisions} decisions, {waiting} still queued)")
    print(f"  work per pass:    {(stats.heads_examined - heads_before) / calls:7.2f} shape heads, "
          f"{(stats.fit_checks - checks_before) / calls:.2f} fit checks")
    return {"submit_us": submit_s / len(requests) * 1e6,
            "schedule_us_per_decision": statistics.median(per_decision),
            "schedule_us_per_decision_best": min(per_decision),
            "task_cycle_us": statistics.median(per_cycle)}


class NaiveQueue:
    """The reference point: one list in priority/arrival order, scanned whole on every pass,
    starting each task that fits (the same pool arithmetic as ours)."""

    def __init__(self, resource_pool: ResourcePool) -> None:
        self.pool = resource_pool
        self.queue: List[Tuple[int, int, str, Shape]] = []
        self.held: Dict[str, Tuple[NodeShare, ...]] = {}

    def submit_all(self, requests: List[TaskRequest]) -> None:
        for seq, request in enumerate(requests):
            shape = self.pool.resolve(request.resources)
            self.queue.append((-request.priority, seq, request.name, shape))
        self.queue.sort()

    def schedule(self) -> List[str]:
        started: List[str] = []
        kept = []
        for entry in self.queue:
            shares = self.pool.allocate(entry[3])
            if shares is None:
                kept.append(entry)
            else:
                self.held[entry[2]] = shares
                started.append(entry[2])
        self.queue = kept
        return started

    def finished(self, name: str) -> None:
        self.pool.release(self.held.pop(name))


def run_naive(requests: List[TaskRequest], cycles: int) -> float:
    naive = NaiveQueue(pool())
    naive.submit_all(requests)
    running: Deque[str] = deque(naive.schedule())
    decisions = 0
    start = time.perf_counter()
    for _ in range(cycles):
        naive.finished(running.popleft())
        placed = naive.schedule()
        decisions += len(placed)
        running.extend(placed)
    elapsed = time.perf_counter() - start
    per_decision = elapsed / max(decisions, 1) * 1e6
    print(f"  naive scan:       {per_decision:7.0f} us per decision "
          f"(whole queue scanned per pass; {decisions} decisions, {len(naive.queue)} queued)")
    return per_decision


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=20_000,
                        help="tasks ended one by one in the steady-state phase")
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--naive-cycles", type=int, default=100,
                        help="tasks ended one by one for the naive scan (0: skip it)")
    parser.add_argument("--json", action="store_true",
                        help="also print the figures as one JSON line at the end")
    args = parser.parse_args()
    print(f"pilot scheduler: {args.tasks} queued tasks in {len(shapes())} shapes; pool of "
          f"{pool().describe()}")
    result: Dict[str, object] = {"workload": "pilot_scheduler", "tasks": args.tasks,
                                 "shapes": len(shapes())}
    for priorities in (1, 3):
        requests = workload(args.tasks, priorities)
        print(f"{priorities} priority level{'s' if priorities > 1 else ''}:")
        figures: Dict[str, float] = run_ours(requests, args.cycles, args.chunks)
        if args.naive_cycles:
            figures["naive_us_per_decision"] = run_naive(requests, args.naive_cycles)
        result[f"priorities_{priorities}"] = figures
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
