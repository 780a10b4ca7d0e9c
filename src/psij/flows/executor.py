"""The ``flow`` executor: ordinary PSI/J jobs carried by the handles of a flow service.

Users submit jobs as to any executor; this one groups them by shape (the job's spec, without
its output paths, and the target executor) and keeps one handle of the service per shape,
with as many instances requested as it has jobs waiting for one:

- the first job of a shape creates a handle with count 1, each next one grows it by 1;
- a poller thread reads each handle's status and labels its jobs in submission order: as
  many ACTIVE as the handle has instances provisioned, the others QUEUED (a job once ACTIVE
  stays so: PSI/J states only move forward). It reads them as soon as the service says that
  one of the caller's handles changed (a watcher thread keeps a ``watch`` request, see the
  flows guide, waiting on a connection of its own), and every ``poll_interval`` seconds
  whatever happens (the leases are renewed then; a service without ``watch`` is read only
  so);
- each instance that ends is handed to one job, the oldest ACTIVE one (else the oldest
  QUEUED): its stdout and stderr are fetched from the service into the job's
  ``stdout_path`` and ``stderr_path`` (when set), the job ends COMPLETED (exit code 0) or
  FAILED with the exit code, the instance record is deleted on the service, and the handle
  is shrunk by one with ``not_running`` (so the replacement the service may have queued
  already goes);
- cancelling a job shrinks its handle by one: with ``not_running`` when the job is QUEUED,
  with the configured ``running_victims`` (``longest`` by default), signal and grace when
  it is ACTIVE (the signal, then a kill when the grace is over, also for the last job of a
  handle); the job ends CANCELED, and the instance removed for it is given to no job;
- the leases of every handle are renewed every third of the provisioning lease;
- a handle whose last job has ended is destroyed.

The url is the service's socket (``unix:///path`` or a path; None: the default, see
:func:`psij.flows.client.default_socket`). The target executor is the job's custom attribute
``flow.executor``, else the config's ``executor`` (``local`` by default).
"""

import threading
import weakref
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger
from psij.exceptions import InvalidJobException, SubmitException
from psij.flows.client import FlowClient, FlowError, FlowUnavailable
from psij.job import Job
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["FlowJobExecutor", "FlowJobExecutorConfig"]

logger = LazyLogger("psij.flows.executor")

_WATCH_TIMEOUT = 300.0  # seconds a watch waits on its connection before it is asked again
_WATCH_RETRY = 1.0  # seconds before a watch is asked again after its connection failed
_LEAST_GAP = 0.1  # seconds between two reads of the handles, however often they change


class FlowJobExecutorConfig(JobExecutorConfig):
    """The ``flow`` executor's settings.

    :param executor: the executor the service runs instances on, when a job does not name
        one in its ``flow.executor`` custom attribute.
    :param lease: the cleanup lease asked for, in seconds.
    :param provisioning_lease: the provisioning lease asked for, in seconds.
    :param poll_interval: seconds between two reads of the handles' status.
    :param running_victims: how a running job's instance is picked when it is cancelled.
    :param signal: the signal sent to that instance; ``grace``: seconds before it is killed.
    :param create_options: more fields of the ``create`` requests (``rate``, ``intervals``,
        ``termination_map``, ``quota_bytes``, ...; see the wire protocol).
    """

    def __init__(self, executor: str = "local", lease: float = 3600.0,
                 provisioning_lease: float = 600.0, poll_interval: float = 2.0,
                 running_victims: str = "longest", signal: str = "SIGTERM",
                 grace: Optional[float] = 30.0,
                 create_options: Optional[Dict[str, Any]] = None, **kw: Any) -> None:
        super().__init__(**kw)
        if running_victims not in ("shortest", "longest"):
            raise ValueError(f"running_victims: expected 'shortest' or 'longest', got "
                             f"{running_victims!r}")
        for name, value in (("lease", lease), ("provisioning_lease", provisioning_lease),
                            ("poll_interval", poll_interval)):
            if not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise ValueError(f"{name}: expected seconds > 0, got {value!r}")
        self.executor = executor
        self.lease = float(lease)
        self.provisioning_lease = float(provisioning_lease)
        self.poll_interval = float(poll_interval)
        self.running_victims = running_victims
        self.signal = signal
        self.grace = grace
        self.create_options = dict(create_options or {})


class _Handle:
    __slots__ = ("handle", "jobs", "renewed", "shape", "victims")

    def __init__(self, shape: str, handle: str) -> None:
        self.shape = shape
        self.handle = handle
        self.jobs: List[Job] = []  # not yet final, in submission order
        self.renewed = 0.0
        self.victims: Set[str] = set()  # instance keys removed for cancelled jobs


class FlowJobExecutor(JobExecutor):
    """Submits jobs onto the handles of a flow service (see the module notes)."""

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        if config is None:
            config = FlowJobExecutorConfig()
        elif not isinstance(config, FlowJobExecutorConfig):
            config = FlowJobExecutorConfig(work_directory=config.work_directory)
        super().__init__(url, config)
        self._config: FlowJobExecutorConfig = config
        path = url
        if path is not None and path.startswith("unix://"):
            path = path[len("unix://"):]
        self._client = FlowClient(path)
        self._lock = threading.RLock()
        self._by_shape: Dict[str, _Handle] = {}
        self._of_job: Dict[str, _Handle] = {}
        self._count = 0
        self._closed = threading.Event()
        self._wake = threading.Event()  # set by the watcher: a handle changed
        self._watch_client = FlowClient(path, timeout=_WATCH_TIMEOUT)
        self._clock: Clock = MonotonicClock()
        self._poller: Optional[threading.Thread] = None
        # The poller holds this executor weakly (the watcher not at all): dropped without
        # close(), it is collected, and this stops both and closes the connections.
        self._finalizer = weakref.finalize(self, _stop, self._closed, self._wake,
                                           (self._client, self._watch_client))

    # -- submitting -------------------------------------------------------------------------

    def _shape(self, job: Job) -> Tuple[str, Dict[str, Any], str]:
        import json

        from psij.serialize import JSONSerializer

        spec = self._check_job(job)
        try:
            as_dict = json.loads(JSONSerializer().dumps(spec))
        except Exception as ex:
            job.executor = None
            raise InvalidJobException(f"flow: the job's spec cannot be sent: {ex}") from ex
        attrs = spec.attributes
        custom = attrs.custom_attributes if attrs is not None else None
        target = str((custom or {}).get("flow.executor", self._config.executor))
        for field in ("stdout_path", "stderr_path"):
            as_dict.pop(field, None)
        return json.dumps([target, as_dict], sort_keys=True), as_dict, target

    def submit(self, job: Job) -> None:
        if self._closed.is_set():
            raise SubmitException("flow: the executor is closed")
        shape, spec, target = self._shape(job)
        with self._lock:
            entry = self._by_shape.get(shape)
            try:
                if entry is None:
                    options = {"lease": self._config.lease,
                               "provisioning_lease": self._config.provisioning_lease,
                               **self._config.create_options}
                    reply = self._client.create(spec, 1, target, **options)
                    entry = _Handle(shape, str(reply["handle"]))
                    self._by_shape[shape] = entry
                else:
                    reply = self._client.grow(entry.handle, 1)
                    if not reply.get("accepted", False):
                        raise FlowError("denied", str(reply.get("reason", "grow denied")))
            except FlowError as ex:
                job.executor = None
                raise SubmitException(f"flow: {ex}") from ex
            self._count += 1
            job._native_id = f"{entry.handle}#{self._count}"
            entry.jobs.append(job)
            self._of_job[job.id] = entry
            self._set_job_status(job, JobStatus(JobState.QUEUED))
            if self._poller is None:
                self._poller = threading.Thread(
                    target=_poll_loop, args=(weakref.ref(self), self._closed, self._wake,
                                             self._clock, self._config.poll_interval),
                    daemon=True, name="psij-flow-executor")
                self._poller.start()
                threading.Thread(target=_watch_loop,
                                 args=(self._watch_client, self._closed, self._wake,
                                       self._clock), daemon=True,
                                 name="psij-flow-watch").start()

    def cancel(self, job: Job) -> None:
        with self._lock:
            entry = self._of_job.get(job.id)
            if entry is None or job.status.final:
                return
            active = job.status.state is JobState.ACTIVE
            # The last job: the handle ends with this shrink, so that the destroy that
            # follows does not kill its victim before the grace is over.
            last = entry.jobs == [job]
            try:
                if active:
                    reply = self._client.shrink(entry.handle, 1, self._config.running_victims,
                                                self._config.signal, self._config.grace,
                                                end_if_zero=last)
                else:
                    reply = self._client.shrink(entry.handle, 1, "not_running",
                                                end_if_zero=last)
                entry.victims.update(str(key) for key in reply.get("victims", []))
            except FlowError as ex:
                logger.warning("flow: shrinking %s for cancelled job %s: %s", entry.handle,
                               job.id, ex)
            self._end(entry, job, JobStatus(JobState.CANCELED))

    def list(self) -> List[str]:
        with self._lock:
            return [str(j.native_id) for e in self._by_shape.values() for j in e.jobs]

    def attach(self, job: Job, native_id: str) -> None:
        raise InvalidJobException("flow: jobs cannot be attached (a job lives only in the "
                                  "executor that submitted it; its handle is on the service)")

    def close(self) -> None:
        self._finalizer()

    # -- following the handles -----------------------------------------------------------

    def _end(self, entry: _Handle, job: Job, status: JobStatus) -> None:
        """Under the lock: ``job`` leaves its handle; the handle is destroyed when empty."""
        if job in entry.jobs:
            entry.jobs.remove(job)
        self._of_job.pop(job.id, None)
        self._set_job_status(job, status)
        if not entry.jobs and self._by_shape.get(entry.shape) is entry:
            del self._by_shape[entry.shape]
            try:
                self._client.destroy(entry.handle)
            except FlowError as ex:
                logger.warning("flow: destroying %s: %s", entry.handle, ex)

    def _poll_handles(self) -> None:
        with self._lock:
            entries = list(self._by_shape.values())
        for entry in entries:
            if self._closed.is_set():
                return
            try:
                self._poll(entry)
            except Exception as ex:  # one handle's trouble must not stop the others
                if self._closed.is_set():
                    return
                logger.warning("flow: following handle %s: %s", entry.handle, ex)

    def _poll(self, entry: _Handle) -> None:
        client = self._client
        status = client.status(entry.handle)
        with self._lock:
            if not status.get("valid", True):
                for job in list(entry.jobs):
                    self._end(entry, job, JobStatus(JobState.FAILED, message=(
                        f"flow: handle {entry.handle} is no longer valid")))
                return
            provisioned = int(status.get("provisioned", 0))
            active = sum(1 for j in entry.jobs if j.status.state is JobState.ACTIVE)
            for job in entry.jobs:
                if active >= provisioned:
                    break
                if job.status.state is JobState.QUEUED:
                    self._set_job_status(job, JobStatus(JobState.ACTIVE))
                    active += 1
        ended = [i for i in client.instances(entry.handle) if i.get("ended") is not None]
        for record in ended:
            self._hand_over(entry, record)
        now = self._clock.now()
        if now - entry.renewed >= self._config.provisioning_lease / 3:
            client.renew(entry.handle, self._config.lease, self._config.provisioning_lease)
            entry.renewed = now

    def _hand_over(self, entry: _Handle, record: Dict[str, Any]) -> None:
        """One ended instance goes to one job (module notes); one this executor removed (the
        victim of a cancelled job's shrink) goes to none."""
        instance = str(record["id"])
        with self._lock:
            waiting = [j for j in entry.jobs if j.status.state is JobState.ACTIVE] \
                or list(entry.jobs)
            removed = record.get("class") == "removed" or record.get("key") in entry.victims
            entry.victims.discard(str(record.get("key")))
            job = waiting[0] if waiting and not removed else None
        if job is not None:
            spec = job.spec
            for stream, path in (("stdout", spec.stdout_path if spec else None),
                                 ("stderr", spec.stderr_path if spec else None)):
                if path is None:
                    continue
                try:
                    data = self._client.output(entry.handle, instance, stream, 16 * 1024 * 1024)
                except FlowError as ex:
                    data = f"(flow: {stream} of instance {instance} unavailable: {ex})\n"
                Path(path).write_text(data)
        try:
            self._client.delete(entry.handle, [instance])
        except FlowError as ex:
            logger.warning("flow: deleting instance %s of %s: %s", instance, entry.handle, ex)
        if job is None:
            return
        code = record.get("exit_code")
        with self._lock:
            if job.status.final:
                return
            try:
                self._client.shrink(entry.handle, 1, "not_running")
            except FlowError as ex:
                logger.warning("flow: shrinking %s: %s", entry.handle, ex)
            if code == 0:
                status = JobStatus(JobState.COMPLETED, exit_code=0)
            else:
                status = JobStatus(JobState.FAILED, exit_code=code, message=(
                    f"flow: instance {instance} ended with exit code {code} "
                    f"(class {record.get('class')})"))
            if job.status.state is JobState.QUEUED:
                self._set_job_status(job, JobStatus(JobState.ACTIVE))
            self._end(entry, job, status)


def _poll_loop(ref: "weakref.ref[FlowJobExecutor]", closed: threading.Event,
               wake: threading.Event, clock: Clock, interval: float) -> None:
    """The poller: follows the handles of the executor ``ref`` refers to when ``wake`` is set
    (a handle changed) and every ``interval`` seconds, until it is closed or collected (it
    holds the executor only while it polls)."""
    while True:
        clock.wait(wake, interval)
        wake.clear()  # before reading: a change from now on wakes the next round
        if closed.is_set():
            return
        executor = ref()
        if executor is None:
            return
        executor._poll_handles()
        del executor
        if clock.wait(closed, _LEAST_GAP):  # changes that come in a burst: read together
            return


def _watch_loop(client: FlowClient, closed: threading.Event, wake: threading.Event,
                clock: Clock) -> None:
    """The watcher: a ``watch`` request always waiting on its own connection; each answer
    (a handle of this user changed) wakes the poller. It ends when the executor is closed
    (its connection shut), or at once on a service that has no ``watch`` (only the poll
    interval is left)."""
    seen = 0
    while not closed.is_set():
        try:
            seen = client.watch(after=seen)
        except FlowError as ex:
            if closed.is_set():
                return
            if not isinstance(ex, FlowUnavailable):
                logger.info("flow: the service does not watch handles (%s); their changes "
                            "are read every poll_interval seconds", ex)
                return
            # Nothing changed for as long as the connection's timeout, or the service is
            # gone (a restarted one numbers its changes from 1): asked again from 0, which
            # is answered at once, and so is any change made meanwhile.
            seen = 0
            if clock.wait(closed, _WATCH_RETRY):
                return
            continue
        wake.set()


def _stop(closed: threading.Event, wake: threading.Event,
          clients: Tuple[FlowClient, ...]) -> None:
    """Close an executor: its poller and watcher end and its connections to the service
    close."""
    closed.set()
    wake.set()
    for client in clients:
        client.close()
