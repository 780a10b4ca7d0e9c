"""``psij release``: submit the jobs that psij held back in a process that has ended.

A batch executor with ``max_queued_per_shape`` keeps jobs back in the client process until
fewer jobs of their shape are queued, and records each in the job registry as held by that
process (:mod:`psij._registry.held`). When that process ends (killed, crashed, or it simply
exited) before their turn, they were never submitted: ``psij list`` and ``psij status`` say so,
and this command submits them from their recorded JobSpec, with the executor and settings
recorded, under their recorded ids. Jobs whose turn has not come under the cap (the recorded
``max_queued_per_shape``) are held by this command's process, which waits until each was given
to the scheduler (or ended) before it exits; killed before that, it leaves them held by a
process that ended, to be released again.

Imported by :mod:`psij.cli._jobs` when the command is named; it uses :mod:`psij.registry` and
:mod:`psij._registry.held` only.
"""

import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from psij.cli._common import EXIT_FAILED, add_command, say

if TYPE_CHECKING:
    import argparse

    from psij.job import Job
    from psij.registry import JobRecord

__all__ = ["Refused", "add_release_command", "release", "release_main"]

_TICK = 0.25  # how often the jobs still held by this command are looked at
_EXPLAIN_EVERY = 60.0  # seconds between two lines saying what it still waits for

LINE = "submit jobs psij held back in a process that has ended"


def add_release_command(commands: Any) -> None:
    release = add_command(
        commands, "release", LINE,
        "Submit jobs that psij held back in a client process (max_queued_per_shape) and "
        "that were never submitted because that process ended: chosen by id or by --tag, "
        "or, with neither, every such job. Each is submitted from its recorded JobSpec, with "
        "its recorded executor and settings, under its recorded id, and is followed as any "
        "other job from then on. Jobs still held under their executor's cap wait in this "
        "command until their turn comes. A job whose process still runs is left to it.",
        epilog="exit status: 0 when every job named was submitted (or none was held); 1 when "
               "some could not be; 2 for bad usage. Each submitted job is printed as ID and "
               "its native id.")
    release.add_argument("ids", nargs="*", metavar="ID",
                         help="job ids, as psij status takes them (a psij id, a prefix of one, "
                              "or a native id)")
    release.add_argument("--tag", metavar="TAG", help="the jobs with this tag")
    release.add_argument("--force", action="store_true",
                         help="also release a job whose process ended while submitting it "
                              "(it may be in the scheduler already) or whose process runs "
                              "on another host")


def release_main(args: "argparse.Namespace") -> int:
    from psij import registry
    from psij.cli._names import resolve

    ids = resolve(args.ids) if args.ids else None
    records = registry.find(ids, tag=args.tag)
    if not ids:
        if not records and args.tag is not None:
            raise ValueError(f"no recorded job has tag {args.tag!r}")
        # Every job held by a process known to have ended.
        records = [r for r in records if _ended(r, args.force)]
    problems: List[str] = []
    jobs: List[Job] = []
    for record, outcome in release(records, force=args.force):
        if isinstance(outcome, Exception):
            problems.append(f"job {record.id}: not released: {outcome}")
        else:
            jobs.append(outcome)
    _wait_submitted(jobs)
    registry.flush()
    for job in jobs:
        status = job.status
        if job.native_id is None:
            problems.append(f"job {job.id}: {status.state}: {status.message}")
        else:
            sys.stdout.write(f"{job.id} {job.native_id}\n")
    for problem in problems:
        say(problem, "release")
    return EXIT_FAILED if problems else 0


def _ended(record: Any, force: bool) -> bool:
    from psij._registry.held import HELD, holder_alive, holder_of

    if record.held_by is None or (record.held != HELD and not force):
        return False
    holder = holder_of(record.holder)
    alive = None if holder is None else holder_alive(holder)
    return alive is False or (alive is None and force)


def _wait_submitted(jobs: List["Job"]) -> None:
    """Wait until each job has a native id or is final, and is no longer held by this process
    (those held by it are submitted when their turn comes, or once their stage-in is done)."""
    from psij._clock import MonotonicClock
    from psij.executors.local._stage_in import held_here

    clock = MonotonicClock()
    said = None
    while True:
        staging = [j for j in jobs if held_here(j) and not j.status.final]
        waiting = staging + [j for j in jobs if j.native_id is None and not j.status.final
                             and not held_here(j)]
        if not waiting:
            return
        now = clock.now()
        if said is None or now - said >= _EXPLAIN_EVERY:
            said = now
            if len(staging) < len(waiting):
                say(f"{len(waiting) - len(staging)} job(s) wait for fewer jobs of their shape "
                    "to be queued (max_queued_per_shape); they are submitted from here as "
                    "their turn comes", "release")
            if staging:
                say(f"{len(staging)} job(s) are staged in from here, then started", "release")
        waiting[0].wait(timedelta(seconds=_TICK))


class Refused(Exception):
    """A held job that is not released, and why."""


def release(records: "Sequence[JobRecord]", force: bool = False
            ) -> "List[Tuple[JobRecord, Any]]":
    """Submit the held jobs of ``records`` whose holding process ended; for each record, the
    live job submitted (held again by this process when its executor's cap says so), or the
    exception saying why it was not (:class:`Refused` for a job that is not to be released)."""
    from psij import registry
    from psij._registry import recorder
    from psij._registry.held import HELD, SUBMITTING, mark, this_holder
    from psij._registry.store import open_store
    from psij.executors.batch._held_jobs import HELD_MESSAGE
    from psij.executors.local._pool_driver import WAITING_MESSAGE
    from psij.executors.local._stage_in import held_here
    from psij.job import Job
    from psij.job_executor import JobExecutor

    held_again = (HELD_MESSAGE, WAITING_MESSAGE)  # by this process: its cap, or its pool
    executors: Dict[Tuple[str, Optional[str], str], JobExecutor] = {}
    done: List[Tuple[JobRecord, Any]] = []
    me = this_holder()
    for record in records:
        try:
            _releasable(record, force)
            spec = record.spec
            if spec is None:
                raise Refused("its JobSpec could not be recorded, so it cannot be submitted "
                              "from the registry")
            store = open_store(record.registry.parent)
            if record.held == SUBMITTING:  # by force: taken back to held first
                store.set_held([(HELD, record.holder, None, None, record.id)])
            if not store.claim_held(record.id, str(record.holder), me):
                raise Refused("another process released or changed it first")
            executor = registry._executor_for(record, executors)
            job = Job(spec)
            job._id = record.id
            job.__dict__[recorder.TAG_ATTR] = record.tag
            try:
                executor.submit(job)
            except BaseException:
                store.set_held([(HELD, record.holder, None, None, record.id)])  # as it was
                raise
            if job.status.message not in held_again and not held_here(job):  # submitted now
                mark(executor, [job], None)
            done.append((record, job))
        except Exception as ex:
            done.append((record, ex))
    return done



def _releasable(record: "JobRecord", force: bool) -> None:
    from psij._registry.held import HELD, SUBMITTING, holder_alive, holder_of

    if record.state.final:
        raise Refused(f"it is {record.state}")
    if record.native_id is not None:
        raise Refused(f"it was submitted (native id {record.native_id})")
    if record.held not in (HELD, SUBMITTING):
        raise Refused("it is not held by psij (only jobs held back in a process that ended "
                      "are released)")
    holder = holder_of(record.holder)
    alive = None if holder is None else holder_alive(holder)
    if holder is not None and alive:
        raise Refused(f"process {holder.pid} that holds it still runs and submits it when "
                      "its turn comes")
    if alive is None and not force:
        raise Refused("whether the process that holds it still runs cannot be told from "
                      "here (another host); --force releases it anyway")
    if record.held == SUBMITTING and not force:
        raise Refused("its process ended while submitting it, so it may be in the scheduler "
                      "already; look there, then --force submits it again")
