"""The ``pilot`` executor: PSI/J jobs run as tasks of a pilot inside one allocation.

``url=None`` runs an engine in this process on the allocation it finds (this machine's cores,
or the nodes of the Slurm, PBS, Grid Engine or LSF job it runs in; nodes or cores given in the
config win). ``url="unix:///path"`` (or a plain path) submits into a pilot started with
``psij pilot serve --socket PATH``, from any process of the same user.

A job becomes one task: its executable starts once, on the first node of its share, in its own
process group, with ``PSIJ_NODEFILE``, ``TMPDIR`` and the ``SLURM_*``/``QCG_PM_*`` variables of
that share. The task id is the job's native id. Custom attributes:

- ``psij.priority`` (or ``pilot.priority``; a whole number): higher starts first;
- ``pilot.after`` (comma-separated): names of jobs submitted through this executor, or native
  ids of any tasks of the pilot, that must all complete first; when one of them fails or is
  cancelled, the job ends FAILED with a message naming it;
- ``pilot.time_limit`` (seconds): the task is killed (TERM, then KILL after the grace period)
  and FAILED (status metadata ``cause``: ``time_limit``) when it runs longer.
  ``JobAttributes.duration`` is not enforced, as with the local executor: its default would
  end every long task;
- ``psij.signal_before_end`` (``SIGNAL@SECONDS``): the signal sent to the task's process group
  that many seconds before its ``pilot.time_limit`` (without one the job is refused).

Only the ``single`` launcher is accepted (the task itself uses the node file to start more
processes), and no pre/post-launch scripts: such jobs are refused at submission. Staging runs in
the task, before and after the job (see ``psij.executors.pilot._staging``).

A job's final status carries the figures of its run in its metadata (absent when not known):
``queued_at``, ``started_at``, ``ended_at`` (the pilot's clock), ``cpu_seconds`` and
``max_rss_bytes`` (of the task's process as the process that started it reaped it: ``wait4``,
counting the descendants it waited for), ``nodes`` (comma-separated; on every status once
placed), ``cores``, ``requested_seconds`` (``pilot.time_limit``), ``requested_memory_bytes``
(the memory the pilot booked) and ``run`` (the job's run number); see the pilot's
documentation for what is and is not counted.

A job with ``psij.requeue`` or ``psij.retry`` (see ``psij._retry``) that is run again
becomes a new task of the pilot, named ``<job id>.<attempt>`` (its native id from then on);
a retry after its time limit has its ``pilot.time_limit`` scaled as its duration is.
"""

import os
import threading
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from psij import _check, _retry, _site_config
from psij._end_signal import end_signal
from psij._priority import job_priority
from psij._registry.durable import commit_rows
from psij.exceptions import InvalidJobException, SubmitException
from psij.executors._gpu_detect import GpuSet, found_gpus, gpus_from_setting
from psij.executors.pilot._engine_events import ended_by_time_limit
from psij.executors.pilot._reruns import CANCELED, run_again
from psij.executors.pilot._staging import final_status, with_staging
from psij.executors.pilot.allocation import (
    Allocation,
    configured_allocation,
    discover_allocation,
    nodes_from_spec,
    with_local_gpus,
)
from psij.executors.pilot.engine import PilotEngine
from psij.executors.pilot.engine_config import EngineConfig
from psij.executors.pilot.resources import NodeSpec, ResourceRequest
from psij.executors.pilot.scheduler import TaskState
from psij.executors.pilot.service import PilotClient, PilotUnavailable, socket_path_of
from psij.executors.pilot.tasks import TaskEvent, TaskSpec, TaskStatus, TaskUse
from psij.job import Job
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = ["PilotJobExecutor", "PilotJobExecutorConfig"]

NodesLike = Union[str, Sequence[Union[NodeSpec, Tuple[str, int]]]]
_GPUS_FIELD = "PilotJobExecutorConfig.gpus"


class PilotJobExecutorConfig(JobExecutorConfig):
    """Configuration of an in-process pilot (ignored when the executor has a url).

    ``nodes``: explicit nodes (``"n1:4,n2:4"`` or a list of NodeSpec / (name, cores)), reached
    through agents started with ``agent_launcher`` (an argument prefix with ``{node}``; empty
    runs them on this machine) unless named ``local_node``. ``cores``: the number of local
    cores when no allocation is found. ``gpus``: the GPUs of the node this process runs on, a
    count (the first ones found, else ids ``0`` to ``N - 1``) or ids (``"0,2"`` or a list of
    str); by default those found there (see the GPUs section of the pilot documentation).
    ``journal`` with ``resume``: see the engine. ``allocation_policy``: an
    :class:`~psij.executors.pilot.allocation_policy.AllocationPolicy`, for a pilot that asks
    for allocations through another executor as work waits and gives them back when idle
    (see the elastic section of the pilot documentation).
    """

    def __init__(self, launcher_log_file: Union[str, Path, None] = None,
                 work_directory: Union[str, Path, None] = None,
                 nodes: Optional[NodesLike] = None, cores: Optional[int] = None,
                 cancel_grace_period: float = 5.0,
                 agent_launcher: Optional[Sequence[str]] = None,
                 local_node: Optional[str] = None,
                 journal: Union[str, Path, None] = None, resume: bool = False,
                 gpus: Union[int, str, Sequence[str], None] = None,
                 allocation_policy: Optional[Any] = None) -> None:
        super().__init__(launcher_log_file=launcher_log_file, work_directory=work_directory)
        self.nodes = self._nodes(nodes)
        self.cores = _check.opt_int("PilotJobExecutorConfig.cores", cores, minimum=1)
        self.cancel_grace_period = _check.seconds(
            "PilotJobExecutorConfig.cancel_grace_period", cancel_grace_period)
        self.agent_launcher = tuple(_check.opt_str_list(
            "PilotJobExecutorConfig.agent_launcher", agent_launcher) or ())
        self.local_node = _check.opt_str("PilotJobExecutorConfig.local_node", local_node)
        self.journal = _check.opt_path("PilotJobExecutorConfig.journal", journal)
        self.resume = _check.opt_bool("PilotJobExecutorConfig.resume", resume)
        if gpus is not None:  # checked now; the machine's GPUs are looked for at start
            gpus_from_setting(_GPUS_FIELD, _listed(gpus), GpuSet(()))
        self.gpus = gpus
        if allocation_policy is not None:
            from psij.executors.pilot.allocation_policy import AllocationPolicy
            _check.instance("PilotJobExecutorConfig.allocation_policy", allocation_policy,
                            AllocationPolicy, "AllocationPolicy")
        self.allocation_policy = allocation_policy

    @staticmethod
    def _nodes(nodes: Optional[NodesLike]) -> Optional[List[NodeSpec]]:
        if nodes is None:
            return None
        if isinstance(nodes, str):
            return nodes_from_spec(nodes)
        return list(configured_allocation(nodes).nodes)

    def allocation(self) -> Allocation:
        if self.nodes is not None:
            found = configured_allocation(self.nodes, self.local_node, self.agent_launcher)
        else:
            found = discover_allocation(cores=self.cores)
        gpus = getattr(self, "gpus", None)
        if gpus is None:
            return with_local_gpus(found, found_gpus())
        return with_local_gpus(found, gpus_from_setting(_GPUS_FIELD, _listed(gpus)), True)


def _listed(gpus: Any) -> Any:
    """A ``gpus`` setting with a tuple of ids as a list (anything else as it is: checked by
    ``gpus_from_setting``)."""
    return list(gpus) if isinstance(gpus, tuple) else gpus


class _Held:
    """What an executor must stop when it is closed or collected (it never refers to the
    executor, or the executor could not be collected)."""

    def __init__(self) -> None:
        self.engine: Optional[PilotEngine] = None
        self.client: Optional[PilotClient] = None

    def close(self, wait: bool = True) -> None:
        """``wait=False`` (the executor was collected, in whatever thread let it go, perhaps
        one of psij's own that others wait for): the engine thread stops the pilot and
        removes its run folder on its own, so that this returns at once."""
        engine, self.engine = self.engine, None
        client, self.client = self.client, None
        if engine is not None:
            engine.close(wait=wait)
        if client is not None:
            client.close()

    def collected(self) -> None:
        self.close(wait=False)


class _WeakMethod:
    """Calls ``owner.<name>(...)`` while the owner lives; does nothing after."""

    __slots__ = ("_name", "_ref")

    def __init__(self, owner: object, name: str) -> None:
        self._ref = weakref.ref(owner)
        self._name = name

    def __call__(self, *args: Any) -> None:
        owner = self._ref()
        if owner is not None:
            getattr(owner, self._name)(*args)


_FINAL_STATES = {
    TaskState.SUCCEEDED: JobState.COMPLETED,
    TaskState.FAILED: JobState.FAILED,
    TaskState.CANCELED: JobState.CANCELED,
    TaskState.OMITTED: JobState.FAILED,
}


def job_status_of(state: TaskState, message: Optional[str], exit_code: Optional[int],
                  nodes: Optional[Sequence[str]], time: Optional[float] = None,
                  use: Optional[TaskUse] = None, run: Optional[int] = None) -> JobStatus:
    """The PSI/J status of a task state; a final one carries the figures of the run
    (``use``, and ``run``: the job's run number)."""
    metadata: Optional[Dict[str, Any]] = {"pilot_state": state.value}
    assert metadata is not None
    if nodes:
        metadata["nodes"] = ",".join(nodes)
    if state.final:
        if use is not None:
            metadata.update(use.to_json())
        if run is not None:
            metadata["run"] = run
    if state in (TaskState.WAITING, TaskState.QUEUED):
        return JobStatus(JobState.QUEUED, time=time, metadata=metadata)
    if state is TaskState.RUNNING:
        return JobStatus(JobState.ACTIVE, time=time, metadata=metadata)
    if state is TaskState.FAILED and ended_by_time_limit(message):
        metadata["cause"] = "time_limit"
    if state is TaskState.OMITTED:
        message = f"not run because a job it depends on did not complete ({message})"
    elif state is TaskState.SUCCEEDED:
        message = None
    return JobStatus(_FINAL_STATES[state], time=time, message=message, exit_code=exit_code,
                     metadata=metadata)


class PilotJobExecutor(JobExecutor):
    """Runs jobs as tasks of a pilot (see the module documentation)."""

    _RERUNS = "submits"  # a new task for each run
    _REQUEUES_ITSELF = False

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        if config is None:
            config = _site_config.config_defaults(self.name, PilotJobExecutorConfig())
        super().__init__(url=url, config=config)
        self._path = None if url is None else socket_path_of(url)
        self._lock = threading.Lock()
        self._jobs: Dict[str, List[Job]] = {}  # by task id, until final (attach adds more)
        self._by_name: Dict[str, List[str]] = {}  # job name -> task ids, for pilot.after
        self._engine: Optional[PilotEngine] = None
        self._client: Optional[PilotClient] = None
        # The engine and the client reach this executor only through weak references, so an
        # executor dropped without close() is collected, and this finalizer then stops them.
        self._held = _Held()
        self._closed = False
        self._finalizer = weakref.finalize(self, self._held.collected)
        self._finalizer.atexit = False  # at exit, tasks are left as a killed process leaves them
        self._listener = _WeakMethod(self, "_on_event")

    # -- the pilot behind this executor -----------------------------------------------------

    def _local_engine(self) -> PilotEngine:
        with self._lock:
            if self._engine is None:
                config = self.config
                if not isinstance(config, PilotJobExecutorConfig):
                    config = PilotJobExecutorConfig(
                        launcher_log_file=config.launcher_log_file,
                        work_directory=config.work_directory)
                engine = PilotEngine(config.allocation(), EngineConfig(
                    work_directory=Path(os.getcwd()), journal=config.journal,
                    resume=config.resume, cancel_grace_period=config.cancel_grace_period,
                    allocation_policy=getattr(config, "allocation_policy", None)))
                engine.add_listener(self._listener)
                engine.start()
                self._engine = self._held.engine = engine
            return self._engine

    def _remote(self) -> PilotClient:
        with self._lock:
            if self._client is None:
                assert self._path is not None
                self._client = self._held.client = PilotClient(
                    self._path, on_event=self._listener, on_lost=_WeakMethod(self, "_on_lost"))
            return self._client

    def close(self) -> None:
        """Stop the in-process pilot (its running tasks are cancelled, its run folder removed),
        or disconnect; later submits raise."""
        with self._lock:
            self._closed = True
            self._engine = self._client = None
        self._held.close()

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if self._closed:
            raise SubmitException(f"{self} is closed")
        spec = self._check_job(job)
        try:
            _site_config.apply_job_defaults(self.name, spec)
            task = self._task_of(job)
        except BaseException:
            job.executor = None
            raise
        try:
            self._send(job, task)
        except BaseException:
            job.executor = None
            raise
        if self._path is not None:
            # The served pilot journaled the task before it answered; its row is committed
            # before submit returns: both outlive this process (docs/registry.rst).
            commit_rows(self, [job])
        if spec.name is not None:
            with self._lock:
                self._by_name.setdefault(spec.name, []).append(task.name)
        self._set_job_status(job, JobStatus(JobState.QUEUED,
                                            metadata={"pilot_state": "QUEUED"}))

    def _send(self, job: Job, task: TaskSpec) -> None:
        """Submit ``task``, the job's run, to the pilot; the job's native id becomes its name
        (and stays what it was when this raises)."""
        with self._lock:
            self._jobs[task.name] = [job]
        before, job._native_id = job._native_id, task.name
        try:
            if self._path is None:
                self._local_engine().submit(task)
            else:
                self._remote().request("submit", tasks=[task.to_json()], watch=True)
        except BaseException as ex:
            with self._lock:
                self._forget(task.name, job)
            job._native_id = before
            if isinstance(ex, (ValueError, TypeError)):
                raise SubmitException(f"job {job.id}: {ex}") from ex
            if isinstance(ex, (PilotUnavailable, TimeoutError, RuntimeError)):
                raise SubmitException(f"job {job.id} could not be submitted: {ex}") from ex
            raise

    def _run_again(self, job: Job, rerun: _retry.Rerun) -> None:
        run_again(self, job, rerun)

    def cancel(self, job: Job) -> None:
        if job.executor is not self:
            raise InvalidJobException(f"job {job.id} was not submitted to this executor")
        job.__dict__[CANCELED] = True  # read by a next run starting meanwhile (_run_again)
        task_id = job.native_id
        if task_id is None or job.status.final:
            return
        try:
            if self._path is None:
                self._local_engine().cancel(task_id)
            else:
                self._remote().request("cancel", task=task_id)
        except ValueError as ex:
            raise InvalidJobException(f"job {job.id}: {ex}") from ex
        except (PilotUnavailable, TimeoutError) as ex:
            raise SubmitException(f"job {job.id} could not be cancelled: {ex}") from ex

    def allocations(self) -> Dict[str, Any]:
        """An elastic pilot's allocations and backlog (see ``ElasticAllocations.status``);
        raises ``ValueError`` for a pilot without an allocation policy."""
        if self._path is not None:
            reply: Dict[str, Any] = self._remote().request("allocations")["allocations"]
            return reply
        elastic = self._local_engine().elastic
        if elastic is None:
            raise ValueError("allocations: this pilot has no allocation policy")
        return elastic.status()

    def list(self) -> List[str]:
        """Native ids of the pilot's tasks that have not ended."""
        if self._path is None:
            return [s.task_id for s in self._local_engine().statuses()
                    if not s.state.final]
        reply = self._remote().request("list")
        return [name for name, state in reply["tasks"] if not TaskState(state).final]

    def attach(self, job: Job, native_id: str) -> None:
        """Follow a task of the pilot (submitted by any process) by its native id."""
        if not isinstance(native_id, str) or native_id == "":
            raise ValueError(f"attach native_id: expected a task id, got {native_id!r}")
        if job.status.state is not JobState.NEW or job.executor is not None:
            raise InvalidJobException(f"attach: job {job.id} must be NEW and not yet bound")
        job.executor = self
        job._native_id = native_id
        with self._lock:
            self._jobs.setdefault(native_id, []).append(job)
        try:
            if self._path is None:
                status = self._local_engine().status(native_id)
            else:
                reply = self._remote().request("watch", tasks=[native_id])
                status = TaskStatus.from_json(reply["statuses"][0])
        except BaseException as ex:
            with self._lock:
                self._forget(native_id, job)
            job.executor = None
            job._native_id = None
            if isinstance(ex, ValueError):
                raise InvalidJobException(f"attach: {ex}") from ex
            raise
        self._apply(job, status.state, status.message, status.exit_code,
                    None if status.share is None else status.share.nodes, use=status.use)

    # -- events -----------------------------------------------------------------------------

    def _forget(self, task_id: str, job: Job) -> None:
        # Called with the lock held.
        jobs = self._jobs.get(task_id)
        if jobs is not None and job in jobs:
            jobs.remove(job)
            if not jobs:
                del self._jobs[task_id]

    def _on_event(self, event: TaskEvent) -> None:
        with self._lock:
            jobs = list(self._jobs.get(event.task_id, ()))
        nodes = None if event.share is None else event.share.nodes
        for job in jobs:
            self._apply(job, event.state, event.message, event.exit_code, nodes, event.time,
                        event.use)

    def _apply(self, job: Job, state: TaskState, message: Optional[str],
               exit_code: Optional[int], nodes: Optional[Sequence[str]],
               time: Optional[float] = None, use: Optional[TaskUse] = None) -> None:
        status = job_status_of(state, message, exit_code, nodes, time, use,
                               _retry.run_attempt(job) or 1 if state.final else None)
        if state.final:
            with self._lock:
                self._forget(job.native_id or "", job)
            status = final_status(status, job.native_id or "", Path(self.config.work_directory))
        self._set_job_status(job, status)

    def _on_lost(self, reason: str) -> None:
        with self._lock:
            jobs = [job for group in self._jobs.values() for job in group]
            self._jobs.clear()
            self._client = None
        for job in jobs:
            self._set_job_status(job, JobStatus(
                JobState.FAILED, message=f"lost the pilot before the job ended: {reason}"))

    # -- JobSpec to task --------------------------------------------------------------------

    def _task_of(self, job: Job, name: Optional[str] = None) -> TaskSpec:
        spec = job.spec
        assert spec is not None
        if spec.executable is None:
            raise InvalidJobException("JobSpec.executable: a job needs an executable")
        if spec.launcher not in (None, "single"):
            raise InvalidJobException(
                f"JobSpec.launcher: {spec.launcher!r} is not supported by the pilot executor, "
                "which starts the executable once on the first node of the job's share; use "
                "'single' and start more processes from the job with $PSIJ_NODEFILE")
        for field in ("pre_launch", "post_launch"):
            if getattr(spec, field):
                raise InvalidJobException(f"JobSpec.{field}: not supported by the pilot "
                                          "executor")
        resources = spec.resources
        if resources is None:
            request = ResourceRequest()
        elif isinstance(resources, ResourceSpecV1):
            request = ResourceRequest.from_resource_spec(resources)
        else:
            raise InvalidJobException(f"JobSpec.resources: expected ResourceSpecV1, got "
                                      f"{type(resources).__name__}")
        directory = os.path.abspath(spec.directory) if spec.directory is not None \
            else os.getcwd()
        attributes = spec.attributes
        priority = _integer_priority(job_priority(attributes))
        after = self._after(attributes.get_custom_attribute("pilot.after")
                            if attributes else None)
        limit = attributes.get_custom_attribute("pilot.time_limit") if attributes else None
        if limit is not None:
            try:
                limit = _check.seconds("custom attribute pilot.time_limit", limit, positive=True)
            except (TypeError, ValueError) as ex:
                raise InvalidJobException(str(ex)) from ex
        warning = end_signal(attributes.custom_attributes if attributes else None,
                             None if limit is None else timedelta(seconds=limit),
                             "custom attribute pilot.time_limit")
        return with_staging(TaskSpec(
            name=job.id if name is None else name, executable=spec.executable,
            arguments=tuple(spec.arguments or ()),
            directory=directory, environment=_retry.run_environment(job, spec.environment),
            inherit_environment=spec.inherit_environment,
            stdin=None if spec.stdin_path is None else str(spec.stdin_path),
            stdout=None if spec.stdout_path is None else str(spec.stdout_path),
            stderr=None if spec.stderr_path is None else str(spec.stderr_path),
            resources=request, priority=priority, after=tuple(after),
            time_limit=limit,
            end_signal=None if warning is None else f"{warning.signal}@{warning.seconds}"),
            spec, Path(self.config.work_directory))

    def _after(self, value: Any) -> List[str]:
        if value is None:
            return []
        if isinstance(value, str):
            names = [n.strip() for n in value.split(",") if n.strip()]
        elif isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value):
            names = list(value)
        else:
            raise InvalidJobException(f"custom attribute pilot.after: expected job names or "
                                      f"native ids separated by commas, got {value!r}")
        ids: List[str] = []
        with self._lock:
            for name in names:
                known = self._by_name.get(name)
                if known is None:
                    ids.append(name)  # a native id, checked by the pilot
                elif len(known) > 1:
                    raise InvalidJobException(
                        f"custom attribute pilot.after: {name!r} names {len(known)} jobs of "
                        "this executor; give their native ids instead")
                else:
                    ids.append(known[0])
        return ids


def _integer_priority(value: Union[int, float]) -> int:
    """The pilot orders tasks by integer priorities: an integral float is taken as an int."""
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidJobException(f"custom attribute psij.priority: the pilot executor "
                                      f"takes whole numbers, got {value!r}")
        return int(value)
    return value
