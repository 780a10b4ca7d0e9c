"""``psij remote serve``: this host's executors for a client on another machine, over the SSH
channel's standard input and output (the protocol of :mod:`psij.remote._protocol`).

One request at a time, in the order sent; status changes are pushed from the executors'
threads as they happen. The process's own standard input and output are moved aside first, so
that nothing a scheduler command or a library prints can reach the channel, and no child
process can read the client's requests.

A submission is never run twice: each job keeps the id the client gave it, and under one lock
per user (``remote/submit.lock`` in the work directory) a server looks the ids up in this
user's job registry before it submits, and flushes the registry before it lets the lock go. A
job submitted by a server whose client went away is found there by the next one. When the
client closes the channel (or the connection drops) the server finishes the request in hand,
flushes the registry and exits; the jobs go on and stay in the registry.
"""

import fcntl
import getpass
import logging
import os
import platform
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from psij import registry
from psij._clock import MonotonicClock
from psij._line_framing import BadLine, LineFramer, decode_line, encode_line
from psij._private_dirs import ensure_private_dir
from psij._registry import recorder
from psij.exceptions import InvalidJobException, SubmitManyException
from psij.job import Job
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_status import JobStatus
from psij.remote import _protocol, _staging
from psij.serialize import _spec_from_json
from psij.version import __version__

logger = logging.getLogger(__name__)

_CLOCK = MonotonicClock()
NATIVE_ID_WAIT = 30.0

CONFIG_VALUE = (str, int, float, bool, type(None))


def hello() -> Dict[str, Any]:
    """The first line a server writes."""
    return {_protocol.HELLO_KEY: _protocol.PROTOCOL, "version": __version__,
            "python": platform.python_version(), "host": socket.gethostname(),
            "user": getpass.getuser(), "pid": os.getpid()}


def _text(field: str, value: Any, optional: bool = False) -> Optional[str]:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ValueError(f"{field}: expected text, got {str(value)[:80]!r}")
    return value


class Server:
    """The state of one ``psij remote serve``: its executors and the jobs it follows."""

    def __init__(self, send: Callable[[Mapping[str, Any]], None],
                 work_directory: Optional[Path] = None) -> None:
        self._send = send
        self.work_directory = (work_directory if work_directory is not None
                               else JobExecutorConfig().work_directory)
        self._executors: Dict[str, JobExecutor] = {}
        self._jobs: Dict[str, Job] = {}
        self._lock = threading.Lock()
        self.staging = _staging.ServerStaging(self.work_directory)
        self._ops: Dict[str, Callable[[Mapping[str, Any]], Any]] = {
            "ping": lambda request: "pong", "open": self._open,
            "submit": self._submit, "cancel": self._cancel, "list": self._list,
            "attach": self._attach, "follow": self._follow,
            "put": self.staging.put, "get": self.staging.get, "drop": self.staging.drop,
        }

    # -- events ---------------------------------------------------------------------------

    def _on_status(self, job: Job, status: JobStatus) -> None:
        try:
            self._send(_protocol.status_to_wire(job.id, job._native_id, status))
        except Exception:  # the channel is gone: the next request (or EOF) tells
            logger.debug("status of job %s not sent", job.id, exc_info=True)

    # -- requests -------------------------------------------------------------------------

    def handle(self, request: Any) -> Dict[str, Any]:
        """The answer to one request (never raises)."""
        if not isinstance(request, dict):
            return {"re": None, "ok": False, "kind": "RemoteError",
                    "error": "a request must be a JSON object"}
        request_id = request.get("id")
        op = request.get("op")
        handler = self._ops.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"re": request_id, "ok": False, "kind": "RemoteError",
                    "error": f"unknown op {str(op)[:40]!r}; accepted: {', '.join(self._ops)}"}
        try:
            return {"re": request_id, "ok": True, "value": handler(request)}
        except Exception as ex:
            logger.debug("request %s failed", op, exc_info=True)
            return _protocol.error_answer(request_id, ex)

    def _executor(self, request: Mapping[str, Any]) -> JobExecutor:
        spec = request.get("ex")
        if not isinstance(spec, dict):
            raise ValueError("ex: expected an object naming the executor")
        key = encode_line(spec).decode()
        found = self._executors.get(key)
        if found is not None:
            return found
        name = _text("ex.name", spec.get("name"))
        assert name is not None
        version = _text("ex.version", spec.get("version"), optional=True)
        settings = spec.get("config") or {}
        if not isinstance(settings, dict) or not all(
                isinstance(v, CONFIG_VALUE) for v in settings.values()):
            raise ValueError("ex.config: expected an object of plain values")
        executor = JobExecutor.get_instance(name, version_constraint=version)
        if settings or Path(executor.config.work_directory) != self.work_directory:
            executor = self._configured(executor, name, version, settings)
        executor.set_job_status_callback(self._on_status)
        self._executors[key] = executor
        return executor

    def _open(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        """Make the executor a client names (its errors come back now, not at the first
        submission); its name and version, the Python interpreter this server runs on (one
        that imports this psij: function calls run there) and the folder under which each
        job's staged files are kept (``<staging>/<job id>``, private, removed by ``drop``)."""
        executor = self._executor(request)
        return {"name": executor.name, "version": str(executor.version),
                "python": sys.executable, "staging": str(self.staging.root.absolute())}

    def _configured(self, executor: JobExecutor, name: str, version: Optional[str],
                    settings: Mapping[str, Any]) -> JobExecutor:
        """The executor again with its own kind of configuration made of ``settings``."""
        cls = type(executor.config)
        accepted = registry._parameters(cls) - {"work_directory"}
        unknown = sorted(set(settings) - accepted)
        if unknown:
            raise ValueError(f"ex.config: {cls.__name__} of executor {name!r} takes no "
                             f"{unknown[0]!r}; accepted: {', '.join(sorted(accepted))}")
        config = cls(work_directory=self.work_directory,
                     **{k: v for k, v in settings.items() if v is not None})
        executor.close()
        return JobExecutor.get_instance(name, version_constraint=version, config=config)

    @contextmanager
    def _submit_lock(self) -> Iterator[None]:
        folder = ensure_private_dir(self.work_directory / "remote", "remote work directory")
        fd = os.open(folder / "submit.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _answer(self, job: Job) -> Dict[str, Any]:
        status = job.status
        return {"id": job.id, "native_id": job._native_id,
                "status": _protocol.status_to_wire(job.id, job._native_id, status)}

    def _submit(self, request: Mapping[str, Any]) -> List[Dict[str, Any]]:
        executor = self._executor(request)
        items = request.get("jobs")
        if not isinstance(items, list) or not items:
            raise ValueError("jobs: expected a list of {id, spec}")
        answers: List[Dict[str, Any]] = []
        with self._submit_lock():
            ids = [_protocol.job_id(item.get("id") if isinstance(item, dict) else None)
                   for item in items]
            if len(set(ids)) != len(ids):
                raise ValueError("jobs: a job id appears twice")
            unknown = [i for i in ids if i not in self._jobs]
            known = {r.id: r for r in registry.find(
                ids=unknown, work_directory=self.work_directory)} if unknown else {}
            done: Dict[str, Any] = {}
            fresh: List[Job] = []
            for job_id, item in zip(ids, items):
                try:
                    job = self._jobs.get(job_id)
                    if job is None and job_id in known:
                        job = self._from_record(executor, known[job_id])
                    if job is None:
                        fresh.append(self._new_job(job_id, item))
                    else:
                        done[job_id] = job
                except Exception as ex:
                    done[job_id] = ex
            for job, problem in self._submit_new(executor, fresh):
                done[job.id] = job if problem is None else problem
            for job_id in ids:
                outcome = done[job_id]
                answers.append(self._answer(outcome) if isinstance(outcome, Job) else
                               {"id": job_id, **_protocol.error_answer(None, outcome)})
            # Every job's row is written before another server may look for it (its native
            # id may follow: see _with_native_id).
            recorder.flush_queued(60.0)
        return answers

    def _new_job(self, job_id: str, item: Mapping[str, Any]) -> Job:
        try:
            spec = _spec_from_json(item.get("spec"))
        except (TypeError, ValueError) as ex:
            raise InvalidJobException(f"job {job_id}: {ex}") from ex
        job = Job(self.staging.rewrite(job_id, spec))
        job._id = job_id
        return job

    def _submit_new(self, executor: JobExecutor, jobs: List[Job]
                    ) -> List[Tuple[Job, Optional[BaseException]]]:
        """Submit ``jobs`` (several at once with the executor's ``submit_many``: arrays on
        batch schedulers); each with None or what its submission raised."""
        failed: Dict[str, BaseException] = {}
        if len(jobs) == 1:
            try:
                executor.submit(jobs[0])
            except Exception as ex:
                failed[jobs[0].id] = ex
        elif jobs:
            try:
                executor.submit_many(jobs)
            except SubmitManyException as ex:
                failed = {job.id: problem for job, problem in ex.failures}
        for job in jobs:
            if job.id not in failed:
                self._jobs[job.id] = job
        return [(job, failed.get(job.id)) for job in jobs]

    def _with_native_id(self, record: registry.JobRecord) -> registry.JobRecord:
        """``record`` again once its native id is recorded (or it ended), for at most
        NATIVE_ID_WAIT seconds: a job submitted by another server is written before its
        native id when its executor gives that later (``local``)."""
        deadline = _CLOCK.now() + NATIVE_ID_WAIT
        while record.native_id is None and not record.state.final and _CLOCK.now() < deadline:
            _CLOCK.sleep(0.05)
            found = registry.find(ids=[record.id], work_directory=self.work_directory)
            if found:
                record = found[0]
        return record

    def _from_record(self, executor: JobExecutor, record: registry.JobRecord) -> Job:
        """A job this user's registry knows, followed again (by the executor that ran it)."""
        record = self._with_native_id(record)
        job = Job(record.spec)
        job._id = record.id
        job.set_job_status_callback(None)
        registry._follow_runs(job, record)
        if record.state.final or record.native_id is None:
            job.executor = executor
            job._native_id = record.native_id
            job._set_status(registry._recorded_status(record))
        else:
            self._recorded_executor(executor, record).attach(job, record.native_id)
        self._jobs[record.id] = job
        return job

    def _recorded_executor(self, executor: JobExecutor, record: registry.JobRecord
                           ) -> JobExecutor:
        """The executor with the settings recorded with the job (its polling interval...),
        when they differ from ``executor``'s."""
        if record.executor != executor.name or record.config is None:
            return executor
        config = registry._recorded_config(type(executor.config), record.config,
                                           str(self.work_directory))
        if config is None:
            return executor
        key = f"recorded {record.executor} {record.config}"
        found = self._executors.get(key)
        if found is None:
            found = JobExecutor.get_instance(record.executor, config=config)
            found.set_job_status_callback(self._on_status)
            self._executors[key] = found
        return found

    def _known(self, executor: JobExecutor, job_id: str, native_id: Optional[str]) -> Job:
        """The job with this id: followed already, in the registry, or attached by native id."""
        job = self._jobs.get(job_id)
        if job is not None:
            return job
        found = registry.find(ids=[job_id], work_directory=self.work_directory)
        if found:
            return self._from_record(executor, found[0])
        if native_id is None:
            raise KeyError(f"job {job_id} is not known on this host")
        job = Job()
        job._id = job_id
        executor.attach(job, native_id)
        self._jobs[job_id] = job
        return job

    def _cancel(self, request: Mapping[str, Any]) -> None:
        executor = self._executor(request)
        job = self._known(executor, _protocol.job_id(request.get("job")),
                          _text("native_id", request.get("native_id"), optional=True))
        if not job.status.state.final:
            assert job.executor is not None
            job.executor.cancel(job)

    def _list(self, request: Mapping[str, Any]) -> List[str]:
        return list(self._executor(request).list())

    def _attach(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        executor = self._executor(request)
        job_id = _protocol.job_id(request.get("job"))
        native_id = _text("native_id", request.get("native_id"))
        return self._answer(self._known(executor, job_id, native_id))

    def _follow(self, request: Mapping[str, Any]) -> List[Dict[str, Any]]:
        """The current status of each job named (followed from now on if it was not)."""
        executor = self._executor(request)
        items = request.get("jobs")
        if not isinstance(items, list):
            raise ValueError("jobs: expected a list of {id, native_id}")
        answers = []
        for item in items:
            job_id = _protocol.job_id(item.get("id") if isinstance(item, dict) else None)
            try:
                native_id = _text("native_id", item.get("native_id"), optional=True)
                answers.append(self._answer(self._known(executor, job_id, native_id)))
            except Exception as ex:
                answers.append({"id": job_id, **_protocol.error_answer(None, ex)})
        return answers

    def close(self) -> None:
        """Close the executors (the jobs they started go on)."""
        for executor in self._executors.values():
            try:
                executor.close()
            except Exception:
                logger.debug("closing %s", executor, exc_info=True)
        self._executors.clear()

    def finish(self) -> None:
        """The client is gone: have every status change so far in the registry."""
        try:
            registry.flush(timedelta(seconds=60))
        except Exception:
            logger.warning("the job registry could not be flushed", exc_info=True)


def _channel() -> Tuple[int, int]:
    """The client's channel, moved off descriptors 0 and 1 (which now read nothing and write
    to standard error)."""
    in_fd = os.dup(0)
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    for fd in (in_fd, out_fd):
        os.set_inheritable(fd, False)
    return in_fd, out_fd


def serve() -> int:
    """Serve the client on standard input and output until it closes them; the exit status."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    in_fd, out_fd = _channel()
    logging.basicConfig(level=logging.WARNING, format="psij remote: %(message)s")
    write_lock = threading.Lock()
    broken = threading.Event()

    def send(message: Mapping[str, Any]) -> None:
        line = encode_line(message)
        with write_lock:
            if broken.is_set():
                return
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(out_fd, view):]
            except OSError:
                broken.set()

    send(hello())
    server = Server(send)
    framer = LineFramer(_protocol.MAX_LINE)
    try:
        while not broken.is_set():
            data = os.read(in_fd, 1 << 20)
            if not data:
                break
            for line in framer.feed(data):
                try:
                    request = decode_line(line)
                except BadLine as ex:
                    send({"re": None, "ok": False, "kind": "RemoteError",
                          "error": f"not a request: {ex}"})
                    continue
                send(server.handle(request))
            if framer.too_long:
                send({"re": None, "ok": False, "kind": "RemoteError",
                      "error": f"a request longer than {_protocol.MAX_LINE} bytes"})
                break
    finally:
        server.finish()
    return 0
