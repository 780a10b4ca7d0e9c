"""The executor base class: submits jobs to a backend and reports their status changes."""

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Dict, Iterable, List, Optional, Set, Tuple, Union

from psij import _check, _retry
from psij._declared_attributes import check_declared
from psij._lazylog import LazyLogger, configure_from_environment
from psij._reexports import lazy_names
from psij.exceptions import InvalidJobException, SubmitException, SubmitManyException
from psij.job import CallbackLike, Job, JobStatusCallback, as_callback
from psij.job_executor_config import JobExecutorConfig
from psij.job_launcher import Launcher, _plugin_name, _plugin_version
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from packaging.version import Version

    from psij.descriptor import Descriptor

__all__ = ["JobExecutor", "job_list"]

logger = LazyLogger(__name__)


def job_list(jobs: Iterable[Job]) -> List[Job]:
    """The jobs given to ``submit_many`` as a list; TypeError naming the first that is not a
    :class:`~psij.Job`, or when ``jobs`` is not an iterable of jobs."""
    if isinstance(jobs, (str, bytes, Job)) or not hasattr(jobs, "__iter__"):
        raise _check.fail_type("submit_many jobs", jobs, "an iterable of psij.Job")
    listed = list(jobs)
    for n, job in enumerate(listed):
        if not isinstance(job, Job):
            raise _check.fail_type(f"submit_many jobs[{n}]", job, "psij.Job")
    return listed


class JobExecutor(ABC):
    """Base class of executors (``local``, ``slurm``, ``pbs``, ...).

    Use :meth:`get_instance` to make one by name; subclasses implement :meth:`submit`,
    :meth:`cancel`, :meth:`list` and :meth:`attach`.
    """

    #: Whether this executor runs a job again (``psij.requeue``, ``psij.retry``, see
    #: :mod:`psij._retry`): "" when it refuses such jobs at submit, "submits" when it starts
    #: the next run itself (:meth:`_run_again`), "told" when its backend does and tells it
    #: (the job's QUEUED status then carries the next ``attempt``).
    _RERUNS: ClassVar[str] = ""
    #: Whether a QUEUED status for an ACTIVE job of a "submits" executor means its scheduler
    #: requeued the job itself (same native id). False where the executor's own QUEUED can
    #: arrive after the ACTIVE of the same run (local, pilot: reported from two threads).
    _REQUEUES_ITSELF: ClassVar[bool] = True

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        if url is not None and not isinstance(url, str):
            raise _check.fail_type(f"{type(self).__name__} url", url, "str or None")
        if config is not None and not isinstance(config, JobExecutorConfig):
            raise _check.fail_type(f"{type(self).__name__} config", config,
                                   "psij.JobExecutorConfig or None")
        configure_from_environment()
        self.url = url
        self.config = config if config is not None else JobExecutorConfig.DEFAULT
        self._cb: Optional[JobStatusCallback] = None
        self._launchers_lock = threading.Lock()
        self._launchers: Dict[str, Launcher] = {}

    @property
    def name(self) -> str:
        """The name this executor was asked for by."""
        return _plugin_name(self, "executor")

    @property
    def version(self) -> "Version":
        """The version from this executor's descriptor."""
        return _plugin_version(self, "executor")

    def _check_job(self, job: Job) -> JobSpec:
        """Check that ``job`` can be submitted, bind it to this executor, return its spec.

        Raises InvalidJobException if the job is not NEW, has no spec, is bound to an executor
        already or has a custom attribute psij reads (``psij.priority``, ``psij.tmp``, ...) of
        the wrong kind; TypeError/ValueError for a bad environment or arguments (these are
        checked again here, and their path-like items made text, because lists and dicts can
        change after they were set).
        """
        if not isinstance(job, Job):
            raise _check.fail_type("submit job", job, "psij.Job")
        if job.status.state is not JobState.NEW:
            raise InvalidJobException(f"job {job.id} is {job.status.state}, only a NEW job can "
                                      "be submitted")
        spec = job.spec
        if spec is None:
            raise InvalidJobException(f"job {job.id} has no JobSpec")
        # Set again through the checks: items put into the list or dict in place since (a
        # pathlib.Path appended to the arguments) are checked and made text here.
        spec.environment = spec.environment
        spec.arguments = spec.arguments
        attributes = spec.__dict__.get("_attributes")  # not made here when there are none
        if attributes is not None:
            check_declared(attributes.custom_attributes)
        if job.executor is not None:
            raise InvalidJobException(f"job {job.id} is already bound to executor "
                                      f"{job.executor}")
        runs = _retry.check_job(spec) if attributes is not None else None
        if runs is not None and not self._RERUNS:
            raise InvalidJobException(
                f"the {self.name} executor does not run a job again: custom attributes "
                f"{_retry.REQUEUE_ATTRIBUTE} and {_retry.RETRY_ATTRIBUTE} are not accepted "
                "by it")
        job.__dict__["_runs"] = runs
        job.executor = self
        return spec

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Submit ``job``; on return it is QUEUED (or further) and has a native id."""

    def submit_many(self, jobs: Iterable[Job]) -> None:
        """Submit every job of ``jobs``, as :meth:`submit` would one by one.

        Batch executors whose scheduler has job arrays (slurm, sge, pbs, lsf) submit jobs that
        differ only in arguments or environment as one array; the others submit the jobs in
        order. A job that cannot be submitted does not stop the others: once all were tried,
        :class:`~psij.exceptions.SubmitManyException` lists the failed ones (still NEW and
        unbound) with their exceptions.
        """
        self._submit_each(job_list(jobs))

    def _submit_each(self, jobs: List[Job]) -> None:
        failures: List[Tuple[Job, BaseException]] = []
        for job in jobs:
            try:
                self.submit(job)
            except Exception as e:
                failures.append((job, e))
        if failures:
            raise SubmitManyException(failures, len(jobs))

    def set_priority(self, job: Job, priority: Union[int, float]) -> bool:
        """Change the priority (``psij.priority``) of a job already submitted; True when it
        now orders the job, False when nothing orders it any more (it runs). Batch executors
        reorder the jobs they hold and, with ``use_nice``, tell the scheduler; others raise
        SubmitException."""
        raise SubmitException(f"the {self.name} executor cannot change the priority of a job "
                              "it has taken")

    @abstractmethod
    def cancel(self, job: Job) -> None:
        """Cancel ``job``; it ends CANCELED unless it finished first."""

    def kill(self, job: Job) -> None:
        """Cancel ``job`` with no grace period: where the backend can, its processes get KILL at
        once instead of the TERM (and the wait before KILL) of :meth:`cancel`; it ends CANCELED
        unless it finished first. For callers that gave the job its grace themselves (a flow's
        shrink with a grace, a destroy). This default cancels as :meth:`cancel` does; ``local``
        and ``slurm`` kill at once (see the user guide and the batch executors' page)."""
        self.cancel(job)

    @abstractmethod
    def list(self) -> List[str]:
        """Native ids of this user's jobs known to this executor's backend."""

    @abstractmethod
    def attach(self, job: Job, native_id: str) -> None:
        """Bind a NEW ``job`` to an existing backend job and track its status from now on."""

    def set_job_status_callback(self, cb: Optional[CallbackLike]) -> None:
        """Call ``cb`` for every status change of every job of this executor."""
        self._cb = as_callback(cb, f"{type(self).__name__}.set_job_status_callback")

    def _silent(self) -> bool:
        """Whether telling it of a status change does nothing (no callback is set, and
        :meth:`_notify_callback` is this class's): a job then skips the telling."""
        return getattr(self, "_cb", None) is None and \
            type(self)._notify_callback is JobExecutor._notify_callback

    def _notify_callback(self, job: Job, status: JobStatus) -> None:
        cb = self._cb
        if cb is not None:
            try:
                cb.job_status_changed(job, status)
            except Exception:
                logger.exception("executor status callback raised for job %s", job.id)

    def _set_job_status(self, job: Job, status: JobStatus) -> None:
        """Enter ``status`` and record it in the job registry (:mod:`psij.registry`); every
        executor reports statuses through here. For a job that may run again
        (:mod:`psij._retry`), a FAILED status may start its next run instead, and from its
        second run on every status's metadata holds its ``attempt``."""
        runs = job.__dict__.get("_runs")
        if runs is not None:
            try:
                through = self._through_runs(job, runs, status)
            except Exception:  # the job ends, or goes on, as told: only its rerun is lost
                logger.exception("job %s: could not decide its next run", job.id)
                through = status
            if through is None:
                return
            status = through
        try:
            entered = job._set_status(status)
        except Exception as ex:
            logger.warning("could not set status of job %s: %s", job.id, ex)
            return
        if entered:
            from psij._registry.recorder import record

            record(self, job)

    def _through_runs(self, job: Job, runs: "_retry.Runs", status: JobStatus
                      ) -> Optional[JobStatus]:
        """``status`` as the job enters it (its metadata with the attempt), or None when it
        started the job's next run instead (see :meth:`_set_job_status`)."""
        state = status.state
        told = (status.metadata or {}).get("attempt") if self._RERUNS == "told" else None
        if state is JobState.QUEUED and isinstance(told, int) and told > runs.attempt:
            # The backend started the job's next run (the job may not have been seen ACTIVE:
            # a run may fail before it starts).
            runs.attempt = told
            self._enter_rerun(job, status)
            return None
        if state is JobState.QUEUED and job.status.state is JobState.ACTIVE:
            rerun = _retry.scheduler_requeue(runs, status) \
                if self._RERUNS == "submits" and self._REQUEUES_ITSELF else None
            if rerun is not None:  # the scheduler requeued the job itself
                _retry.counted(runs, rerun)
                self._enter_rerun(job, _retry.rerun_status(rerun, runs, status,
                                                           job._native_id))
                return None
        elif state is JobState.FAILED and self._RERUNS == "submits" \
                and not job.__dict__.get("_runs_followed"):
            # A job attached again (psij.registry) is followed, not run again, by this
            # process: the one that submitted it may be doing so.
            rerun = _retry.next_run(job, runs, status)
            if rerun is not None:
                failed = self._start_rerun(job, runs, rerun, status)
                if failed is None:
                    return None
                status = failed
        if runs.attempt > 1:
            meta = dict(status.metadata or {})
            meta.setdefault("attempt", runs.attempt)
            status = JobStatus(status.state, status.time, status.message, status.exit_code,
                               meta)
        return status

    def _enter_rerun(self, job: Job, status: JobStatus) -> bool:
        if not job._rerun(status):
            return False
        from psij._registry.recorder import record

        record(self, job)
        return True

    def _start_rerun(self, job: Job, runs: "_retry.Runs", rerun: "_retry.Rerun",
                     failed: JobStatus) -> Optional[JobStatus]:
        """Start ``rerun`` of ``job`` after its run ended with ``failed``: None once started,
        else the status the job ends with (``failed``, saying why it could not run again)."""
        assert job.spec is not None  # next_run gives no run to a job without a spec
        spec = _retry.spec_for(job.spec, rerun)
        status = _retry.rerun_status(rerun, runs, failed, job._native_id, spec)
        before = (job.spec, runs.attempt, runs.requeues, runs.retries)
        job.spec = spec
        _retry.counted(runs, rerun)
        if not self._enter_rerun(job, status):  # final meanwhile (cancelled)
            job.spec, runs.attempt, runs.requeues, runs.retries = before
            return failed
        native_id = job._native_id
        try:
            self._run_again(job, rerun)
            if job._native_id != native_id and job._native_id is not None:
                from psij._registry.recorder import record

                record(self, job)  # the new run's native id, before it changes state
            return None
        except Exception as ex:
            logger.warning("job %s: could not start run %d: %s", job.id, rerun.attempt, ex)
            return JobStatus(failed.state, failed.time,
                             f"{failed.message or 'the job failed'}; running it again "
                             f"({rerun.kind} after {rerun.cause}) failed: {ex}",
                             failed.exit_code, failed.metadata)

    def _run_again(self, job: Job, rerun: "_retry.Rerun") -> None:
        """Start the next run of ``job`` (QUEUED again, its ``spec`` the run's): executors
        whose ``_RERUNS`` is "submits" implement it; raise when it cannot start (the job then
        ends with the status of its run before)."""
        raise NotImplementedError(f"{type(self).__name__} does not run jobs again")

    def _restate_job_status(self, job: Job, status: JobStatus) -> None:
        """Replace the status of ``job`` by ``status`` of the state it is in, when more is known
        about it (see ``Job._restate``), and record it in the job registry."""
        if job._restate(status):
            from psij._registry.recorder import record

            record(self, job)

    def _get_launcher(self, name: str, version_constraint: Optional[str] = None) -> Launcher:
        with self._launchers_lock:
            launcher = self._launchers.get(name)
            if launcher is None:
                try:
                    launcher = Launcher.get_instance(name, version_constraint=version_constraint,
                                                     config=self.config)
                except ValueError as ex:  # the name comes from JobSpec.launcher
                    raise ValueError(f"JobSpec.launcher: {ex}") from None
                self._launchers[name] = launcher
            return launcher

    @staticmethod
    def get_instance(name: str, version_constraint: Optional[str] = None,
                     url: Optional[str] = None,
                     config: Optional[JobExecutorConfig] = None) -> "JobExecutor":
        """A new executor of the named kind (highest version matching the constraint).

        Raises ValueError for an unknown name (listing the known ones), an unsatisfiable
        constraint, or a plugin that failed to load.
        """
        if isinstance(url, str) and url[:6].lower() == "ssh://":
            # The executor of another host (psij.remote, a layer above: loaded by name, as
            # every executor is).
            import importlib

            remote = importlib.import_module("psij.remote._executor")
            made: JobExecutor = remote.remote_executor(name, version_constraint, url, config)
            return made
        from psij._plugins import REGISTRY

        entry = REGISTRY.select("executor", name, version_constraint, base=JobExecutor)
        assert entry.cls is not None and issubclass(entry.cls, JobExecutor)  # select checked it
        inst: JobExecutor = entry.cls.__new__(entry.cls)
        inst.__dict__["_psij_plugin"] = (name, entry.desc.version)
        inst.__init__(url=url, config=config)  # type: ignore[misc]
        return inst

    @staticmethod
    def get_executor_names() -> Set[str]:
        """Names of all known executors."""
        from psij._plugins import REGISTRY

        return set(REGISTRY.names("executor"))

    @staticmethod
    def register_executor(desc: "Descriptor", root: str) -> None:
        """Declare an executor by hand, as a descriptor file in ``root`` would."""
        from psij._plugins import REGISTRY

        REGISTRY.register("executor", desc, root)

    def close(self) -> None:  # noqa: B027 (optional hook: most executors hold nothing)
        """Release what this executor holds (threads, connections, folders); after it, submit
        raises. Executors that hold nothing do nothing. ``with executor:`` calls it on leaving
        the block, whether the block raised or not."""

    def __enter__(self) -> "JobExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __str__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    __repr__ = __str__


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "Descriptor": "psij.descriptor",
        "FunctionJobStatusCallback": "psij.job",
        "ResourceSpecV1": "psij.resource_spec",
    })
