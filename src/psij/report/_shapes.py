"""The shapes the report's plots are drawn from, computed from runs: the bars of the timeline
(one row per job, or per core of a pilot run), the levels of a count over time (cores busy,
runs waiting) and the time unit an axis is best read in.

Pure functions over lists, no plotting library, so they are cheap to test; large runs are cut
down by the plotting module (:mod:`psij.report._plots`), not here.
"""

import heapq
from typing import Dict, List, Optional, Sequence, Tuple

from psij.report._runs import JobRun

__all__ = ["Bar", "core_lanes", "job_rows", "levels", "time_unit"]

WAIT = "waiting"  # the kind of a bar that shows a wait, not a run

# (row, start, end, kind): kind is a state name, or WAIT.
Bar = Tuple[int, float, float, str]


def time_unit(span: float) -> Tuple[str, float]:
    """The unit to show ``span`` seconds in, and its length in seconds."""
    if span > 2 * 86400:
        return "days", 86400.0
    if span > 2 * 3600:
        return "hours", 3600.0
    if span > 120:
        return "minutes", 60.0
    return "seconds", 1.0


def _last_time(runs: Sequence[JobRun]) -> Optional[float]:
    ends = [t for r in runs for t in (r.ended_at, r.started_at, r.queued_at, r.submitted)
            if t is not None]
    return max(ends) if ends else None


def job_rows(runs: Sequence[JobRun]) -> Tuple[List[str], List[Bar]]:
    """One row per run (in the order they were queued): its wait (from when it was queued,
    or submitted, to its start, or to its end for a run that never started) and its run
    (start to end, or to the last time known for a run not ended), coloured by state."""
    now = _last_time(runs)
    order = sorted((r for r in runs if (r.queued_at or r.submitted or r.started_at) is not None),
                   key=lambda r: (r.queued_at or r.submitted or r.started_at or 0.0, r.name))
    labels: List[str] = []
    bars: List[Bar] = []
    for row, run in enumerate(order):
        labels.append(run.name)
        begin = run.queued_at if run.queued_at is not None else run.submitted
        end = run.ended_at if run.ended_at is not None else (None if run.final else now)
        if begin is not None:
            stop = run.started_at if run.started_at is not None else end
            if stop is not None and stop >= begin:
                bars.append((row, begin, stop, WAIT))
        if run.started_at is not None and end is not None and end >= run.started_at:
            bars.append((row, run.started_at, end, run.state))
    return labels, bars


def core_lanes(runs: Sequence[JobRun]) -> Tuple[List[str], List[Bar]]:
    """One row per core of a pilot run (``node/core``). When the pilot wrote the ids of each
    task's cores, each task is drawn on those; otherwise each is put on the lowest cores of
    its node(s) free when it starts, as many as its share gives it there, and a node has as
    many rows as it had cores busy at once (``node/#n``). Tasks without a start, an end or a
    placement are left out."""
    placed = [r for r in runs if r.placement and r.started_at is not None
              and r.ended_at is not None and r.ended_at >= r.started_at]
    if placed and all(r.core_ids for r in placed):
        return _given_cores(placed)
    events: List[Tuple[float, int, int]] = []  # (time, 0 end / 1 start, index)
    for i, run in enumerate(placed):
        assert run.started_at is not None and run.ended_at is not None
        events.append((run.started_at, 1, i))
        events.append((run.ended_at, 0, i))
    events.sort()
    free: Dict[str, List[int]] = {}
    size: Dict[str, int] = {}
    held: Dict[int, List[Tuple[str, List[int]]]] = {}
    spans: List[Tuple[str, int, float, float, str]] = []
    for when, starting, i in events:
        run = placed[i]
        if not starting:
            for node, slots in held.pop(i, ()):
                for slot in slots:
                    heapq.heappush(free[node], slot)
            continue
        taken = []
        for node, count in run.placement:
            pool = free.setdefault(node, [])
            slots = []
            for _ in range(count):
                if pool:
                    slots.append(heapq.heappop(pool))
                else:
                    slots.append(size.get(node, 0))
                    size[node] = size.get(node, 0) + 1
            taken.append((node, slots))
            for slot in slots:
                assert run.ended_at is not None
                spans.append((node, slot, when, run.ended_at, run.state))
        held[i] = taken
    first: Dict[str, int] = {}
    labels: List[str] = []
    for node in sorted(size):
        first[node] = len(labels)
        labels.extend(f"{node}/#{slot}" for slot in range(size[node]))
    bars = [(first[node] + slot, start, end, state) for node, slot, start, end, state in spans]
    return labels, bars


def _given_cores(placed: Sequence[JobRun]) -> Tuple[List[str], List[Bar]]:
    """One row per core id the pilot gave any task, by node and id."""
    cores = sorted({(node, core) for run in placed for node, ids in run.core_ids
                    for core in ids})
    row = {key: i for i, key in enumerate(cores)}
    bars: List[Bar] = []
    for run in placed:
        assert run.started_at is not None and run.ended_at is not None
        for node, ids in run.core_ids:
            bars.extend((row[(node, core)], run.started_at, run.ended_at, run.state)
                        for core in ids)
    return [f"{node}/{core}" for node, core in cores], bars


def levels(changes: Sequence[Tuple[float, float]]) -> Tuple[List[float], List[float]]:
    """A count over time from its changes ``(time, +n or -n)``: the times where it changes
    and the level from each of them on (changes at the same time taken together)."""
    times: List[float] = []
    values: List[float] = []
    level = 0.0
    for when, delta in sorted(changes):
        level += delta
        if times and times[-1] == when:
            values[-1] = level
        else:
            times.append(when)
            values.append(level)
    return times, values


def busy_changes(runs: Sequence[JobRun]) -> List[Tuple[float, float]]:
    """The changes of the cores busy: +cores at each start, -cores at each end (runs whose
    cores are unknown count as 1, said in the plot)."""
    changes: List[Tuple[float, float]] = []
    end_all = _last_time(runs)
    for run in runs:
        end = run.ended_at if run.ended_at is not None else (None if run.final else end_all)
        if run.started_at is None or end is None:
            continue
        cores = float(run.cores) if run.cores else 1.0
        changes.append((run.started_at, cores))
        changes.append((max(end, run.started_at), -cores))
    return changes


def waiting_changes(runs: Sequence[JobRun]) -> List[Tuple[float, float]]:
    """The changes of the runs waiting: +1 when queued (or submitted), -1 at the start (or the
    end of a run that never started)."""
    changes: List[Tuple[float, float]] = []
    end_all = _last_time(runs)
    for run in runs:
        begin = run.queued_at if run.queued_at is not None else run.submitted
        stop = run.started_at if run.started_at is not None else (
            run.ended_at if run.ended_at is not None else (None if run.final else end_all))
        if begin is None or stop is None:
            continue
        changes.append((begin, 1.0))
        changes.append((max(stop, begin), -1.0))
    return changes
