"""Jobs held by psij in a client process, in the job registry: recorded at once, told apart from
jobs whose process ended, and released (submitted) by another process.

A batch executor with ``max_queued_per_shape`` keeps some jobs back in the client until fewer
jobs of their shape are queued (:mod:`psij.executors.batch._held_jobs`). Such a job exists
only in that process's memory; were the process to end, it would never be submitted. So its
row is written **synchronously**, before ``submit``/``submit_many`` returns (not through the
recorder's batched writer thread), with two columns: ``held`` (``"held"``, then
``"submitting"`` while its submission is under way; NULL once it was submitted, dropped or
failed) and ``holder`` (the holding process as JSON: ``pid``, ``host`` and ``start``, the
kernel's start time of that pid, which tells a reused pid apart). A ``kill -9`` right after
``submit`` returns leaves the row saying who held the job.

:func:`holder_alive` tells whether the holding process still runs (None where it cannot be told:
another host). ``psij release`` (:mod:`psij.cli._release`) submits held jobs whose process
ended, from their recorded JobSpec, with the executor and settings recorded: each job is first
claimed (its holder becomes the releasing process, in one conditional update, so that two
releasers never submit one job twice), then submitted under its recorded id, and it is followed
as any other job from then on.
A job whose process ended while submitting it (``held = "submitting"``) may have reached the
scheduler: it is released only when asked for by force.

Recording never fails a job: a registry that cannot be written is said once per file on the
``psij.registry`` logger, as the recorder does.
"""

import json
import os
import socket
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple

from psij._clock import wall_time
from psij._record import Record
from psij._registry import recorder
from psij._registry.accounting import NO_USE
from psij.job_state import JobState

if TYPE_CHECKING:
    from psij.job import Job
    from psij.job_executor import JobExecutor
    from psij.registry import JobRecord

__all__ = ["HELD", "SUBMITTING", "Holder", "cancel_ended", "describe", "holder_alive",
           "holder_of", "mark", "this_holder"]

HELD = "held"
SUBMITTING = "submitting"
_ME: Dict[int, str] = {}


class Holder(Record):
    """The process that holds a job: its ``pid``, ``host`` and kernel ``start`` time."""

    pid: int
    host: str
    start: Optional[str]


def this_holder() -> str:
    """This process as a holder (JSON text)."""
    pid = os.getpid()
    text = _ME.get(pid)
    if text is None:
        from psij._pids import start_time

        text = _ME[pid] = json.dumps({"pid": pid, "host": socket.gethostname(),
                                      "start": start_time(pid)})
    return text


def holder_of(text: Any) -> Optional[Holder]:
    """The ``holder`` column read back (None when it holds no readable process)."""
    if not isinstance(text, str):
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    pid, host, start = found.get("pid"), found.get("host"), found.get("start")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 \
            or not isinstance(host, str):
        return None
    return Holder(pid, host, start if isinstance(start, str) else None)


def holder_alive(holder: Holder) -> Optional[bool]:
    """Whether the holding process still runs; None when it cannot be told (another host)."""
    if holder.host != socket.gethostname():
        return None
    from psij._pids import start_time

    now = start_time(holder.pid)
    if now is None:  # no such process (Linux)
        return False
    if holder.start is None or holder.start == "None" or now == "None":
        try:  # no kernel start times here: the pid alone
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return now == holder.start


def describe(held: Optional[str], holder_text: Any) -> Optional[str]:
    """What a row's held marker says, in words (None: the job is not held by psij)."""
    if held not in (HELD, SUBMITTING):
        return None
    holder = holder_of(holder_text)
    if holder is None:
        return "held by psij in a process that cannot be told"
    where = f"process {holder.pid}" if holder.host == socket.gethostname() \
        else f"process {holder.pid} on {holder.host}"
    alive = holder_alive(holder)
    if alive is None:
        return f"held by psij in {where} (whether it still runs cannot be told from here)"
    if alive:
        return f"held by psij in {where}" + (", being submitted" if held == SUBMITTING else "")
    if held == SUBMITTING:
        return (f"held by psij in {where}, which ended while submitting it; it may have "
                "reached the scheduler")
    return f"held by psij in {where}, which ended; never submitted"


# -- writing (the executor's submit path and its holding's worker thread) ------------------

def mark(executor: "JobExecutor", jobs: "Sequence[Job]", held: Optional[str],
         final: Optional[Tuple[str, int, str]] = None) -> None:
    """Record at once that ``jobs`` of ``executor`` are ``held`` (HELD, SUBMITTING) by this
    process, or (None) no longer held: submitted (their native ids are written with it) or,
    with ``final`` (state name, rank, message), ended while held."""
    if not jobs or not recorder.enabled():
        return
    try:
        identity = recorder._identity(executor)
        store = identity[1]
        me = this_holder()
        if held == HELD:
            store.mark_held([_row(job, identity, me) for job in jobs])
        else:
            store.set_held([(held, me if held else None, job._native_id, final, job.id)
                            for job in jobs])
    except Exception as ex:
        recorder._warn_once(str(getattr(executor.config, "work_directory", "?")), ex)


def _row(job: "Job", identity: Any, me: str) -> Tuple[Any, ...]:
    _, _, name, version, url, config = identity
    status = job.status
    attempt, rerun = recorder.run_of(job, status)
    # Written before its QUEUED status is reported (which the recorder writes over this).
    state = JobState.QUEUED if status.state is JobState.NEW else status.state
    now = wall_time()
    return (job.id, name, version, recorder._text(url), config, None, recorder._spec_text(job),
            job.__dict__.get(recorder.TAG_ATTR), now, state.name, state.order, None,
            recorder._text(status.message), now, 0, attempt, recorder._rerun_text(rerun), None,
            *NO_USE, HELD, me)


def cancel_ended(record: "JobRecord") -> bool:
    """End ``record`` CANCELED in the registry if it is a job held by a process that ended
    (never submitted, it has nothing else to cancel); False when it is no such job."""
    if record.held != HELD or record.held_by is None:
        return False
    holder = holder_of(record.holder)
    if holder is None or holder_alive(holder) is not False:
        return False
    from psij._registry.store import open_store

    store = open_store(record.registry.parent)
    if not store.claim_held(record.id, str(record.holder), this_holder()):
        return False
    store.set_held([(None, None, None, (JobState.CANCELED.name, JobState.CANCELED.order,
                                        "cancelled while held by psij in a process that had "
                                        "ended; never submitted"), record.id)])
    return True
