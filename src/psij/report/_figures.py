"""The figures of a report, computed from a list of :class:`~psij.report._runs.JobRun`: counts
by state and cause, percentiles of the queue wait and run time, CPU and memory efficiency
(as Slurm's ``seff``), the worst jobs, core-hours and the failures with their messages.

Pure functions: no I/O, no clock. A figure no run knows is None (shown as "unknown"), and
each figure says over how many runs it was taken.

Percentiles are nearest-rank: the p-th percentile of n sorted values is the value at rank
ceil(p/100 x n) (1-based), so it is always one of the values measured.
"""

import math
from collections import Counter
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from psij._record import Record
from psij.report._runs import (
    STATE_ORDER,
    JobRun,
    core_seconds,
    cpu_efficiency,
    held_seconds,
    memory_efficiency,
    requested_core_seconds,
    run_seconds,
    wait_seconds,
)

__all__ = ["Failure", "Spread", "Summary", "percentile", "spread", "summarize"]

PERCENTILES = (50, 90, 99)
WORST = 5  # jobs named for each efficiency
MESSAGES = 5  # distinct messages shown for each cause of failure
NO_CAUSE = "(no cause given)"
FAILED_STATES = ("FAILED", "CANCELED", "OMITTED", "RERUN")


def percentile(ordered: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of ``ordered``, sorted and not
    empty."""
    if not ordered:
        raise ValueError("percentile: no values")
    if not 0 < p <= 100:
        raise ValueError(f"percentile: p must be in (0, 100], got {p!r}")
    rank = math.ceil(p / 100 * len(ordered))
    return ordered[max(1, rank) - 1]


class Spread(Record):
    """The median, 90th and 99th percentiles and the maximum of ``count`` known values."""

    count: int
    p50: float
    p90: float
    p99: float
    max: float
    min: float


def spread(values: Iterable[Optional[float]]) -> Optional[Spread]:
    """The spread of the values known (None ones left out); None when none is known."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    p50, p90, p99 = (percentile(ordered, p) for p in PERCENTILES)
    return Spread(count=len(ordered), p50=p50, p90=p90, p99=p99, max=ordered[-1],
                  min=ordered[0])


class Failure(Record):
    """The runs that did not complete for one cause: how many, their distinct messages (most
    frequent first, with counts) and the names of the first few."""

    cause: str
    count: int
    messages: Tuple[Tuple[str, int], ...]
    names: Tuple[str, ...]


class Summary(Record):
    """Every figure of the report."""

    total: int
    final: int
    by_state: Tuple[Tuple[str, int], ...]
    by_cause: Tuple[Tuple[str, int], ...]
    """Causes of the final runs; runs without one counted under :data:`NO_CAUSE`."""
    wait: Optional[Spread]
    held: Optional[Spread]
    run: Optional[Spread]
    cpu: Optional[Spread]
    """Per-run CPU efficiency (fractions)."""
    cpu_overall: Optional[float]
    """Sum of CPU seconds over the sum of cores x elapsed, over the runs that know all three."""
    memory: Optional[Spread]
    memory_overall: Optional[float]
    worst_cpu: Tuple[Tuple[str, float], ...]
    worst_memory: Tuple[Tuple[str, float], ...]
    core_hours_used: Optional[float]
    used_known: int
    core_hours_requested: Optional[float]
    """Cores x time limit, over the ended runs that started and know both."""
    requested_known: int
    cpu_hours: Optional[float]
    cpu_known: int
    first: Optional[float]
    """The earliest time known of any run (submitted, queued or started)."""
    last: Optional[float]
    """The latest end (or start) known."""
    failures: Tuple[Failure, ...]


def _ordered_counts(counter: "Counter[str]", order: Sequence[str]) -> Tuple[Tuple[str, int], ...]:
    known = [(name, counter[name]) for name in order if counter[name]]
    rest = sorted(((n, c) for n, c in counter.items() if n not in order),
                  key=lambda item: (-item[1], item[0]))
    return tuple(known + rest)


def _overall(runs: Sequence[JobRun], used: Callable[[JobRun], Optional[float]],
             given: Callable[[JobRun], Optional[float]]) -> Optional[float]:
    top = bottom = 0.0
    for run in runs:
        a, b = used(run), given(run)
        if a is not None and b:
            top += a
            bottom += b
    return top / bottom if bottom else None


def _worst(runs: Sequence[JobRun], figure: Callable[[JobRun], Optional[float]]
           ) -> Tuple[Tuple[str, float], ...]:
    known = [(value, run.name) for run in runs for value in (figure(run),) if value is not None]
    known.sort()
    return tuple((name, value) for value, name in known[:WORST])


def _failures(runs: Sequence[JobRun]) -> Tuple[Failure, ...]:
    groups: Dict[str, List[JobRun]] = {}
    for run in runs:
        if run.state in FAILED_STATES:
            groups.setdefault(run.cause or NO_CAUSE, []).append(run)
    failures = []
    for cause, members in groups.items():
        messages = Counter(" ".join((r.message or "(no message)").split()) for r in members)
        top = sorted(messages.items(), key=lambda item: (-item[1], item[0]))[:MESSAGES]
        failures.append(Failure(cause, len(members), tuple(top),
                                tuple(r.name for r in members[:WORST])))
    failures.sort(key=lambda f: (-f.count, f.cause))
    return tuple(failures)


def _hours(values: Iterable[Optional[float]]) -> Tuple[Optional[float], int]:
    known = [v for v in values if v is not None]
    return (sum(known) / 3600 if known else None), len(known)


def summarize(runs: Sequence[JobRun]) -> Summary:
    """Every figure of the report for ``runs``."""
    final = [r for r in runs if r.final]
    by_state = _ordered_counts(Counter(r.state for r in runs), STATE_ORDER)
    by_cause = _ordered_counts(Counter(r.cause or NO_CAUSE for r in final), ())
    held = [h for h in map(held_seconds, runs) if h is not None]
    used, used_known = _hours(map(core_seconds, final))
    # Requested: the runs that started (a run cancelled in the queue was given nothing).
    requested, requested_known = _hours(requested_core_seconds(r) for r in final
                                        if r.started_at is not None)
    cpu_hours, cpu_known = _hours(r.cpu_seconds for r in final)
    times = [t for r in runs for t in (r.submitted, r.queued_at, r.started_at)
             if t is not None]
    ends = [t for r in runs for t in (r.ended_at, r.started_at) if t is not None]
    return Summary(
        total=len(runs), final=len(final), by_state=by_state, by_cause=by_cause,
        wait=spread(map(wait_seconds, runs)), held=spread(held),
        run=spread(map(run_seconds, final)),
        cpu=spread(map(cpu_efficiency, final)),
        cpu_overall=_overall(final, lambda r: r.cpu_seconds, core_seconds),
        memory=spread(map(memory_efficiency, final)),
        memory_overall=_overall(final, lambda r: None if r.max_rss_bytes is None
                                else float(r.max_rss_bytes),
                                lambda r: None if r.requested_memory_bytes is None
                                else float(r.requested_memory_bytes)),
        worst_cpu=_worst(final, cpu_efficiency), worst_memory=_worst(final, memory_efficiency),
        core_hours_used=used, used_known=used_known, core_hours_requested=requested,
        requested_known=requested_known, cpu_hours=cpu_hours, cpu_known=cpu_known,
        first=min(times) if times else None, last=max(ends) if ends else None,
        failures=_failures(runs))
