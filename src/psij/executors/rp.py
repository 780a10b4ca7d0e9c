"""The ``rp`` executor: runs each job as a task of a RADICAL-Pilot pilot.

Declared only where ``radical.pilot`` can be imported (``psij-descriptors/psij_rp.py``); this
module itself imports it only when the executor starts its session, so that it can be imported,
and its errors read, without RADICAL-Pilot.

The executor starts one RADICAL-Pilot session, pilot manager and task manager on the first job
(or ``list``/``attach``), and submits one pilot described by its configuration
(:class:`RPExecutorConfig`: ``resource``, by default ``local.localhost``, ``cores`` and
``runtime`` in minutes); ``close`` ends the session. A job becomes a task named after
``job.id``; its native id is the task's uid. The task's states map to the job's: until the
agent runs it QUEUED, ``AGENT_EXECUTING`` ACTIVE, ``DONE`` COMPLETED, ``FAILED`` FAILED (with the
task's exit code and the end of its standard error) and ``CANCELED`` CANCELED.

What a job's spec becomes: executable and arguments, environment (added to the agent's;
``inherit_environment=False`` is refused, as a task always inherits it), directory (the task's
sandbox), stdout and stderr paths, ``pre_launch``/``post_launch`` (sourced before/after the
executable in the task's shell), and the resources (``ranks`` = process count, cores and GPUs
per rank). ``stdin_path`` is refused: a task has no standard input.
"""

import os
import shlex
import threading
from typing import Any, Dict, List, Optional, Tuple

from psij import _check
from psij._lazylog import LazyLogger
from psij.exceptions import InvalidJobException, SubmitException
from psij.job import Job
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = ["RPExecutorConfig", "RPJobExecutor"]

logger = LazyLogger(__name__)

# RADICAL-Pilot task states (radical.pilot.states) that change the job's state.
_STATES = {"AGENT_EXECUTING": JobState.ACTIVE, "DONE": JobState.COMPLETED,
           "FAILED": JobState.FAILED, "CANCELED": JobState.CANCELED}


class RPExecutorConfig(JobExecutorConfig):
    """Configuration of the ``rp`` executor: the pilot it submits.

    ``resource``: a RADICAL-Pilot resource label (``local.localhost`` runs the pilot on this
    machine); ``cores``: cores of the pilot (None: this machine's count); ``runtime``: the
    pilot's lifetime in minutes.
    """

    def __init__(self, launcher_log_file: Any = None, work_directory: Any = None,
                 resource: str = "local.localhost", cores: Optional[int] = None,
                 runtime: int = 15) -> None:
        super().__init__(launcher_log_file=launcher_log_file, work_directory=work_directory)
        if not isinstance(resource, str) or not resource.strip() or "\n" in resource:
            raise _check.fail_type("RPExecutorConfig.resource", resource,
                                   "a RADICAL-Pilot resource label such as 'local.localhost'")
        for field, value in (("cores", cores), ("runtime", runtime)):
            if value is None and field == "cores":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
                raise ValueError(f"RPExecutorConfig.{field}: expected a positive whole number, "
                                 f"got {value!r}")
        self.resource = resource
        self.cores = cores
        self.runtime = runtime


class RPJobExecutor(JobExecutor):
    """Runs jobs as RADICAL-Pilot tasks (name ``rp``)."""

    _NAME_ = "rp"

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        if config is None:
            config = RPExecutorConfig()
        elif not isinstance(config, RPExecutorConfig):
            if not isinstance(config, JobExecutorConfig):
                raise _check.fail_type("RPJobExecutor config", config,
                                       "psij.JobExecutorConfig or None")
            config = RPExecutorConfig(launcher_log_file=config.launcher_log_file,
                                      work_directory=config.work_directory)
        super().__init__(url=url, config=config)
        self._lock = threading.RLock()
        self._rp: Any = None
        self._session: Any = None
        self._tmgr: Any = None
        self._jobs: Dict[str, Job] = {}  # by task uid
        self._by_name: Dict[str, Job] = {}  # by job id, until the task's uid is known

    # ----------------------------------------------------------------------- session

    def _manager(self) -> Any:
        """The task manager, with the session and pilot started on the first call."""
        with self._lock:
            if self._tmgr is not None:
                return self._tmgr
            try:
                import radical.pilot as rp  # type: ignore[import-not-found,unused-ignore]
            except ImportError as e:
                raise SubmitException("the rp executor needs RADICAL-Pilot (the radical.pilot "
                                      f"package), which cannot be imported: {e}") from e
            assert isinstance(self.config, RPExecutorConfig)
            cfg = self.config
            session = rp.Session()
            try:
                pmgr = rp.PilotManager(session=session)
                tmgr = rp.TaskManager(session=session)
                tmgr.register_callback(self._task_changed)
                pilot = pmgr.submit_pilots(rp.PilotDescription({
                    "resource": cfg.resource, "cores": cfg.cores or os.cpu_count() or 1,
                    "runtime": cfg.runtime}))
                tmgr.add_pilots(pilot)
            except Exception as e:
                session.close(download=False)
                raise SubmitException(f"RADICAL-Pilot could not start a pilot on "
                                      f"{cfg.resource}: {e}") from e
            self._rp, self._session, self._tmgr = rp, session, tmgr
            return tmgr

    def close(self) -> None:
        """End the RADICAL-Pilot session (its pilot and the tasks still running)."""
        with self._lock:
            session, self._session, self._tmgr = self._session, None, None
        if session is not None:
            session.close(download=False)

    # ----------------------------------------------------------------------- jobs

    def submit(self, job: Job) -> None:
        """Submit ``job`` as a task of this executor's pilot."""
        spec = self._check_job(job)
        try:
            description = self._description(job, spec)
            tmgr = self._manager()
            with self._lock:
                self._by_name[job.id] = job
            task = tmgr.submit_tasks(self._rp.TaskDescription(description))
        except Exception as e:
            with self._lock:
                self._by_name.pop(job.id, None)
            job.executor = None
            if isinstance(e, (InvalidJobException, SubmitException)):
                raise
            raise SubmitException(f"RADICAL-Pilot did not take job {job.id}: {e}") from e
        self._track(job, task)

    def _track(self, job: Job, task: Any) -> None:
        with self._lock:
            self._jobs[str(task.uid)] = job
            self._by_name.pop(job.id, None)
        job._native_id = str(task.uid)
        if job.status.state is JobState.NEW:
            self._set_job_status(job, JobStatus(JobState.QUEUED))
        self._task_changed(task, task.state)

    def _description(self, job: Job, spec: JobSpec) -> Dict[str, Any]:
        if spec.executable is None:
            raise InvalidJobException(f"job {job.id}: JobSpec.executable is not set")
        if spec.stdin_path is not None:
            raise InvalidJobException(f"job {job.id}: JobSpec.stdin_path: a RADICAL-Pilot task "
                                      "has no standard input; leave it None")
        if not spec.inherit_environment:
            raise InvalidJobException(f"job {job.id}: JobSpec.inherit_environment=False: a "
                                      "RADICAL-Pilot task always inherits its agent's "
                                      "environment; leave it True")
        resources = spec.resources or ResourceSpecV1()
        if not isinstance(resources, ResourceSpecV1):
            raise InvalidJobException(f"job {job.id}: JobSpec.resources: only ResourceSpecV1 "
                                      "is understood")
        d: Dict[str, Any] = {
            "name": job.id, "executable": str(spec.executable),
            "arguments": [str(a) for a in spec.arguments or []],
            "environment": {k: str(v) for k, v in (spec.environment or {}).items()},
            "ranks": resources.computed_process_count,
            "cores_per_rank": resources.cpu_cores_per_process or 1,
        }
        if resources.gpu_cores_per_process:
            d["gpus_per_rank"] = resources.gpu_cores_per_process
        if spec.directory is not None:
            d["sandbox"] = str(spec.directory)
        if spec.stdout_path is not None:
            d["stdout"] = str(spec.stdout_path)
        if spec.stderr_path is not None:
            d["stderr"] = str(spec.stderr_path)
        if spec.pre_launch is not None:
            d["pre_exec"] = [". " + shlex.quote(str(spec.pre_launch))]
        if spec.post_launch is not None:
            d["post_exec"] = [". " + shlex.quote(str(spec.post_launch))]
        return d

    def _task_changed(self, task: Any, state: Any) -> None:
        """RADICAL-Pilot's callback for a task's state change (in its own thread)."""
        try:
            with self._lock:
                job = self._jobs.get(str(task.uid)) or self._by_name.get(str(task.name))
            if job is None:
                return
            status = self._status(task, str(state))
            if status is not None:
                self._set_job_status(job, status)
        except Exception:  # an error here must not stop RADICAL-Pilot's callback thread
            logger.exception("rp executor: task %s state %s", getattr(task, "uid", "?"), state)

    def _status(self, task: Any, state: str) -> Optional[JobStatus]:
        mapped = _STATES.get(state)
        metadata: Dict[str, object] = {"native_state": state}
        if mapped is None:
            return None
        if mapped is JobState.COMPLETED or mapped is JobState.FAILED:
            code = task.exit_code
            if mapped is JobState.COMPLETED and code not in (None, 0):
                mapped = JobState.FAILED
            message = None
            if mapped is JobState.FAILED:
                tail = (task.stderr or "").strip()[-2000:]
                message = f"the RADICAL-Pilot task {task.uid} failed" + \
                    (f" (exit code {code})" if code is not None else "") + \
                    (f": {tail}" if tail else "")
            return JobStatus(mapped, exit_code=code, message=message, metadata=metadata)
        return JobStatus(mapped, metadata=metadata)

    def cancel(self, job: Job) -> None:
        """Cancel ``job``'s task; a job not submitted yet ends CANCELED at once."""
        if job.status.final:
            return
        native_id = job.native_id
        if native_id is None:
            self._set_job_status(job, JobStatus(JobState.CANCELED))
            return
        self._manager().cancel_tasks(uids=[native_id])

    def list(self) -> List[str]:
        """The uids of the tasks of this executor's session."""
        return [str(uid) for uid in self._manager().list_tasks()]

    def attach(self, job: Job, native_id: str) -> None:
        """Follow the task ``native_id`` of this executor's session as ``job`` (NEW)."""
        if job.status.state is not JobState.NEW:
            raise InvalidJobException(f"job {job.id} is {job.status.state}, only a NEW job can "
                                      "be attached")
        tasks = self._manager().get_tasks(uids=[native_id])
        found: Tuple[Any, ...] = tuple(t for t in tasks if t is not None) \
            if isinstance(tasks, list) else (tasks,)
        if not found:
            raise InvalidJobException(f"no RADICAL-Pilot task {native_id!r} in this session")
        job.executor = self
        self._track(job, found[0])
