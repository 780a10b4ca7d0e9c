"""``FunctionExecutor``: a ``concurrent.futures.Executor`` whose calls run as PSI/J jobs on
any executor (``local``, ``pilot``, ``slurm``, ``sge``, a side-loaded one).

``submit`` serializes the call at once (an argument that cannot be pickled is refused there,
by name) and puts it into a job: on the fast executors (``local``, ``pilot``) calls made close
together share a job (``_packer``), elsewhere each call is its own job unless ``pack`` says
otherwise. ``map`` submits its calls ``chunksize`` per job, all jobs in one ``submit_many`` (one
array on batch schedulers that have them). A job runs ``python -m psij.futures._run DIR`` and
nothing else, so the compute side needs the call directory and the work directory's key, never
this process. Only the PSI/J API is used: ``JobExecutor.get_instance``, ``Job``, ``JobSpec``,
status callbacks.

A result watcher (one thread per executor, while it has jobs) settles each call as soon as its
result file is written, before the executor tells that the job ended. It must not import
cloudpickle at import (``_payload`` does on the first call) nor hold a lock while a future's
done-callbacks run.
"""

import concurrent.futures
import math
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Union

from psij import _check
from psij._clock import MonotonicClock
from psij._lazylog import LazyLogger
from psij._record import Record
from psij._registry.recorder import TAG_ATTR
from psij.exceptions import SubmitManyException
from psij.futures import _wire
from psij.futures._future import FunctionFuture
from psij.futures._job_calls import JobCalls
from psij.futures._packer import CallPacker
from psij.futures._payload import call_header, dumps_call, function_name
from psij.futures._remote import RemoteCalls
from psij.futures._workdir import WorkDirectory
from psij.job import Job
from psij.job_attributes import JobAttributes
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.resource_spec import ResourceSpec

__all__ = ["RUNNER_MODULE", "FunctionExecutor"]

RUNNER_MODULE = "psij.futures._run"
FAST_EXECUTORS = ("local", "pilot")
FAST_PACK = 32  # calls per job at most, by default, where jobs start in milliseconds
MAX_PACK = 100_000
_JOBS_PER_SLOT = 4  # map's automatic chunks: this many jobs per core, to even out the load
_NAME_LENGTH = 64
RESULT_WATCH = 0.25  # seconds between looks for results written before their job ended
_clock = MonotonicClock()
_log = LazyLogger(__name__)


class _Call(Record):
    """One serialized call, waiting to be put into a job."""

    future: FunctionFuture
    payload: bytes
    needs_cloudpickle: bool


def job_name(qualname: str) -> str:
    """``fn:<qualname>`` in characters every scheduler takes in a job name."""
    return "fn:" + re.sub(r"[^A-Za-z0-9_.]", "_", qualname)[:_NAME_LENGTH]


def _pack(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _check.fail_type("FunctionExecutor.pack", value, f"None or an int from 1 to "
                                                               f"{MAX_PACK}")
    if not 1 <= value <= MAX_PACK:
        raise ValueError(f"FunctionExecutor.pack: expected None or an int from 1 to "
                         f"{MAX_PACK}, got {value}")
    return value


def _chunksize(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _check.fail_type("FunctionExecutor.map chunksize", value, "None or an int >= 1")
    if not 1 <= value <= MAX_PACK:
        raise ValueError(f"FunctionExecutor.map chunksize: expected None or an int from 1 to "
                         f"{MAX_PACK}, got {value}")
    return value


def _environment(value: Any) -> Dict[str, str]:
    env = _check.env_dict("FunctionExecutor.environment", value) or {}
    for key, text in env.items():
        _check.os_text("FunctionExecutor.environment key", key)
        _check.os_text(f"FunctionExecutor.environment[{key!r}]", text)
    return env


def _client_path() -> str:
    """This interpreter's module path, for jobs run by the same interpreter."""
    seen: List[str] = []
    for entry in sys.path:
        entry = os.path.abspath(entry or os.curdir)
        if entry not in seen and os.path.isdir(entry):
            seen.append(entry)
    return os.pathsep.join(seen)


class FunctionExecutor(concurrent.futures.Executor):
    """Runs Python functions as PSI/J jobs; see the module documentation and
    ``docs/futures.rst``.

    ``executor`` is an executor's name (made with ``JobExecutor.get_instance(executor,
    url=url, config=config)`` and closed by :meth:`shutdown`) or a :class:`psij.JobExecutor`
    (not closed here). ``attributes`` and ``resources`` are given to every job; ``python`` is
    the interpreter on the compute side (default ``sys.executable``, whose module path then
    reaches the jobs as ``PYTHONPATH``); ``environment`` is added to the jobs' environment.
    ``work_directory`` (default ``<executor work directory>/functions``) holds the call
    files, removed once a call's result was collected unless ``keep_files``. ``pack`` caps
    the calls of one job (default: 32 on ``local`` and ``pilot``, 1 elsewhere; 1 turns packing
    off).
    """

    def __init__(self, executor: Union[str, JobExecutor] = "local", *,
                 url: Optional[str] = None, config: Optional[JobExecutorConfig] = None,
                 attributes: Optional[JobAttributes] = None,
                 resources: Optional[ResourceSpec] = None, python: Optional[str] = None,
                 environment: Optional[Dict[str, str]] = None,
                 work_directory: Union[str, Path, None] = None, keep_files: bool = False,
                 pack: Optional[int] = None) -> None:
        self._attributes = _check.instance("FunctionExecutor.attributes", attributes,
                                           JobAttributes, "psij.JobAttributes")
        self._resources = _check.instance("FunctionExecutor.resources", resources,
                                          ResourceSpec, "psij.ResourceSpec")
        given_python = _check.opt_str("FunctionExecutor.python", python)
        if given_python is not None:
            if not given_python.strip():
                raise ValueError("FunctionExecutor.python: expected the path or name of a "
                                 "Python interpreter, got an empty string")
            _check.os_text("FunctionExecutor.python", given_python)
        self._environment = _environment(environment)
        folder = _check.opt_path("FunctionExecutor.work_directory", work_directory)
        self._keep_files = _check.opt_bool("FunctionExecutor.keep_files", keep_files)
        cap = _pack(pack)
        if isinstance(executor, JobExecutor):
            if url is not None or config is not None:
                raise ValueError("FunctionExecutor: url and config are for an executor given "
                                 "by name; this one was given made")
            self._executor, self._owned = executor, False
        elif isinstance(executor, str):
            self._executor = JobExecutor.get_instance(executor, url=url, config=config)
            self._owned = True
        else:
            raise _check.fail_type("FunctionExecutor executor", executor,
                                   "an executor's name (str) or a psij.JobExecutor")
        try:
            self._remote = RemoteCalls.of(self._executor)
        except BaseException:
            self._close_executor()
            raise
        if self._remote is not None:
            # Another host: its own Python (the one its psij runs on) and module path.
            self._python = given_python or self._remote.python
        else:
            self._python = given_python or sys.executable
            if given_python is None and "PYTHONPATH" not in self._environment:
                self._environment["PYTHONPATH"] = _client_path()
        self._fast = self._executor.name in FAST_EXECUTORS
        self._given_pack = cap
        self._cap = cap if cap is not None else (FAST_PACK if self._fast else 1)
        try:
            base = Path(self._executor.config.work_directory)
            self._work = WorkDirectory(folder if folder is not None else base / "functions",
                                       "FunctionExecutor.work_directory")
        except BaseException:
            self._close_executor()
            raise
        self._lock = threading.Lock()
        self._live: Set[JobCalls] = set()
        self._shut = False
        self._slots = _slots(self._executor)
        self._packer: CallPacker[_Call] = CallPacker(
            self._submit_groups, self._fail_calls, self._cap, self._may_submit)
        self._watch_stop = threading.Event()
        self._watcher: Optional[threading.Thread] = None

    @property
    def executor(self) -> JobExecutor:
        """The PSI/J executor the jobs go to."""
        return self._executor

    @property
    def work_directory(self) -> Path:
        """Where the call directories are made (verified private)."""
        return Path(self._work.path)

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
               ) -> FunctionFuture:
        """Run ``fn(*args, **kwargs)`` in a job; its future."""
        call = self._call("submit", fn, args, kwargs)
        self._check_open()
        if self._cap == 1:
            self._submit_groups([[call]], raise_errors=True)
        else:
            call.future._place(self, None, 0)
            self._packer.add(call)
        return call.future

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any],
            timeout: Optional[float] = None, chunksize: Optional[int] = None
            ) -> Iterator[Any]:
        """``fn`` over the items of ``iterables``, results in order (as the builtin ``map``);
        the calls go ``chunksize`` to a job, all jobs in one ``submit_many``. ``timeout``
        (seconds from this call) bounds the wait for each result; the calls not yet
        collected are cancelled when the iterator is closed or raises."""
        limit = _check.timeout("FunctionExecutor.map timeout", timeout)
        size = _chunksize(chunksize)
        if not callable(fn):
            raise _check.fail_type("FunctionExecutor.map fn", fn, "a callable")
        self._check_open()
        calls = [self._call(f"map item {i}", fn, tuple(args), {})
                 for i, args in enumerate(zip(*iterables))]
        if size is None:
            size = self._automatic_chunk(len(calls))
        groups = [calls[i:i + size] for i in range(0, len(calls), size)]
        if groups:
            self._submit_groups(groups, raise_errors=False)
        return _results([call.future for call in calls], limit)

    def _automatic_chunk(self, count: int) -> int:
        if not self._fast:
            return self._cap
        size = math.ceil(count / (self._slots * _JOBS_PER_SLOT))
        return max(1, min(self._given_pack or MAX_PACK, size))

    def _may_submit(self) -> bool:
        """Whether a job may go now rather than wait to gather more calls: while fewer jobs
        than a few per core are running or waiting."""
        with self._lock:
            return len(self._live) < self._slots * _JOBS_PER_SLOT

    def _check_open(self) -> None:
        if self._shut:
            raise RuntimeError("cannot schedule new calls after shutdown")

    def _call(self, where: str, fn: Callable[..., Any], args: Any,
              kwargs: Dict[str, Any]) -> _Call:
        if not callable(fn):
            raise _check.fail_type(f"FunctionExecutor.{where} fn", fn, "a callable")
        payload, needs = dumps_call(where, fn, args, kwargs)
        return _Call(FunctionFuture(function_name(fn)), payload, needs)

    def _job(self, group: List[_Call]) -> Job:
        """A job for ``group``: its call directory and files written, its books made."""
        directory = self._work.new_call_directory()
        name = os.path.basename(directory)
        futures = [call.future for call in group]
        # A job on another host gets a key of its own, sent with it (see _remote).
        key = self._work.key if self._remote is None else RemoteCalls.new_key()
        try:
            with _wire.open_private(_wire.calls_file(directory)) as out:
                for index, call in enumerate(group):
                    header = call_header(f"{name}/{index}", call.needs_cloudpickle,
                                         call.future.function_name)
                    out.write(_wire.signed_header(key, header, call.payload))
                    out.write(call.payload)
            for stream in ("stdout", "stderr"):  # made private before the executor opens them
                _wire.open_private(os.path.join(directory, stream)).close()
            if self._remote is not None:
                with _wire.open_private(os.path.join(directory, _wire.KEY_NAME)) as out:
                    out.write(key)
        except BaseException:
            self._work.remove(directory)
            raise
        calls = JobCalls(self._work, directory, futures, self._keep_files, self._ended,
                         key=key, remote=self._remote is not None)
        title = job_name(futures[0].function_name)
        job = Job()
        if self._remote is not None:
            fields = self._remote.spec_fields(job.id, directory, len(group), RUNNER_MODULE)
        else:
            fields = {"arguments": ["-m", RUNNER_MODULE, directory],
                      "stdout_path": os.path.join(directory, "stdout"),
                      "stderr_path": os.path.join(directory, "stderr")}
        fields["executable"] = self._python
        job.spec = JobSpec(name=title, environment=dict(self._environment),
                           resources=self._resources, attributes=self._attributes, **fields)
        job.__dict__[TAG_ATTR] = title  # shown by psij status and psij list
        job.set_job_status_callback(calls.status_changed)
        calls.bind(job)
        with self._lock:
            self._live.add(calls)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_results, daemon=True,
                                                 name="psij-futures-results")
                self._watcher.start()
        return job

    def _watch_results(self) -> None:
        """The result watcher's thread: a call whose result is written is settled then, not
        when the executor learns that its job ended (a batch scheduler's next poll, the end
        of the pack it is in). It ends once no job is left (the next job starts another), so
        that an executor dropped without ``shutdown()`` leaves no thread."""
        while True:
            _clock.wait(self._watch_stop, RESULT_WATCH)
            with self._lock:
                live = list(self._live)
                if not live or self._watch_stop.is_set():
                    self._watcher = None
                    return
            for calls in live:
                try:
                    calls.collect_early()
                except Exception:  # one job's books fail alone; the next look tries again
                    _log.exception("function job %s: looking for early results", calls.name)

    def _submit_groups(self, groups: List[List[_Call]], raise_errors: bool = False) -> None:
        jobs: List[Job] = []
        for group in groups:
            try:
                jobs.append(self._job(group))
            except Exception as ex:
                if raise_errors:
                    raise
                self._fail_calls(group, ex)
        if not jobs:
            return
        try:
            if len(jobs) == 1:
                self._executor.submit(jobs[0])
            else:
                self._executor.submit_many(jobs)
        except SubmitManyException as ex:
            for job, error in ex.failures:
                self._job_not_submitted(job, error)
        except Exception as ex:
            for job in jobs:
                self._job_not_submitted(job, ex)
            if raise_errors:
                raise
        finally:
            for group in groups:
                for call in group:
                    call.future._ready()

    def _job_not_submitted(self, job: Job, error: BaseException) -> None:
        calls = self._books_of(job)
        if calls is None:
            return
        self._work.remove(calls.directory)
        with self._lock:
            self._live.discard(calls)
        for future in calls.futures:
            future._settle(False, error)

    def _books_of(self, job: Job) -> Optional[JobCalls]:
        with self._lock:
            for calls in self._live:
                if calls.job is job:
                    return calls
        return None

    def _fail_calls(self, calls: List[_Call], error: BaseException) -> None:
        for call in calls:
            call.future._settle(False, error)
            call.future._ready()

    def _ended(self, calls: JobCalls) -> None:
        with self._lock:
            self._live.discard(calls)
        self._packer.poke()

    def cancel_call(self, future: FunctionFuture) -> bool:
        """``cancel()`` of a call still waiting to be put into a job."""
        if self._packer.withdraw(lambda call: call.future is future):
            cancelled = future._cancel_now()
            future._ready()
            return cancelled
        future._placed.wait(10.0)  # being put into a job at this moment
        owner = future._owner
        if owner is not None and owner is not self:
            return owner.cancel_call(future)
        return future.cancelled()

    # -- ending -------------------------------------------------------------------------------

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; with ``cancel_futures``, the calls not started are cancelled; with
        ``wait``, returns once every call has its result (and closes the executor it made)."""
        with self._lock:
            self._shut = True
        if cancel_futures:
            for call in self._packer.drain():
                call.future._cancel_now()
                call.future._ready()
        self._packer.close()
        with self._lock:
            futures = [future for calls in self._live for future in calls.futures]
        if cancel_futures:
            for future in futures:
                future.cancel()
        if wait:
            concurrent.futures.wait(futures)
            self._close_executor()

    def _close_executor(self) -> None:
        stop = getattr(self, "_watch_stop", None)
        if stop is not None:
            stop.set()
        if getattr(self, "_owned", False):
            self._executor.close()


def _slots(executor: JobExecutor) -> int:
    """The cores the jobs share: those an in-process pilot was given (``nodes`` or
    ``cores`` of its configuration), else those this process may use."""
    if executor.name == "pilot" and executor.url is None:
        nodes = getattr(executor.config, "nodes", None)
        if nodes:
            return max(1, sum(int(getattr(node, "cores", 1)) for node in nodes))
        cores = getattr(executor.config, "cores", None)
        if isinstance(cores, int) and cores > 0:
            return cores
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _results(futures: List[FunctionFuture], limit: Optional[float]) -> Iterator[Any]:
    end = None if limit is None else _clock.now() + limit
    futures.reverse()
    try:
        while futures:
            future = futures[-1]
            if end is None:
                value = future.result()
            else:
                value = future.result(max(0.0, end - _clock.now()))
            futures.pop()
            yield value
    finally:
        for future in futures:
            future.cancel()
