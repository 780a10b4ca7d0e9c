"""The ``psij`` commands over the job registry: ``submit``, ``status``, ``wait``, ``cancel``,
``priority``, ``list``, ``attach`` and ``release``.

They work on the registry of the default work directory (``~/.psij/work/jobs.sqlite``), the one
every executor records its jobs in (:mod:`psij.registry`). ``list`` shows what is recorded;
``status``, ``wait``, ``cancel`` and ``priority`` re-attach the jobs that are not final to their
executors, so what they show and change is what the executors have now. A job held back by
the process that submitted it (``max_queued_per_shape``) is given to the scheduler only by that
process: these commands show it as held by psij in that process, or, when the process has
ended, as never submitted; ``release`` (:mod:`psij.cli._release`) submits those.

A ``local`` job submitted with ``psij submit`` is started by the local executor's keeper
process (``psij.executors.local._keeper``), which outlives ``submit``, records the job's exit
code when it ends, and then exits. Jobs of other executors live in their scheduler.

Output written to a closed pipe (``psij list | head``) ends the command quietly.

The job ids given to ``status``, ``wait``, ``cancel`` and ``priority`` (and ``release``) are
resolved by :mod:`psij.cli._names`: a whole psij id, a prefix of one or a native id. The tables
have a CAUSE column (why a final state came) and, with ``--wide``, whole messages; ``wait
--timeout`` exits with :data:`~psij.cli._common.EXIT_TIMEOUT` when jobs are still not final.

Jobs are read and changed only through :mod:`psij.registry` and their executors; this module
imports the shared modules of :mod:`psij.cli` (``_common``, ``_job_options``, ``_names``,
``_wait_progress``, and ``_runs``, the table of ``status --runs``) and no other command's.
"""

import json
import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from psij._clock import MonotonicClock
from psij.cli._common import (
    EXIT_FAILED,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    UsageError,
    add_command,
    exit_status,
    say,
)
from psij.cli._runs import HELP as RUNS_HELP
from psij.cli._runs import JSON_HELP as RUNS_JSON_HELP

if TYPE_CHECKING:
    import argparse

    from psij.job import Job
    from psij.registry import JobRecord

__all__ = ["add_job_commands", "jobs_main"]

_STATUS_WAIT = timedelta(seconds=30)  # for a re-attached job's first status
_CANCEL_WAIT = timedelta(seconds=120)  # a batch job's cancellation is seen at a later poll
_MESSAGE_WIDTH = 60
_REDRAW = 1.0  # seconds between two redraws of psij wait's live line (its elapsed time)
_CLOCK = MonotonicClock()

_IDS_HELP = ("job ids: a psij id, a prefix of one (4 characters or more), or the native id "
             "its scheduler gave (2415, an array element as 2415_3); a word naming several "
             "jobs is refused with their list")
_WIDE_HELP = "whole messages in the table (else cut to 60 characters)"
_JSON_HELP = ("--json prints a JSON array with one object per job: id, executor, "
              "executor_version, url, native_id, tag, state, final, exit_code, cause (why "
              "a final state came: time_limit, out_of_memory, unstartable..., or null), "
              "message, "
              "submitted, updated (times in ISO 8601, UTC), attempt (1, then 2, 3... for a "
              "job run again), rerun (null, or its last rerun: rerun, cause, requeues, "
              "retries) and held (null, or while psij holds the job back in a client process: "
              "phase (held or submitting), pid, host, running (true, false, or null when it "
              "cannot be told) and message); for a final job, what its executor told of its "
              "last run: queued_at, started_at and ended_at (ISO 8601, UTC), cpu_seconds "
              "(user + system), max_rss_bytes (peak memory), nodes, cores, "
              "requested_memory_bytes and requested_seconds, each null when not told; "
              "held_from and held_to (ISO 8601, UTC), when psij held the job back in a client "
              "process, else null.")


def add_job_commands(commands: Any, only: Optional[str] = None) -> None:
    """The registry commands (``only`` that one when given)."""
    if only in (None, "submit"):
        from psij.cli._job_options import ATTRIBUTE_HELP, DEFAULT_EXECUTOR, add_job_options

        submit = add_command(
            commands, "submit", "submit one job, print its id and return at once",
            "Submit one job, record it in the job registry and print its id.\n"
            "The options are those of `psij run`; the job's standard streams are\n"
            "/dev/null unless --stdin, --stdout and --stderr name files.",
            usage="psij submit [options] [--tag TAG] [--] EXECUTABLE [ARGUMENT ...]",
            keep_lines=True,
            epilog="exit status: 0 when submitted; 1 when it could not be submitted or "
                   "recorded; 2 for bad usage\n\n" + ATTRIBUTE_HELP)
        submit.add_argument("--executor", default=DEFAULT_EXECUTOR, metavar="NAME",
                            help=f"executor to submit to (default: {DEFAULT_EXECUTOR})")
        submit.add_argument("--tag", metavar="TAG", help="label to find the job by")
        add_job_options(submit)
    for name, text in (("status", "show the current state of recorded jobs"),
                       ("wait", "wait until recorded jobs are final"),
                       ("cancel", "cancel recorded jobs")):
        if only not in (None, name):
            continue
        sub = add_command(
            commands, name, text,
            f"{text[0].upper()}{text[1:]}, chosen by id or by --tag" +
            (" (or all of them with --all)" if name == "status" else "") +
            ". Jobs not final are re-attached to their executors first.",
            epilog=_EPILOGS[name])
        sub.add_argument("ids", nargs="*", metavar="ID", help=_IDS_HELP)
        sub.add_argument("--tag", metavar="TAG", help="the jobs with this tag")
        if name == "status":
            sub.add_argument("--all", action="store_true", help="every recorded job")
            sub.add_argument("--runs", action="store_true", help=RUNS_HELP)
        if name != "cancel":
            sub.add_argument("--json", action="store_true", help="print JSON (see below)")
            sub.add_argument("--wide", action="store_true", help=_WIDE_HELP)
        if name == "wait":
            sub.add_argument("--timeout", type=_timeout, metavar="SECONDS",
                             help="wait at most this long (0 or more seconds), then exit "
                                  f"with status {EXIT_TIMEOUT} if some jobs are still not "
                                  "final")
            _add_progress_options(sub)
    if only in (None, "priority"):
        priority = add_command(
            commands, "priority", "change the priority of recorded jobs",
            "Give recorded jobs, chosen by id or by --tag, a new priority (psij.priority: a "
            "number, higher goes first). A job its executor holds back (max_queued_per_shape) "
            "takes its new place at once; a job queued in the scheduler gets the scheduler's "
            "value when its executor uses use_nice.",
            usage="psij priority [--tag TAG] [ID ...] PRIORITY", epilog=_EPILOGS["priority"])
        priority.add_argument("words", nargs="+", metavar="ID ... PRIORITY",
                              help="job ids (as for psij status), then the new priority")
        priority.add_argument("--tag", metavar="TAG", help="the jobs with this tag")
    if only in (None, "list"):
        lister = add_command(
            commands, "list", "list recorded jobs as last recorded",
            "List the jobs recorded in the job registry, as last recorded (no executor is "
            "asked).", epilog=_JSON_HELP)
        lister.add_argument("--executor", metavar="NAME", help="only this executor's jobs")
        lister.add_argument("--state", metavar="STATE", action="append",
                            help="only jobs in this state (repeatable)")
        lister.add_argument("--tag", metavar="TAG", help="only jobs with this tag")
        lister.add_argument("--since", metavar="WHEN", help="only jobs submitted at or after "
                            "WHEN (ISO 8601, local time unless a zone is given, or an age: "
                            "90m, 2h, 7d)")
        lister.add_argument("--until", metavar="WHEN", help="only jobs submitted at or before "
                            "WHEN")
        lister.add_argument("--json", action="store_true", help="print JSON (see below)")
        lister.add_argument("--wide", action="store_true", help=_WIDE_HELP)
    if only in (None, "attach"):
        attach = add_command(
            commands, "attach", "adopt a job submitted elsewhere into the registry",
            "Attach to a job that an executor knows by its native id (submitted by other "
            "means), record it and print its new job id.",
            epilog="exit status: 0 when attached; 1 when the executor does not know the job; "
                   "2 for bad usage")
        attach.add_argument("--executor", required=True, metavar="NAME", help="its executor")
        attach.add_argument("--tag", metavar="TAG", help="label to find the job by")
        attach.add_argument("native_id", metavar="NATIVE_ID", help="the executor's job id")
    if only in (None, "release"):
        from psij.cli._release import add_release_command

        add_release_command(commands)


MAX_TIMEOUT = 1e9  # seconds (some 31 years): more is taken for a mistake


def _timeout(text: str) -> float:
    """An argparse ``type``: ``psij wait --timeout``'s seconds."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds from 0 to {MAX_TIMEOUT:g}, got {text[:40]!r}")
    return value


def _add_progress_options(sub: Any) -> None:
    from psij.cli._wait_progress import DEFAULT_INTERVAL, check_interval

    def interval(text: str) -> float:
        import argparse

        try:
            return check_interval(text)
        except ValueError as ex:
            raise argparse.ArgumentTypeError(str(ex)) from None

    group = sub.add_mutually_exclusive_group()
    group.add_argument("--progress", action="store_true", default=None,
                       help="show progress on standard error: a live line on a terminal, "
                            "plain lines otherwise (default: only on a terminal)")
    group.add_argument("--no-progress", dest="progress", action="store_false",
                       help="show no progress")
    sub.add_argument("--progress-every", type=interval, default=DEFAULT_INTERVAL,
                     metavar="SECONDS", help="seconds between plain progress lines "
                     f"(default: {DEFAULT_INTERVAL:g}; a last line when all are final)")


_EPILOGS = {
    "status": "exit status: 0; 1 when the registry cannot be read or a job cannot be "
              "re-attached; 2 for bad usage, such as no job named (ids, --tag or --all) or an id "
              "naming no recorded job, or several. " + _JSON_HELP + " " + RUNS_JSON_HELP,
    "wait": "exit status: the worst of the jobs' statuses, each as `psij run` gives it "
            "(the exit code, 1 for a failure without one, 130 for a canceled job), 0 when "
            f"all completed; {EXIT_TIMEOUT} when --timeout passed with some jobs not final "
            "(whatever the others' statuses: --json tells each); 2 for bad usage. "
            + _JSON_HELP,
    "cancel": "exit status: 0 when every job is final; 1 otherwise; 2 for bad usage.",
    "priority": "exit status: 0 when every job has its new priority where its place is "
                "decided; 1 when a job's place cannot change (it runs, its scheduler has it "
                "without use_nice, or only the process that submitted it holds it); 2 for bad "
                "usage.",
}


# -- output ----------------------------------------------------------------------------------

def _out(text: str) -> None:
    sys.stdout.write(text)


# The columns of the table, and of the rows it is made from.
_TABLE = ("id", "executor", "native_id", "tag", "state", "exit_code", "message", "final",
          "attempt", "rerun", "held", "holder", "cause")
_HEAD = ("ID", "EXECUTOR", "NATIVE_ID", "TAG", "STATE", "EXIT", "CAUSE", "MESSAGE")


def _live(row: Tuple[Any, ...], job: Optional["Job"]) -> Tuple[Any, ...]:
    """A table row with the status ``job`` has now, if it has one."""
    if job is None or job.status.state.name == "NEW":
        return row
    from psij._registry.recorder import cause_of

    st = job.status
    attempt, rerun = _run_now(job, row[8], row[9])
    return (row[0], row[1], job.native_id, row[3], st.state.name, st.exit_code, st.message,
            st.state.final, attempt, rerun, None, None, cause_of(st))


def _run_now(job: "Job", attempt: int, rerun: Optional[str]) -> Tuple[int, Any]:
    """The run a live job is in: its attempt and its last rerun (kind, cause), or those
    recorded (``rerun`` as the registry's column has it) when it has not run again since."""
    from psij._registry.recorder import RERUN_ATTR, run_of

    now, _ = run_of(job, job.status)
    if now > attempt:
        return now, job.__dict__.get(RERUN_ATTR)
    return attempt, rerun


def _rerun_words(attempt: int, rerun: Any) -> str:
    """"attempt 2 (retry after out_of_memory)": the run a job is in, from its second on."""
    if not isinstance(attempt, int) or attempt <= 1:
        return ""
    if isinstance(rerun, str):
        from psij.registry import _rerun_of

        rerun = _rerun_of(rerun)[:2]
    kind, cause = rerun if isinstance(rerun, tuple) else (None, None)
    if kind and cause:
        return f"attempt {attempt} ({kind} after {cause})"
    return f"attempt {attempt}"


def _message(row: Tuple[Any, ...], wide: bool = False) -> str:
    """The message column: the run (from the second on), then the status's message (for a
    job psij holds back, what holds it); cut to :data:`_MESSAGE_WIDTH` unless ``wide``."""
    if row[10] is not None and not row[7] and row[2] is None:
        from psij._registry.held import describe

        held = describe(row[10], row[11])
        if held is not None:
            return held if "ended" not in held else f"{held} (psij release)"
    run = _rerun_words(row[8], row[9])
    text = (f"{run}: {row[6]}" if row[6] else run) if run else (row[6] or "")
    return _cell(text) if wide else _short(text)


def _print_table(rows: Sequence[Tuple[Any, ...]], wide: bool = False) -> None:
    # Column by column: 100 000 rows print in a fraction of a second.
    columns = [[r[0] for r in rows], [r[1] for r in rows], [_cell(r[2]) or "-" for r in rows],
               [r[3] or "-" for r in rows], [r[4] for r in rows],
               ["-" if r[5] is None else str(r[5]) for r in rows],
               [_cell(r[12]) or "-" for r in rows],
               [_message(r, wide) for r in rows]]
    last = len(_HEAD) - 1
    widths = [max(len(_HEAD[i]), max(map(len, columns[i]), default=0)) for i in range(last)]
    padded = [[text.ljust(width) for text in column]
              for column, width in zip(columns[:last], widths)]
    head = "  ".join(h.ljust(w) for h, w in zip(_HEAD[:last], widths)) + "  " + _HEAD[last]
    _out("\n".join([head] + ["  ".join(cells) for cells in zip(*padded, columns[last])])
         + "\n")


def _print_json(records: Sequence["JobRecord"], jobs: Dict[str, "Job"]) -> None:
    from psij._registry.recorder import cause_of
    from psij.registry import _iso, use_json

    views = []
    for record in records:
        view = record.to_json()
        job = jobs.get(record.id)
        if job is not None and job.status.state.name != "NEW":
            st = job.status
            view.update(native_id=job.native_id, state=st.state.name, final=st.state.final,
                        exit_code=st.exit_code, cause=cause_of(st), message=st.message,
                        updated=_iso(st.time))
            if st.state.final and st.metadata:
                # What the live status tells, over what was recorded (a start the registry
                # has from an earlier status stays).
                view.update({k: v for k, v in use_json(st.metadata).items() if v is not None})
            attempt, rerun = _run_now(job, record.attempt, None)
            if attempt > record.attempt:  # it ran again since it was recorded
                runs = job.__dict__.get("_runs")
                view.update(attempt=attempt, rerun={
                    "rerun": rerun[0] if rerun else None, "cause": rerun[1] if rerun else None,
                    "requeues": getattr(runs, "requeues", 0),
                    "retries": getattr(runs, "retries", 0)})
        views.append(view)
    _out(json.dumps(views, indent=1) + "\n")


def _short(message: Optional[str]) -> str:
    text = _cell(message)
    return text if len(text) <= _MESSAGE_WIDTH else text[:_MESSAGE_WIDTH - 3] + "..."


def _cell(text: Optional[str]) -> str:
    """``text`` for one cell of the table: on one line (each run of spaces, tabs and line
    breaks one space), any other control character (a terminal's escape) shown escaped."""
    if not text:
        return ""
    words = " ".join(text.split())
    if words.isprintable():
        return words
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in words)


# -- choosing and refreshing jobs ------------------------------------------------------------

class _Chosen:
    """The jobs a command line names, as table rows, and the live jobs of those that were not
    final (re-attached to their executors)."""

    def __init__(self, args: "argparse.Namespace", what: str, refresh: bool = True) -> None:
        from psij import registry

        every = getattr(args, "all", False)
        ids = getattr(args, "ids", None) or None
        if ids is None and args.tag is None and not every and what != "list":
            raise ValueError(f"name the jobs to {what}: job ids or --tag TAG" + (
                ", or --all for every recorded job (psij list shows them all as last "
                "recorded, without asking their executors)" if what == "status" else ""))
        if ids:
            from psij.cli._names import resolve

            ids = resolve(ids)
        self.filters = (ids, args.tag, getattr(args, "executor", None),
                        getattr(args, "state", None))
        _, self.rows = registry._select(*self.filters, None, _TABLE)
        if getattr(args, "since", None) is not None or getattr(args, "until", None) is not None:
            from psij.report._sources import parse_time

            low = -1.0 if args.since is None else parse_time("--since", args.since)
            high = float("inf") if args.until is None else parse_time("--until", args.until)
            _, times = registry._select(*self.filters, None, ("id", "submitted"))
            within = {i for i, t in times if isinstance(t, (int, float)) and low <= t <= high}
            self.rows = [r for r in self.rows if r[0] in within]
        if not ids and not self.rows and args.tag is not None and what != "list":
            raise ValueError(f"no recorded job has tag {args.tag!r}")
        self.jobs: Dict[str, Job] = {}
        self.problems: List[str] = []
        self.failures: List[Tuple[JobRecord, Exception]] = []  # could not be re-attached
        if refresh:  # status: not the jobs psij holds back (their holder records them)
            self._refresh(registry, [r[0] for r in self.rows
                                     if not r[7] and (r[10] is None or r[2] is not None
                                                      or what != "status")])

    def _refresh(self, registry: Any, ids: List[str]) -> None:
        from psij.job_state import JobState

        if not ids:
            return
        try:
            jobs = registry.attach(registry.find(ids))
        except registry.AttachError as ex:
            jobs = ex.jobs
            self.failures = ex.failures
            self.problems = [f"job {r.id}: {e}" for r, e in ex.failures]
        for job in jobs:
            job.wait(_STATUS_WAIT, target_states=JobState.QUEUED)
            self.jobs[job.id] = job

    def say_problems(self, what: str) -> None:
        for problem in self.problems:
            say(problem, what)

    def print(self, as_json: bool, wide: bool = False) -> None:
        if as_json:
            from psij import registry

            ids, tag, executor, state = self.filters
            chosen = {r[0] for r in self.rows}
            _print_json([r for r in registry.find(ids, tag=tag, executor=executor, state=state)
                         if r.id in chosen], self.jobs)
        else:
            _print_table([_live(r, self.jobs.get(r[0])) for r in self.rows], wide)

    def final_rows(self) -> List[Tuple[Any, ...]]:
        return [_live(r, self.jobs.get(r[0])) for r in self.rows]


# -- commands --------------------------------------------------------------------------------

def _status(args: "argparse.Namespace") -> int:
    if args.runs:
        from psij.cli._runs import print_runs

        return print_runs(args)
    chosen = _Chosen(args, "status")
    chosen.say_problems("status")
    chosen.print(args.json, args.wide)
    return EXIT_FAILED if chosen.problems else 0


def _list(args: "argparse.Namespace") -> int:
    _Chosen(args, "list", refresh=False).print(args.json, args.wide)
    return 0


def _wait(args: "argparse.Namespace") -> int:
    from psij.job_state import JobState
    from psij.job_status import JobStatus

    chosen = _Chosen(args, "wait for")
    deadline = None if args.timeout is None else _CLOCK.now() + args.timeout
    progress = _progress_wanted(args)
    if progress is None:
        for job in chosen.jobs.values():
            job.wait(_left(deadline))
    else:
        _wait_showing(chosen, progress, args.progress_every, deadline)
    chosen.say_problems("wait")
    chosen.print(args.json, args.wide)
    late = [job.id for job in chosen.jobs.values() if not job.status.final]
    if late and deadline is not None:
        say(f"{len(late)} job(s) not final after {args.timeout:g} s: {', '.join(late[:10])}"
            + (" ..." if len(late) > 10 else ""), "wait")
        return EXIT_TIMEOUT
    worst = EXIT_FAILED if chosen.problems else 0
    for row in chosen.final_rows():
        if row[7]:
            code, _ = exit_status(JobStatus(JobState[row[4]], exit_code=row[5], message=row[6]))
            worst = max(worst, code)
    return worst


def _left(deadline: Optional[float]) -> Optional[float]:
    """Seconds to ``deadline`` (on the monotonic clock), none less than 0; None for none."""
    return None if deadline is None else max(0.0, deadline - _CLOCK.now())


def _progress_wanted(args: "argparse.Namespace") -> Optional[bool]:
    """None for no progress display; else whether it is the live one (standard error is a
    terminal) rather than plain lines."""
    if args.progress is False:
        return None
    return sys.stderr.isatty()


def _wait_showing(chosen: _Chosen, live: bool, every: float,
                  deadline: Optional[float] = None) -> None:
    """Wait for every chosen job, showing the progress: redrawn when a job changes state
    (each job's status change wakes the wait at once), and at least every ``every`` seconds
    (plain lines) or every :data:`_REDRAW` seconds (the live line's elapsed time); until
    ``deadline`` (on the monotonic clock) at most, when given."""
    import threading

    from psij._clock import MonotonicClock
    from psij.cli._wait_progress import Progress

    def states() -> List[str]:
        return [_live(r, chosen.jobs.get(r[0]))[4] for r in chosen.rows]

    def final() -> int:
        return sum(1 for r in chosen.rows if _live(r, chosen.jobs.get(r[0]))[7])

    changed = threading.Event()

    def watch(job: "Job", status: object) -> None:
        changed.set()

    pending = list(chosen.jobs.values())
    for job in pending:
        job._add_watcher(watch)
    clock = MonotonicClock()
    progress = Progress(len(chosen.rows), final(), sys.stderr, live, every)
    try:
        while True:
            changed.clear()  # before looking: a change from now on wakes the next wait
            progress.update(final(), states())
            pending = [j for j in pending if not j.status.final]
            left = _left(deadline)
            if not pending or left == 0:
                break
            due = progress.next_line_in()
            pause = _REDRAW if due is None else max(due, 0.05)
            clock.wait(changed, pause if left is None else min(pause, left))
    finally:
        for job in chosen.jobs.values():
            job._remove_watcher(watch)
        progress.close(final(), states())


def _cancel(args: "argparse.Namespace") -> int:
    from psij.exceptions import SubmitException

    chosen = _Chosen(args, "cancel")
    problems = chosen.problems
    if chosen.failures:  # held back by a process that ended: cancelled in the registry
        from psij import registry
        from psij._registry import held

        chosen.problems = problems = [f"job {r.id}: {ex}" for r, ex in chosen.failures
                                      if not held.cancel_ended(r)]
        _, chosen.rows = registry._select(*chosen.filters, None, _TABLE)
    jobs = list(chosen.jobs.values())
    for job in jobs:
        try:
            if not job.status.final:
                job.cancel()
        except SubmitException as ex:
            problems.append(f"job {job.id}: could not cancel: {ex}")
    for job in jobs:
        if job.wait(_CANCEL_WAIT) is None:
            problems.append(f"job {job.id}: not final {_CANCEL_WAIT.seconds} s after cancel")
    chosen.say_problems("cancel")
    chosen.print(False)
    return EXIT_FAILED if problems else 0


def _priority(args: "argparse.Namespace") -> int:
    import argparse

    from psij._declared_attributes import from_text
    from psij._priority import ATTRIBUTE
    from psij.exceptions import InvalidJobException, SubmitException
    from psij.executors.batch._held_jobs import HELD_MESSAGE
    from psij.executors.batch._priority_change import checked_priority
    from psij.job_state import JobState

    *ids, text = args.words
    try:
        priority = checked_priority(from_text(ATTRIBUTE, text))
    except (TypeError, ValueError):
        raise ValueError(f"PRIORITY: expected a finite number (higher goes first), got "
                         f"{text!r}") from None
    chosen = _Chosen(argparse.Namespace(ids=ids, tag=args.tag), "set the priority of")
    problems = [f"job {record.id}: it is held back by the process that submitted it "
                "(max_queued_per_shape) and was not given to the scheduler yet, so only that "
                "process can change its priority (executor.set_priority)"
                if record.message == HELD_MESSAGE and "ended" not in (record.held_by or "")
                else f"job {record.id}: {ex}" for record, ex in chosen.failures]
    for job in chosen.jobs.values():
        executor = job.executor
        if job.status.final or executor is None:
            problems.append(f"job {job.id}: it is {job.status.state}; its priority no longer "
                            "matters")
            continue
        try:
            applied = executor.set_priority(job, priority)
        except (SubmitException, InvalidJobException) as ex:
            problems.append(f"job {job.id}: {ex}")
            continue
        if applied:
            _out(f"{job.id}: priority {priority}\n")
        elif job.status.state is JobState.ACTIVE:
            problems.append(f"job {job.id}: it runs already; its priority no longer matters")
        else:
            problems.append(f"job {job.id}: its scheduler has it and its executor does not "
                            "give priorities to the scheduler (use_nice is off), so its place "
                            "there stays")
    for problem in problems:
        say(problem, "priority")
    return EXIT_FAILED if problems else 0


def _attach(args: "argparse.Namespace") -> int:
    import psij.registry
    from psij.job import Job
    from psij.job_executor import JobExecutor
    from psij.job_state import JobState

    executor = JobExecutor.get_instance(args.executor)
    job = Job()
    psij.registry.set_tag(job, args.tag)
    executor.attach(job, args.native_id)
    job.wait(_STATUS_WAIT, target_states=JobState.QUEUED)
    psij.registry.flush()
    _out(job.id + "\n")
    return 0


def _submit(args: "argparse.Namespace") -> int:
    import psij.registry
    from psij._plugins import REGISTRY
    from psij.cli._job_options import build_spec, check_launcher

    spec = build_spec(args, inherit_streams=False)
    check_launcher(args.launcher)
    if args.tag is not None:
        psij.registry._check_tag(args.tag)
    REGISTRY.select("executor", args.executor)  # an unknown name is refused first
    psij.registry.find([])  # the registry must be usable before anything is submitted
    job = _submit_here(args, spec)
    _out(job.id + "\n")
    return 0


def _submit_here(args: "argparse.Namespace", spec: Any) -> "Job":
    import psij.registry
    from psij.job import Job
    from psij.job_executor import JobExecutor

    executor = JobExecutor.get_instance(args.executor)
    job = Job(spec)
    psij.registry.set_tag(job, args.tag)
    try:
        executor.submit(job)
    finally:
        psij.registry.flush()
    return job


def _release(args: "argparse.Namespace") -> int:
    from psij.cli._release import release_main

    return release_main(args)


_HANDLERS = {"submit": _submit, "status": _status, "wait": _wait, "cancel": _cancel,
             "priority": _priority, "list": _list, "attach": _attach, "release": _release}


def jobs_main(args: "argparse.Namespace") -> int:
    """Run one registry command; its exit status."""
    from psij.exceptions import InvalidJobException, SubmitException
    from psij.registry import RegistryError

    command = args.command
    try:
        try:
            return _HANDLERS[command](args)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as other tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FAILED
    except RegistryError as ex:
        say(str(ex), command)
        return EXIT_FAILED
    except SubmitException as ex:
        say(f"{ex}", command)
        return EXIT_FAILED
    except InvalidJobException as ex:
        say(str(ex), f"{command}: error")
        return EXIT_FAILED if command == "attach" else EXIT_USAGE
    except (ValueError, TypeError, UsageError) as ex:
        say(str(ex), f"{command}: error")
        return EXIT_USAGE
