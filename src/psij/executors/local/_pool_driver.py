"""Local jobs run through a resource pool: the ``local`` executor's ``resource_pool`` setting
(also what the batch executors' ``fallback="local"`` uses).

:class:`PoolDriver` feeds the pure machine of :mod:`psij.executors.local._pool_machine` and
carries out its actions: a job that fits starts at once; one that does not waits in this
process, reported QUEUED with ``waiting_for: "local resources"`` (and ``waiting``: how many
jobs wait with it) in its status metadata, and :data:`WAITING_MESSAGE` as its message (which
the registry recognises: only this process can follow such a job, it has no native id yet);
waiting jobs start in priority order (the ``psij.priority`` custom attribute, higher first;
then by arrival) as running ones end; a waiting job that is cancelled ends CANCELED without
ever starting; a job that asks for more of any resource than the pool has runs alone. A job
that asks for GPUs (GPUs per process times processes) is started with its own GPU ids in its
environment (``CUDA_VISIBLE_DEVICES``, or ``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``
on AMD; see :mod:`psij.executors.local._pool_gpus`), unless its specification sets that
variable itself. The executor says how to start a job and how to report a status; the driver
does the rest. A job that waits is recorded in the job registry as held by this process before
``submit`` returns (:mod:`psij._registry.held`, through the executor's ``mark``), as being
started when its turn comes, and as no longer held once started, cancelled or failed, so that
``psij list`` tells the jobs of a process that ended before their turn and ``psij release``
starts them.

The setting (checked by :func:`psij._check.resource_pool`): ``False`` (no pool: every job
starts at once), ``True`` (this machine's cores, memory, free temporary disk and GPUs,
:func:`machine_capacity`) or a dict with any of ``cores`` (int, at least 1), ``memory`` and
``tmp`` (ints, bytes, at least 0) and ``gpus`` (a count from 0 to 4096, or a list of distinct
GPU ids, which the pool then hands out), a missing key meaning this machine's amount.
"""

import os
import shutil
import tempfile
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from psij import _check, _priority
from psij._lazylog import LazyLogger
from psij._registry.held import HELD, SUBMITTING
from psij.executors._gpu_detect import GpuSet
from psij.executors.local._pool_gpus import found_gpus, pool_gpus
from psij.executors.local._pool_machine import (
    Action,
    Amounts,
    Arrived,
    Cancel,
    Dropped,
    Ended,
    LocalPool,
    Start,
    Wait,
)
from psij.job import Job
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = ["WAITING_FOR", "WAITING_MESSAGE", "PoolDriver", "demand_of",
           "machine_capacity", "pool_capacity", "pool_gpu_set"]

logger = LazyLogger(__name__)

# Records jobs as held by this process, being started, or no longer held (ended so when a final
# status is given): :func:`psij._registry.held.mark` for the executor.
Mark = Callable[[Sequence[Job], Optional[str], Optional[Tuple[str, int, str]]], None]

WAITING_FOR = "local resources"
WAITING_MESSAGE = ("waiting for local resources (resource_pool) in the process that "
                   "submitted it")
FIELD = _check.RESOURCE_POOL

ResourcePool = Union[bool, Dict[str, Any]]


def machine_capacity() -> Amounts:
    """This machine's cores, memory, free temporary disk (None where it cannot be read) and
    GPUs (:func:`psij.executors.local._pool_gpus.found_gpus`: 0 when none is found)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        memory: Optional[int] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    try:
        tmp: Optional[int] = shutil.disk_usage(tempfile.gettempdir()).free
    except OSError:
        tmp = None
    return Amounts(cores, memory, tmp, len(found_gpus().ids))


def pool_capacity(setting: ResourcePool) -> Optional[Amounts]:
    """The capacity a checked ``resource_pool`` setting gives; None for no pool."""
    if setting is False:
        return None
    machine = machine_capacity()
    if setting is True:
        return machine
    assert isinstance(setting, dict)
    return Amounts(setting.get("cores", machine.cores), setting.get("memory", machine.memory),
                   setting.get("tmp", machine.tmp), len(pool_gpu_set(setting).ids))


def pool_gpu_set(setting: ResourcePool) -> GpuSet:
    """The GPUs a checked ``resource_pool`` setting (not False) hands out."""
    return pool_gpus(f"{FIELD}['gpus']",
                     setting.get("gpus") if isinstance(setting, dict) else None)


def demand_of(spec: JobSpec) -> Amounts:
    """What a job asks for, all its nodes together (InvalidJobException for a bad
    ``psij.tmp``)."""
    from psij.executors.batch._shapes import job_tmp

    r = spec.resources if isinstance(spec.resources, ResourceSpecV1) else ResourceSpecV1()
    nodes = r.computed_node_count
    tmp = job_tmp(spec)
    processes = r.computed_process_count
    return Amounts(processes * (r.cpu_cores_per_process or 1),
                   None if r.memory is None else r.memory * nodes,
                   None if tmp is None else tmp * nodes,
                   processes * r.gpu_cores_per_process if r.gpu_cores_per_process else None)


class PoolDriver:
    """Runs an executor's jobs through a :class:`LocalPool` (see the module's documentation).

    ``start(payload, environment)`` starts a job the pool let through (raising if it cannot),
    with ``environment`` (its GPUs: ``CUDA_VISIBLE_DEVICES``, or ``ROCR_VISIBLE_DEVICES`` and
    ``HIP_VISIBLE_DEVICES`` on AMD; empty for a job given none) added to its own (but for
    what its specification sets); ``report(payload, status)`` reports a status of a job
    (QUEUED while it waits; CANCELED or FAILED for one that never started). ``gpus`` names
    the pool's GPUs (default: as many of this machine's as the capacity has). The payload
    is what the executor gave :meth:`submit`. The executor calls :meth:`ended` when a job it
    started reaches a final state.
    """

    def __init__(self, capacity: Amounts, start: Callable[[Any, Mapping[str, str]], None],
                 report: Callable[[Any, JobStatus], None],
                 gpus: Optional[GpuSet] = None, mark: Optional[Mark] = None) -> None:
        if gpus is None:
            gpus = pool_gpus(f"{FIELD}['gpus']", capacity.gpus or 0)
        self._gpus = gpus
        self._pool = LocalPool(capacity, gpus.ids)
        self._start = start
        self._report = report
        self._mark: Mark = mark or (lambda jobs, held, final: None)
        self._marking = threading.Lock()
        self._lock = threading.Lock()
        self._jobs: Dict[str, Tuple[Job, Any]] = {}  # waiting or running
        self._todo: Deque[Action] = deque()
        self._performing = False

    @property
    def capacity(self) -> Amounts:
        """The pool's cores, memory, temporary disk and GPUs."""
        return self._pool.capacity

    @property
    def gpu_ids(self) -> Tuple[str, ...]:
        """The ids of the pool's GPUs."""
        return self._pool.gpu_ids

    def _environment(self, start: Start) -> Mapping[str, str]:
        return self._gpus.environment(start.gpus)

    def submit(self, job: Job, spec: JobSpec, payload: Any) -> None:
        """Start the job now if it fits, else report it QUEUED; raises (the pool forgetting the
        job) for a bad priority or ``psij.tmp``, or when the job cannot start now."""
        demand = demand_of(spec)
        priority = _priority.job_priority(spec.attributes)
        with self._marking:  # recorded as held before it is recorded as being started
            with self._lock:
                actions = self._pool.step(Arrived(job.id, demand, priority))
                self._jobs[job.id] = (job, payload)
            mine = next(a for a in actions if a.key == job.id)
            if isinstance(mine, Wait):
                self._mark([job], HELD, None)
        if isinstance(mine, Start):
            try:
                self._start(payload, self._environment(mine))
            except BaseException:
                self.ended(job)
                raise
        elif isinstance(mine, Wait):
            self._report(payload, JobStatus(JobState.QUEUED, message=WAITING_MESSAGE, metadata={
                "waiting_for": WAITING_FOR, "waiting": mine.ahead}))
        self._perform([a for a in actions if a.key != job.id])

    def cancel_waiting(self, job: Job) -> bool:
        """Cancel the job if it waits (it ends CANCELED); False if it does not wait."""
        with self._lock:
            if not self._pool.is_waiting(job.id):
                return False
            actions = self._pool.step(Cancel(job.id))
        self._perform(actions)
        return True

    def ended(self, job: Job) -> None:
        """A job the pool let through reached a final state: its resources are free again."""
        with self._lock:
            if self._jobs.pop(job.id, None) is None:
                return
            actions = self._pool.step(Ended(job.id))
        self._perform(actions)

    def _perform(self, actions: List[Action]) -> None:
        # One thread at a time carries out the actions, in order; a job ending while one is
        # started (on this thread or another) adds its actions to the queue, so the stack never
        # grows with the number of jobs.
        with self._lock:
            self._todo.extend(actions)
            if self._performing:
                return
            self._performing = True
        while True:
            with self._lock:
                if not self._todo:
                    self._performing = False
                    return
                action = self._todo.popleft()
            try:
                self._carry_out(action)
            except Exception:
                logger.exception("local resource pool: %r failed", action)

    def _carry_out(self, action: Action) -> None:
        with self._lock:
            entry = self._jobs.get(str(action.key))
            if entry is not None and isinstance(action, Dropped):
                del self._jobs[str(action.key)]
        if entry is None:
            return
        job, payload = entry
        if isinstance(action, Dropped):
            message = f"cancelled while waiting for {WAITING_FOR}"
            self._report(payload, JobStatus(JobState.CANCELED, message=message))
            self._mark([job], None, (JobState.CANCELED.name, JobState.CANCELED.order, message))
        elif isinstance(action, Start):
            with self._marking:
                self._mark([job], SUBMITTING, None)
            try:
                self._start(payload, self._environment(action))
            except Exception as e:
                logger.warning("local job %s could not be started: %s", action.key, e)
                message = f"could not be started on this machine: {e}"
                self._report(payload, JobStatus(JobState.FAILED, message=message))
                self._mark([job], None, (JobState.FAILED.name, JobState.FAILED.order, message))
                return
            self._mark([job], None, None)
