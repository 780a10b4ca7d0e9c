"""The job registry: every job submitted through any executor, found and re-attached later.

Each executor records the jobs it runs in ``jobs.sqlite`` in its work directory
(``JobExecutorConfig.work_directory``, by default ``~/.psij/work``, so one registry per user):
one row per job with its id, the executor's name, version, URL and settings, the native id,
the JobSpec (in :mod:`psij.serialize`'s JSON form), the submit time, an optional tag and the
last status recorded. A process that restarts calls :func:`reattach` and gets its jobs back
as live :class:`~psij.Job` objects whose callbacks fire from then on; a job that ended while no
process watched it gets the final state its executor reports (never a guess).

This module is not loaded by ``import psij``; import it as ``import psij.registry``. See the
"Job registry" guide for the file, its rules and the ``psij submit/status/wait/cancel/list``
commands built on it.
"""

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from psij import _check
from psij._record import Record
from psij._registry import recorder as _recorder
from psij._registry import store as _store
from psij._registry.accounting import USE_KEYS, use_of
from psij._registry.run_records import RunRecord, run_records
from psij._registry.store import RegistryError, Row
from psij.exceptions import InvalidJobException
from psij.job import CallbackLike, Job, as_callback
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["AttachError", "JobRecord", "RegistryError", "RunRecord", "attach", "find", "flush",
           "prune", "reattach", "registry_file", "runs", "set_prune_age", "set_recording",
           "set_tag"]

MAX_TAG_LENGTH = 1000

StateFilter = Union[JobState, str, Iterable[Union[JobState, str]], None]
PathLike = Union[str, Path, None]


class AttachError(RegistryError):
    """Some recorded jobs could not be re-attached. ``jobs`` holds those that were (they are
    live and followed); ``failures`` pairs each other record with the reason."""

    def __init__(self, message: str, jobs: List[Job],
                 failures: "List[Tuple[JobRecord, Exception]]") -> None:
        super().__init__(message)
        self.jobs = jobs
        self.failures = failures


class JobRecord(Record):
    """One recorded job, as last written to the registry."""


    id: str
    executor: str
    executor_version: Optional[str]
    url: Optional[str]
    config: Optional[str]
    """The executor's settings as a JSON object (text)."""
    native_id: Optional[str]
    spec_json: Optional[str]
    """The JobSpec in :mod:`psij.serialize`'s JSON form (text), if it could be recorded."""
    tag: Optional[str]
    submitted: float
    """When the job was first recorded (seconds since the epoch)."""
    state: JobState
    exit_code: Optional[int]
    message: Optional[str]
    updated: float
    """When its status was last recorded (seconds since the epoch)."""
    registry: Path
    """The registry file it was read from."""
    attempt: int = 1
    """Which run of the job this is (1, then 2, 3... once it is run again, requeued or
    retried; see the custom attributes ``psij.requeue`` and ``psij.retry``)."""
    rerun: Optional[str] = None
    """How its last run was started (``requeue`` or ``retry``), from its second run on."""
    rerun_cause: Optional[str] = None
    """Why the run before it ended (``out_of_memory``, ``time_limit``, ``preempted``,
    ``checkpoint``...), from its second run on."""
    requeues: int = 0
    """How many times it was requeued (as its executor counted them; 0 when unknown)."""
    retries: int = 0
    """How many times it was retried (as its executor counted them; 0 when unknown)."""
    held: Optional[str] = None
    """``"held"`` while psij holds the job back in a client process (``max_queued_per_shape``)
    and has not given it to the scheduler, ``"submitting"`` while that process submits it;
    None otherwise. See :attr:`held_by` and ``psij release``."""
    holder: Optional[str] = None
    """The process that holds it, while ``held``, as JSON text with ``pid``, ``host`` and
    ``start`` (its kernel start time)."""
    cause: Optional[str] = None
    """Why its final state came, when its executor said (the ``cause`` of the final status's
    metadata: ``time_limit``, ``out_of_memory``, ``unstartable``, ``preempted``...); None for a
    job not final, or one whose executor gave no cause."""
    started_at: Optional[float] = None
    """When its last run started (seconds since the epoch), as its final status told (the
    ``local`` executor's: see its documentation); None when not told."""
    ended_at: Optional[float] = None
    """When its last run ended (seconds since the epoch), likewise."""
    cpu_seconds: Optional[float] = None
    """The CPU time (user + system) its last run used, likewise."""
    max_rss_bytes: Optional[int] = None
    """The peak memory (maximum resident set size) of its last run, in bytes, likewise."""
    queued_at: Optional[float] = None
    """When its scheduler accepted its last run (seconds since the epoch), likewise."""
    nodes: Optional[str] = None
    """The nodes its last run ran on, comma-separated, as its scheduler spells them,
    likewise."""
    cores: Optional[int] = None
    """The cores its last run was given, likewise."""
    requested_memory_bytes: Optional[int] = None
    """The memory its last run asked for, in bytes, likewise."""
    requested_seconds: Optional[float] = None
    """The duration (time limit) its last run asked for, in seconds, likewise."""
    held_from: Optional[float] = None
    """When psij began to hold the job back in a client process (``max_queued_per_shape``,
    a resource pool, a stage-in; seconds since the epoch); None when it never did."""
    held_to: Optional[float] = None
    """When psij ceased to hold it (it was submitted, or ended while held); None while it
    is held or when it never was."""

    @property
    def held_by(self) -> Optional[str]:
        """What holds the job back, in words ("held by psij in process N", "..., which ended;
        never submitted"); None when psij does not hold it (or it is final, or has a native
        id: it was submitted)."""
        if self.state.final or self.native_id is not None:
            return None
        from psij._registry.held import describe

        return describe(self.held, self.holder)

    @property
    def spec(self) -> Optional[JobSpec]:
        """The recorded JobSpec, read back."""
        if self.spec_json is None:
            return None
        from psij.serialize import JSONSerializer

        return JSONSerializer().loads(self.spec_json)

    def to_json(self) -> Dict[str, Any]:
        """The stable JSON form printed by ``psij status --json`` and ``psij list --json``."""
        return {"id": self.id, "executor": self.executor,
                "executor_version": self.executor_version, "url": self.url,
                "native_id": self.native_id, "tag": self.tag, "state": self.state.name,
                "final": self.state.final, "exit_code": self.exit_code,
                "cause": self.cause, "message": self.message, "submitted": _iso(self.submitted),
                "updated": _iso(self.updated), "attempt": self.attempt,
                "rerun": None if self.attempt == 1 else {
                    "rerun": self.rerun, "cause": self.rerun_cause,
                    "requeues": self.requeues, "retries": self.retries},
                "held": self._held_json(), **use_json(self._figures()),
                "held_from": _iso_or_none(self.held_from), "held_to": _iso_or_none(self.held_to)}

    def _figures(self) -> Dict[str, Any]:
        return {key: getattr(self, key) for key in USE_KEYS}

    def _held_json(self) -> Optional[Dict[str, Any]]:
        if self.held_by is None:
            return None
        from psij._registry.held import holder_alive, holder_of

        holder = holder_of(self.holder)
        return {"phase": self.held, "pid": None if holder is None else holder.pid,
                "host": None if holder is None else holder.host,
                "running": None if holder is None else holder_alive(holder),
                "message": self.held_by}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def _iso_or_none(t: Any) -> Optional[str]:
    checked = _time_read(t)
    return None if checked is None else _iso(checked)


# The figures that are times (printed as ISO 8601 texts by --json).
_TIMES = ("started_at", "ended_at", "queued_at")


def use_json(figures: Any) -> Dict[str, Any]:
    """The figures of a run (a mapping of :data:`psij._registry.accounting.USE_KEYS`) as
    ``--json`` prints them: the times as ISO 8601 texts (UTC), the seconds, bytes and cores
    as numbers, the nodes as text; None for those not known (or not sound)."""
    checked = dict(zip(USE_KEYS, use_of(figures, True)))
    return {key: (_iso(value) if key in _TIMES and value is not None else value)
            for key, value in checked.items()}


def _work_directory(work_directory: PathLike) -> Path:
    if work_directory is None:
        return Path(JobExecutorConfig.DEFAULT.work_directory)
    found = _check.opt_path("work_directory", work_directory)
    assert found is not None
    return found


def registry_file(work_directory: PathLike = None) -> Path:
    """The registry file of ``work_directory`` (default: the default executor work directory)."""
    return _store.registry_path(_work_directory(work_directory))


def _record(row: Row, path: Path) -> JobRecord:
    (job_id, executor, version, url, config, native_id, spec, tag, submitted, state, _rank,
     exit_code, message, updated, _final, attempt, rerun, held, holder, final_cause,
     *figures, held_from, held_to) = row
    try:
        job_state = JobState[state]
    except KeyError:
        raise RegistryError(f"job registry {path}: job {job_id} has an unknown state "
                            f"{state!r}") from None
    kind, cause, requeues, retries = _rerun_of(rerun)
    return JobRecord(job_id, executor, version, url, config, native_id, spec, tag, submitted,
                     job_state, exit_code, message, updated, path,
                     attempt if isinstance(attempt, int) and attempt >= 1 else 1, kind, cause,
                     requeues, retries, held if isinstance(held, str) else None,
                     holder if isinstance(holder, str) else None,
                     final_cause if isinstance(final_cause, str) and job_state.final else None,
                     **dict(zip(USE_KEYS, use_of(dict(zip(USE_KEYS, figures)),
                                                 job_state.final))),
                     held_from=_time_read(held_from), held_to=_time_read(held_to))


def _time_read(value: Any) -> Optional[float]:
    """A time read back from the registry, checked as when it was written (a file another
    program wrote is not trusted)."""
    return use_of({"queued_at": value}, True)[4]  # type: ignore[no-any-return]


def _rerun_of(text: Any) -> Tuple[Optional[str], Optional[str], int, int]:
    """The ``rerun`` column read back: kind, cause, requeues, retries (what cannot be read,
    written by another version say, is left out: None or 0)."""
    if not isinstance(text, str):
        return None, None, 0, 0
    import json

    try:
        found = json.loads(text)
    except ValueError:
        return None, None, 0, 0
    if not isinstance(found, dict):
        return None, None, 0, 0

    def word(key: str) -> Optional[str]:
        value = found.get(key)
        return value if isinstance(value, str) else None

    def count(key: str) -> int:
        value = found.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) \
            and value >= 0 else 0

    return word("rerun"), word("cause"), count("requeues"), count("retries")


def _follow_runs(job: Job, record: JobRecord) -> None:
    """Have ``job``, made again from ``record`` and about to be attached, keep the run the
    record holds: its statuses carry that ``attempt`` (and later ones when its executor tells
    it ran again), and the registry goes on recording it. A process that follows a job does
    not start its next runs itself (the one that submitted it does, or its scheduler):
    :mod:`psij._retry`'s counts are kept for the job's scheduler requeues only."""
    from psij import _retry

    runs = None
    if record.spec_json is not None and job.spec is not None:
        try:
            runs = _retry.check_job(job.spec)
        except Exception:  # a policy this version does not read: the attempt alone
            runs = None
    if runs is None and record.attempt == 1:
        return
    if runs is None:
        runs = _retry.Runs(0, None)
    runs.attempt = record.attempt
    runs.requeues = record.requeues
    runs.retries = record.retries
    job.__dict__["_runs"] = runs
    job.__dict__["_runs_followed"] = True
    if record.rerun is not None:
        job.__dict__[_recorder.RERUN_ATTR] = (record.rerun, record.rerun_cause)


def _recorded_status(record: JobRecord) -> JobStatus:
    """The final status ``record`` holds, with its attempt, cause and run's figures in the
    metadata."""
    meta: Optional[Dict[str, Any]] = None
    if record.attempt > 1:
        meta = {"attempt": record.attempt}
        if record.rerun is not None:
            meta.update(rerun=record.rerun, cause=record.rerun_cause)
    if record.cause is not None:  # the final state's own cause
        meta = dict(meta or {}, cause=record.cause)
    use = {name: value for name, value in (
        ("started_at", record.started_at), ("ended_at", record.ended_at),
        ("cpu_seconds", record.cpu_seconds), ("max_rss_bytes", record.max_rss_bytes))
        if value is not None}
    if use:  # its last run's figures
        meta = dict(meta or {}, **use)
    return JobStatus(record.state, time=record.updated, exit_code=record.exit_code,
                     message=record.message, metadata=meta)


def _text(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _check.fail_type(field, value, "str")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as ex:
        raise ValueError(f"{field}: {value[:80]!r} is not valid Unicode text ({ex.reason}); "
                         f"accepted: text without lone surrogates") from None
    if "\0" in value:
        raise ValueError(f"{field}: {value[:80]!r} contains a NUL character")
    return value


def _states(state: StateFilter) -> Optional[List[str]]:
    if state is None:
        return None
    items = [state] if isinstance(state, (JobState, str)) else list(state)
    names = []
    for item in items:
        if isinstance(item, JobState):
            names.append(item.name)
        elif isinstance(item, str) and item.upper() in JobState.__members__:
            names.append(item.upper())
        else:
            raise ValueError(f"state: expected a JobState or one of "
                             f"{', '.join(JobState.__members__)}, got {item!r}")
    return names


def find(ids: Union[str, Iterable[str], None] = None, *, tag: Optional[str] = None,
         executor: Optional[str] = None, state: StateFilter = None,
         work_directory: PathLike = None) -> List[JobRecord]:
    """The recorded jobs matching every filter given, oldest first.

    ``ids`` is a job id or several; ``state`` a JobState (or its name) or several. Raises
    :class:`RegistryError` naming the file when the registry cannot be read.
    """
    store, rows = _select(ids, tag, executor, state, work_directory)
    return [_record(row, store.path) for row in rows]


def runs(job: Union[str, JobRecord], work_directory: PathLike = None) -> List[RunRecord]:
    """The runs of a recorded job (its id, or its :class:`JobRecord`), first run first: one
    per run, its first and each after a requeue or retry, with what each told (state, exit
    code, cause, native id, times, CPU and memory used, nodes, cores, what it asked for,
    where its output is). Empty for a job recorded by a version without the table, or before
    its first status was written. Raises :class:`RegistryError` naming the file when the
    registry cannot be read."""
    if isinstance(job, JobRecord):
        store = _store.open_store(job.registry.parent)
        return run_records(store, job.id)
    job_id = _text("job", job)
    return run_records(_store.open_store(_work_directory(work_directory)), job_id)


def _select(ids: Union[str, Iterable[str], None], tag: Optional[str], executor: Optional[str],
            state: StateFilter, work_directory: PathLike,
            columns: Sequence[str] = _store.COLUMNS
            ) -> Tuple[_store.Store, List[Row]]:
    """:func:`find`'s checks and query, returning plain rows of ``columns``."""
    id_list = None
    if ids is not None:
        id_list = [_text("ids", i) for i in ([ids] if isinstance(ids, str) else ids)]
    if tag is not None:
        _text("tag", tag)
    if executor is not None:
        _text("executor", executor)
    states = _states(state)
    store = _store.open_store(_work_directory(work_directory))
    return store, store.select(id_list, tag=tag, executor=executor, states=states,
                               columns=columns)


def set_tag(job: Job, tag: Optional[str]) -> None:
    """Record ``job`` with ``tag`` (a label to find it by); call it before submitting."""
    if not isinstance(job, Job):
        raise _check.fail_type("set_tag job", job, "psij.Job")
    if job.status.state is not JobState.NEW:
        raise InvalidJobException(f"set_tag: job {job.id} is {job.status.state}; a tag is "
                                  "given before the job is submitted")
    if tag is not None:
        _check_tag(tag)
    job.__dict__[_recorder.TAG_ATTR] = tag


def _check_tag(tag: str) -> None:
    """ValueError/TypeError naming the tag unless it is 1 to 1000 printable characters."""
    _text("tag", tag)
    if not tag or len(tag) > MAX_TAG_LENGTH:
        raise ValueError(f"tag: expected 1 to {MAX_TAG_LENGTH} characters, got {len(tag)}")
    if not tag.isprintable():
        raise ValueError(f"tag: {tag[:80]!r} contains a control character; accepted: "
                         f"printable text")


def _executor_for(record: JobRecord, cache: Dict[Tuple[str, Optional[str], str], JobExecutor]
                  ) -> JobExecutor:
    work_directory = str(record.registry.parent)
    key = (record.executor, record.url, work_directory)
    executor = cache.get(key)
    if executor is None:
        executor = JobExecutor.get_instance(
            record.executor, url=record.url,
            config=JobExecutorConfig(work_directory=work_directory))
        config = _recorded_config(type(executor.config), record.config, work_directory)
        if config is not None:
            _close(executor)
            executor = JobExecutor.get_instance(record.executor, url=record.url, config=config)
        cache[key] = executor
    return executor


def _recorded_config(cls: type, recorded: Optional[str], work_directory: str
                     ) -> Optional[JobExecutorConfig]:
    """The executor's own kind of configuration with the recorded settings (polling
    intervals, ``use_nice`` and the like), or None when the plain one will do or they do not
    fit."""
    if cls is JobExecutorConfig or recorded is None:
        return None
    import json

    try:
        settings = json.loads(recorded)
        # Not fallback: where new jobs would go is no concern of a job being followed.
        accepted = _parameters(cls) - {"fallback"}
        kwargs = {k: v for k, v in settings.items() if k in accepted and v is not None}
        kwargs["work_directory"] = work_directory
        config = cls(**kwargs)
    except Exception:  # settings of another version: the executor's defaults will do
        return None
    return config if isinstance(config, JobExecutorConfig) else None


def _parameters(cls: type) -> Set[str]:
    """The names a configuration class takes, those its ``__init__`` passes on to its base
    classes' through ``**kwargs`` included (``SlurmExecutorConfig`` takes ``use_nice``)."""
    import inspect

    names: Set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        parameters = list(inspect.signature(init).parameters.values())
        names.update(p.name for p in parameters[1:]
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return names


def _close(executor: JobExecutor) -> None:
    close = getattr(executor, "close", None)
    if callable(close):
        close()


def attach(records: Iterable[JobRecord], callback: Optional[CallbackLike] = None
           ) -> List[Job]:
    """Live jobs for ``records``, each bound to its executor (one executor per executor name,
    URL and work directory) and keeping its recorded id.

    A job recorded as final gets that status (it was recorded from its executor); any other is
    attached with its executor's ``attach``, which reports its current state and follows it.
    ``callback`` is set on every job before it is attached, so it sees each state the job
    enters from now on. Raises :class:`AttachError` (holding the jobs that were attached)
    when some could not be.
    """
    cb = as_callback(callback, "attach callback")
    executors: Dict[Tuple[str, Optional[str], str], JobExecutor] = {}
    jobs: List[Job] = []
    failures: List[Tuple[JobRecord, Exception]] = []
    for record in records:
        if not isinstance(record, JobRecord):
            raise _check.fail_type("attach records item", record, "psij.registry.JobRecord")
        try:
            jobs.append(_attach_one(record, cb, executors))
        except Exception as ex:
            failures.append((record, ex))
    if failures:
        lines = "; ".join(f"job {r.id} ({r.executor} {r.native_id}): {ex}"
                          for r, ex in failures[:10])
        more = f" and {len(failures) - 10} more" if len(failures) > 10 else ""
        raise AttachError(f"{len(failures)} recorded job(s) could not be attached: "
                          f"{lines}{more}", jobs, failures)
    return jobs


def _say_not_attachable(record: JobRecord) -> None:
    """Raise for a job recorded without a native id: held back by the process that submitted
    it (by its cap, or waiting for its local resource pool), or one that ended first."""
    from psij.executors.batch._held_jobs import HELD_MESSAGE
    from psij.executors.local._pool_driver import WAITING_MESSAGE

    held_by = record.held_by
    pool = record.message == WAITING_MESSAGE
    if held_by is not None and "ended" in held_by:
        why = "resource_pool" if pool else "max_queued_per_shape"
        raise RegistryError(f"the job was held back ({why}) and is {held_by}: "
                            f"`psij release {record.id}` submits it")
    if record.state.final:
        return
    if pool:
        raise RegistryError("the job waits for the local resource pool (resource_pool) of "
                            "the process that submitted it and has not started, so only "
                            "that process can follow it; it has no native id yet")
    if held_by is not None or record.message == HELD_MESSAGE:
        raise RegistryError("the job is held by the client process that submitted it "
                            "(max_queued_per_shape) and was not given to the scheduler, "
                            "so only that process can follow it; it has no native id yet"
                            + (f" ({held_by})" if held_by else ""))


def _attach_one(record: JobRecord, cb: Any,
                executors: Dict[Tuple[str, Optional[str], str], JobExecutor]) -> Job:
    if record.native_id is None:
        _say_not_attachable(record)
        raise RegistryError("no native id was recorded (the submitting process ended before "
                            "its executor gave one)")
    try:
        spec = record.spec
    except (ValueError, TypeError) as ex:
        raise RegistryError(f"its recorded JobSpec cannot be read: {ex}") from ex
    executor = _executor_for(record, executors)
    job = Job(spec)
    job._id = record.id
    job.__dict__[_recorder.TAG_ATTR] = record.tag
    if cb is not None:
        job.set_job_status_callback(cb)
    _follow_runs(job, record)
    if record.state.final:
        job.executor = executor
        job._native_id = record.native_id
        job._set_status(_recorded_status(record))
    else:
        executor.attach(job, record.native_id)
    return job


def reattach(ids: Union[str, Iterable[str], None] = None, *, tag: Optional[str] = None,
             executor: Optional[str] = None, state: StateFilter = None,
             work_directory: PathLike = None, callback: Optional[CallbackLike] = None
             ) -> List[Job]:
    """:func:`find` then :func:`attach`: the matching recorded jobs, live again."""
    return attach(find(ids, tag=tag, executor=executor, state=state,
                       work_directory=work_directory), callback)


def _seconds(field: str, age: timedelta) -> float:
    if not isinstance(age, timedelta):
        raise _check.fail_type(field, age, "datetime.timedelta")
    seconds = age.total_seconds()
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{field}: expected a duration of zero or more, got {age!r}")
    return seconds


def prune(older_than: timedelta, work_directory: PathLike = None) -> int:
    """Delete the final jobs last updated more than ``older_than`` ago; returns their count.
    Jobs not final are never pruned."""
    seconds = _seconds("prune older_than", older_than)
    return _store.open_store(_work_directory(work_directory)).prune(seconds)


def set_prune_age(age: timedelta) -> None:
    """How old a final job must be to be pruned when a registry is first opened in this
    process (default 30 days)."""
    _store.set_prune_age(_seconds("set_prune_age age", age))


def set_recording(on: bool) -> None:
    """Turn recording of submitted jobs on (the default) or off, in this process."""
    if not isinstance(on, bool):
        raise _check.fail_type("set_recording on", on, "bool")
    _recorder.set_enabled(on)


def flush(timeout: Optional[timedelta] = None) -> bool:
    """Wait until every status change recorded before the call is written: True once they
    all are in the registry, False if ``timeout`` passed first or some could not be written
    (said, with why, on the ``psij.registry`` logger; they are tried again by the next write
    and flush, for two minutes). It is done at exit too. Local jobs submitted so far get their
    native ids first (their starts are answered after ``submit`` returns), so each is recorded
    with its process id."""
    seconds = None if timeout is None else _seconds("flush timeout", timeout)
    return _recorder.flush(seconds, say=True)
