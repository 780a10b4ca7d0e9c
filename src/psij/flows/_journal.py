"""The flow service's journal: one SQLite file of (kind, key) -> JSON value records.

The flow machine says what must survive a crash (a handle, its leases, an instance, an
instance record) as journal actions; the service writes each one here at once, on the loop's
thread, and on a restart gives every record back to the machine. The file is
``<state directory>/flow.sqlite`` (the directory 0700, the file 0600, both checked with
:mod:`psij._private_dirs`), in WAL mode with ``synchronous=FULL``: a record the machine was
told is written is on disk before the service answers the request that caused it. With
``sync="normal"`` a record survives the service's own crash (``kill -9``) but the last ones
may be lost if the machine itself goes down; it costs one ``fsync`` per checkpoint instead of
one per transaction (``bench/flow_restarts.py`` measures both).

A file that is not a SQLite database, or one with another table layout, raises
:class:`JournalError` naming the file and is left as it is.
"""

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from psij._private_dirs import check_private_file, ensure_private_dir
from psij.flows._flow_values import JournalDelete, JournalPut

__all__ = ["FILE_NAME", "Journal", "JournalError"]

FILE_NAME = "flow.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
"""
_COLUMNS = ["kind", "key", "value"]


class JournalError(Exception):
    """The journal cannot be used; the message names the file and why."""


class Journal:
    """One open journal file. Thread-safe (one connection, used under a lock)."""

    def __init__(self, directory: Path, sync: str = "full") -> None:
        if sync not in ("full", "normal"):
            raise ValueError(f"sync: expected 'full' or 'normal', got {sync!r}")
        directory = ensure_private_dir(directory, "flow state directory")
        self.path = directory / FILE_NAME
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
        except OSError as ex:
            raise JournalError(f"flow journal {self.path}: cannot open: "
                               f"{ex.strerror or ex}") from ex
        os.close(fd)
        check_private_file(self.path, "flow journal")
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None,
                                     check_same_thread=False)
        try:
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot use WAL mode (journal mode is {mode})")
            self._conn.execute(f"PRAGMA synchronous={sync.upper()}")
            self._conn.executescript(_SCHEMA)
            found = [r[1] for r in self._conn.execute("PRAGMA table_info(records)")]
            if found != _COLUMNS:
                raise sqlite3.DatabaseError(f"its 'records' table has columns {found}, not "
                                            f"{_COLUMNS}")
        except sqlite3.DatabaseError as ex:
            self._conn.close()
            raise JournalError(f"flow journal {self.path}: {ex}. The file was left as it is; "
                               f"move it away to start with no flows") from ex
        for name in (FILE_NAME + "-wal", FILE_NAME + "-shm"):
            try:
                os.chmod(directory / name, 0o600, follow_symlinks=False)
            except (OSError, NotImplementedError):
                pass

    def put(self, kind: str, key: str, value: Any) -> None:
        """Write (or replace) one record; ``value`` is anything :func:`json.dumps` writes."""
        self.write([(kind, key, value)], [])

    def delete(self, kind: str, key: str) -> None:
        """Forget one record (nothing happens when there is none)."""
        self.write([], [(kind, key)])

    def write(self, puts: Iterable[Tuple[str, str, Any]],
              deletes: Iterable[Tuple[str, str]]) -> None:
        """Records written and records forgotten, in one transaction."""
        rows = [(str(kind), str(key), json.dumps(value, allow_nan=False, default=_plain))
                for kind, key, value in puts]
        gone = [(str(kind), str(key)) for kind, key in deletes]
        with self._lock:
            try:
                with self._conn:
                    self._conn.execute("BEGIN IMMEDIATE")
                    if rows:
                        self._conn.executemany(
                            "INSERT OR REPLACE INTO records (kind, key, value) VALUES (?, ?, ?)",
                            rows)
                    if gone:
                        self._conn.executemany("DELETE FROM records WHERE kind = ? AND key = ?",
                                               gone)
            except sqlite3.Error as ex:
                raise JournalError(f"flow journal {self.path}: cannot write: {ex}") from ex

    def apply(self, ops: Iterable[Union[JournalPut, JournalDelete]]) -> None:
        """The flow machine's journal actions, in order, in one transaction."""
        rows = []
        for op in ops:
            if type(op) is JournalPut:
                rows.append((0, str(op.kind), str(op.key), json.dumps(op.value, allow_nan=False,
                                                                      default=_plain)))
            elif type(op) is JournalDelete:
                rows.append((1, str(op.kind), str(op.key), ""))
            else:
                raise TypeError(f"flow journal: expected JournalPut or JournalDelete, got "
                                f"{op!r}")
        with self._lock:
            try:
                with self._conn:
                    self._conn.execute("BEGIN IMMEDIATE")
                    for delete, kind, key, value in rows:
                        if delete:
                            self._conn.execute(
                                "DELETE FROM records WHERE kind = ? AND key = ?", (kind, key))
                        else:
                            self._conn.execute(
                                "INSERT OR REPLACE INTO records (kind, key, value) "
                                "VALUES (?, ?, ?)", (kind, key, value))
            except sqlite3.Error as ex:
                raise JournalError(f"flow journal {self.path}: cannot write: {ex}") from ex

    def records(self, kind: Optional[str] = None) -> List[Tuple[str, str, Any]]:
        """Every record (of ``kind`` when given) as (kind, key, value), in key order."""
        return list(self._iter(kind))

    def _iter(self, kind: Optional[str]) -> Iterator[Tuple[str, str, Any]]:
        with self._lock:
            try:
                if kind is None:
                    rows = self._conn.execute(
                        "SELECT kind, key, value FROM records ORDER BY kind, key").fetchall()
                else:
                    rows = self._conn.execute(
                        "SELECT kind, key, value FROM records WHERE kind = ? ORDER BY key",
                        (kind,)).fetchall()
            except sqlite3.Error as ex:
                raise JournalError(f"flow journal {self.path}: cannot read: {ex}") from ex
        for k, key, value in rows:
            yield k, key, json.loads(value)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _plain(value: Any) -> Any:
    """Mappings and other iterables the machine's values hold, as JSON can write them."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"not JSON: {value!r}")
