"""The executor of a job on another host: ``JobExecutor.get_instance(name, url="ssh://...")``
gives one, whose jobs are run by that host's executor ``name`` through ``psij remote serve``
(:mod:`psij.remote._server`).

A job keeps its id on both sides. Its status changes are pushed by the server and entered
here as they come (and recorded in this machine's registry too, with the URL, so
:func:`psij.registry.reattach` in a later process follows it again over SSH). ``config`` is
the remote executor's configuration: its settings (polling intervals, queue names...) are
sent along, but not ``work_directory``, which stays this machine's (where this process
records its jobs); on the remote host jobs go to that user's own work directory.

A job that may run again (custom attributes ``psij.requeue`` and ``psij.retry``) is run again
by the remote host's executor: the server pushes the QUEUED status of its next run, whose
metadata holds the ``attempt`` (and ``rerun``, ``cause``, ``previous``), and the job here
enters QUEUED again (:meth:`psij.JobExecutor._set_job_status`); its native id is the one the
remote side tells last (a job submitted again there gets a new one).

The connection holds an executor weakly (its status callbacks and reconnect hook): an
executor dropped without :meth:`RemoteJobExecutor.close` is collected, and its finalizer then
stops following its jobs and lets go of the connection, which closes (the ``ssh`` process and
its threads end) when no other executor of the process uses it.
"""

import logging
import posixpath
import threading
import weakref
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from packaging.version import InvalidVersion, Version

from psij import _retry
from psij._registry.durable import commit_rows
from psij.exceptions import InvalidJobException, SubmitException, SubmitManyException
from psij.job import Job
from psij.job_executor import JobExecutor, job_list
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.remote import _connection, _staging
from psij.remote._protocol import (
    RemoteError,
    RemoteProtocolError,
    raised,
    status_from_wire,
)
from psij.remote._protocol import job_id as job_id_of
from psij.remote._target import parse
from psij.serialize import _spec_to_json

logger = logging.getLogger(__name__)

_MAX_ATTEMPT = 2 ** 31  # a greater attempt from the remote side is not believed

SUBMIT_CHUNK = 500
"""Jobs in one submission request of ``submit_many``."""


def _settings(config: JobExecutorConfig) -> Optional[Dict[str, Any]]:
    """The settings of ``config`` the remote executor is made with (those of plain values:
    others are named in a warning and left to the remote executor's defaults)."""
    settings = {}
    left = []
    for key, value in sorted(vars(config).items()):
        if key.startswith("_") or key == "work_directory" or value is None:
            continue
        if isinstance(value, Path):
            value = str(value)
        if isinstance(value, (str, int, float, bool)):
            settings[key] = value
        else:
            left.append(key)
    if left:
        logger.warning("config settings not sent to the remote host (only text, numbers, "
                       "true/false and paths are): %s", ", ".join(left))
    return settings or None


def _remote_path(value: Any) -> Optional[str]:
    """``value`` when it is an absolute path the remote side may give, else None."""
    if (not isinstance(value, str) or not value.startswith("/") or len(value) > 4096
            or not value.isprintable()):
        return None
    return value


class RemoteJobExecutor(JobExecutor):
    """Executor ``name`` of the host of an ``ssh://[user@]host[:port]`` URL (see the module
    documentation and the remote executors guide)."""

    # A job that may run again (psij.requeue, psij.retry) is run again by the remote
    # executor; its statuses tell this side (QUEUED again, with the next attempt).
    _RERUNS = "told"

    def __init__(self, name: str, url: str, config: Optional[JobExecutorConfig] = None,
                 version_constraint: Optional[str] = None) -> None:
        super().__init__(url=url, config=config)
        target = parse(url)
        if not isinstance(name, str) or not name:
            raise ValueError(f"remote executor name: expected text, got {name!r}")
        self._ex = {"name": name, "version": version_constraint,
                    "config": _settings(self.config)}
        self._jobs: Dict[str, Job] = {}
        self._finishing: Dict[str, bool] = {}
        self._lock = threading.Lock()
        self._native_cv = threading.Condition(threading.Lock())
        self._closed = False
        self._conn = _connection.connect(target)
        try:
            opened = self._conn.call("open", {"ex": self._ex})
        except BaseException:
            _connection.release(self._conn)
            raise
        info: Dict[str, Any] = opened if isinstance(opened, dict) else {}  # a server's answer
        try:
            version: Version = Version(str(info.get("version")))
        except InvalidVersion:
            version = Version("0")
        self.__dict__["_psij_plugin"] = (name, version)
        self._remote_python = _remote_path(info.get("python"))
        self._remote_staging = _remote_path(info.get("staging"))
        self._conn.on_reconnect(self._refollow)
        self._followed: Set[str] = set()  # ids of the jobs followed (for the finalizer)
        self._follower = _weak_follower(self._on_event)
        self._finalizer = weakref.finalize(self, _let_go, self._conn, self._followed, False)
        self._finalizer.atexit = False  # the connections are closed at exit anyway

    @property
    def remote_python(self) -> Optional[str]:
        """The Python interpreter the remote ``psij`` runs on (it imports that ``psij``), or
        None when the remote side did not say."""
        return self._remote_python

    def remote_job_folder(self, job_id: str) -> Optional[str]:
        """The private folder on the remote host that holds the staged files of job
        ``job_id``: made when its first stage-in file is sent, removed once the job is final
        and its stage-out files are back (None when the remote side did not say where)."""
        if self._remote_staging is None:
            return None
        return posixpath.join(self._remote_staging, job_id_of(job_id))

    @property
    def connection(self) -> "_connection.Connection":
        """The SSH connection this executor uses (shared with the process's other remote
        executors of the same target)."""
        return self._conn

    def _call(self, op: str, fields: Dict[str, Any]) -> Any:
        if self._closed:
            raise RemoteError(f"{self} is closed")
        return self._conn.call(op, fields)

    # -- jobs -------------------------------------------------------------------------------

    def _watch(self, job: Job) -> None:
        with self._lock:
            self._jobs[job.id] = job
            self._followed.add(job.id)
        self._conn.follow(job.id, self._follower)

    def _unwatch(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job.id, None)
            self._followed.discard(job.id)
        self._conn.unfollow(job.id)

    def _on_event(self, message: Mapping[str, Any]) -> None:
        with self._lock:
            job = self._jobs.get(message.get("job"))  # type: ignore[arg-type]
        if job is not None:
            self._apply(job, message)

    def _wait_native_id(self, job: Job, timeout: float = 60.0) -> None:
        """Wait until the remote side told the job's native id (or the job ended): what
        ``Job.native_id`` waits for when the remote executor gives it after the submission
        (``local``)."""
        with self._native_cv:
            self._native_cv.wait_for(
                lambda: job._native_id is not None or job.status.state.final
                or job.id not in self._jobs, timeout)

    def _apply(self, job: Job, message: Mapping[str, Any]) -> None:
        """Enter the status a server message describes."""
        native_id = message.get("native_id")
        status = status_from_wire(message)
        attempt = _later_run(job, status)
        stale = attempt is None and not status.state.is_greater_than(job.status.state)
        if isinstance(native_id, str) and native_id and job._native_id != native_id \
                and (job._native_id is None or not stale):
            # Set once, or changed: the remote executor submitted the job again. (Not by a
            # message older than the state the job is in: the answer to the submission may
            # come after the statuses of later runs, with the first run's id.)
            with self._native_cv:
                job._native_id = native_id
                self._native_cv.notify_all()
        if attempt is not None and status.state is not JobState.QUEUED:
            # A later run whose QUEUED was not seen (after a reconnection the server tells
            # only the current status): the job enters that run first.
            self._set_job_status(job, JobStatus(JobState.QUEUED, time=status.time,
                                                metadata={"attempt": attempt}))
        elif stale:
            return
        if status.state.final:
            with self._lock:
                if self._finishing.get(job.id):
                    return
                self._finishing[job.id] = True
            status = self._finish(job, status)
            self._unwatch(job)
        self._set_job_status(job, status)

    def _finish(self, job: Job, status: JobStatus) -> JobStatus:
        """Bring the job's stage-out files back and drop its remote folder, before the job is
        seen final; a stage-out that failed fails a job that had completed."""
        spec = job.spec
        if spec is None or not (spec.stage_in or spec.stage_out):
            return status
        problems = _staging.fetch_outputs(self._call, job.id, spec) \
            if _staging.has_outputs(spec) else []
        try:
            self._call("drop", {"job": job.id})
        except Exception as ex:
            logger.warning("the remote staging folder of job %s was not removed: %s",
                           job.id, ex)
        if problems and status.state is JobState.COMPLETED:
            return JobStatus(JobState.FAILED, time=status.time, exit_code=status.exit_code,
                             message="stage out failed: " + "; ".join(problems),
                             metadata=status.metadata)
        return status

    def submit(self, job: Job) -> None:
        """Submit ``job`` on the remote host; on return it is QUEUED (or further).

        A dropped connection is made again and the submission sent again: the job's id makes
        it happen once. If no answer comes in time, SubmitException (transient) says so; the
        job may then be on the remote host, and submitting this same Job again is safe."""
        spec = self._check_job(job)
        failures = self._submit_checked([(job, spec)])
        if failures:
            raise failures[0][1]

    def submit_many(self, jobs: Iterable[Job]) -> None:
        """Submit every job of ``jobs`` in one request per 500 jobs (the remote executor's
        ``submit_many`` is not used: the jobs are submitted there one by one, under one lock
        and one registry flush); SubmitManyException lists those that failed."""
        listed = job_list(jobs)
        checked: List[Tuple[Job, JobSpec]] = []
        failures: List[Tuple[Job, BaseException]] = []
        for job in listed:
            try:
                checked.append((job, self._check_job(job)))
            except Exception as ex:
                failures.append((job, ex))
        for start in range(0, len(checked), SUBMIT_CHUNK):
            failures += self._submit_checked(checked[start:start + SUBMIT_CHUNK])
        if failures:
            raise SubmitManyException(failures, len(listed))

    def _submit_checked(self, checked: List[Tuple[Job, JobSpec]]
                        ) -> List[Tuple[Job, BaseException]]:
        """Submit jobs bound by ``_check_job``; those that failed (unbound again), each with
        its exception."""
        failures: List[Tuple[Job, BaseException]] = []
        payloads = []
        sent: List[Job] = []
        for job, spec in checked:
            try:
                payload = {"id": job.id, "spec": _spec_to_json(spec)}
                _staging.check_outputs(spec)
                if spec.stage_in:
                    _staging.send_inputs(self._call, job.id, spec)
            except Exception as ex:
                job.executor = None
                failures.append((job, SubmitException(f"job {job.id}: {ex}", ex,
                                                      transient=True)
                                 if isinstance(ex, RemoteError) else ex))
                continue
            payloads.append(payload)
            sent.append(job)
            self._watch(job)
        if not sent:
            return failures
        try:
            answers = self._call("submit", {"ex": self._ex, "jobs": payloads})
            if not isinstance(answers, list) or len(answers) != len(sent):
                raise RemoteProtocolError(f"{self._conn.target.where} answered a submission "
                                          f"of {len(sent)} jobs with {str(answers)[:200]!r}")
        except RemoteError as ex:
            for job in sent:
                failures.append((job, self._lost(job, ex)))
            return failures
        taken: List[Job] = []
        for job, answer in zip(sent, answers):
            problem = self._answer_problem(job, answer)
            if problem is not None:
                failures.append((job, problem))
                continue
            self._take_answer(job, answer)
            taken.append(job)
        # Recorded here before submit returns (the remote host's registry has them too): a
        # client killed the next instant can still follow them again (psij.registry.reattach).
        commit_rows(self, taken)
        return failures

    def _lost(self, job: Job, ex: RemoteError) -> SubmitException:
        """Unbind a job whose submission got no answer that can be used, saying so."""
        self._unwatch(job)
        job.executor = None
        return SubmitException(f"job {job.id}: {ex}; the job may have reached the remote "
                               f"host: submitting this same Job again is safe (its id makes "
                               f"it run once)", ex, transient=True)

    def _answer_problem(self, job: Job, answer: Any) -> Optional[BaseException]:
        """None if ``answer`` tells the job was submitted; the exception to raise otherwise
        (the job unbound)."""
        where = self._conn.target.where
        if not isinstance(answer, dict) or answer.get("id") != job.id:
            return self._lost(job, RemoteProtocolError(
                f"{where} answered the submission of job {job.id} with "
                f"{str(answer)[:200]!r}"))
        if answer.get("ok") is False:
            self._unwatch(job)
            job.executor = None
            return raised(answer, where)
        try:
            _check_answer(answer)
        except ValueError as ex:
            return self._lost(job, RemoteProtocolError(
                f"{where} answered the submission of job {job.id} with what is not a job's "
                f"state: {ex}"))
        return None

    def _take_answer(self, job: Job, answer: Mapping[str, Any]) -> None:
        native_id = answer.get("native_id")
        if isinstance(native_id, str) and job._native_id is None:
            with self._native_cv:
                job._native_id = native_id
                self._native_cv.notify_all()
        status = answer.get("status")
        if isinstance(status, dict):
            self._apply(job, status)

    def cancel(self, job: Job) -> None:
        if job.status.state.final:
            return
        self._call("cancel", {"ex": self._ex, "job": job.id, "native_id": job._native_id})

    def list(self) -> List[str]:
        """The native ids of the remote executor's jobs of the remote user."""
        ids = self._call("list", {"ex": self._ex})
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise RemoteError(f"{self._conn.target.where} answered a list with "
                              f"{str(ids)[:200]!r}")
        return ids

    def attach(self, job: Job, native_id: str) -> None:
        """Follow the remote job ``native_id`` (by its id, when the remote registry knows it)."""
        if not isinstance(native_id, str) or not native_id:
            raise ValueError(f"attach native_id: expected text, got {native_id!r}")
        if job.executor is not None and job.executor is not self:
            raise InvalidJobException(f"job {job.id} is already bound to executor "
                                      f"{job.executor}")
        job.executor = self
        job._native_id = native_id
        if job.__dict__.get("_runs") is None:  # it may be run again there: follow its runs
            job.__dict__["_runs"] = _retry.Runs(0, None)
        self._watch(job)
        try:
            answer = self._call("attach", {"ex": self._ex, "job": job.id,
                                           "native_id": native_id})
            try:
                _check_answer(answer)
            except ValueError as ex:
                raise RemoteProtocolError(f"{self._conn.target.where} answered the attach of "
                                          f"{native_id!r} with {str(answer)[:200]!r}: {ex}"
                                          ) from None
        except Exception:
            self._unwatch(job)
            raise
        self._take_answer(job, answer)

    def _refollow(self) -> None:
        """After a reconnection: the current status of every job still followed."""
        with self._lock:
            jobs = list(self._jobs.values())
        if not jobs:
            return
        answers = self._call("follow", {"ex": self._ex, "jobs": [
            {"id": job.id, "native_id": job._native_id} for job in jobs]})
        by_id = {job.id: job for job in jobs}
        for answer in answers if isinstance(answers, list) else ():
            job = by_id.get(str(answer.get("id"))) if isinstance(answer, dict) else None
            if job is None:
                continue
            if answer.get("ok") is False:
                logger.warning("job %s could not be followed again: %s", job.id,
                               answer.get("error"))
                continue
            self._take_answer(job, answer)

    def close(self) -> None:
        """Stop following this executor's jobs and let go of the connection (closed when no
        other remote executor of this process uses it). The remote jobs go on."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs.clear()
        self._finalizer.detach()
        _let_go(self._conn, self._followed, True)

    def __str__(self) -> str:
        return f"RemoteJobExecutor({self._ex['name']!r}, url={self.url!r})"

    __repr__ = __str__


def _weak_follower(method: Any) -> Any:
    """A follower that calls the bound ``method`` while its executor lives (the connection
    must not keep an executor alive)."""
    ref = weakref.WeakMethod(method)

    def follower(message: Mapping[str, Any]) -> None:
        found = ref()
        if found is not None:
            found(message)

    return follower


def _let_go(conn: "_connection.Connection", followed: Set[str], wait: bool) -> None:
    """An executor closed (``wait``: until the connection closed, if it was the last user) or
    collected: its jobs are no longer followed and it no longer uses the connection."""
    for job_id in list(followed):
        conn.unfollow(job_id)
    followed.clear()
    _connection.release(conn, wait)


def _later_run(job: Job, status: JobStatus) -> Optional[int]:
    """The attempt of ``status`` when it is of a later run of the job than the one it is in
    (the remote executor ran it again: requeued or retried), else None."""
    told = (status.metadata or {}).get("attempt")
    if isinstance(told, bool) or not isinstance(told, int) or told > _MAX_ATTEMPT:
        return None
    runs = job.__dict__.get("_runs")
    if runs is None or job.status.state.final:
        return None
    return told if told > runs.attempt else None


def _check_answer(answer: Any) -> None:
    """ValueError unless ``answer`` is a job's answer: an object with an optional native id
    (text) and a status."""
    if not isinstance(answer, dict):
        raise ValueError("expected an object")
    native_id = answer.get("native_id")
    if native_id is not None and (not isinstance(native_id, str) or not native_id):
        raise ValueError(f"native_id: expected text, got {str(native_id)[:80]!r}")
    status = answer.get("status")
    if not isinstance(status, dict):
        raise ValueError("status: expected an object")
    status_from_wire(status)


def remote_executor(name: str, version_constraint: Optional[str], url: str,
                    config: Optional[JobExecutorConfig]) -> JobExecutor:
    """What ``JobExecutor.get_instance`` gives for an ``ssh://`` URL."""
    return RemoteJobExecutor(name, url, config=config, version_constraint=version_constraint)
