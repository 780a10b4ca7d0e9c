"""``psij pilot run REQUESTS.json``: a pilot that runs a QCG-PilotJob request file.

The file is read and checked whole first (:mod:`psij.executors.pilot.qcg_requests`); a bad file
stops the command before anything runs. Then one :class:`PilotEngine` runs on the allocation
and the requests are handled one after the other, in file order, without waiting for tasks in
between: a status request reports the moment it is read. After the last request the command
waits until every task has ended, whether or not the file asked for it with
``finishAfterAllTasksDone`` (a file-mode pilot has nothing to gain by stopping its tasks);
``finish`` stops at once, cancelling what has not ended and ignoring the requests after it.

The command works in its working directory (``--wd``, default the current directory): the
process changes to it once the file is checked, so that tasks, which run there unless a job
names another ``wd``, start without a change of directory. Files written there:

- ``service.log``: what the pilot did, with every response as one line of JSON, as
  ``<time> response to requests[N] (<request>): {...}``, and every task's end;
- ``jobs.report``: one entry per task in the order they ended (see
  :func:`~psij.executors.pilot.qcg_requests.format_report_entry`);
- ``psij-pilot.journal``: the engine's journal, which ``--resume`` reads so that tasks that
  succeeded before a crash are not run again.

This module owns the files and the order of requests; it does not start processes itself (the
engine does) and does not parse requests (``qcg_requests`` does).
"""

import json
import os
import signal
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from psij._private_dirs import ensure_private_dir
from psij.executors.pilot._record import replace
from psij.executors.pilot.allocation import Allocation, allocation_from_options
from psij.executors.pilot.engine import (
    EngineConfig,
    PilotEngine,
    TaskEvent,
    TaskShare,
    TaskSpec,
    TaskStatus,
)
from psij.executors.pilot.qcg_requests import (
    CURRENT,
    CancelJob,
    Control,
    Finish,
    JobInfo,
    JobStatus,
    ListJobs,
    PlannedSubmit,
    RemoveJob,
    Request,
    RequestFile,
    ResourcesInfo,
    StartContext,
    TaskReport,
    TaskTemplate,
    error_response,
    expand_variables,
    format_report_entry,
    job_info_data,
    job_status_data,
    load_request_file,
    ok_response,
    plan_requests,
    qcg_state,
    request_kind,
    resources_data,
    start_variables,
)
from psij.executors.pilot.scheduler import TaskState

__all__ = ["EXIT_BAD_FILE", "EXIT_FAILED", "QcgFileRun", "run_request_file"]

SERVICE_LOG = "service.log"
JOBS_REPORT = "jobs.report"
JOURNAL = "psij-pilot.journal"

EXIT_FAILED = 1
EXIT_BAD_FILE = 2
_EXIT_SIGNALLED = 128


class _Stop(Exception):
    """Raised in the main thread when SIGINT/SIGTERM/SIGHUP arrives."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class ServiceLog:
    """``service.log``: time-stamped lines, written from the main and the engine thread."""

    def __init__(self, path: Path, append: bool) -> None:
        self._file: IO[str] = open(path, "a" if append else "w", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, text: str, flush: bool = False) -> None:
        line = f"{datetime.now()} {text}\n"
        with self._lock:
            self._file.write(line)
            if flush:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def run_request_file(path: str, cores: Optional[int] = None, nodes: Optional[str] = None,
                     wd: Optional[str] = None, resume: bool = False,
                     err: Optional[IO[str]] = None) -> int:
    """The whole ``psij pilot run`` command; returns its exit status (0 once every request
    was handled, 2 for a bad file or option, 1 when the pilot could not run, 128+N after
    signal N)."""
    out = sys.stderr if err is None else err
    work_directory = Path(wd if wd is not None else os.getcwd()).resolve()
    journal = work_directory / JOURNAL
    try:
        # Everything is checked before the first file is written.
        requests = load_request_file(path)
        planned = plan_requests(requests, datetime.now(), lambda: os.urandom(16).hex())
        allocation = allocation_from_options(cores, nodes)
        if resume and not journal.is_file():
            raise ValueError(f"--resume: no journal {journal} to resume from (it is written "
                             f"by a run with the same --wd)")
    except (TypeError, ValueError) as exc:  # RequestFileError included
        out.write(f"psij pilot run: {exc}\n")
        return EXIT_BAD_FILE
    except OSError as exc:
        out.write(f"psij pilot run: {exc}\n")
        return EXIT_BAD_FILE
    try:
        ensure_private_dir(work_directory, "pilot work directory (--wd)")
        _work_in(work_directory)
        run = QcgFileRun(requests, planned, allocation, work_directory, resume)
    except OSError as exc:
        # Without strerror the message is psij's own and names the folder already.
        detail = f"--wd {work_directory}: {exc.strerror}" if exc.strerror else str(exc)
        out.write(f"psij pilot run: {detail}\n")
        return EXIT_BAD_FILE
    try:
        return run.run()
    except (OSError, RuntimeError, ValueError) as exc:
        # The engine could not start (agents, journal, files); what ran is reported.
        out.write(f"psij pilot run: the pilot failed: {exc}\n")
        return EXIT_FAILED


def _work_in(work_directory: Path) -> None:
    """Make this process work in ``work_directory``, the tasks' default directory, and keep
    the descriptors it inherited (above 2) from its tasks.

    Tasks are then started the cheapest way, with no change of directory and nothing to close
    (see ``_task_process``); they get the same directory and descriptors either way.
    """
    os.chdir(work_directory)
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # listdir's own descriptor, closed since


class QcgFileRun:
    """One run of a checked and planned request file on one engine."""

    def __init__(self, requests: RequestFile, planned: Sequence[Union[PlannedSubmit, Request]],
                 allocation: Allocation, work_directory: Path, resume: bool) -> None:
        self._dialect = requests.dialect
        self._planned = planned
        self._allocation = allocation
        self._work_directory = work_directory
        self._root_wd = str(work_directory)
        self._resume = resume
        # Job names as the requests use them: a plain task, or an iteration group standing
        # for its sub-tasks; in submission order.
        self._jobs: Dict[str, Tuple[str, ...]] = {}
        # Tasks in the order they ended, and reports of ended tasks removed by removeJob.
        self._ended: List[str] = []
        self._removed: Dict[str, TaskReport] = {}
        # A resumed run continues the log of the run it resumes.
        self._log = ServiceLog(work_directory / SERVICE_LOG, append=resume)
        # Tasks not known to have ended, and an event set when there are none left after the
        # last request. Counting here keeps the final wait O(1) per task end.
        self._open: Set[str] = set()
        self._open_lock = threading.Lock()
        self._all_read = False
        self._all_ended = threading.Event()
        self._finishing = False

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> int:
        journal = self._work_directory / JOURNAL
        if not self._resume and journal.exists():
            journal.unlink()  # a new run starts a new journal
        engine = PilotEngine(self._allocation, EngineConfig(
            work_directory=self._work_directory, journal=journal, resume=self._resume,
            prepare=self._prepare))
        engine.add_listener(self._on_event)
        self._log.write(f"pilot started on {self._allocation.describe()}; working directory "
                        f"{self._root_wd}" + ("; resuming from the journal"
                                              if self._resume else ""), flush=True)
        status = 0
        with _stop_signals():
            try:
                engine.start()
                self._track_restored(engine)
                self._handle_requests(engine)
                with self._open_lock:
                    self._all_read = True
                    if not self._open:
                        self._all_ended.set()
                while not self._finishing and not self._all_ended.wait(1.0):
                    pass
            except _Stop as stop:
                self._log.write(f"stopped by signal {stop.signum}; cancelling every task that "
                                f"has not ended", flush=True)
                status = _EXIT_SIGNALLED + stop.signum
            finally:
                engine.close()
                statuses = engine.statuses()
                self._write_report(statuses)
                counts = self._counts(statuses)
                self._log.write("pilot finished: " + ", ".join(
                    f"{n} {state}" for state, n in counts.items() if n), flush=True)
                self._log.close()
        return status

    def _handle_requests(self, engine: PilotEngine) -> None:
        for position, request in enumerate(self._planned):
            if isinstance(request, PlannedSubmit):
                where, kind = f"requests[{request.position}]", "submit"
                response = self._submit(engine, request)
            else:
                where, kind = f"requests[{request.position}]", request_kind(request)
                response = self._answer(engine, request)
            self._log.write(f"response to {where} ({kind}): {_json(response)}", flush=True)
            if isinstance(request, Finish):
                self._finishing = True
                left = len(self._planned) - position - 1
                if left:
                    self._log.write(f"finish: the {left} request(s) after {where} are ignored",
                                    flush=True)
                return

    # -- requests -----------------------------------------------------------------------------

    def _submit(self, engine: PilotEngine, request: PlannedSubmit) -> Dict[str, Any]:
        specs = [self._task_spec(t) for t in request.tasks]
        if self._resume:
            # Tasks the journal restored are known already; the others are submitted again.
            known = set(engine.task_ids())
            specs = [spec for spec in specs if spec.name not in known]
        names = [spec.name for spec in specs]
        with self._open_lock:
            # Before submitting: the engine thread may report a task's end at once.
            self._open.update(names)
        try:
            engine.submit_many(specs)
        except (TypeError, ValueError) as exc:
            with self._open_lock:
                self._open.difference_update(names)
            return error_response(f"nothing of this request was submitted: {exc}")
        for template in request.tasks:
            self._jobs.setdefault(template.job, ())
            self._jobs[template.job] += (template.name,)
        jobs = list(request.job_names)
        return ok_response({"submitted": len(jobs), "jobs": jobs},
                           f"{len(jobs)} jobs submitted")

    def _answer(self, engine: PilotEngine, request: Request) -> Dict[str, Any]:
        if isinstance(request, Control):
            return ok_response(message=f"{request.command} command accepted")
        if isinstance(request, (JobStatus, JobInfo)):
            return self._status(engine, request)
        if isinstance(request, CancelJob):
            return self._cancel(engine, request.names)
        if isinstance(request, RemoveJob):
            return self._remove(engine, request.names)
        if isinstance(request, ListJobs):
            return self._list(engine)
        if isinstance(request, ResourcesInfo):
            usage = engine.usage()
            return ok_response(resources_data(self._dialect, usage.total_nodes,
                                              usage.total_cores, usage.used_cores))
        assert isinstance(request, Finish)
        return ok_response(message="finishing: tasks that have not ended are cancelled")

    def _status(self, engine: PilotEngine, request: Union[JobStatus, JobInfo]) -> Dict[str, Any]:
        detailed = isinstance(request, JobInfo)
        if isinstance(request, JobStatus) and not request.listed:
            name = request.names[0]
            report = self._job_report(engine, name)
            if report is None:
                return error_response(f"Job '{name}' doesn't exist")
            return ok_response(job_status_data(report))
        jobs: Dict[str, Any] = {}
        for name in request.names:
            report = self._job_report(engine, name)
            if report is None:
                jobs[name] = {"status": 1, "message": f"Job '{name}' doesn't exist"}
            elif detailed:
                jobs[name] = {"status": 0, "data": job_info_data(report)}
            else:
                jobs[name] = {"status": 0, "data": {"jobName": name, "status": report.state}}
        return ok_response({"jobs": jobs})

    def _cancel(self, engine: PilotEngine, names: Sequence[str]) -> Dict[str, Any]:
        canceled = 0
        errors: Dict[str, str] = {}
        for name in names:
            tasks = self._tasks_of(name)
            if tasks is None:
                errors[name] = f"Job '{name}' doesn't exist"
                continue
            for task in tasks:
                if not engine.status(task).state.final:
                    engine.cancel(task)
                    canceled += 1
        data: Dict[str, Any] = {"canceled": canceled}
        if errors:
            data["errors"] = errors
        return ok_response(data)

    def _remove(self, engine: PilotEngine, names: Sequence[str]) -> Dict[str, Any]:
        removed = 0
        errors: Dict[str, str] = {}
        for name in names:
            tasks = self._tasks_of(name)
            if tasks is None:
                errors[name] = f"Job '{name}' doesn't exist"
                continue
            running = [t for t in tasks if not engine.status(t).state.final]
            if running:
                errors[name] = (f"Job '{name}' has not ended ({len(running)} task(s) still "
                                f"queued or executing); only ended jobs can be removed")
                continue
            for task in tasks:
                self._removed[task] = self._task_report(engine.status(task))
                engine.forget(task)
            del self._jobs[name]
            removed += 1
        data: Dict[str, Any] = {"removed": removed}
        if errors:
            data["errors"] = errors
        return ok_response(data)

    def _list(self, engine: PilotEngine) -> Dict[str, Any]:
        names = list(self._jobs)
        if self._dialect != CURRENT:
            return ok_response({"length": len(names), "names": names})
        jobs: Dict[str, Any] = {}
        for name in names:
            report = self._job_report(engine, name)
            assert report is not None
            jobs[name] = {"status": report.state}
        return ok_response({"length": len(names), "jobs": jobs})

    # -- tasks --------------------------------------------------------------------------------

    def _tasks_of(self, name: str) -> Optional[Tuple[str, ...]]:
        """The tasks a request means by ``name``: a job, an iteration group or a sub-task."""
        tasks = self._jobs.get(name)
        if tasks is not None:
            return tasks
        job = name.rpartition(":")[0]
        if job and name in self._jobs.get(job, ()):
            return (name,)
        return None

    def _job_report(self, engine: PilotEngine, name: str) -> Optional[TaskReport]:
        tasks = self._tasks_of(name)
        if tasks is None:
            return None
        if tasks == (name,):
            return self._task_report(engine.status(name))
        states = [engine.status(t).state for t in tasks]
        return TaskReport(name=name, state=_group_state(states))

    def _task_report(self, status: TaskStatus) -> TaskReport:
        history: List[Tuple[datetime, str]] = []
        for when, state in status.history:
            name = qcg_state(state)
            if not history or history[-1][1] != name:
                history.append((datetime.fromtimestamp(when), name))
        runtime = None
        if status.started is not None and status.ended is not None:
            runtime = timedelta(seconds=max(0.0, status.ended - status.started))
        return TaskReport(
            name=status.task_id, state=qcg_state(status.state), history=tuple(history),
            allocation=status.share.allocation_text if status.share is not None else None,
            wd=status.directory if status.share is not None else None, runtime=runtime,
            exit_code=status.exit_code, message=status.message)

    def _task_spec(self, template: TaskTemplate) -> TaskSpec:
        execution = template.execution
        command = execution.command()
        environment = dict(execution.env)
        if execution.model == "threads":
            environment.setdefault("OMP_NUM_THREADS", "${ncores}")
        return TaskSpec(
            name=template.name, executable=command[0], arguments=tuple(command[1:]),
            directory=execution.wd, environment=environment, stdin=execution.stdin,
            stdout=execution.stdout, stderr=execution.stderr, resources=template.resources,
            after=template.after, group=template.group, create_directories=True,
            time_limit=None if template.walltime is None
            else template.walltime.total_seconds())

    def _prepare(self, spec: TaskSpec, share: TaskShare) -> TaskSpec:
        """Expand root_wd, ncores, nnodes and nlist once the task's share is known."""
        texts = [spec.executable, *spec.arguments, *spec.environment.values(),
                 spec.directory or "", spec.stdin or "", spec.stdout or "", spec.stderr or ""]
        if not any("${" in text for text in texts):
            return spec
        values = start_variables(StartContext(root_wd=self._root_wd, ncores=share.core_count,
                                              nnodes=len(share.nodes), nodes=share.nodes))

        def one(text: Optional[str]) -> Optional[str]:
            return None if text is None else expand_variables(text, values)

        return replace(
            spec, executable=expand_variables(spec.executable, values),
            arguments=tuple(expand_variables(a, values) for a in spec.arguments),
            environment={k: expand_variables(v, values) for k, v in spec.environment.items()},
            directory=one(spec.directory), stdin=one(spec.stdin), stdout=one(spec.stdout),
            stderr=one(spec.stderr))

    def _track_restored(self, engine: PilotEngine) -> None:
        """Count the tasks the journal restored that have still to run."""
        with self._open_lock:
            # Under the lock: an end reported after the status was read waits for the add.
            for status in engine.statuses():
                if not status.state.final:
                    self._open.add(status.task_id)

    def _on_event(self, event: TaskEvent) -> None:
        if not event.state.final:
            return
        self._ended.append(event.task_id)
        with self._open_lock:
            self._open.discard(event.task_id)
            if self._all_read and not self._open:
                self._all_ended.set()
        detail = f" (exit code {event.exit_code})" if event.exit_code is not None else ""
        if event.message and event.state is not TaskState.SUCCEEDED:
            detail += f": {event.message}"
        self._log.write(f"task {event.task_id} {qcg_state(event.state)}{detail}")

    # -- the report ---------------------------------------------------------------------------

    def _write_report(self, every: Sequence[TaskStatus]) -> None:
        statuses = {status.task_id: status for status in every}
        order = list(dict.fromkeys(self._ended))
        # Tasks the journal restored as ended never sent an event in this run: first.
        seen = set(order)
        restored = [task for task, status in statuses.items()
                    if status.state.final and task not in seen]
        entries: List[str] = []
        for task in restored + order:
            if task in self._removed:
                entries.append(format_report_entry(self._removed[task]))
            elif task in statuses:
                entries.append(format_report_entry(self._task_report(statuses[task])))
        path = self._work_directory / JOBS_REPORT
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(entries), encoding="utf-8")
        os.replace(tmp, path)

    @staticmethod
    def _counts(statuses: Sequence[TaskStatus]) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for status in statuses:
            name = qcg_state(status.state)
            counts[name] = counts.get(name, 0) + 1
        return counts


def _group_state(states: Sequence[TaskState]) -> str:
    """One QCG state for an iteration group: executing while a member runs, queued while one
    waits, then succeeded only if all did, else the first of failed, canceled, omitted."""
    if any(s is TaskState.RUNNING for s in states):
        return qcg_state(TaskState.RUNNING)
    if not all(s.final for s in states):
        return qcg_state(TaskState.QUEUED)
    for state in (TaskState.FAILED, TaskState.CANCELED, TaskState.OMITTED):
        if state in states:
            return qcg_state(state)
    return qcg_state(TaskState.SUCCEEDED)


def _json(response: Mapping[str, Any]) -> str:
    return json.dumps(response)


class _stop_signals:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`_Stop` in the main thread while active."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._previous: Dict[int, Any] = {}
        self._stopping = False

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        # Once: a second signal must not interrupt the cancelling and reporting it started.
        if not self._stopping:
            self._stopping = True
            raise _Stop(signum)

    def __enter__(self) -> "_stop_signals":
        if threading.current_thread() is threading.main_thread():
            for signum in self._SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

