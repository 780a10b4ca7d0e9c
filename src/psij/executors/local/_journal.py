"""The local executor's record of its runs: which jobs were started, as which process, and how
they ended, so that ``list()`` and ``attach()`` of any executor instance, in any process, see
every job.

Where the records go: the job registry of the work directory (table ``local_runs`` of
``<work_directory>/jobs.sqlite``, see :mod:`psij._registry.store`), one store per user whatever
the number of processes and executor instances, written in batched transactions (by the
process's keeper, ``_keeper``, for the jobs it starts, and through the registry's writer
thread, :func:`psij._registry.recorder.record_run`, for the others). When recording in the
registry is off or the registry cannot be written, they go to a journal file instead: one per
process in ``<work_directory>/local/`` (created on its first record), shared by every local
executor instance of the process with that work directory, holding lines
``S <pid> <start> <job id>`` when a job starts (``start`` is the kernel's start time of the
process, which tells a reused pid apart), ``E <pid> <start> <exit code>[ canceled]`` when it
ends, and ``C <pid> <start> canceled`` when a process cancels a job another one started.
Journal files of earlier versions are read the same way (jobs started before an upgrade can
still be attached), and pruned after 7 days.

Reading trusts nothing in the journal files: a line that does not have that form (a pid
written with other digits than ASCII ones, a pid out of range, a cut or binary line) is
skipped, with one warning per journal, and never stops ``list()`` or ``attach()``.

It does not start, signal or watch processes.
"""

import os
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Dict, Optional, Set, Tuple, Union

from psij._clock import wall_time
from psij._lazylog import LazyLogger
from psij._record import Record
from psij.executors._process import start_time

if TYPE_CHECKING:
    from psij._registry.store import RunRecord, Store
    from psij.job_status import JobStatus

__all__ = ["Journal", "JournalEntry", "RunCanceled", "RunEnded", "RunNote", "RunStarted",
           "final_from_entry", "journal_line", "latest_entry", "note", "run_store", "scan",
           "scan_all", "scan_journals"]

logger = LazyLogger(__name__)

_SUFFIX = ".journal"
_MAX_AGE = 7 * 24 * 3600.0
_PID_LIMIT = 1 << 31
_MAX_OPEN = 32
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


class RunStarted(Record):
    """Job ``job_id`` started as process ``pid``, whose kernel start time is ``start``."""

    pid: int
    start: str
    job_id: str
    kind: ClassVar[str] = "S"

    @property
    def text(self) -> str:
        return self.job_id


class RunEnded(Record):
    """Process ``pid`` (started at ``start``) ended with ``exit_code`` (None: unknown), after
    a cancel or not."""

    pid: int
    start: str
    exit_code: Optional[int]
    canceled: bool = False
    kind: ClassVar[str] = "E"

    @property
    def text(self) -> str:
        code = "" if self.exit_code is None else str(self.exit_code)
        return f"{code} canceled" if self.canceled else code


class RunCanceled(Record):
    """This process cancelled the job of process ``pid`` (started at ``start``), which another
    process started."""

    pid: int
    start: str
    kind: ClassVar[str] = "C"
    text: ClassVar[str] = "canceled"


RunNote = Union[RunStarted, RunEnded, RunCanceled]


def run_record(run: RunNote) -> "RunRecord":
    """A run note as the registry stores it: (kind, pid, start, text)."""
    return (run.kind, run.pid, run.start, run.text)


def journal_line(run: RunNote) -> str:
    """A run note as a journal line."""
    return f"{run.kind} {run.pid} {run.start} {run.text}"


class Journal:
    """This process's append-only journal of job starts and ends in one folder (its file is
    made on the first line written)."""

    def __init__(self, fd: int, path: Path, key: Tuple[str, int]) -> None:
        self._fd = fd
        self._path = path
        self.text = str(path)  # its path as a string
        self._key = key
        self._lock = threading.Lock()  # taken after _OPEN_LOCK, never before

    @staticmethod
    def create(folder: Path) -> "Journal":
        """The journal of this process in ``folder``: the one already known unless its file is
        gone (the folder was removed and made again), else a new one, whose file is made when
        the first line is written."""
        key = (str(folder), os.getpid())  # a forked child writes a journal of its own
        with _OPEN_LOCK:
            journal = _OPEN.get(key)
            if journal is not None and (journal._fd < 0 or journal._same_file()):
                _OPEN.move_to_end(key)
                return journal
            _prune(folder)
            name = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}{_SUFFIX}"
            if journal is not None:
                journal._close()
            journal = _OPEN[key] = Journal(-1, folder / name, key)
            _close_oldest()
            return journal

    @property
    def path(self) -> Path:
        return self._path

    def _same_file(self) -> bool:
        try:
            mine, there = os.fstat(self._fd), os.stat(self._path)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def append(self, line: str) -> None:
        # One write of a short line to an O_APPEND file: never interleaved with other writers
        # (other processes); the lock keeps this process's threads in turn.
        if self._fd < 0:  # closed to keep few files open: the latest open again
            with _OPEN_LOCK:
                current = _OPEN.setdefault(self._key, self)
                _OPEN.move_to_end(self._key)
                _close_oldest()
            if current is not self:  # its folder was made again: write to the new file
                current.append(line)
                return
        try:
            data = (line + "\n").encode("utf-8", "surrogateescape")
            with self._lock:
                if self._fd < 0:
                    self._fd = os.open(self._path, _FLAGS, 0o600)
                os.write(self._fd, data)
        except (OSError, UnicodeEncodeError) as ex:
            logger.warning("could not write the local job journal: %s", ex)

    def append_run(self, run: RunNote) -> None:
        self.append(journal_line(run))

    def _close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


# The journals of this process, by folder, the most recently asked for last; the
# :data:`_MAX_OPEN` latest stay open (an older one opens its file again when written to).
_OPEN: "OrderedDict[Tuple[str, int], Journal]" = OrderedDict()
_OPEN_LOCK = threading.Lock()


def _close_oldest() -> None:
    # Under _OPEN_LOCK: many work directories in one process keep at most _MAX_OPEN files open.
    while len(_OPEN) > _MAX_OPEN:
        _OPEN.popitem(last=False)[1]._close()


def _after_fork() -> None:
    # A thread of the parent may have held the lock when it forked: the child starts afresh.
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()
    _OPEN.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class JournalEntry:
    """One job of a journal: its id and, once it ended, its exit code and whether it was
    cancelled (``ended`` tells an end without a recorded code from no end)."""

    __slots__ = ("canceled", "code", "ended", "job_id")

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.ended = False
        self.code: Optional[int] = None
        self.canceled = False

    def end(self, text: str) -> None:
        code, _, note = text.partition(" ")
        self.ended = text != ""  # an empty end: the exit code was not known
        self.code = int(code) if _is_int(code.lstrip("-")) else None
        self.canceled = note == "canceled"


def _is_int(text: str) -> bool:
    # str.isdigit accepts other digits ("²", "٣") that int() refuses or reads otherwise.
    return text.isascii() and text.isdigit() and len(text) < 12


def scan_journals(folder: Path) -> Dict[Tuple[int, str], JournalEntry]:
    """Every job in every journal, keyed by (pid, kernel start time)."""
    found: Dict[Tuple[int, str], JournalEntry] = {}
    canceled: Set[Tuple[int, str]] = set()
    try:
        names = [n for n in os.listdir(folder) if n.endswith(_SUFFIX)]
    except OSError:
        return found
    for name in names:
        try:
            with open(folder / name, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        skipped = 0
        for line in lines:
            parts = line.split(" ", 3)
            if len(parts) < 4 or parts[0] not in ("S", "E", "C") or not _is_int(parts[1]) \
                    or not 0 < int(parts[1]) < _PID_LIMIT:
                skipped += 1
                continue
            key = (int(parts[1]), parts[2])
            if parts[0] == "S":
                found[key] = JournalEntry(parts[3])
            elif parts[0] == "C":
                canceled.add(key)  # may be in another journal than the start
            elif key in found:
                found[key].end(parts[3])
        if skipped:
            logger.warning("local job journal %s: %d line(s) that are not job records were "
                           "skipped", folder / name, skipped)
    for key in canceled & found.keys():
        found[key].canceled = True
    return found


def scan(folder: Path, store: "Optional[Store]") -> Dict[Tuple[int, str], JournalEntry]:
    """Every job in the journal files of ``folder`` and in the registry ``store`` (if any)."""
    found = scan_journals(folder)
    if store is None:
        return found
    try:
        rows = store.local_runs()
    except Exception as ex:  # the journal files are still read
        logger.warning("the local jobs recorded in %s cannot be read: %s", store.path, ex)
        return found
    for pid, start, job_id, code, ended, canceled in rows:
        key = (int(pid), str(start))
        entry = found.get(key)
        if job_id is not None:
            if entry is None:
                entry = found[key] = JournalEntry(str(job_id))
            if ended:
                entry.ended = True
                entry.code = code if isinstance(code, int) else None
        if canceled and entry is not None:  # a row without a job id: its start is in a file
            entry.canceled = True
    return found


def run_store(work_directory: Path) -> "Optional[Store]":
    """The registry that local run records go to; None: they go to the journal files."""
    from psij._registry.recorder import run_store as store_for

    return store_for(work_directory)


def note(work_directory: Path, journal: Journal, run: RunNote, job_id: str = "") -> None:
    """Record a run's start, end or cancel: in the registry (batched), else, or if it cannot be
    written, in ``journal`` (an end with its start again, ``job_id``'s: the start may be in
    the registry that could not be written)."""
    store = run_store(work_directory)
    if store is None:
        journal.append_run(run)
        return
    from psij._registry.recorder import record_run

    def fallback(_: "RunRecord") -> None:
        if isinstance(run, RunEnded) and job_id:
            journal.append_run(RunStarted(run.pid, run.start, job_id))
        journal.append_run(run)

    record_run(store, run_record(run), fallback)


def scan_all(folder: Path, work_directory: Path) -> Dict[Tuple[int, str], JournalEntry]:
    """:func:`scan` of the journals in ``folder`` and the registry of ``work_directory``, with
    this process's queued records written first. A registry that recording is off for is read
    all the same, if it exists: other processes may have written to it."""
    store = run_store(work_directory)
    if store is not None:
        from psij._registry.recorder import flush

        flush()
    else:
        from psij._registry.store import open_store, registry_path

        if os.path.isfile(registry_path(work_directory)):
            try:
                store = open_store(work_directory)
            except Exception as ex:
                logger.warning("the local jobs recorded in %s cannot be read: %s",
                               registry_path(work_directory), ex)
    return scan(folder, store)


def latest_entry(found: Dict[Tuple[int, str], JournalEntry], pid: int
                 ) -> Optional[Tuple[int, str]]:
    """The key of ``pid``'s job: the running one if any, else the one started last."""
    keys = [k for k in found if k[0] == pid]
    if not keys:
        return None
    live = start_time(pid)
    if live is not None and (pid, live) in found:
        return (pid, live)
    return max(keys, key=lambda k: int(k[1]) if _is_int(k[1]) else -1)


def _prune(folder: Path) -> None:
    cutoff = wall_time() - _MAX_AGE
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.endswith(_SUFFIX) and e.stat().st_mtime < cutoff:
                    os.unlink(e.path)
    except OSError:
        pass


def final_from_entry(canceled: bool, entry: "Optional[JournalEntry]") -> "JobStatus":
    """The final status of an attached job from its record (``canceled``: by this process)."""
    from psij.executors._process import failure_message
    from psij.job_state import JobState
    from psij.job_status import JobStatus

    if entry is None or not entry.ended:
        return JobStatus(JobState.FAILED, message=(
            "the process ended but its exit code was not recorded (the process that "
            "started it exited first)"))
    code = entry.code
    state = JobState.COMPLETED if code == 0 else JobState.FAILED
    if canceled or entry.canceled:
        state = JobState.CANCELED
    msg = failure_message(code, None) if state is JobState.FAILED else None
    return JobStatus(state, exit_code=code, message=msg)
