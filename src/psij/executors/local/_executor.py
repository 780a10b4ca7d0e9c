"""The local executor's class and its configuration (:class:`LocalJobExecutor`,
:class:`LocalJobExecutorConfig`, re-exported by the package): how a job runs is told in the
package's documentation (``psij.executors.local``). It drives the package's other modules
(checks, environment, keepers, records, worker threads, time limit, staging, resource pool)
and is the one that sets the jobs' states: the others hand it the states they compute.
"""

import os
import subprocess
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from psij import _check, _site_config
from psij._clock import wall_time
from psij._end_signal import ATTRIBUTE as END_SIGNAL
from psij._end_signal import EndSignal, end_signal
from psij._lazylog import LazyLogger
from psij._private_dirs import ensure_private_dir
from psij._registry.held import mark as mark_held
from psij._retry import Rerun, run_environment
from psij.exceptions import InvalidJobException, SubmitException
from psij.executors._process import (
    SIGTERM,
    LaunchError,
    Spawner,
    exit_code_of,
    failure_message,
    killpg,
    signal_reaped_group,
    start_time,
)
from psij.executors._process_watch import WATCH
from psij.executors.local._checks import (
    check_executable,
    check_os_texts,
)
from psij.executors.local._env import BASE, NodeFiles, check_sizes, merged
from psij.executors.local._handover import batched, commit_rest, hand_over
from psij.executors.local._journal import (
    Journal,
    JournalEntry,
    RunCanceled,
    RunEnded,
    RunNote,
    RunStarted,
    final_from_entry,
    latest_entry,
    note,
    scan_all,
)
from psij.executors.local._keeper_client import (
    Keeper,
    flush_keepers,
    keeper_for,
    keeper_for_job,
)
from psij.executors.local._pool_driver import (
    PoolDriver,
    pool_capacity,
    pool_gpu_set,
)
from psij.executors.local._prepared import NotRunnable, Prepared, spawn_failure
from psij.executors.local._prepared import Run as _Run
from psij.executors.local._reruns import TIME_LIMIT, cancel_between_runs, may_run_again, run_again
from psij.executors.local._stage_in import (
    held_here,
    hold,
    let_go_cancelled,
    stage_in_and_start,
)
from psij.executors.local._start import NATIVE_IDS
from psij.executors.local._time_limit import TimeLimit, time_limit_message
from psij.executors.local._transfer import stage_out_and_cleanup
from psij.executors.local._worker import WORKER as _WORKER
from psij.job import Job
from psij.job_executor import JobExecutor, job_list
from psij.job_executor_config import JobExecutorConfig
from psij.job_launcher import Launcher
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1
from psij.staging import StageOutFlags, normalize_flags

__all__ = ["LocalJobExecutor", "LocalJobExecutorConfig"]

logger = LazyLogger("psij.executors.local")  # the name it had as one module


class LocalJobExecutorConfig(JobExecutorConfig):
    """Local executor configuration; adds ``cancel_grace_period`` (seconds, or a timedelta,
    from TERM to KILL) and ``enforce_duration``: when true, a job still running when its
    ``JobAttributes.duration`` has passed is ended (TERM, then KILL after the grace period)
    and ends FAILED with a time-limit message. False by default, as in psij-python, where
    ``local`` ignores ``duration``. With ``keeper=False`` jobs are started by this process
    instead of its keeper (a little faster, but a job that ends after this process has no
    recorded exit code; see the module documentation). ``resource_pool``: False (the default,
    as in psij-python: every job starts at once), True (this machine's cores, memory, free
    temporary disk and GPUs) or a dict of ``cores``, ``memory`` and ``tmp`` (bytes) and
    ``gpus`` (a count, or a list of GPU ids such as ``["0", "2"]``; a missing key is this
    machine's amount): jobs that do not fit wait, QUEUED, and
    start in ``psij.priority`` order (higher first), then by arrival; a job asking for more of
    any of them than the pool has runs alone; a job asking for GPUs gets its own, named in
    ``CUDA_VISIBLE_DEVICES`` (``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES`` on AMD)."""

    def __init__(self, launcher_log_file: Union[str, Path, None] = None,
                 work_directory: Union[str, Path, None] = None,
                 cancel_grace_period: Union[float, timedelta] = 5.0,
                 enforce_duration: bool = False, keeper: bool = True,
                 resource_pool: Union[bool, Mapping[str, Any]] = False) -> None:
        super().__init__(launcher_log_file=launcher_log_file, work_directory=work_directory)
        self.cancel_grace_period = _check.seconds("LocalJobExecutorConfig.cancel_grace_period",
                                                  cancel_grace_period)
        self.enforce_duration = _check.opt_bool("LocalJobExecutorConfig.enforce_duration",
                                                enforce_duration)
        self.keeper = _check.opt_bool("LocalJobExecutorConfig.keeper", keeper)
        self.resource_pool = _check.resource_pool(resource_pool)


_NO_ENVIRONMENT: Mapping[str, str] = {}




def _needs_staging(spec: JobSpec) -> bool:
    return bool(spec.stage_in or spec.stage_out or spec.cleanup)


def _stages_on_cancel(spec: JobSpec) -> bool:
    """Whether a cancelled job has stage-out or cleanup to do (after its processes end)."""
    return any(s.flags & StageOutFlags.ON_CANCEL for s in spec.stage_out or []) or bool(
        spec.cleanup and normalize_flags(spec.cleanup_flags) & StageOutFlags.ON_CANCEL)


class LocalJobExecutor(JobExecutor):
    """Runs jobs as local processes (see the module documentation for how)."""

    _RERUNS = "submits"  # a new process for each run (_reruns)
    _REQUEUES_ITSELF = False
    _psij_keeps_run_outputs = True  # run N's output moved to <path>.N (_reruns.keep_outputs)

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=config if config is not None
                         else _site_config.config_defaults(self.name, LocalJobExecutorConfig()))
        # Checked again: the config's attribute may have been changed since it was made.
        self._grace = _check.seconds("LocalJobExecutorConfig.cancel_grace_period",
                                     getattr(self.config, "cancel_grace_period", 5.0))
        self._enforce_duration = _check.opt_bool(
            "LocalJobExecutorConfig.enforce_duration",
            getattr(self.config, "enforce_duration", False))
        self._kept = _check.opt_bool("LocalJobExecutorConfig.keeper",
                                     getattr(self.config, "keeper", True))
        setting = _check.resource_pool(getattr(self.config, "resource_pool", False))
        capacity = pool_capacity(setting)
        self._pool = None if capacity is None else PoolDriver(
            capacity, self._launch, self._pool_report, pool_gpu_set(setting),
            self._pool_mark)
        self._work = Path(self.config.work_directory)
        self._dir = self._work / "local"
        # The registry file, as psij._registry.store.registry_path names it (that module is
        # not imported here: it loads sqlite3).
        self._registry = os.path.join(os.path.abspath(self.config.work_directory), "jobs.sqlite")
        self._dir_ready = False
        self._lock = threading.Lock()
        self._runs: Dict[int, _Run] = {}  # by job object id, while not final
        self._nodefiles = NodeFiles(self._dir)
        self._cwd_path: Optional[Tuple[str, Path]] = None
        self._journal_file: Optional[Journal] = None
        # Reaps the jobs and times the KILL after a cancel's TERM (tests give it a manual clock).
        self._watch = WATCH
        self._closed = False

    # -- submit ---------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Start the job (or queue its stage-in; with a resource pool, keep it QUEUED until it
        fits); raises before anything runs if it cannot."""
        if self._closed:
            raise SubmitException(f"{self} is closed")
        spec = self._check_job(job)
        try:
            _site_config.apply_job_defaults(self.name, spec)
            run, prepared = self._prepare(job, spec)
            with self._lock:
                self._runs[id(job)] = run
            if self._pool is None:
                self._launch((run, prepared))
            else:
                self._pool.submit(job, spec, (run, prepared))
        except BaseException:
            with self._lock:
                self._runs.pop(id(job), None)
            job.executor = None
            raise
        commit_rest(self, run)

    def submit_many(self, jobs: Iterable[Job]) -> None:
        """Submit the jobs as :meth:`submit` does, their starts sent to the keepers in one
        message each and the other jobs' registry rows committed in one transaction, before
        it returns (see :meth:`psij.JobExecutor.submit_many` for failures)."""
        listed = job_list(jobs)
        with batched(self):
            self._submit_each(listed)

    def _launch(self, todo: Tuple[_Run, Prepared],
                environment: Mapping[str, str] = _NO_ENVIRONMENT) -> None:
        run, prepared = todo
        assert run.job.spec is not None
        given = run.job.spec.environment or {}
        for name, value in environment.items():  # the GPUs the resource pool gave the job
            if name not in given:
                prepared.env[name] = value
        if run.canceled:  # while it waited for the resource pool
            self._finish(run, JobStatus(JobState.CANCELED))
        elif _needs_staging(run.job.spec):
            self._set_job_status(run.job, JobStatus(JobState.QUEUED))
            hold(self, run.job)  # until its start is with a keeper (or it ended)
            _WORKER.put(lambda: stage_in_and_start(self, run, prepared, self._start,
                                                   self._finish))
        else:
            try:
                self._start(run, prepared)
            except NotRunnable as ex:
                self._finish(run, ex.status)

    def _run_again(self, job: Job, rerun: Rerun) -> None:
        run_again(self, job)

    def _pool_mark(self, jobs: Sequence[Job], held: Optional[str],
                   final: Optional[Tuple[str, int, str]]) -> None:
        # A job the pool started that is held for its stage-in keeps that marker.
        if held is None and final is None:
            jobs = [job for job in jobs if not held_here(job)]
        mark_held(self, jobs, held, final)

    def _pool_report(self, todo: Tuple[_Run, Prepared], status: JobStatus) -> None:
        if status.state.final:
            self._finish(todo[0], status)
        else:
            self._set_job_status(todo[0].job, status)

    def _ensure_dir(self) -> None:
        if not self._dir_ready:
            ensure_private_dir(self._dir, "local executor directory", self.config.work_directory)
            self._dir_ready = True

    def _prepare(self, job: Job, spec: JobSpec) -> Tuple[_Run, Prepared]:
        if spec.executable is None:
            raise InvalidJobException("JobSpec.executable: a job needs an executable")
        check_os_texts(spec)
        self._end_signal(spec)
        job_dir = spec.directory if spec.directory is not None else self._cwd()
        if spec.directory is not None and not job_dir.is_dir():
            raise SubmitException(f"JobSpec.directory: {str(job_dir)!r} is not an existing "
                                  "directory")
        self._ensure_dir()
        run = _Run(job, job_dir)
        launcher_name = spec.launcher or Launcher.DEFAULT_LAUNCHER_NAME
        direct = (launcher_name == "single" and spec.pre_launch is None
                  and spec.post_launch is None)
        env = self._environment(job, spec)
        base = BASE.get() if spec.inherit_environment else None
        check_sizes(f"job {job.id}: could not start {spec.executable!r}",
                    spec.arguments or (), env, BASE.size() if base is not None else 0)
        if not direct:
            try:
                run.launcher = self._get_launcher(launcher_name)
            except ValueError as ex:
                raise InvalidJobException(f"JobSpec.launcher: {ex}") from ex
            prepared_failure = check_executable(spec, job_dir,
                                                merged(None if base is None else base[1], env))
        else:
            prepared_failure = None
        for field in ("pre_launch", "post_launch"):
            p = getattr(spec, field)
            if p is not None and not os.access(job_dir / p, os.R_OK):
                raise SubmitException(f"JobSpec.{field}: {str(p)!r} is not a readable file")
        if spec.stderr_path is not None:
            run.stderr_path = job_dir / spec.stderr_path
        prepared = Prepared(direct, env, job_dir)
        prepared.base = base
        prepared.failure = prepared_failure
        if not _needs_staging(spec):
            # With stage-in, stdin may arrive with the staged files: check it when starting.
            prepared.check_streams(spec)
        return run, prepared

    def _cwd(self) -> Path:
        """This process's working directory (a Path made again only when it changed)."""
        text = os.getcwd()
        cwd = self._cwd_path
        if cwd is None or cwd[0] != text:
            cwd = self._cwd_path = (text, Path(text))
        return cwd[1]

    def _environment(self, job: Job, spec: JobSpec) -> Dict[str, str]:
        """The job's own variables (the inherited ones are ``Prepared.base``), with
        ``PSIJ_ATTEMPT`` for a job that may be run again (:func:`psij._retry.run_environment`)."""
        env: Dict[str, str] = dict(run_environment(job, spec.environment))
        res = spec.resources
        env["PSIJ_NODEFILE"] = self._nodefiles.path(
            res.computed_process_count if isinstance(res, ResourceSpecV1) else 1)
        return env

    def _start(self, run: _Run, prepared: Prepared) -> None:
        job = run.job
        spec = job.spec
        assert spec is not None
        if prepared.failure is not None:
            raise NotRunnable(prepared.failure)
        keeper = keeper_for_job(JobState.COMPLETED.order, self._watch) if self._kept else None
        if keeper is not None and self._hand_over(run, prepared, keeper):
            return
        streams = prepared.open_streams(spec) if prepared.direct else None
        out_fd = -1
        try:
            if prepared.direct:
                assert streams is not None
                argv = [spec.executable or ""] + (spec.arguments or [])
                stdin, stdout, stderr = streams
            else:
                argv = self._launch_command(run)
                out_fd = os.open(run.launcher_out or "", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                                 0o600)
                stdin, stdout, stderr = subprocess.DEVNULL, out_fd, out_fd
            try:
                pid = _SPAWNER.spawn(argv, str(prepared.job_dir), prepared.whole_env(), stdin,
                                     stdout, stderr)
            except LaunchError as ex:
                raise spawn_failure(ex, job, prepared) from ex
        finally:
            if streams is not None:
                for s in set(streams):  # stdout and stderr may share one descriptor
                    if isinstance(s, int) and s > 2:
                        os.close(s)
            elif out_fd >= 0:
                os.close(out_fd)
        run.pid = pid
        run.began = wall_time()
        job._native_id = str(pid)
        run.start = start_time(pid)
        self._note(RunStarted(pid, str(run.start), job.id))
        self._set_job_status(job, JobStatus(JobState.ACTIVE))
        self._watch.watch(pid, lambda pid, status: self._on_exit(run, status))
        self._arm(run, pid)

    def _launch_command(self, run: _Run) -> List[str]:
        assert run.launcher is not None
        log = self.config.launcher_log_file
        argv = run.launcher.get_launch_command(  # type: ignore[call-arg]
            run.job, str(log) if log is not None else None)
        run.launcher_out = str(self._dir / f"{run.job.id}.launcher.out")
        return argv

    def _hand_over(self, run: _Run, prepared: Prepared, keeper: Keeper) -> bool:
        """Have ``keeper`` start the job (``_handover``); False: it must be started here."""
        if hand_over(self, run, prepared, keeper, _SPAWNER.on_path):
            return True
        logger.warning("local job %s: the keeper has ended; starting it here", run.job.id)
        return False

    def _start_again(self, run: _Run, prepared: Prepared) -> None:
        """On the worker: start a job whose keeper ended before it was sent the job."""
        run.kept, run.keeper = False, None
        try:
            self._start(run, prepared)
        except NotRunnable as ex:
            self._finish(run, ex.status)
        except Exception as ex:
            self._finish(run, JobStatus(JobState.FAILED, message=f"could not start: {ex}"))
        if not run.kept:  # started here, or failed: no keeper will answer
            run.starting = False
            NATIVE_IDS.answered()

    def _started(self, run: _Run, pid: int) -> None:
        """On a thread of the starts: the keeper started the job."""
        with self._lock:
            run.activating, end, run.end = False, run.end, None
        self._set_job_status(run.job, JobStatus._made(JobState.ACTIVE))
        if end is not None:  # it ended while its ACTIVE waited
            _WORKER.put(end)
            return
        self._arm(run, pid)

    def _end_signal(self, spec: JobSpec) -> Optional[EndSignal]:
        """The signal ``spec`` asks for before its end; only a limit enforced here has one."""
        attrs = spec.attributes
        custom = attrs.custom_attributes
        if not custom or custom.get(END_SIGNAL) is None:
            return None
        if not self._enforce_duration:
            raise InvalidJobException(f"custom attribute {END_SIGNAL}: the local executor "
                                      "ends jobs at their duration, and warns them before, "
                                      "only with LocalJobExecutorConfig(enforce_duration=True)")
        return end_signal(custom, attrs.duration, "JobAttributes.duration")

    def _arm(self, run: _Run, pid: int) -> None:
        spec = run.job.spec
        assert spec is not None
        if self._enforce_duration and spec.attributes is not None:
            run.limit = TimeLimit(self._watch, pid, spec.attributes.duration, self._grace,
                                  lambda: run.exited, self._end_signal(spec))
            run.limit.arm()
        if run.canceled:  # cancelled while it was being started
            self._watch.terminate(pid, run.grace, canceled=True, keepers=self._kill_keeper)

    def _wait_native_id(self, job: Job) -> None:
        """``job.native_id`` of a job whose start the keeper has not answered yet waits."""
        run = self._runs.get(id(job))
        if run is not None and run.starting:
            NATIVE_IDS.wait(lambda: not run.starting)

    def _note(self, run: RunNote, job: Optional[Job] = None) -> None:
        """Record a job's start, end or cancel (batched; in the journal if it cannot be)."""
        note(self._work, self._journal(), run, "" if job is None else job.id)

    def _scan(self) -> Dict[Tuple[int, str], JournalEntry]:
        """Every local job recorded in the registry or journal files of the work directory,
        this process's own records included (committed first)."""
        self._ensure_dir()  # journals others could write are not read
        flush_keepers()
        return scan_all(self._dir, self._work)

    def _journal(self) -> Journal:
        j = self._journal_file
        if j is None:
            with self._lock:
                if self._journal_file is None:
                    self._journal_file = Journal.create(self._dir)
                j = self._journal_file
        return j

    # -- completion -----------------------------------------------------------------------------

    def _on_exit(self, run: _Run, status: Optional[int]) -> None:
        # On the ProcessWatch thread: record what is needed, hand the rest to the worker.
        code = exit_code_of(status)
        run.exited = True
        use = self._use_of(run)
        task = lambda: self._complete(run, code, use)  # noqa: E731
        with self._lock:
            if run.activating:
                # Its ACTIVE is not being set yet: the end waits for it (``_started``), or the
                # worker would run the ACTIVE callbacks the end skips, and a slow one would
                # hold the ends of all other jobs.
                run.end = task
                return
        _WORKER.put(task)

    def _use_of(self, run: _Run) -> Optional[Tuple[float, float, float, int]]:
        """The resource use of the run that ended (on the watch thread): as its keeper
        reported it, or, for a job started here, as the watch reaped it."""
        keeper, pid = run.keeper, run.pid
        if pid is None:
            return None
        if keeper is not None:
            return keeper.usage.pop(pid, None)
        take = getattr(self._watch, "take_usage", None)  # (tests may give another watch)
        reaped = take(pid) if take is not None and not run.attached else None
        if reaped is None or run.began is None:
            return None
        return run.began, reaped[0], reaped[1], reaped[2]

    def _complete(self, run: _Run, code: Optional[int],
                  use: Optional[Tuple[float, float, float, int]] = None) -> None:
        try:
            self._settle(run, code, use)
        except Exception as ex:
            # The job must still end, or a waiter would wait forever; the worker goes on.
            logger.exception("local job %s: handling its end failed", run.job.id)
            self._finish(run, JobStatus(JobState.FAILED, exit_code=code, message=(
                f"the job exited with code {code}, but handling its end failed: {ex!r}")))

    def _settle(self, run: _Run, code: Optional[int],
                use: Optional[Tuple[float, float, float, int]] = None) -> None:
        job = run.job
        spec = job.spec
        if run.start is not None and run.pid is not None and not run.kept:  # else the keeper's
            self._note(RunEnded(run.pid, run.start, code, run.canceled), job)
        message, cause = None, None
        state = JobState.COMPLETED if code == 0 else JobState.FAILED
        if run.launcher is not None and run.launcher_out is not None:
            try:
                with open(run.launcher_out, errors="replace") as f:
                    out = f.read()
                os.unlink(run.launcher_out)
            except OSError:
                out = ""
            if not run.canceled and run.launcher.is_launcher_failure(out):
                state = JobState.FAILED
                message = run.launcher.get_launcher_failure_message(out) or \
                    f"launcher exited with code {code} without finishing"
        if run.canceled:
            state = JobState.CANCELED
        elif run.limit is not None and run.limit.expired:
            assert spec is not None and spec.attributes is not None
            state, message = JobState.FAILED, time_limit_message(spec.attributes.duration)
            cause = dict(TIME_LIMIT)
        elif code is None and message is None:
            keeper = run.keeper
            message = _NO_CODE if keeper is None or keeper.ended is None else (
                f"the keeper process {keeper.pid} that started the job ended "
                f"({keeper.ended}); the job's processes were killed")
        elif state is JobState.FAILED and message is None:
            message = failure_message(code, run.stderr_path)
        assert spec is not None
        if _needs_staging(spec):
            staging_error = stage_out_and_cleanup(
                run.job_dir, spec, state, lambda st: self._set_job_status(job, JobStatus(st)))
            if staging_error is not None and state is JobState.COMPLETED:
                state, message = JobState.FAILED, staging_error
        meta: Dict[str, Any] = dict(cause or ())
        if use is not None:  # as its keeper reaped it (see "Resource use" in the docs)
            meta.update(zip(_USE_KEYS, use))
        self._finish(run, JobStatus._made(state, None, message, code) if not meta
                     else JobStatus(state, None, message, code, meta))

    def _finish(self, run: _Run, status: JobStatus) -> None:
        with self._lock:
            if self._runs.get(id(run.job)) is run:
                del self._runs[id(run.job)]
        # Before the status when it may start the job's next run, which the pool then holds.
        early = self._pool is not None and may_run_again(run.job)
        if early:
            self._pool.ended(run.job)  # type: ignore[union-attr]
        self._set_job_status(run.job, status)
        if self._pool is not None and not early:
            self._pool.ended(run.job)

    def close(self) -> None:
        """Refuse further submits. Jobs already submitted are still run (those waiting for the
        resource pool as well) and followed to their end (the shared watch holds no thread
        per executor)."""
        self._closed = True

    # -- cancel, list, attach -------------------------------------------------------------------

    def cancel(self, job: Job) -> None:
        """TERM to the job's process group, KILL after the grace period (sent by its keeper);
        the job is CANCELED on return (see the module documentation)."""
        self._cancel(job, self._grace)

    def _cancel(self, job: Job, grace: float) -> None:
        if not isinstance(job, Job):
            raise _check.fail_type("cancel job", job, "psij.Job")
        if job.executor is not self:
            raise InvalidJobException(f"job {job.id} was not submitted to this executor")
        if self._pool is not None and self._pool.cancel_waiting(job):
            return
        with self._lock:
            run = self._runs.get(id(job))
            if cancel_between_runs(job, run):
                return  # its next run will not start
        if run is None or job.status.final or run.exited:
            return  # over, or its exit is being handled: it keeps the state it reached
        run.grace = grace  # before the flag: a start in progress reads both
        run.canceled = True
        if job.spec is None or not _stages_on_cancel(job.spec):
            self._set_job_status(job, JobStatus(JobState.CANCELED))
        if run.pid is None:  # not started yet: the worker sees the flag and never starts it
            if not run.starting:
                let_go_cancelled(self, job, JobStatus(JobState.CANCELED))
            return
        if not run.attached:
            self._watch.terminate(run.pid, grace, canceled=True, keepers=self._kill_keeper)
            return
        # Started by another process: noted for any later reader, then its group is ended
        # while its leader is the process the record names.
        assert run.start is not None
        pid, start = run.pid, run.start
        self._note(RunCanceled(pid, start))

        def end(signum: int) -> None:
            if start_time(pid) == start:
                killpg(pid, signum)
            else:
                signal_reaped_group(pid, signum)

        leader = pid if start_time(pid) == start else None
        end(SIGTERM)
        self._watch.kill_later(pid, grace, leader, self._kill_keeper)

    def _kill_keeper(self) -> Optional[Keeper]:
        """A keeper of this process to send a KILL later, even after this process ended
        (started if there is none; None if none can be)."""
        return keeper_for(JobState.COMPLETED.order, self._watch)

    def kill(self, job: Job) -> None:
        """Cancel ``job`` with KILL at once, without the grace period (CANCELED on return)."""
        self._cancel(job, 0.0)

    def list(self) -> List[str]:
        """Native ids (pids) of this user's local jobs that are still running."""
        found = self._scan()
        return sorted((str(pid) for (pid, start), rec in found.items()
                       if not rec.ended and start_time(pid) == start), key=int)

    def attach(self, job: Job, native_id: str) -> None:
        """Follow a local job started by any executor instance or process, by its pid.

        A running job is reported ACTIVE and then its final state when it ends; a finished one
        gets its final state at once, with the exit code when it was recorded.
        """
        if not isinstance(native_id, str) or not native_id.isascii() or not native_id.isdigit():
            raise ValueError(f"attach native_id: expected a process id (digits), got "
                             f"{native_id!r}")
        if job.status.state is not JobState.NEW or job.executor is not None:
            raise InvalidJobException(f"attach: job {job.id} must be NEW and not yet bound")
        pid = int(native_id)
        found = self._scan()
        key = latest_entry(found, pid)
        if key is None:
            raise InvalidJobException(f"attach: no local job with native id {native_id} is "
                                      f"known in {self._dir}")
        job.executor = self
        job._native_id = native_id
        run = _Run(job, Path(os.getcwd()))
        with self._lock:
            self._runs[id(job)] = run
        entry = found[key]
        if entry.ended:
            # Already over: report the final state now, not after a first poll.
            self._finish(run, final_from_entry(run.canceled, entry))
            return
        run.attached, run.start = True, key[1]
        if start_time(pid) == key[1]:
            run.pid = pid
            self._set_job_status(job, JobStatus(JobState.ACTIVE))
            if self._watch.watch(pid, lambda p, s: self._attached_exit(run, key), child=False):
                return
        self._attached_exit(run, key)

    def _attached_exit(self, run: _Run, key: Tuple[int, str], tries: int = 0) -> None:
        # On the watch's thread: reading the records (which may wait for a registry
        # locked by a writer) is the worker's task.
        _WORKER.put(lambda: self._attached_end(run, key, tries))

    def _attached_end(self, run: _Run, key: Tuple[int, str], tries: int) -> None:
        # The owner records the exit code just after the exit (batched): look again a few
        # times, on a timer, so that neither shared thread ever sleeps.
        entry = self._scan().get(key)
        if (entry is None or not entry.ended) and tries < _ATTACH_RETRIES:
            self._watch.call_later(0.02 * (tries + 1),
                                   lambda: self._attached_exit(run, key, tries + 1))
            return
        self._finish(run, final_from_entry(run.canceled, entry))



_ATTACH_RETRIES = 14  # about 2 s in all
# The status metadata of a run's use (as the registry's columns and the batch executors name
# the times).
_USE_KEYS = ("started_at", "ended_at", "cpu_seconds", "max_rss_bytes")
_NO_CODE = ("the job ended, but its exit code is not known (the keeper process that started "
            "it ended first)")
# Popen always: a job must not inherit a descriptor this process made inheritable after start.
_SPAWNER = Spawner(posix_spawn=False)
