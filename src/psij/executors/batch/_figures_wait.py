"""Ended batch jobs waiting a moment for the scheduler's record of their run.

A job's end is often known before the scheduler has written its record: from the job's own
exit-code file, or from the queue, which gives no figures. Its final status then waits for
the record (:data:`WAITS`: asked 1, 2, 4 and 8 seconds after the end, with no answer then
the status is set without figures; asked at once for an end the scheduler told, whose record
is written by then); one command asks about every job due within :data:`MIN_GAP` seconds
(:class:`AwaitingFigures`), at most once every :data:`MIN_GAP` seconds whatever the number of
jobs. A failed command ends the wait of the jobs it asked about (their statuses are set at
once, without figures); after :data:`OFF_AFTER` failures in a row, no job waits for
:data:`OFF_SECONDS` (a site whose accounting is down costs each job's end nothing more).

:func:`ended_figures` asks an executor's scheduler: its accounting commands, or (executors
whose status command shows ended jobs: PBS ``qstat -x``, LSF ``bjobs -a``, Flux ``flux jobs
-a``) its status command. This module does no I/O of its own but through the executor.
"""

import logging
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Generic,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

from psij._record import Record
from psij.executors.batch._figures import figures_of

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = ["MIN_GAP", "OFF_AFTER", "OFF_SECONDS", "WAITS", "AwaitingFigures", "ended_figures"]

logger = logging.getLogger(__name__)

# Seconds after a job's end when the scheduler's record is asked for (the last: given up).
WAITS = (1.0, 2.0, 4.0, 8.0)
# The least seconds between two commands asking for records.
MIN_GAP = 1.0
# Failed commands in a row after which no job waits, for OFF_SECONDS.
OFF_AFTER = 3
OFF_SECONDS = 600.0

_P = TypeVar("_P")


class _Waiting(Record):
    since: float
    due: float
    payload: Any
    partial: Optional[Dict[str, Any]] = None  # an unfinished record's figures


class AwaitingFigures(Generic[_P]):
    """The ended jobs whose final status waits for the scheduler's record (not thread-safe:
    the poller's thread alone uses it). ``payload`` is what is finished with the figures."""

    def __init__(self, limit: float = WAITS[-1]) -> None:
        """``limit``: the most seconds a job waits (the asks after it are left out)."""
        self._waits = (*(w for w in WAITS if w < limit), limit) if limit > 0 else (0.0,)
        self._jobs: Dict[str, _Waiting] = {}
        self._last_ask: Optional[float] = None
        self._failures = 0
        self._off_until: Optional[float] = None

    def __len__(self) -> int:
        return len(self._jobs)

    def wanted(self, now: float) -> bool:
        """Whether ends wait for records now (not for a while after failures in a row)."""
        return self._off_until is None or now >= self._off_until

    def add(self, native_id: str, payload: _P, now: float, at_once: bool = False) -> None:
        """Let a job wait; ``at_once``: ask at the next chance (the scheduler told the end)."""
        if native_id not in self._jobs:
            self._jobs[native_id] = _Waiting(now, now if at_once else now + self._waits[0],
                                             payload)

    def due_at(self) -> Optional[float]:
        """When the next command should ask (None: no job waits)."""
        if not self._jobs:
            return None
        due = min(job.due for job in self._jobs.values())
        return due if self._last_ask is None else max(due, self._last_ask + MIN_GAP)

    def take_due(self, now: float) -> List[str]:
        """The jobs to ask about now, once one of them is due: those due before the next ask
        could come (Grid Engine asks once per job: the others are not asked early)."""
        due = self.due_at()
        if due is None or now < due:
            return []
        return [nid for nid, job in self._jobs.items() if job.due <= now + MIN_GAP]

    def settle(self, asked: Sequence[str], found: Optional[Mapping[str, Mapping[str, Any]]],
               now: float) -> List[Tuple[_P, Dict[str, Any]]]:
        """What a command said of ``asked`` (None: it failed): the jobs to finish now, each
        with its figures ({}: none); the others wait for the next ask. A record is whole once
        it has the job's end (``ended_at``), or when it shows the end but no figure at all
        (none will come); the figures of one not whole yet are kept for the job's end if it
        waited long enough."""
        self._last_ask = now
        done: List[Tuple[_P, Dict[str, Any]]] = []
        if found is None:
            self._failures += 1
            if self._failures >= OFF_AFTER:
                self._failures = 0
                self._off_until = now + OFF_SECONDS
                logger.warning("the scheduler's accounting failed %d times in a row: ended "
                               "jobs get their final status without waiting for its figures "
                               "for %.0f s", OFF_AFTER, OFF_SECONDS)
        else:
            self._failures = 0
            self._off_until = None
        for nid in asked:
            job = self._jobs.get(nid)
            if job is None:
                continue
            figures = None if found is None else found.get(nid)
            partial = job.partial if figures is None else dict(figures)
            whole = figures is not None and ("ended_at" in figures or not figures)
            if found is None or whole or now - job.since >= self._waits[-1]:
                del self._jobs[nid]
                done.append((job.payload, dict(partial or {})))
                continue
            waited = now - job.since
            later = [w for w in self._waits if w > waited]
            self._jobs[nid] = _Waiting(job.since, job.since + later[0], job.payload, partial)
        return done

    def drain(self) -> List[_P]:
        """Every waiting job's payload, forgotten here (the poller stops)."""
        payloads = [job.payload for job in self._jobs.values()]
        self._jobs.clear()
        return payloads


def ended_figures(executor: "BatchSchedulerExecutor", native_ids: Sequence[str]
                  ) -> Optional[Dict[str, Dict[str, Any]]]:
    """The figures of those of ``native_ids`` whose record shows their end, by native id
    (None: no command could be run and read). The executor's ``FIGURES_FROM`` says where
    they are: ``"accounting"`` or ``"status"``."""
    source = getattr(executor, "FIGURES_FROM", None)
    if source == "accounting":
        commands = executor.get_accounting_commands(native_ids)
        parse = executor.parse_accounting_output
    elif source == "status":
        commands = [executor.get_status_command(native_ids)]
        parse = executor.parse_status_output
    else:
        return None
    wanted = set(native_ids)
    found: Dict[str, Dict[str, Any]] = {}
    answered = False
    for argv in commands:
        result = executor._run(argv)
        if result.exit_code is None:
            logger.info("accounting command failed: %s", result.describe())
            continue
        if source == "status" and executor.output_means_no_jobs(result.exit_code,
                                                                result.output):
            answered = True
            continue
        out = result.stdout if result.exit_code == 0 else result.output
        try:
            statuses = parse(result.exit_code, out)
        except Exception as e:
            logger.info("accounting not available: %s (%s)", result.describe(), e)
            continue
        answered = True
        for nid, status in statuses.items():
            if nid in wanted and status.state.final:
                found[nid] = figures_of(status.metadata)
    return found if answered else None
