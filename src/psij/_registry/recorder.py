"""Records every job in the job registry as its executor reports status changes.

:meth:`psij.JobExecutor._set_job_status`, which every executor (local, batch, pilot, and
side-loaded ones written for psij-python) calls to report a status, calls :func:`record` after
the job entered the new state. The registry is the one of the executor's work directory
(``config.work_directory``, by default ``~/.psij/work``: one per user).

Writes are batched: :func:`record` only queues the change (a few microseconds in the submitting
thread), and one writer thread per process commits what has accumulated about every 50 ms in one
transaction (the first change of a job inserts its row, the others update it), and at exit. The
writer ends once it has had nothing to write for :data:`IDLE_SECONDS` and the next change starts
it again, so a program that stopped using psij keeps no thread of it. The writer also opens the
registry and describes the executor (once each), so that the first job an executor submits waits
for neither, nor for this module's imports of SQLite and JSON. Its first write to a registry
also prunes old final jobs. A ``kill -9`` may therefore lose the last 50 ms or so of changes;
those are cheap to lose (re-attaching asks the executor for the real state), and no job is lost
with them: the executors commit (or hand to a process that outlives them) each job's first row
before ``submit`` returns (:mod:`psij._registry.durable`, and :mod:`psij._registry.held` for the
jobs psij holds back). :func:`flush` waits until the changes
queued before it are written and says True only if they all are committed (see
:class:`_Writer` for changes a write could not commit); ``psij submit`` calls it before it prints
the job id. A writer thread that cannot start leaves the queue to :func:`flush` and the exit,
which write it in their own thread.

The local executor's run records (:func:`record_run`) go through the same thread and
transactions; a record that cannot be written is handed back to the caller's fallback (which
appends it to a journal file), so none is lost.

Recording never fails a job: a registry that cannot be written is reported once per file on the
``psij.registry`` logger and the job goes on. Nothing here runs user callbacks.
"""

# No annotation is evaluated on import (typing compiles a quoted name inside a subscript).
from __future__ import annotations

import atexit
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple, Union

from psij._clock import Clock, MonotonicClock, wall_time
from psij._lazylog import LazyLogger
from psij._registry.accounting import NO_USE, use_of
from psij._registry.runs import keeps_outputs, merged, previous_run, run_figures, run_rows

if TYPE_CHECKING:
    from psij._registry.store import Row, RunRecord, Store, Update
    from psij.job import Job
    from psij.job_executor import JobExecutor
    from psij.job_status import JobStatus

__all__ = ["RERUN_ATTR", "TAG_ATTR", "cause_of", "enabled", "flush", "record", "record_run",
           "run_of", "run_store", "set_enabled"]

logger = LazyLogger("psij.registry")

TAG_ATTR = "_psij_registry_tag"
_RECORDED_ATTR = "_psij_registry_recorded"  # on a job: its row is queued or written
RECORDED_ATTR = _RECORDED_ATTR
_SPEC_TEXT_ATTR = "_psij_registry_spec"  # on a job: its spec's text, made at submit (durable)
_IDENTITY_ATTR = "_psij_registry"  # on an executor: its Identity
RERUN_ATTR = "_psij_registry_rerun"  # on a job: (kind, cause) of its last rerun
MAX_ATTEMPT = 2 ** 31  # a greater attempt recorded is taken for none (1)
_WORD = 200  # the most characters of a rerun's kind or cause recorded
_BATCH_SECONDS = 0.05
_FULL_BATCH = 5000  # a batch this big is written without waiting for more
_GIVE_UP_SECONDS = 120.0  # changes that failed this long ago are no longer tried again
_THREAD_RETRY_SECONDS = 1.0  # a writer thread that could not start is not tried before
IDLE_SECONDS = 2.0  # the writer thread ends after this long with nothing to write
_EXIT_FLUSH_SECONDS = 120.0

_state = {"enabled": True}
_warned: Set[Tuple[str, str]] = set()
_failures: Dict[Path, Tuple[float, str]] = {}
_RETRY_SECONDS = 30.0
_CLOCK: Clock = MonotonicClock()  # retries and flush timeouts are measured on it

if TYPE_CHECKING:  # the aliases serve type checkers only (annotations are not evaluated)
    # (pid, store, executor name, version, url, config as JSON); remade in a forked child.
    Identity = Tuple[int, Store, str, Optional[str], Optional[str], Optional[str]]
    # A queued change: (executor, job, True for its first change, the status values), or
    # (store, None, None, (local run record, its fallback)).
    _Queued = Tuple[Union[JobExecutor, Store], Optional[Job], Optional[bool], Tuple[Any, ...]]
    # The same with the executor's identity worked out: (store, job, identity or None for an
    # update, the status values), or a local run record as above.
    _Change = Tuple[Store, Optional[Job], Optional[Identity], Tuple[Any, ...]]


def set_enabled(on: bool) -> None:
    _state["enabled"] = bool(on)


def enabled() -> bool:
    return _state["enabled"]


def _identity(executor: JobExecutor) -> Identity:
    """The executor's registry and description (the writer thread works it out)."""
    import json

    found: Optional[Identity] = executor.__dict__.get(_IDENTITY_ATTR)
    if found is not None and found[0] == os.getpid():
        return found
    try:
        name = executor.name
    except Exception:  # a plugin whose descriptor cannot be read: its class name will do
        name = type(executor).__name__.lower()
    try:
        version: Optional[str] = str(executor.version)
    except Exception:
        version = None
    config = executor.config
    settings = {key: (str(value) if isinstance(value, Path) else value)
                for key, value in sorted(vars(config).items())
                if not key.startswith("_") and (value is None or isinstance(
                    value, (str, int, float, bool, Path)))}
    try:
        config_text: Optional[str] = json.dumps(settings, allow_nan=False)
    except ValueError:
        config_text = None
    store = _open(Path(config.work_directory))
    identity: Identity = (os.getpid(), store, name, version, executor.url, config_text)
    executor.__dict__[_IDENTITY_ATTR] = identity
    return identity


def _open(work_directory: Path) -> Store:
    """The registry, or the error it gave less than :data:`_RETRY_SECONDS` ago (a damaged
    file is not opened again for every job)."""
    from psij._registry.store import RegistryError, open_store

    failed = _failures.get(work_directory)
    if failed is not None and _CLOCK.now() - failed[0] < _RETRY_SECONDS:
        raise RegistryError(failed[1])
    try:
        return open_store(work_directory)
    except Exception as ex:
        _failures[work_directory] = (_CLOCK.now(), str(ex))
        raise


def run_store(work_directory: Path) -> Optional[Store]:
    """The registry the local executor records its runs in: None when recording is off or the
    registry cannot be opened (said once per file; the executor then keeps journal files)."""
    if not _state["enabled"]:
        return None
    store = _RUN_STORES.get(work_directory)
    if store is not None:
        return store
    try:
        store = _RUN_STORES[work_directory] = _open(work_directory)
        return store
    except Exception as ex:
        _warn_once(str(work_directory), ex)
        return None


# Opened registries by work directory as given (a spawn asks at every job).
_RUN_STORES: Dict[Path, Store] = {}


def record_run(store: Store, run: RunRecord,
               fallback: Callable[[RunRecord], None]) -> None:
    """Queue a local run record; ``fallback`` gets it if it cannot be written."""
    _WRITER.put((store, None, None, (run, fallback)))


def _warn_once(where: str, ex: Exception) -> None:
    key = (where, type(ex).__name__)
    if key not in _warned:
        _warned.add(key)
        logger.warning("jobs are not recorded in the job registry (%s): %s", where, ex)


def _text(value: Optional[str]) -> Optional[str]:
    """A string SQLite can store (a lone surrogate is written as its escape)."""
    if value is None:
        return None
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def keep_spec_text(job: Job, text: Optional[str]) -> None:
    """Keep the spec's ``text``, made for ``job`` at submit (:mod:`.durable`), for the job's
    first write here (the spec is encoded once)."""
    job.__dict__[_SPEC_TEXT_ATTR] = (text,)


def _spec_text(job: Job) -> Optional[str]:
    kept = job.__dict__.pop(_SPEC_TEXT_ATTR, None)
    if kept is not None:
        return kept[0]  # type: ignore[no-any-return]
    spec = job.spec
    if spec is None:
        return None
    from psij.serialize import _spec_to_json

    encoder = _ENCODER.get("json")
    if encoder is None:
        import json

        encoder = _ENCODER["json"] = json.JSONEncoder(allow_nan=False)
    try:
        return str(encoder.encode(_spec_to_json(spec)))
    except (ValueError, TypeError) as ex:
        logger.warning("job %s: its JobSpec cannot be recorded in the job registry (%s); "
                       "the job is recorded without it", job.id, ex)
        return None


# One encoder for every spec (json.dumps with an option makes a new one per call).
_ENCODER: Dict[str, Any] = {}

def record(executor: JobExecutor, job: Job) -> None:
    """Queue the job's current status for the registry (see the module's rules)."""
    if not _state["enabled"]:
        return
    try:
        status = job.status
        state = status.state
        attempt, rerun = run_of(job, status)
        figures = use_of(status.metadata, True)
        now = wall_time()
        values = (job._native_id, state.name, state.order, status.exit_code, status.message,
                  now, state.final, attempt, rerun, cause_of(status),
                  figures if state.final else NO_USE,
                  (run_figures(figures, state.name, job._native_id, now),
                   keeps_outputs(executor), previous_run(status, attempt)))
        first = _RECORDED_ATTR not in job.__dict__
        job.__dict__[_RECORDED_ATTR] = True
        _WRITER.put((executor, job, first, values))
    except Exception as ex:
        _warn_once(str(getattr(executor.config, "work_directory", "?")), ex)


def cause_of(status: JobStatus) -> Optional[str]:
    """Why a final status came (its metadata's ``cause``: ``time_limit``, ``out_of_memory``,
    ``unstartable``...), at most :data:`_WORD` characters; None for a status not final (the
    cause a new run's status carries is its rerun's, kept apart)."""
    cause = (status.metadata or {}).get("cause") if status.state.final else None
    return _text(cause[:_WORD]) if isinstance(cause, str) and cause else None


def run_of(job: Job, status: JobStatus) -> Tuple[int, Optional[Tuple[Any, ...]]]:
    """The job's attempt (1 for its first run) and, from its second run on, its last rerun:
    (kind, cause, requeues, retries), from the runs its executor counts
    (:mod:`psij._retry`) or, for a job without them, the attempt (or run) its status metadata
    holds."""
    runs = job.__dict__.get("_runs")
    meta = status.metadata
    if meta and isinstance(meta.get("rerun"), str):  # the status that starts a run
        cause = meta.get("cause")
        job.__dict__[RERUN_ATTR] = (meta["rerun"][:_WORD],
                                    cause[:_WORD] if isinstance(cause, str) else None)
    # (A status's "attempt", or its "run": the run of a job its scheduler requeued.)
    attempt = runs.attempt if runs is not None else \
        (meta or {}).get("attempt", (meta or {}).get("run"))
    # What a status says (another host's, a plugin's) is not trusted to fit the column.
    if isinstance(attempt, bool) or not isinstance(attempt, int) \
            or not 1 < attempt <= MAX_ATTEMPT:
        return 1, None
    kind, cause = job.__dict__.get(RERUN_ATTR, (None, None))
    return attempt, (kind, cause, getattr(runs, "requeues", None),
                     getattr(runs, "retries", None))


def _resolved(queued: List[_Queued]) -> List[_Change]:
    """The queued changes with their executors' identities (in the writer thread); a change
    whose executor's registry cannot be opened is left out, said once per file."""
    return _resolve(queued)[0]


def _resolve(queued: List[_Queued]) -> Tuple[List[_Change], List[int], List[Tuple[int, str]]]:
    """:func:`_resolved`, with the index in ``queued`` of each change and the changes left
    out, (index, why)."""
    changes: List[_Change] = []
    origin: List[int] = []
    missed: List[Tuple[int, str]] = []
    for at, (target, job, first, values) in enumerate(queued):
        if job is None:
            changes.append((target, None, None, values))  # type: ignore[arg-type]
            origin.append(at)
            continue
        executor: JobExecutor = target  # type: ignore[assignment]
        try:
            identity = _identity(executor)
        except Exception as ex:
            where = str(getattr(executor.config, "work_directory", "?"))
            _warn_once(where, ex)
            missed.append((at, f"{where}: {ex}"))
            continue
        changes.append((identity[1], job, identity if first else None, values))
        origin.append(at)
    return changes, origin, missed


def _rerun_text(rerun: Optional[Tuple[Any, ...]]) -> Optional[str]:
    """The ``rerun`` column: a JSON object (rerun, cause, requeues, retries), or None."""
    if rerun is None:
        return None
    import json

    kind, cause, requeues, retries = rerun
    return json.dumps({"rerun": _text(kind), "cause": _text(cause), "requeues": requeues,
                       "retries": retries})


def _row(job: Job, identity: Identity, values: Tuple[Any, ...]) -> Row:
    _, _, name, version, url, config = identity
    native_id, state, rank, exit_code, message, now, final, attempt, rerun, cause, use = \
        values[:11]
    return (job.id, name, version, _text(url), config, _text(native_id), _spec_text(job),
            job.__dict__.get(TAG_ATTR), now, state, rank, exit_code, _text(message), now,
            int(final), attempt, _rerun_text(rerun), cause, *use)


def _update(job: Job, values: Tuple[Any, ...]) -> Update:
    native_id, state, rank, exit_code, message, now, final, attempt, rerun, cause, use = \
        values[:11]
    return (_text(native_id), state, rank, exit_code, _text(message), now, int(final),
            attempt, _rerun_text(rerun), job.id, cause, *use)


class _Retry:
    """A job's changes that a write could not commit, kept for the next write: ``seq``, the
    sequence number of its earliest change not committed; ``change``, its latest change (an
    insert if any of them was its first); ``why``; ``since``, when they first failed (on
    _CLOCK). A plain class: a NamedTuple would make forward references of these annotations
    when this module is imported."""

    __slots__ = ("change", "seq", "since", "why")

    def __init__(self, seq: int, change: _Queued, why: str, since: float) -> None:
        self.seq, self.change, self.why, self.since = seq, change, why, since


class _Writer:
    """The one thread that commits queued changes, a batch at a time.

    Every queued change has a sequence number (the n-th change queued has n); ``_done`` is the
    greatest number up to which every change went through a write. A job's changes that a
    write could not commit (the registry locked for too long, unwritable, not to be opened) are
    kept, one entry per job, and written with the next batch, for :data:`_GIVE_UP_SECONDS`;
    then they count as lost. :meth:`wait` compares those numbers with the ones queued before
    it was called, so that it says "written" only of what is in the file.
    """

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._cv = threading.Condition()
        self._write_lock = threading.Lock()  # one batch at a time, in the order queued
        self._queue: List[_Queued] = []
        self._queued = 0  # changes queued so far
        self._done = 0  # every change up to this number went through a write
        self._batches = 0  # batches written (or tried) so far
        self._retry: Dict[Job, _Retry] = {}
        self._retry_now = False  # a flush asks for the kept changes to be tried again
        # What was given up: its first number, how many jobs or local runs, why (the last).
        self._lost: Optional[Tuple[int, int, str]] = None
        self._busy = False
        self._flushing = 0  # callers of flush waiting: write without gathering more
        self._thread: Optional[threading.Thread] = None
        self._no_thread_until = -1e300  # a thread that could not start is not retried before

    def put(self, change: _Queued) -> None:
        with self._cv:
            self._queue.append(change)
            self._queued += 1
            if not _state.get("atexit"):
                _state["atexit"] = True
                atexit.register(_flush_at_exit)
            if self._thread is None:
                self._start()
            elif len(self._queue) == 1 or len(self._queue) == _FULL_BATCH:
                self._cv.notify_all()

    def _start(self) -> bool:
        """Start the writer thread (the caller holds ``_cv``); False if it cannot start now
        (too many threads or processes, the interpreter shutting down): :meth:`wait` then
        writes in the calling thread, and a later change tries again."""
        if _CLOCK.now() < self._no_thread_until:
            return False
        thread = threading.Thread(target=self._run, name="psij-registry-writer", daemon=True)
        try:
            thread.start()
        except RuntimeError as ex:
            self._no_thread_until = _CLOCK.now() + _THREAD_RETRY_SECONDS
            # At exit (Python 3.12 starts no thread then) the exit's flush writes them.
            if "shutdown" not in str(ex) and ("thread", "start") not in _warned:
                _warned.add(("thread", "start"))
                logger.warning("the job registry's writer thread cannot start (%s); status "
                               "changes are written by psij.registry.flush() and at exit", ex)
            return False
        self._thread = thread
        return True

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._queue and not self._retry_now:
                    self._busy = False
                    self._cv.notify_all()
                    # put() starts a new thread once this one is no longer _thread: both
                    # decide under the lock, so no change is left without a writer.
                    if not self._cv.wait_for(lambda: self._queue or self._retry_now,
                                             self.idle_seconds):
                        self._thread = None
                        return
                self._busy = True
                # Let more changes gather into this transaction, unless someone waits for it
                # or a batch is already full.
                self._cv.wait_for(lambda: self._flushing > 0
                                  or len(self._queue) >= _FULL_BATCH, _BATCH_SECONDS)
            try:
                self._batch()
            except BaseException:  # the next change, or a flush, starts another writer
                with self._cv:
                    self._thread, self._busy = None, False
                    self._cv.notify_all()
                raise

    def _batch(self) -> None:
        """Write what is queued, and the changes kept from failed writes, in one batch."""
        with self._write_lock:
            with self._cv:
                queued, self._queue = self._queue, []
                first = self._done + 1
                end = self._done + len(queued)
                kept = list(self._retry.values())
                self._retry, self._retry_now = {}, False
            items = [entry.change for entry in kept] + queued
            seqs = [entry.seq for entry in kept] + list(range(first, end + 1))
            failures: List[Tuple[int, str, bool]] = []
            interrupted: Optional[BaseException] = None
            try:
                changes, origin, missed = _resolve(items)
                failures = [(at, why, True) for at, why in missed]
                failures += [(origin[at], why, again)
                             for at, why, again in self._write(changes) or ()]
            except Exception as ex:  # this batch only: the writer goes on with the next one
                logger.exception("the job registry writer could not write a batch")
                failures = [(at, f"{type(ex).__name__}: {ex}", True)
                            for at in range(len(items))]
            except BaseException as ex:  # the thread ends: what it held counts as given up
                interrupted = ex
                failures = [(at, f"interrupted: {type(ex).__name__}", False)
                            for at in range(len(items))]
            retry, lost = self._sorted_out(items, seqs, kept, failures)
            with self._cv:
                self._done = max(self._done, end)
                self._batches += 1
                self._retry = retry
                if lost:
                    seq, count, _ = self._lost or (lost[0][0], 0, "")
                    self._lost = (min(seq, min(n for n, _ in lost)), count + len(lost),
                                  lost[-1][1])
                self._cv.notify_all()
            # Jobs (and through them executors) must not outlive their write.
            del queued, items, kept, retry
            if interrupted is not None:
                raise interrupted

    @staticmethod
    def _sorted_out(items: List[_Queued], seqs: List[int], kept: List[_Retry],
                    failures: List[Tuple[int, str, bool]]
                    ) -> Tuple[Dict[Job, _Retry], List[Tuple[int, str]]]:
        """The failed changes to try again (one entry per job) and those given up (number,
        why): local run records (their fallback had them), changes that cannot be written
        however often tried, and those that failed for :data:`_GIVE_UP_SECONDS`."""
        now = _CLOCK.now()
        retry: Dict[Job, _Retry] = {}
        lost: List[Tuple[int, str]] = []
        lost_jobs: Set[int] = set()  # counted once each
        for at, why, again in failures:
            target, job, first, values = items[at]
            since = kept[at].since if at < len(kept) else now
            if job is None or not again or now - since > _GIVE_UP_SECONDS:
                if job is None or id(job) not in lost_jobs:
                    lost.append((seqs[at], why))
                if job is not None:
                    lost_jobs.add(id(job))
                    if first:
                        job.__dict__.pop(_RECORDED_ATTR, None)  # inserted by its next change
                continue
            seen = retry.get(job)
            if seen is not None:
                _, _, seen_first, seen_values = seen.change
                if (seen_values[7], seen_values[2]) > (values[7], values[2]):
                    values = seen_values  # by run (attempt), then by state
                first = bool(first or seen_first)
                since = min(since, seen.since)
            retry[job] = _Retry(min(seqs[at], seen.seq if seen else seqs[at]),
                                (target, job, first, values), why, since)
        return retry, lost

    @staticmethod
    def _write(batch: List[_Change]) -> List[Tuple[int, str, bool]]:
        """Write ``batch``; the changes not committed: (index in ``batch``, why, whether a
        later write may succeed). A local run record not committed is handed to its fallback
        and is not among them unless the fallback failed."""
        from psij._registry.store import prune_once

        # A job whose row is new in this batch gets one insert with its latest status, one
        # whose row was written before one update with its latest status. "Latest" is by the
        # run (a job run again goes back to QUEUED), then by the state's rank, not by queue
        # order: two threads may queue a job's changes out of order (the one that saw ACTIVE
        # may put after the one that saw FAILED), and a final state must never be overwritten
        # by an earlier one (the store keeps the same rule).
        latest: Dict[int, Dict[Job, Tuple[Optional[Identity], Tuple[Any, ...], List[int]]]] = {}
        runs: Dict[int, List[Tuple[int, RunRecord, Callable[[RunRecord], None]]]] = {}
        stores: Dict[int, Store] = {}
        for at, (store, job, identity, values) in enumerate(batch):
            key = id(store)
            stores[key] = store
            if job is None:
                runs.setdefault(key, []).append((at, values[0], values[1]))
                continue
            jobs = latest.setdefault(key, {})
            seen = jobs.get(job)
            if seen is None:
                jobs[job] = (identity, values, [at])
            else:
                # By run (attempt), then by state; the figures the other tells of its run
                # are kept with it (an ACTIVE status's start, a new run's run before).
                newer = (values[7], values[2]) >= (seen[1][7], seen[1][2])
                keep = merged(values, seen[1]) if newer else merged(seen[1], values)
                seen[2].append(at)
                jobs[job] = (identity if identity is not None else seen[0], keep, seen[2])
        failed: List[Tuple[int, str, bool]] = []
        for key, store in stores.items():
            rows: List[Row] = []
            updates: List[Update] = []
            job_runs: List[Tuple[Any, ...]] = []
            kept: List[Tuple[Any, ...]] = []
            written: List[int] = []
            for job, (identity, values, where) in latest.get(key, {}).items():
                try:
                    made, moved = run_rows(job, values)
                    if identity is not None:
                        rows.append(_row(job, identity, values))
                    else:
                        updates.append(_update(job, values))
                    job_runs += made
                    kept += moved
                    written += where
                except Exception as ex:
                    logger.exception("job %s: could not be recorded", job.id)
                    failed += [(at, f"job {job.id}: {ex}", False) for at in where]
            store_runs = runs.get(key, [])
            try:
                prune_once(store)
                store.write(rows, updates, [run for _, run, _ in store_runs], job_runs, kept)
            except Exception as ex:
                _warn_once(str(store.path), ex)
                failed += [(at, str(ex), True) for at in written]
                for at, run, fallback in store_runs:
                    try:
                        fallback(run)
                    except Exception as lost:
                        logger.exception("a local run record could not be kept")
                        failed.append((at, f"{ex}; its journal: {lost}", False))
        return failed

    def wait(self, timeout: Optional[float] = None) -> Optional[str]:
        """Wait until every change queued before the call is committed: None then, else why
        not (``timeout`` passed first, or a write failed). Changes kept from failed writes
        are tried again first. Without a writer thread the batches are written here."""
        deadline = None if timeout is None else _CLOCK.now() + timeout
        with self._cv:
            target = self._queued
            again = any(entry.seq <= target for entry in self._retry.values())
            self._retry_now = self._retry_now or again
            batches = self._batches
            self._flushing += 1
            self._cv.notify_all()
            try:
                while self._done < target or (again and self._batches == batches):
                    alive = self._thread is not None and self._thread.is_alive()
                    if not alive and not self._start():
                        self._cv.release()
                        try:
                            self._batch()
                        finally:
                            self._cv.acquire()
                        continue
                    remaining = None if deadline is None else deadline - _CLOCK.now()
                    if remaining is not None and remaining <= 0:
                        return (f"{target - self._done} of the status changes queued were "
                                f"still being written after {timeout:.0f} s")
                    _CLOCK.wait(self._cv, remaining)
                return self._failure(target)
            finally:
                self._flushing -= 1

    def _failure(self, target: int) -> Optional[str]:
        """Why changes numbered up to ``target`` are not all committed (None: they are)."""
        kept = [entry for entry in self._retry.values() if entry.seq <= target]
        why: List[str] = []
        if kept:
            why.append(f"the status changes of {len(kept)} job(s) could not be written "
                       f"({kept[-1].why}); they are tried again with the next write")
        if self._lost is not None and self._lost[0] <= target:
            why.append(f"the status changes of {self._lost[1]} job(s) or local run(s) could "
                       f"not be written and were given up ({self._lost[2]})")
        return "; ".join(why) or None

    def flush(self, timeout: Optional[float] = None, say: bool = False) -> bool:
        """:meth:`wait`; True if everything queued before is committed, else False (with
        ``say``, saying why on the ``psij.registry`` logger)."""
        why = self.wait(timeout)
        if why is not None and say:
            logger.warning("the job registry: %s", why)
        return why is None

    def forget_failures(self) -> None:
        """Drop the changes kept from failed writes and the count of lost ones (their jobs'
        later changes are recorded as usual)."""
        with self._cv:
            for entry in self._retry.values():
                job, first = entry.change[1], entry.change[2]
                if job is not None and first:
                    job.__dict__.pop(_RECORDED_ATTR, None)
            self._retry, self._lost = {}, None

    def after_fork(self) -> None:
        # The parent's changes, and its kept ones, are the parent's to write.
        self.__init__(self.idle_seconds)  # type: ignore[misc]


_WRITER = _Writer()
_BEFORE_FLUSH_SECONDS = 30.0


# Called by flush() first, with the seconds they may take: executors whose jobs get their
# native id after submit returns (the local executor's keepers) let those arrive, so that a
# flush after submit records what a synchronous submit would have.
_BEFORE_FLUSH: List[Callable[[float], None]] = []


def before_flush(hook: Callable[[float], None]) -> None:
    """Have ``hook(seconds)`` run at the start of every :func:`flush` (once, however often
    it is given)."""
    if hook not in _BEFORE_FLUSH:
        _BEFORE_FLUSH.append(hook)


def flush(timeout: Optional[float] = None, say: bool = False) -> bool:
    """Commit every change queued before the call (after the :func:`before_flush` steps); True
    once they are all in the registry, False if ``timeout`` passed first or some could not be
    written (with ``say``, saying why on the ``psij.registry`` logger: what
    :func:`psij.registry.flush` does; psij's own waits, followed by the exit's, say nothing)."""
    deadline = None if timeout is None else _CLOCK.now() + timeout
    for hook in list(_BEFORE_FLUSH):
        try:
            hook(_BEFORE_FLUSH_SECONDS if deadline is None
                 else max(0.0, deadline - _CLOCK.now()))
        except Exception:
            logger.exception("the job registry: a step before flushing failed")
    return _WRITER.flush(None if deadline is None else max(0.0, deadline - _CLOCK.now()), say)


def flush_queued(timeout: Optional[float] = None) -> bool:
    """Commit the changes queued so far, without the steps of :func:`flush` that wait for
    native ids to come (a local job queued here may be recorded without its process id yet,
    which a later change brings); False as :func:`flush`."""
    return _WRITER.flush(timeout)


def _flush_at_exit() -> None:
    why = _WRITER.wait(_EXIT_FLUSH_SECONDS)
    if why is not None:
        logger.warning("the job registry: %s; those status changes of this process are not "
                       "recorded (their executors still know them)", why)


def _after_fork_in_child() -> None:
    # SQLite connections must not be used across fork; the child opens its own.
    store_module = sys.modules.get("psij._registry.store")
    if store_module is not None:
        store_module.forget_stores()
    _RUN_STORES.clear()
    _WRITER.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
