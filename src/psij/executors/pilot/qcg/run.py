"""``psij pilot run REQUESTS.json``: a pilot that runs a QCG-PilotJob request file.

Requests are handled one after the other, in file order, as QCG-PilotJob handles them: each
is checked and planned when its turn comes (:mod:`~psij.executors.pilot.qcg._requests`,
:mod:`~psij.executors.pilot.qcg._plan`), and one that cannot run gets an error response (code
and message in ``service.log``) while the others still run. Only a file that is not a JSON list
stops the command before anything runs; ``--check`` checks every request instead and runs
nothing. One :class:`PilotEngine` runs the tasks; a status request reports the moment it is
read. After the last request the command waits until every task has ended, whether or not the
file asked for it with ``finishAfterAllTasksDone`` (a file-mode pilot has nothing to gain by
stopping its tasks); ``finish`` stops at once, cancelling what has not ended and ignoring the
requests after it.

The iterations of a job are handed to the engine in chunks as they are made, and the request
thread waits while many handed over have not ended: a million iterations start at once and hold
memory only for those waiting, and the engine thread never waits for the request thread.

The command works in its working directory (``--wd``, default the current directory): the
process changes to it once the file is read, so that tasks, which run there unless a job
names another ``wd``, start without a change of directory. Files written there (0600):

- ``service.log``: what the pilot did, with every response as one line of JSON, as
  ``<time> response to requests[N] (<request>): {...}``, and every task's end;
- ``jobs.report``: one entry per task as it ends, and one per iterative job once all its
  iterations have ended (see :mod:`~psij.executors.pilot.qcg._books`), with QCG's runtime
  entries and the task's core ids, CPU seconds and peak memory
  (:meth:`~psij.executors.pilot.qcg._report.TaskReport.runtime_fields`);
- ``psij-pilot.journal``: the engine's journal, which ``--resume`` reads so that tasks that
  succeeded before a crash are not run again.

This module owns the files and the order of requests; it does not start processes itself (the
engine does) and does not parse requests.
"""

import json
import os
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from psij._clock import wall_time
from psij._private_dirs import ensure_private_dir
from psij._record import replace
from psij._stop_signals import StopSignals
from psij.executors.pilot.allocation import Allocation, allocation_from_options
from psij.executors.pilot.engine import (
    EngineConfig,
    PilotEngine,
    TaskEvent,
    TaskShare,
    TaskSpec,
    TaskStatus,
)
from psij.executors.pilot.qcg._books import GroupBook, LockedTextFile, ReportFile
from psij.executors.pilot.qcg._plan import (
    PlannedJob,
    PlannedSubmit,
    RequestPlanner,
    StartContext,
    TaskTemplate,
    start_variables,
)
from psij.executors.pilot.qcg._report import (
    TaskReport,
    error_response,
    job_info_data,
    job_status_data,
    ok_response,
    qcg_state,
    resources_data,
)
from psij.executors.pilot.qcg._requests import load_request_file
from psij.executors.pilot.qcg._schema import (
    CURRENT,
    BadRequest,
    CancelJob,
    Control,
    FinishRequest,
    JobInfo,
    JobStatusRequest,
    ListJobs,
    RemoveJob,
    Request,
    RequestFile,
    ResourcesInfo,
    expand_variables,
    request_kind,
)
from psij.executors.pilot.resources import ResourcePool
from psij.executors.pilot.scheduler import TaskState

__all__ = ["EXIT_BAD_FILE", "EXIT_FAILED", "QcgFileRun", "check_request_file",
           "run_request_file"]

SERVICE_LOG = "service.log"
JOBS_REPORT = "jobs.report"
JOURNAL = "psij-pilot.journal"

EXIT_FAILED = 1
EXIT_BAD_FILE = 2
_EXIT_SIGNALLED = 128

# Iterations are handed to the engine this many at a time; the request thread waits while
# more than _HIGH tasks have not ended, until fewer than _LOW have not.
_CHUNK = 500
_HIGH = 20000
_LOW = 10000


class _Stop(Exception):
    """Raised in the main thread when SIGINT/SIGTERM/SIGHUP arrives."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class ServiceLog(LockedTextFile):
    """``service.log``: time-stamped lines, written from the main and the engine thread."""

    def write(self, text: str, flush: bool = False) -> None:
        line = f"{datetime.now()} {text}\n"
        with self._lock:
            self._append(line, flush)


def check_request_file(path: str, cores: Optional[int] = None, nodes: Optional[str] = None,
                       err: Optional[IO[str]] = None, gpus: Optional[str] = None) -> int:
    """``psij pilot run --check``: every request checked and planned, nothing run; each error
    listed with its request; 0 when there is none, else 2."""
    out = sys.stderr if err is None else err
    try:
        requests = load_request_file(path)
        allocation = allocation_from_options(cores, nodes, gpus=gpus)
    except (OSError, TypeError, ValueError) as exc:  # RequestFileError included
        out.write(f"psij pilot run: {exc}\n")
        return EXIT_BAD_FILE
    planner = RequestPlanner(datetime.now(), lambda: os.urandom(16).hex(),
                             ResourcePool(list(allocation.nodes)))
    errors = 0
    for request in requests.requests:
        planned = planner.plan(request)
        if isinstance(planned, BadRequest):
            errors += 1
            out.write(f"psij pilot run: {planned.message}\n")
    if errors:
        out.write(f"psij pilot run: {path}: {errors} of {len(requests.requests)} request(s) "
                  f"cannot run; nothing was run\n")
        return EXIT_BAD_FILE
    sys.stdout.write(f"{path}: {len(requests.requests)} request(s), no errors\n")
    return 0


def run_request_file(path: str, cores: Optional[int] = None, nodes: Optional[str] = None,
                     wd: Optional[str] = None, resume: bool = False,
                     err: Optional[IO[str]] = None, emulate_slurm: bool = False,
                     gpus: Optional[str] = None) -> int:
    """The whole ``psij pilot run`` command; returns its exit status (0 once every request
    was handled, 2 for a file that is not a list of requests or a bad option, 1 when the
    pilot could not run, 128+N after signal N)."""
    out = sys.stderr if err is None else err
    work_directory = Path(wd if wd is not None else os.getcwd()).resolve()
    journal = work_directory / JOURNAL
    try:
        requests = load_request_file(path)
        allocation = allocation_from_options(cores, nodes, gpus=gpus)
        if resume and not journal.is_file():
            raise ValueError(f"--resume: no journal {journal} to resume from (it is written "
                             f"by a run with the same --wd)")
    except (OSError, TypeError, ValueError) as exc:  # RequestFileError included
        out.write(f"psij pilot run: {exc}\n")
        return EXIT_BAD_FILE
    try:
        ensure_private_dir(work_directory, "pilot work directory (--wd)")
        _work_in(work_directory)
        run = QcgFileRun(requests, allocation, work_directory, resume, emulate_slurm)
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
    """One run of a request file on one engine (see the module documentation)."""

    def __init__(self, requests: RequestFile, allocation: Allocation, work_directory: Path,
                 resume: bool, emulate_slurm: bool = False) -> None:
        self._requests = requests
        self._dialect = requests.dialect
        self._allocation = allocation
        self._work_directory = work_directory
        self._root_wd = str(work_directory)
        self._resume = resume
        self._emulate_slurm = emulate_slurm
        self._planner = RequestPlanner(datetime.now(), lambda: os.urandom(16).hex(),
                                       ResourcePool(list(allocation.nodes)))
        # Job names as the requests use them: a plain task (None) or an iterative job.
        self._jobs: Dict[str, Optional[GroupBook]] = {}
        # Tasks that never reached the engine (a dependency that is no job): OMITTED.
        self._omitted: Dict[str, TaskReport] = {}
        # Reports of ended tasks removed by removeJob.
        self._removed: Dict[str, TaskReport] = {}
        # A resumed run continues the log and report of the run it resumes.
        self._log = ServiceLog(work_directory / SERVICE_LOG, append=resume)
        self._report = ReportFile(work_directory / JOBS_REPORT, append=resume)
        # Tasks not known to have ended; the request thread waits on ``_lock`` while there
        # are many, and the final wait ends when there are none after the last request.
        self._open: Set[str] = set()
        self._lock = threading.Condition()
        self._early_ends: Dict[str, bool] = {}  # ends seen before their job was booked
        self._all_read = False
        self._all_ended = threading.Event()
        self._finishing = False
        self._signals = _stop_signals()  # not entered: only the one in run() acts
        self._ended: Dict[str, int] = {}  # tasks per final QCG state, for the last log line

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> int:
        journal = self._work_directory / JOURNAL
        try:
            if not self._resume and journal.exists():
                journal.unlink()  # a new run starts a new journal
            engine = PilotEngine(self._allocation, EngineConfig(
                work_directory=self._work_directory, journal=journal, resume=self._resume,
                prepare=self._prepare, slurm_variables=True if self._emulate_slurm else None))
        except BaseException:
            self._report.close()
            self._log.close()
            raise
        engine.add_listener(lambda event: self._on_event(engine, event))
        engine.add_flush_hook(self._flush_files)
        self._log.write(f"pilot started on {self._allocation.describe()}; working directory "
                        f"{self._root_wd}" + ("; resuming from the journal"
                                              if self._resume else ""), flush=True)
        status = 0
        with _stop_signals() as self._signals:
            try:
                engine.start()
                self._track_restored(engine)
                self._handle_requests(engine)
                with self._lock:
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
                self._report_left(engine)
                self._log.write("pilot finished: " + ", ".join(
                    f"{n} {state}" for state, n in self._ended.items() if n), flush=True)
                self._report.close()
                self._log.close()
        return status

    def _handle_requests(self, engine: PilotEngine) -> None:
        requests = self._requests.requests
        for position, request in enumerate(requests):
            planned = self._planner.plan(request)
            where, kind = f"requests[{request.position}]", request_kind(request)
            if isinstance(planned, BadRequest):
                response = error_response(planned.message)
            elif isinstance(planned, PlannedSubmit):
                response = self._submit(engine, planned)
            else:
                response = self._answer(engine, planned)
            self._log.write(f"response to {where} ({kind}): {json.dumps(response)}",
                            flush=True)
            if isinstance(request, FinishRequest):
                self._finishing = True
                left = len(requests) - position - 1
                if left:
                    self._log.write(f"finish: the {left} request(s) after {where} are ignored",
                                    flush=True)
                return

    # -- submitting ---------------------------------------------------------------------------

    def _submit(self, engine: PilotEngine, request: PlannedSubmit) -> Dict[str, Any]:
        known: Set[str] = set(engine.task_ids()) if self._resume else set()
        # The tasks of plain jobs go to the engine together, a chunk at a time, not one
        # submission each; an iterative job hands over its own chunks, after what came before.
        plain: List[TaskSpec] = []
        for job in request.jobs:
            if job.group is not None and plain:
                self._hand_over(engine, None, plain)
                plain = []
            self._feed(engine, job, known, plain)
            if len(plain) >= _CHUNK:
                self._hand_over(engine, None, plain)
                plain = []
        if plain:
            self._hand_over(engine, None, plain)
        jobs = list(request.job_names)
        return ok_response({"submitted": len(jobs), "jobs": jobs},
                           f"{len(jobs)} jobs submitted")

    def _feed(self, engine: PilotEngine, job: PlannedJob, known: Set[str],
              plain: List[TaskSpec]) -> None:
        """Hand the job's tasks to the engine a chunk at a time (see the module notes); the
        task of a plain job is added to ``plain`` instead."""
        group: Optional[GroupBook] = None
        if job.group is not None:
            group = GroupBook(job.group, job.start, job.count, wall_time())
        with self._lock:
            if group is not None:
                self._jobs[job.group or ""] = group
        chunk: List[TaskSpec] = []
        for template in job.tasks():
            if group is None:
                with self._lock:
                    self._jobs[template.name] = None
            name = template.name
            if name in known:
                self._count_restored(engine, group, name)
                continue
            why = self._why_omitted(template)
            if why is not None:
                self._omit(group, template, why)
                continue
            if group is None:
                plain.append(self._task_spec(template))
                continue
            chunk.append(self._task_spec(template))
            if len(chunk) >= _CHUNK:
                self._hand_over(engine, group, chunk)
                chunk = []
        if chunk:
            self._hand_over(engine, group, chunk)

    def _hand_over(self, engine: PilotEngine, group: Optional[GroupBook],
                   specs: List[TaskSpec]) -> None:
        with self._lock:
            while len(self._open) > _HIGH and not self._finishing:
                self._lock.wait(0.5)
            # Before submitting: the engine thread may report a task's end at once.
            self._open.update(spec.name for spec in specs)
            if group is not None:
                group.fed += len(specs)
        try:
            with self._signals.held():
                engine.submit_many(specs)
            return
        except (TypeError, ValueError):
            pass  # one of them cannot be submitted: each on its own, to tell which
        with self._lock:
            self._open.difference_update(spec.name for spec in specs)
            if group is not None:
                group.fed -= len(specs)
        for spec in specs:
            # A task after one omitted just now, in this same chunk, is omitted as it would
            # have been had they come one by one.
            why = next((f"omitted: dependency {d!r} ended OMITTED" for d in spec.after
                        if d in self._omitted), None)
            if why is not None:
                self._omit(group, spec, why)
                continue
            with self._lock:
                self._open.add(spec.name)
            try:
                with self._signals.held():
                    engine.submit(spec)
                if group is not None:
                    with self._lock:
                        group.fed += 1
            except (TypeError, ValueError) as exc:
                with self._lock:
                    self._open.discard(spec.name)
                self._omit(group, spec, f"omitted: {exc}")

    def _why_omitted(self, template: TaskTemplate) -> Optional[str]:
        if template.missing is not None:
            return f"omitted: dependency {template.missing!r} is not a submitted job"
        for dependency in template.after:
            if dependency in self._omitted:
                return f"omitted: dependency {dependency!r} ended OMITTED"
            with self._lock:
                group = self._jobs.get(dependency)
            if group is not None and group.not_succeeded:
                return (f"omitted: dependency {dependency!r} has iterations that did not "
                        f"succeed")
        return None

    def _omit(self, group: Optional[GroupBook], task: Union[TaskTemplate, TaskSpec],
              why: str) -> None:
        now = datetime.now()
        report = TaskReport(name=task.name, state="OMITTED",
                            history=((now, "QUEUED"), (now, "OMITTED")), message=why)
        self._omitted[task.name] = report
        self._report.write(report, flush=True)
        self._log.write(f"task {task.name} OMITTED: {why}", flush=True)
        with self._lock:
            self._count_end("OMITTED")
        if group is not None:
            with self._lock:
                group.fed += 1
                if group.record_end(False, wall_time()):
                    self._report.write(group.report())

    def _count_restored(self, engine: PilotEngine, group: Optional[GroupBook],
                        name: str) -> None:
        """A task the journal restored (``--resume``): it counts for its job as it is."""
        if group is None:
            return
        with self._lock:
            group.fed += 1
            if name in self._early_ends:
                if group.record_end(self._early_ends.pop(name), wall_time()):
                    self._report.write(group.report())

    # -- requests -----------------------------------------------------------------------------

    def _answer(self, engine: PilotEngine, request: Request) -> Dict[str, Any]:
        if isinstance(request, Control):
            return ok_response(message=f"{request.command} command accepted")
        if isinstance(request, (JobStatusRequest, JobInfo)):
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
        assert isinstance(request, FinishRequest)
        return ok_response(message="finishing: tasks that have not ended are cancelled")

    def _status(self, engine: PilotEngine, request: Union[JobStatusRequest, JobInfo]
                ) -> Dict[str, Any]:
        detailed = isinstance(request, JobInfo)
        if isinstance(request, JobStatusRequest) and not request.listed:
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
                if task not in self._omitted and not engine.status(task).state.final:
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
            tasks = [t for t in tasks if t not in self._omitted]
            running = sum(1 for t in tasks if not engine.status(t).state.final)
            if running:
                errors[name] = (f"Job '{name}' has not ended ({running} task(s) still "
                                f"queued or executing); only ended jobs can be removed")
                continue
            for task in tasks:
                self._removed[task] = self._task_report(engine.status(task))
                engine.forget(task)
            with self._lock:
                del self._jobs[name]
            removed += 1
        data: Dict[str, Any] = {"removed": removed}
        if errors:
            data["errors"] = errors
        return ok_response(data)

    def _list(self, engine: PilotEngine) -> Dict[str, Any]:
        with self._lock:
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

    def _tasks_of(self, name: str) -> Optional[List[str]]:
        """The tasks a request means by ``name``: a job, an iterative job or one iteration."""
        with self._lock:
            if name in self._jobs:
                group = self._jobs[name]
                return [name] if group is None else list(group.members())
            group = self._jobs.get(name.rpartition(":")[0])
            if group is not None and group.has_member(name):
                return [name]
        return None

    def _job_report(self, engine: PilotEngine, name: str) -> Optional[TaskReport]:
        with self._lock:
            group = self._jobs.get(name)
            if group is not None:
                return group.report()
        if self._tasks_of(name) is None:
            return None
        if name in self._omitted:
            return self._omitted[name]
        return self._task_report(engine.status(name))

    def _task_report(self, status: TaskStatus) -> TaskReport:
        history: List[Tuple[datetime, str]] = []
        for when, state in status.history:
            name = qcg_state(state)
            if not history or history[-1][1] != name:
                history.append((datetime.fromtimestamp(when), name))
        runtime = None
        if status.started is not None and status.ended is not None:
            runtime = timedelta(seconds=max(0.0, status.ended - status.started))
        share, use = status.share, status.use
        return TaskReport(
            name=status.task_id, state=qcg_state(status.state), history=tuple(history),
            allocation=share.allocation_text if share is not None else None,
            wd=status.directory if share is not None else None, runtime=runtime,
            exit_code=status.exit_code, message=status.message,
            core_ids=share.cores_text if share is not None else None,
            cpu_seconds=None if use is None else use.cpu_seconds,
            max_rss_bytes=None if use is None else use.max_rss_bytes)

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
        with self._lock:
            # Under the lock: an end reported after the status was read waits for the add.
            for status in engine.statuses():
                if not status.state.final:
                    self._open.add(status.task_id)

    def _on_event(self, engine: PilotEngine, event: TaskEvent) -> None:
        """On the engine thread: books, the report and the log of one state change."""
        task = event.task_id
        if not event.state.final:
            if event.state is TaskState.RUNNING and ":" in task:
                group_name = task.rpartition(":")[0]
                with self._lock:
                    group = self._jobs.get(group_name)
                    if group is not None:
                        group.record_start(event.time)
            return
        group_name = task.rpartition(":")[0]
        self._report.write(self._task_report(engine.status(task)))
        succeeded = event.state is TaskState.SUCCEEDED
        with self._lock:
            self._count_end(qcg_state(event.state))
            self._open.discard(task)
            if len(self._open) < _LOW:
                self._lock.notify_all()
            if self._all_read and not self._open:
                self._all_ended.set()
            group = self._jobs.get(group_name) if group_name else None
            if group is not None and group.has_member(task):
                if group.record_end(succeeded, event.time):
                    self._report.write(group.report())
            elif group_name:
                self._early_ends[task] = succeeded
        detail = f" (exit code {event.exit_code})" if event.exit_code is not None else ""
        if event.message and not succeeded:
            detail += f": {event.message}"
        self._log.write(f"task {task} {qcg_state(event.state)}{detail}")

    def _flush_files(self) -> None:
        """On the engine thread, every few milliseconds while tasks end: what the report and
        the log hold goes to their files."""
        self._report.flush()
        self._log.flush()

    def _report_left(self, engine: PilotEngine) -> None:
        """After the engine closed: the entries of tasks whose end was never delivered."""
        with self._lock:
            left = list(self._open)
        for task in left:
            try:
                status = engine.status(task)
            except ValueError:
                continue
            if status.state.final:
                self._report.write(self._task_report(status))
                with self._lock:
                    self._count_end(qcg_state(status.state))

    def _count_end(self, state: str) -> None:
        """Under the lock."""
        self._ended[state] = self._ended.get(state, 0) + 1


def _stop_signals() -> StopSignals:
    """SIGINT, SIGTERM and SIGHUP raise :class:`_Stop` in the main thread while active, once:
    a second signal must not interrupt the cancelling and reporting the first one started."""
    return StopSignals(_raise_stop, once=True)


def _raise_stop(signum: int) -> None:
    raise _Stop(signum)
