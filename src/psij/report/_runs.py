"""One run of a job as the report sees it (:class:`JobRun`), and the figures derived from it.

Every field but ``name`` and ``state`` may be None: not known to the source it came from (a
registry written before a column existed, a scheduler whose accounting does not give it, a
pilot report without it). A figure derived from an unknown one is unknown too (None), never
0. Numbers that are not finite, negative or huge are taken as unknown when a run is made
(:func:`sound_seconds`, :func:`sound_count`), so no figure below ever sees NaN or inf.
"""

from typing import Any, Optional, Tuple

from psij._record import Record

__all__ = ["JobRun", "cpu_efficiency", "held_seconds", "memory_efficiency", "run_seconds",
           "sound_count", "sound_seconds", "wait_seconds"]

# The states a run may end in, in the order the report lists them; any other word a source
# gives is listed after these.
STATE_ORDER = ("COMPLETED", "FAILED", "CANCELED", "OMITTED", "RERUN", "ACTIVE", "QUEUED", "NEW")
_MAX_INT = (1 << 63) - 1


MAX_SECONDS = 1e11
"""The largest number of seconds (or epoch time: the year 5138) taken for one; more is no
time a clock or a job could give."""


def sound_seconds(value: Any) -> Optional[float]:
    """``value`` as seconds (or epoch seconds) when it is a number from 0 to
    :data:`MAX_SECONDS`; None otherwise (bool, text, NaN, inf, negative, huge)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past the floats
        return None
    return number if 0 <= number <= MAX_SECONDS else None


def sound_count(value: Any) -> Optional[int]:
    """``value`` as a count (cores, bytes) when it is an int from 0 to 2**63-1; else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= _MAX_INT else None


def sound_text(value: Any) -> Optional[str]:
    """``value`` when it is text (lone surrogates replaced, so it can be written out)."""
    if not isinstance(value, str):
        return None
    return value.encode("utf-8", "replace").decode("utf-8") if not value.isascii() else value


class JobRun(Record):
    """What the report knows of one run of a job; times are epoch seconds."""

    name: str
    """The job's id (registry) or task name (pilot)."""
    state: str
    """Its state's name: COMPLETED, FAILED, CANCELED (OMITTED for a pilot task skipped because
    one it depended on failed; RERUN for an earlier run of a job run again whose own final
    state was not recorded), or ACTIVE, QUEUED, NEW for a run not ended."""
    cause: Optional[str] = None
    message: Optional[str] = None
    submitted: Optional[float] = None
    queued_at: Optional[float] = None
    held_from: Optional[float] = None
    held_to: Optional[float] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    cpu_seconds: Optional[float] = None
    max_rss_bytes: Optional[int] = None
    cores: Optional[int] = None
    nodes: Optional[str] = None
    requested_memory_bytes: Optional[int] = None
    requested_seconds: Optional[float] = None
    exit_code: Optional[int] = None
    native_id: Optional[str] = None
    placement: Tuple[Tuple[str, int], ...] = ()
    """Where a pilot task ran: (node, cores) for each node of its share; empty otherwise."""
    core_ids: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()
    """The ids of the cores a pilot task was given on each node, when its pilot wrote them."""

    @property
    def final(self) -> bool:
        return self.state not in ("ACTIVE", "QUEUED", "NEW")


def wait_seconds(run: JobRun) -> Optional[float]:
    """Queue wait: from when the scheduler (or pilot) accepted the run, else from its
    submission, to its start; None when either end is unknown. A start recorded before the
    acceptance (clocks of two hosts) counts as no wait."""
    begin = run.queued_at if run.queued_at is not None else run.submitted
    if begin is None or run.started_at is None:
        return None
    return max(0.0, run.started_at - begin)


def held_seconds(run: JobRun) -> Optional[float]:
    """How long psij itself held the run back (``max_queued_per_shape``) before giving it to
    the scheduler; None when it was not held or the end of the holding is unknown."""
    if run.held_from is None or run.held_to is None:
        return None
    return max(0.0, run.held_to - run.held_from)


def run_seconds(run: JobRun) -> Optional[float]:
    """Elapsed time from start to end, None when either is unknown."""
    if run.started_at is None or run.ended_at is None:
        return None
    return max(0.0, run.ended_at - run.started_at)


def cpu_efficiency(run: JobRun) -> Optional[float]:
    """CPU time used over the core time allocated, as Slurm's ``seff`` computes it: CPU
    seconds (user + system) / (cores x elapsed seconds); a fraction, above 1 for a run that
    used more cores than it was given. None when a figure is unknown or the run took no
    time."""
    elapsed = run_seconds(run)
    if run.cpu_seconds is None or not run.cores or not elapsed:
        return None
    return run.cpu_seconds / (run.cores * elapsed)


def memory_efficiency(run: JobRun) -> Optional[float]:
    """Peak memory over the memory requested, as ``seff`` computes it (max RSS / requested
    memory); a fraction. None when either is unknown or nothing was requested."""
    if run.max_rss_bytes is None or not run.requested_memory_bytes:
        return None
    return run.max_rss_bytes / run.requested_memory_bytes


def core_seconds(run: JobRun) -> Optional[float]:
    """Cores x elapsed seconds, None when either is unknown."""
    elapsed = run_seconds(run)
    if run.cores is None or elapsed is None:
        return None
    return run.cores * elapsed


def requested_core_seconds(run: JobRun) -> Optional[float]:
    """Cores x requested seconds (the time limit asked for), None when either is unknown."""
    if run.cores is None or run.requested_seconds is None:
        return None
    return run.cores * run.requested_seconds
