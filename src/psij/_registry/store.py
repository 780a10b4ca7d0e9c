"""The job registry's SQLite file: one row per job, opened, checked, written and read here.

The file is ``<work directory>/jobs.sqlite`` (the directory 0700, the file 0600, both checked
with :mod:`psij._private_dirs`). It is used in WAL mode, so readers never wait for a writer and a
status change writes one row. Several processes may write at once: SQLite serialises writers,
and a writer that finds the file locked waits (:data:`LOCK_WAIT_SECONDS` in all), saying once
on the ``psij.registry`` logger (stderr unless logging is configured), when it has waited a few
seconds, that it waits and for whom.

A job run again (requeued or retried, :mod:`psij._retry`) keeps its row: ``attempt`` says
which run it is in, ``rerun`` how the last one started, and a later run's status is written
even when its state is an earlier one (QUEUED again), an earlier run's never. A registry made
by a version without these columns gets them when it is opened (``ALTER TABLE``, once).

Nothing here ever deletes, truncates or rewrites a file it cannot read: a file that is not a
SQLite database, or a damaged one, raises :class:`RegistryError` naming the file and is left as
it is for the user to inspect or move away.

The table ``runs`` holds one row per run of a job (:mod:`psij._registry.runs`), written in the
same transactions as the job's row.

The same file holds the local executor's record of the processes it started (table
``local_runs``, one row per process: pid, kernel start time, job id, exit code, whether it was
cancelled), written by :mod:`psij.executors.local._keeper` and :mod:`psij.executors.local` and
read by the local executor's ``list()`` and ``attach()``.

This module does no recording policy (which jobs, when): see :mod:`psij._registry.recorder`.
``import psij`` does not load it (it imports :mod:`sqlite3`).
"""

import itertools
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, TypeVar
from urllib.parse import quote

from psij._clock import Clock, MonotonicClock, wall_time
from psij._lazylog import LazyLogger
from psij._private_dirs import check_private_file, ensure_private_dir
from psij._registry import runs as _runs
from psij._registry.accounting import USE_KEYS

__all__ = ["FILE_NAME", "LOCK_WAIT_SECONDS", "RUN_SQL", "RegistryError", "Row", "RunRecord",
           "Store", "forget_stores", "open_store", "prune_once", "registry_path",
           "set_prune_age"]

logger = LazyLogger("psij.registry")

FILE_NAME = "jobs.sqlite"
LOCK_WAIT_SECONDS = 600.0
_CLOCK: Clock = MonotonicClock()  # what the wait for another process's write lock is measured on
# SQLite's own busy wait between our checks; each expiry lets us say that we are waiting.
_BUSY_SLICE_SECONDS = 1.0
# A write that has waited this long for the lock says so (once per file and process): several
# processes writing at once take turns, each waiting for the others' batches.
_LOCK_NOTICE_SECONDS = 2.0
DEFAULT_PRUNE_AGE_SECONDS = 30 * 24 * 3600.0
_prune_age = {"seconds": DEFAULT_PRUNE_AGE_SECONDS}

_T = TypeVar("_T")

# Columns in table order; a ``Row`` read is a tuple in this order, a ``Row`` written one in the
# order of ``STATUS_COLUMNS``.
COLUMNS = ("id", "executor", "executor_version", "url", "config", "native_id", "spec", "tag",
           "submitted", "state", "rank", "exit_code", "message", "updated", "final", "attempt",
           "rerun", "held", "holder", "cause", "started_at", "ended_at", "cpu_seconds",
           "max_rss_bytes", "queued_at", "nodes", "cores", "requested_memory_bytes",
           "requested_seconds", "held_from", "held_to")
# The columns later versions added, each with its definition: a registry made before them gets
# them when it is opened (``ALTER TABLE ... ADD COLUMN``, once).
ADDED_COLUMNS = (
    ("attempt", "INTEGER NOT NULL DEFAULT 1"),  # the job's run: 2 once it runs again
    ("rerun", "TEXT"),  # its last rerun as JSON: rerun (kind), cause, requeues, retries
    ("held", "TEXT"),  # held by psij in a client process: "held" or "submitting" (else NULL)
    ("holder", "TEXT"),  # that process as JSON: pid, host, start (its kernel start time)
    ("cause", "TEXT"),  # why a final state came (status metadata "cause"), else NULL
    # A final state's run, as its status metadata tells (the local executor's, from the
    # resource use of the job's process as its keeper reaped it), else NULL: its start and
    # end (wall clock), its CPU time (user + system) and its peak memory (max RSS).
    ("started_at", "REAL"),
    ("ended_at", "REAL"),
    ("cpu_seconds", "REAL"),
    ("max_rss_bytes", "INTEGER"),
    # More of the final state's run, likewise (psij._registry.accounting): when its scheduler
    # queued it, the nodes it ran on, its cores, the memory and duration it asked for.
    ("queued_at", "REAL"),
    ("nodes", "TEXT"),
    ("cores", "INTEGER"),
    ("requested_memory_bytes", "INTEGER"),
    ("requested_seconds", "REAL"),
    # When psij began and ceased to hold the job back in a client process (the ``held``
    # marker: its caps, a pool, a stage-in), seconds since the epoch; NULL when never held.
    ("held_from", "REAL"),
    ("held_to", "REAL"),
)
# The figures of a run, as ``JobStatus.metadata`` keys and columns.
USE_COLUMNS = USE_KEYS
# The columns a status recording writes (the held marker is written apart: ``mark_held``).
STATUS_COLUMNS = (*COLUMNS[:COLUMNS.index("held")], "cause", *USE_COLUMNS)
_FINAL_AT = STATUS_COLUMNS.index("final")
# The columns of a held job's row (``mark_held``): its status, then its marker.
HELD_COLUMNS = (*STATUS_COLUMNS, "held", "holder")
Row = Tuple[Any, ...]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT NOT NULL UNIQUE,
    executor TEXT NOT NULL,
    executor_version TEXT,
    url TEXT,
    config TEXT,
    native_id TEXT,
    spec TEXT,
    tag TEXT,
    submitted REAL NOT NULL,
    state TEXT NOT NULL,
    rank INTEGER NOT NULL,
    exit_code INTEGER,
    message TEXT,
    updated REAL NOT NULL,
    final INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    rerun TEXT,
    held TEXT,
    holder TEXT,
    cause TEXT,
    started_at REAL,
    ended_at REAL,
    cpu_seconds REAL,
    max_rss_bytes INTEGER,
    queued_at REAL,
    nodes TEXT,
    cores INTEGER,
    requested_memory_bytes INTEGER,
    requested_seconds REAL,
    held_from REAL,
    held_to REAL
);
CREATE INDEX IF NOT EXISTS jobs_by_tag ON jobs(tag) WHERE tag IS NOT NULL;
"""

# The local executor's processes (a row with no job id only notes a cancel by another process).
RUNS_SCHEMA = """
CREATE TABLE IF NOT EXISTS local_runs (
    pid INTEGER NOT NULL,
    start TEXT NOT NULL,
    job_id TEXT,
    exit_code INTEGER,
    ended INTEGER NOT NULL DEFAULT 0,
    canceled INTEGER NOT NULL DEFAULT 0,
    updated REAL NOT NULL,
    PRIMARY KEY (pid, start)
);
"""
RUN_COLUMNS = ("pid", "start", "job_id", "exit_code", "ended", "canceled")

# A local run's records, as the journal files have them: kind (S: started as job ``text``, E:
# ended with exit code ``text``, empty if unknown, a " canceled" after it if cancelled, C:
# cancelled by another process), pid, start, text.
RunRecord = Tuple[str, int, str, str]
# (kind, SQL with parameters pid, start, text, updated); the keeper holds the same statements.
RUN_SQL = {
    "S": "INSERT INTO local_runs (pid, start, job_id, updated) VALUES (?, ?, ?, ?) "
         "ON CONFLICT(pid, start) DO UPDATE SET job_id = excluded.job_id, "
         "updated = excluded.updated",
    "E": "UPDATE local_runs SET ended = 1, exit_code = CAST(nullif(substr(?3 || ' ', 1, "
         "instr(?3 || ' ', ' ') - 1), '') AS INTEGER), canceled = max(canceled, "
         "?3 LIKE '% canceled'), updated = ?4 WHERE pid = ?1 AND start = ?2",
    "C": "INSERT INTO local_runs (pid, start, canceled, updated) VALUES (?1, ?2, 1, ?4) "
         "ON CONFLICT(pid, start) DO UPDATE SET canceled = 1, updated = excluded.updated",
}

# The first write of a job in a process: a new row, or (a job attached again) the status
# columns of the existing row, never moving its state backwards: a later run of the job
# (a greater attempt) may go back to QUEUED, an earlier one changes nothing.
_UPSERT = (
    f"INSERT INTO jobs ({', '.join(STATUS_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(STATUS_COLUMNS))}) "
    "ON CONFLICT(id) DO UPDATE SET native_id = coalesce(excluded.native_id, jobs.native_id), "
    "state = excluded.state, rank = excluded.rank, exit_code = excluded.exit_code, "
    "message = excluded.message, updated = excluded.updated, final = excluded.final, "
    "tag = coalesce(excluded.tag, jobs.tag), attempt = excluded.attempt, "
    "rerun = coalesce(excluded.rerun, jobs.rerun), cause = excluded.cause, "
    + ", ".join(f"{name} = excluded.{name}" for name in USE_COLUMNS) + " "
    "WHERE excluded.attempt > jobs.attempt "
    "OR (excluded.attempt = jobs.attempt AND excluded.rank >= jobs.rank)")

# A status change: one row, only forwards (callbacks of one job may be recorded out of order),
# by run and then by state.
_UPDATE = ("UPDATE jobs SET native_id = coalesce(?1, native_id), state = ?2, rank = ?3, "
           "exit_code = ?4, message = ?5, updated = ?6, final = ?7, attempt = ?8, "
           "rerun = coalesce(?9, rerun), cause = ?11, "
           + ", ".join(f"{name} = ?{at}" for at, name in enumerate(USE_COLUMNS, 12)) + " "
           "WHERE id = ?10 AND (attempt < ?8 OR (attempt = ?8 AND rank <= ?3))")

# (native_id, state, rank, exit_code, message, updated, final, attempt, rerun, id, cause,
# then the figures of USE_COLUMNS)
Update = Tuple[Any, ...]


class RegistryError(Exception):
    """The job registry cannot be used (damaged, unreadable or locked for too long); the
    message names the file."""


class RegistryLockedError(RegistryError):
    """Another process held the registry's write lock for longer than we would wait."""


def registry_path(work_directory: Path) -> Path:
    return Path(os.path.abspath(work_directory)) / FILE_NAME


class Store:
    """One open registry file. Thread-safe: one connection, used under a lock. A process keeps
    at most :data:`MAX_CONNECTED` of its registries connected (three descriptors each); the
    connection of the one used least recently is closed when another is opened, and made
    again when it is next used."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn: Optional[sqlite3.Connection] = conn
        self._lock = threading.Lock()
        self.pruned = False
        self._said_locked = False  # that a write waits for another process's lock
        self.used = next(_USES)  # when it was last used, for closing the least used

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def disconnect(self) -> bool:
        """Close the connection unless it is in use (it is made again when next used); whether
        it is closed now."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            return True
        finally:
            self._lock.release()

    def _connection(self) -> sqlite3.Connection:
        """The open connection, made again if it was closed (never making a new file)."""
        self.used = next(_USES)
        if self._conn is None:
            self._conn = _connect(f"file:{quote(str(self.path))}?mode=rw", uri=True)
            self._conn.execute("PRAGMA synchronous=NORMAL")
            with _STORES_LOCK:
                _limit_connected(self)
        return self._conn

    # -- retries and errors ---------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[sqlite3.Connection], _T],
              wait: Optional[float] = None) -> _T:
        """``fn(conn)`` under the lock, waiting up to ``wait`` seconds (by default
        :data:`LOCK_WAIT_SECONDS`) more than SQLite's own busy wait while another process holds
        the write lock."""
        if wait is None:
            wait = LOCK_WAIT_SECONDS
        started = _CLOCK.now()
        deadline = started + wait
        with self._lock:
            while True:
                conn = None
                try:
                    conn = self._connection()
                    return fn(conn)
                except sqlite3.OperationalError as ex:
                    if conn is not None and _rollback_needed(conn):
                        conn.rollback()
                    if not _is_busy(ex):
                        raise _damaged(self.path, what, ex) from ex
                    if _CLOCK.now() >= deadline:
                        raise RegistryLockedError(
                            f"job registry {self.path}: still locked by another process after "
                            f"{wait:.0f} s while trying to {what}") from ex
                    # Writers taking turns wait a little: only a long wait is said, once.
                    if not self._said_locked and _CLOCK.now() - started >= _LOCK_NOTICE_SECONDS:
                        self._said_locked = True
                        logger.warning("job registry %s is locked by another process; waiting "
                                       "to %s (up to %.0f s)", self.path, what, wait)
                except sqlite3.DatabaseError as ex:
                    if conn is not None and _rollback_needed(conn):
                        conn.rollback()
                    raise _damaged(self.path, what, ex) from ex

    # -- writing ----------------------------------------------------------------------------

    def write(self, rows: Sequence[Row], updates: Sequence[Update],
              runs: Sequence[RunRecord] = (), job_runs: Sequence[_runs.RunRow] = (),
              kept: Sequence[_runs.Keep] = ()) -> None:
        """New rows (or jobs attached again), then status changes, then the rows of the
        jobs' runs (:mod:`.runs`) and the earlier runs' outputs moved aside, then local run
        records, in one transaction."""
        def run(conn: sqlite3.Connection) -> None:
            with conn:
                if rows:
                    conn.executemany(_UPSERT, rows)
                if updates:
                    conn.executemany(_UPDATE, updates)
                if job_runs:
                    conn.executemany(_runs.UPSERT, job_runs)
                    final = [(row[0],) for row in rows if row[_FINAL_AT]]
                    final += [(update[9],) for update in updates if update[6]]
                    conn.executemany(_runs.FILL_JOB_SQL, final)
                if kept:
                    conn.executemany(_runs.KEEP_SQL, kept)
                now = wall_time()
                for kind, pid, start, text in runs:
                    conn.execute(RUN_SQL[kind], (pid, start, text, now))
        self._call("record jobs", run)

    # -- jobs held by psij in a client process (:mod:`psij._registry.held`) ------------------

    def mark_held(self, rows: Sequence[Row]) -> None:
        """Record jobs held by psij in a client process, at once: each row is a status row
        (``STATUS_COLUMNS``) followed by ``held`` and ``holder`` (:data:`HELD_COLUMNS`). A
        row already written keeps its status (it is at least as late) and takes the marker."""
        sql = (f"INSERT INTO jobs ({', '.join(HELD_COLUMNS)}, held_from) VALUES "
               f"({', '.join('?' * len(HELD_COLUMNS))}, ?) ON CONFLICT(id) DO UPDATE SET "
               "held = excluded.held, holder = excluded.holder, "
               "held_from = coalesce(jobs.held_from, excluded.held_from), held_to = NULL")
        now = wall_time()

        def run(conn: sqlite3.Connection) -> None:
            with conn:
                conn.executemany(sql, [(*row, now) for row in rows])
                conn.executemany(_runs.HELD_SQL, [(row[0],) for row in rows])
        self._call("record held jobs", run)

    def set_held(self, changes: Sequence[Tuple[Optional[str], Optional[str], Optional[str],
                                               Optional[Tuple[str, int, Optional[str]]],
                                               str]]) -> None:
        """For each (held, holder, native id, final status or None, job id): the job's held
        marker (None: no longer held), its native id when given, and the final status
        (state, rank, message) when given (a job dropped or failed while held). The job's
        ``held_from`` is set when it is first held, ``held_to`` when it no longer is."""
        def run(conn: sqlite3.Connection) -> None:
            now = wall_time()
            with conn:
                for held, holder, native_id, final, job_id in changes:
                    conn.execute("UPDATE jobs SET held = ?1, holder = ?2, "
                                 "native_id = coalesce(?3, native_id), "
                                 "held_from = CASE WHEN ?1 IS NULL THEN held_from "
                                 "ELSE coalesce(held_from, ?5) END, "
                                 "held_to = CASE WHEN ?1 IS NOT NULL THEN NULL "
                                 "WHEN held_from IS NULL THEN held_to "
                                 "ELSE coalesce(held_to, ?5) END WHERE id = ?4",
                                 (held, holder, native_id, job_id, now))
                    conn.execute(_runs.HELD_SQL, (job_id,))
                    if final is not None:
                        conn.execute("UPDATE jobs SET state = ?, rank = ?, message = ?, "
                                     "final = 1, updated = ? WHERE id = ? AND final = 0",
                                     (final[0], final[1], final[2], now, job_id))
        self._call("record held jobs", run)

    def claim_held(self, job_id: str, holder: str, new_holder: str) -> bool:
        """Make ``new_holder`` the holder of a job still held (not being submitted) by
        ``holder``; False when another process changed it first."""
        def run(conn: sqlite3.Connection) -> bool:
            with conn:
                return conn.execute("UPDATE jobs SET holder = ? WHERE id = ? AND held = 'held' "
                                    "AND holder = ? AND final = 0 AND native_id IS NULL",
                                    (new_holder, job_id, holder)).rowcount == 1
        return self._call("claim held jobs", run)

    def local_runs(self) -> List[Row]:
        """Every local run (:data:`RUN_COLUMNS`), oldest first."""
        def run(conn: sqlite3.Connection) -> List[Row]:
            return conn.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM local_runs "
                                "ORDER BY rowid").fetchall()
        return self._call("read local runs", run)

    def prune(self, older_than_seconds: float, now: Optional[float] = None,
              wait: Optional[float] = None) -> int:
        """Delete final jobs last updated more than ``older_than_seconds`` ago; their count."""
        limit = (wall_time() if now is None else now) - older_than_seconds

        def run(conn: sqlite3.Connection) -> int:
            with conn:
                conn.execute("DELETE FROM local_runs WHERE updated < ?", (limit,))
                count = conn.execute("DELETE FROM jobs WHERE final = 1 AND updated < ?",
                                     (limit,)).rowcount
                if count:
                    conn.execute(_runs.PRUNE_SQL)
                return count
        return self._call("prune old jobs", run, wait)

    # -- reading ----------------------------------------------------------------------------

    def select(self, ids: Optional[Sequence[str]] = None, tag: Optional[str] = None,
               executor: Optional[str] = None, states: Optional[Iterable[str]] = None,
               columns: Sequence[str] = COLUMNS) -> List[Row]:
        """Rows (of ``columns``) matching every filter given, oldest first."""
        where: List[str] = []
        params: List[Any] = []
        if ids is not None:
            where.append(f"id IN ({', '.join('?' * len(ids))})")
            params.extend(ids)
        if tag is not None:
            where.append("tag = ?")
            params.append(tag)
        if executor is not None:
            where.append("executor = ?")
            params.append(executor)
        if states is not None:
            names = list(states)
            where.append(f"state IN ({', '.join('?' * len(names))})")
            params.extend(names)
        sql = f"SELECT {', '.join(columns)} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY rowid"  # the order jobs were first recorded in

        def run(conn: sqlite3.Connection) -> List[Row]:
            return conn.execute(sql, params).fetchall()
        if ids is not None and len(ids) > 500:  # SQLite limits the number of parameters
            rows: List[Row] = []
            for start in range(0, len(ids), 500):
                rows += self.select(ids[start:start + 500], tag, executor, states, columns)
            if "submitted" in columns:
                at = list(columns).index("submitted")
                rows.sort(key=lambda r: (r[at], r[0]))
            return rows
        return self._call("read jobs", run)

    def runs(self, job_id: str) -> List[Row]:
        """The runs of ``job_id`` (:data:`psij._registry.runs.COLUMNS`), first run first."""
        return self._call("read runs", lambda conn: _runs.read(conn, job_id))

    def run_jobs(self, native_id: str) -> List[str]:
        """The ids of the jobs one of whose runs had ``native_id``, oldest first."""
        def run(conn: sqlite3.Connection) -> List[str]:
            return [r[0] for r in conn.execute(
                "SELECT job_id FROM runs WHERE native_id = ? GROUP BY job_id "
                "ORDER BY min(updated)", (native_id,))]
        return self._call("read runs", run)

    def named(self, word: str, prefix_from: int, number: Optional[str],
              columns: Sequence[str] = COLUMNS) -> List[Row]:
        """Rows (of ``columns``) that ``word`` may name, oldest first: its job id, job ids it
        begins (when it is at least ``prefix_from`` characters long), its native id, and
        native ids beginning with ``number`` (a scheduler's job number, to find the array
        elements it names). Compared as plain text: no character of ``word`` is a pattern."""
        sql = (f"SELECT {', '.join(columns)} FROM jobs WHERE id = ?1 "
               "OR (length(?1) >= ?2 AND substr(id, 1, length(?1)) = ?1) OR native_id = ?1 "
               "OR (?3 IS NOT NULL AND substr(native_id, 1, length(?3)) = ?3) ORDER BY rowid")

        def run(conn: sqlite3.Connection) -> List[Row]:
            return conn.execute(sql, (word, prefix_from, number)).fetchall()
        return self._call("read jobs", run)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _is_busy(ex: sqlite3.OperationalError) -> bool:
    text = str(ex)
    return "locked" in text or "busy" in text


def _rollback_needed(conn: sqlite3.Connection) -> bool:
    try:
        return conn.in_transaction
    except sqlite3.Error:
        return False


def _damaged(path: Path, what: str, ex: Exception) -> RegistryError:
    return RegistryError(f"job registry {path}: cannot {what}: {ex}. The file was left as it "
                         f"is; move it away to start a new registry (its jobs are then no "
                         f"longer listed)")


MAX_CONNECTED = 8  # registries a process keeps connected at once
_USES = itertools.count()
_STORES: Dict[Path, Store] = {}
_STORES_LOCK = threading.Lock()


def set_prune_age(seconds: float) -> None:
    _prune_age["seconds"] = seconds


def open_store(work_directory: Path) -> Store:
    """The registry in ``work_directory`` (created if missing), opened once per process."""
    path = registry_path(work_directory)
    with _STORES_LOCK:
        store = _STORES.get(path)
        if store is None:
            store = _open(path)
            _STORES[path] = store
            _limit_connected(store)
        return store


def _limit_connected(store: Store) -> None:
    """Disconnect the registries used least recently but ``store`` while more than
    :data:`MAX_CONNECTED` are connected (one in use stays connected). Under _STORES_LOCK."""
    connected = [s for s in _STORES.values() if s.connected and s is not store]
    for old in sorted(connected, key=lambda s: s.used)[:len(connected) + 1 - MAX_CONNECTED]:
        old.disconnect()


def prune_once(store: Store) -> None:
    """Prune final jobs older than the prune age (:func:`set_prune_age`, by default
    :data:`DEFAULT_PRUNE_AGE_SECONDS`), the first time this process writes to ``store``.

    Housekeeping: when another process holds the write lock it is left for another time."""
    if store.pruned:
        return
    store.pruned = True
    try:
        store.prune(_prune_age["seconds"], wait=0)
    except RegistryLockedError:
        pass


_ABANDONED: List[Store] = []


def forget_stores() -> None:
    """Forget every open registry in a forked child, which must not use (nor close: closing
    may checkpoint the parent's WAL) the connections it inherited; it opens its own."""
    global _STORES_LOCK
    _STORES_LOCK = threading.Lock()
    _ABANDONED.extend(_STORES.values())
    _STORES.clear()


def _add_columns(c: sqlite3.Connection, found: List[str]) -> List[str]:
    """Add the columns of :data:`ADDED_COLUMNS` that a registry made by an earlier version
    lacks (it has every column before them, in order); the columns it has then."""
    base = len(COLUMNS) - len(ADDED_COLUMNS)
    if tuple(found[:base]) != COLUMNS[:base] or len(found) >= len(COLUMNS) \
            or tuple(found[base:]) != COLUMNS[base:len(found)]:
        return found  # not one of ours: the caller says so
    c.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have added them since we looked.
        found = [r[1] for r in c.execute("PRAGMA table_info(jobs)")]
        for name, definition in ADDED_COLUMNS[max(0, len(found) - base):]:
            c.execute(f"ALTER TABLE jobs ADD COLUMN {name} {definition}")
        c.execute("COMMIT")
    except BaseException:
        if c.in_transaction:
            c.execute("ROLLBACK")
        raise
    return [r[1] for r in c.execute("PRAGMA table_info(jobs)")]


def _connect(database: str, uri: bool = False) -> sqlite3.Connection:
    conn = sqlite3.connect(database, timeout=_BUSY_SLICE_SECONDS, isolation_level=None,
                           check_same_thread=False, uri=uri)
    # Each write takes the write lock with its first statement, so SQLite's busy wait applies.
    conn.isolation_level = "IMMEDIATE"
    return conn


def _open(path: Path) -> Store:
    ensure_private_dir(path.parent, "work directory")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as ex:
        raise RegistryError(f"job registry {path}: cannot open: {ex.strerror or ex}") from ex
    os.close(fd)
    check_private_file(path, "job registry")
    conn = _connect(str(path))
    store = Store(path, conn)

    def setup(c: sqlite3.Connection) -> None:
        # Only a new file is written to here: opening a registry in use waits for nobody.
        mode = c.execute("PRAGMA journal_mode").fetchone()
        if mode is None or str(mode[0]).lower() != "wal":
            mode = c.execute("PRAGMA journal_mode=WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot use WAL mode (journal mode is {mode})")
        c.execute("PRAGMA synchronous=NORMAL")
        found = [r[1] for r in c.execute("PRAGMA table_info(jobs)")]
        if not found:
            c.executescript("BEGIN IMMEDIATE;" + _SCHEMA + RUNS_SCHEMA + _runs.SCHEMA
                            + "COMMIT;")
            found = [r[1] for r in c.execute("PRAGMA table_info(jobs)")]
        if tuple(found) != COLUMNS:
            found = _add_columns(c, found)
        if tuple(found) != COLUMNS:
            raise sqlite3.DatabaseError(f"its 'jobs' table has columns {found}, not "
                                        f"{list(COLUMNS)}")
        found = [r[1] for r in c.execute("PRAGMA table_info(runs)")]
        if not found:  # a registry made by an earlier version
            c.executescript("BEGIN IMMEDIATE;" + _runs.SCHEMA + "COMMIT;")
            found = [r[1] for r in c.execute("PRAGMA table_info(runs)")]
        if tuple(found) != _runs.COLUMNS:
            raise sqlite3.DatabaseError(f"its 'runs' table has columns {found}, not "
                                        f"{list(_runs.COLUMNS)}")
        runs = [r[1] for r in c.execute("PRAGMA table_info(local_runs)")]
        if not runs:  # a registry made by an earlier version
            c.executescript("BEGIN IMMEDIATE;" + RUNS_SCHEMA + "COMMIT;")
            runs = [r[1] for r in c.execute("PRAGMA table_info(local_runs)")]
        if tuple(runs[:len(RUN_COLUMNS)]) != RUN_COLUMNS:
            raise sqlite3.DatabaseError(f"its 'local_runs' table has columns {runs}, not "
                                        f"{list(RUN_COLUMNS)} and 'updated'")

    try:
        store._call("open it", setup)
    except BaseException:
        conn.close()
        raise
    return store

