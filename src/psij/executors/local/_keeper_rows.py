"""What the local jobs' keeper (``_keeper``) writes to the job registry, in one transaction per
batch: the jobs' rows that a submitting process sent with their starts, the records of the runs
(table ``local_runs``) and the final states of the jobs that ended after their submitter.

Like the keeper, it uses the standard library only: the keeper loads it from its file
(:func:`load`), since it cannot import the package.

A job's row comes with its start (the columns and the values of its QUEUED row, as the
registry's recorder makes them: :func:`psij._registry.durable.submit_row`) so that a job
``submit()`` returned for is in the registry even when its submitter is killed the next
instant: the keeper has the request as soon as it is on its socket, and writes the row with
the job's pid as native id (or, when the job could not start, FAILED with why), unless the
submitter's own recorder wrote the row first (then only a native id it lacks is filled in, and
the failure of a job that could not start, unless the row is final already). A job whose start
the system refused for now has its row written as it came (QUEUED) while it waits.
"""

import os
import signal
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

# As psij._registry.store.RUN_SQL has them (parameters pid, start, text, updated).
RUN_SQL = {
    "S": "INSERT INTO local_runs (pid, start, job_id, updated) VALUES (?, ?, ?, ?) "
         "ON CONFLICT(pid, start) DO UPDATE SET job_id = excluded.job_id, "
         "updated = excluded.updated",
    "E": "UPDATE local_runs SET ended = 1, exit_code = CAST(nullif(substr(?3 || ' ', 1, "
         "instr(?3 || ' ', ' ') - 1), '') AS INTEGER), canceled = max(canceled, "
         "?3 LIKE '% canceled'), updated = ?4 WHERE pid = ?1 AND start = ?2",
}
# With the run's figures (psij._registry.store.USE_COLUMNS: started_at, ended_at, cpu_seconds,
# max_rss_bytes), which a job already final keeps as its submitter recorded them.
FINAL_SQL = ("UPDATE jobs SET state = ?, rank = ?, exit_code = ?, message = ?, updated = ?, "
             "final = 1, started_at = ?, ended_at = ?, cpu_seconds = ?, max_rss_bytes = ? "
             "WHERE id = ? AND final = 0")
JOB = "J"  # the kind of a job's row among the records (its text is the row)
# A job's row as sent: the column names, then the values in that order.
Row = Tuple[Tuple[str, ...], Tuple[Any, ...]]
# A record: (kind, pid, start, text or row, journal, job id).
Record = Tuple[str, int, str, Any, str, str]
# A run's use as the keeper reaped it: started, ended (wall clock), CPU seconds, max RSS bytes.
Use = Tuple[float, float, float, int]
# A job that ended with nobody listening: (job id, exit code, cancelled, its use).
Ended = Tuple[str, int, bool, Use]

BATCH_SECONDS = 0.05  # records wait at most this long for a commit
RETRY_SECONDS = 0.01  # a registry locked by another writer is tried again after this long
FINAL_LOCK_WAIT_MS = 60000  # when the keeper ends: then the records go to the journal
_ROW_SQL: Dict[Tuple[Any, ...], str] = {}
_NEEDED = ("id", "native_id", "state", "rank", "message", "final", "exit_code")


def check_row(row: Any) -> Optional[Row]:
    """``row`` as sent with a start if it is one (column names that are plain words, as many
    values, the columns the keeper fills in among them); None for none. Raises ValueError
    for anything else."""
    if row is None:
        return None
    if not (isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], tuple)
            and isinstance(row[1], tuple) and len(row[0]) == len(row[1])):
        raise ValueError("a job's row is (columns, values)")
    columns, values = row
    for name in columns:
        if not (isinstance(name, str) and name.isascii() and name.isidentifier()):
            raise ValueError(f"not a column name: {name!r:.40}")
    if not all(name in columns for name in _NEEDED):
        raise ValueError(f"a job's row needs the columns {', '.join(_NEEDED)}")
    return columns, values


def started_row(row: Row, pid: int) -> Row:
    """The row of a job the keeper started: its pid is its native id."""
    columns, values = row
    changed = list(values)
    changed[columns.index("native_id")] = str(pid)
    return columns, tuple(changed)


def failed_row(row: Row, final_rank: int, words: str) -> Row:
    """The row of a job the keeper could not start: FAILED, saying why."""
    columns, values = row
    changed = list(values)
    for name, value in (("state", "FAILED"), ("rank", final_rank), ("final", 1),
                        ("message", f"could not start the job: {words}")):
        changed[columns.index(name)] = value
    return columns, tuple(changed)


def row_sql(columns: Tuple[str, ...], final: bool = False) -> str:
    """The statement writing a job's row: a new one, or, when it was written first (by the
    submitter's recorder, or by the keeper while the job's start waited), only the native id
    it lacks; with ``final`` (a job that could not start) its failure too, unless the row is
    final already."""
    sql = _ROW_SQL.get((final, *columns))
    if sql is None:
        sql = _ROW_SQL[(final, *columns)] = (
            f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            "ON CONFLICT(id) DO UPDATE SET native_id = coalesce(jobs.native_id, "
            "excluded.native_id)" + (
                ", state = excluded.state, rank = excluded.rank, final = excluded.final, "
                "message = excluded.message, exit_code = excluded.exit_code "
                "WHERE jobs.final = 0" if final else ""))
    return sql


def write(conn: Any, batch: Sequence[Record],
          ended: Sequence[Ended], final_rank: int, now: float) -> List[str]:
    """Write ``batch`` (rows, then run records, in their order) and the final states of
    ``ended`` (job id, exit code, cancelled, use) in the transaction ``conn`` is in. A job's row
    the registry refuses (not a lock: that fails the whole batch, to be tried again) is left
    out, its job and why returned: one bad row must not send the others to the journals."""
    refused: List[str] = []
    for kind, pid, start, text, _, job_id in batch:
        if kind == JOB:
            try:
                final = bool(text[1][text[0].index("final")])
                conn.execute(row_sql(text[0], final), text[1])
            except Exception as ex:  # sqlite3.Error, or values it cannot bind
                if "locked" in str(ex) or "busy" in str(ex):
                    raise
                refused.append(f"job {job_id}: its row was refused: {ex}")
        else:
            conn.execute(RUN_SQL[kind], (pid, start, text, now))
    conn.executemany(FINAL_SQL, [
        ("CANCELED" if canceled else "COMPLETED" if code == 0 else "FAILED",
         final_rank, code, None if canceled or code == 0 else message(code), now,
         *use, job_id) for job_id, code, canceled, use in ended])
    return refused


def message(code: int) -> str:
    """The words the local executor gives a failed job's exit code (``exit_message``)."""
    words = {126: " (command not executable)", 127: " (command not found)"}.get(code, "")
    if code > 128:
        try:
            return f"the job was killed by {signal.Signals(code - 128).name} (exit code {code})"
        except ValueError:
            pass
    return f"the job exited with code {code}{words}"


def lines(batch: List[Record]) -> List[Tuple[str, str]]:
    """The journal lines (journal, line) of the run records of a batch that could not be
    written to the registry: an end whose start is not in the batch gets its start again
    (that start may be in the registry). Jobs' rows have no journal lines."""
    started = {run[1] for run in batch if run[0] == "S"}
    out: List[Tuple[str, str]] = []
    for kind, pid, start, text, journal, job_id in batch:
        if kind == JOB:
            continue
        if kind == "E" and pid not in started:
            out.append((journal, f"S {pid} {start} {job_id}\n"))
        out.append((journal, f"{kind} {pid} {start} {text}\n"))
    return out


class Records:
    """The keeper's writing of its records (a part of ``_keeper.Keeper``): queued by registry,
    committed in batches, appended to the journals when the registry cannot be written."""

    runs: Dict[str, List[Record]]  # by registry, not yet committed
    orphaned: List[Tuple[str, str, int, bool, Use]]  # (registry, job id, code, canceled, use)
    since: float  # when the oldest record not yet committed was made
    broken: Dict[str, str]  # registries that cannot be written, and why
    conns: Dict[str, Any]  # sqlite3 connections, by registry
    final_rank: int

    def append(self, journal: str, line: str) -> None: ...

    def note(self, text: str) -> None: ...

    def record(self, run: Record, registry: str, in_registry: bool) -> None:
        """Queue a record for the registry's next commit, or append it to the journal."""
        if in_registry and registry and registry not in self.broken:
            self.runs.setdefault(registry, []).append(run)
            self.since = self.since or time.monotonic()
        elif run[0] != JOB:  # a job's row has no journal line
            self.append(run[4], f"{run[0]} {run[1]} {run[2]} {run[3]}\n")

    def commit(self, final: bool = False) -> None:
        """Write the queued records and the final states of jobs that ended after the requesting
        process (a job already final there, cancelled by someone, keeps its state), one
        transaction per registry. A registry still locked keeps its records for a later try
        (when the keeper ends, after a long wait, they go to the journals)."""
        runs, self.runs = self.runs, {}
        finals: Dict[str, List[Ended]] = {}
        for registry, job_id, code, canceled, use in self.orphaned:
            finals.setdefault(registry, []).append((job_id, code, canceled, use))
        self.orphaned = []
        self.since = 0.0
        for registry in {**runs, **finals}:
            batch, ended = runs.get(registry, []), finals.get(registry, [])
            try:
                self.write(registry, batch, ended, final)
                continue
            except Exception as ex:  # this registry only: the others are written
                busy = "locked" in str(ex) or "busy" in str(ex)
                if busy and not final:  # the loop never waits for a lock: spawns would wait
                    self.runs.setdefault(registry, []).extend(batch)
                    self.orphaned += [(registry, job_id, code, canceled, use)
                                      for job_id, code, canceled, use in ended]
                    self.since = time.monotonic() - BATCH_SECONDS + RETRY_SECONDS
                    continue
                self.broken.setdefault(registry, str(ex))
                self.note(f"keeper: registry {registry}: {ex}; local job records go to "
                          "journal files")
                conn = self.conns.pop(registry, None)
                if conn is not None:
                    conn.close()
            for journal, line in lines(batch):
                self.append(journal, line)

    def write(self, registry: str, batch: List[Record], ended: List[Ended],
              final: bool) -> None:
        if not os.path.isfile(registry):
            if batch:  # removed: the records go to the journal (no file is made here)
                raise OSError(f"{registry} does not exist")
            return  # never made (recording off): nothing to update
        conn = self.conns.get(registry)
        if conn is None:
            import sqlite3

            conn = sqlite3.connect(registry, timeout=0, isolation_level=None)
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL: no fsync per commit
            self.conns[registry] = conn
        conn.execute(f"PRAGMA busy_timeout = {FINAL_LOCK_WAIT_MS if final else 0}")
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        try:
            refused = write(conn, batch, ended, self.final_rank, now)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        for words in refused:
            self.note(f"keeper: registry {registry}: {words}")

