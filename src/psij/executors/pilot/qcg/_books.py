"""The books of a QCG-PilotJob file run: which job names the requests may use, the state of
each iterative job as a whole, and ``jobs.report`` written as jobs end.

An iterative job is kept as counters (:class:`GroupBook`), never as a list of its sub-tasks,
so that its cost does not grow with its iterations; its sub-tasks ``name:i`` are known by
their index. :class:`ReportFile` appends one entry per ended task, and one per iterative job
once all its iterations have ended; the runner flushes it every few milliseconds while tasks
end (the engine's flush hook), so that a pilot killed with SIGKILL keeps the report of every
task that had ended but those of the last few milliseconds.

No process is started here and nothing is read from the engine; the runner
(:mod:`psij.executors.pilot.qcg.run`) feeds in what happened.
"""

import os
import re
import threading
from datetime import datetime
from pathlib import Path
from typing import IO, Iterator, Optional, Set

from psij.executors.pilot.qcg._report import TaskReport, format_report_entry
from psij.executors.pilot.qcg._schema import iteration_index

__all__ = ["GroupBook", "ReportFile", "open_private"]

_ENTRY_START = r"^(\S+) \([A-Z]+\)"


def open_private(path: Path, append: bool) -> IO[str]:
    """``path`` opened for writing text, created 0600, appended to or truncated."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    return open(os.open(path, flags, 0o600), "w", encoding="utf-8")


class GroupBook:
    """An iterative job: its sub-tasks ``name:start`` ... fed so far, and how they ended.

    Used under the runner's lock; ``complete`` once every iteration was fed to the engine
    (or recorded as OMITTED without it).
    """

    __slots__ = ("count", "ended", "fed", "first_start", "last_end", "name", "not_succeeded",
                 "removed", "reported", "start", "submitted")

    def __init__(self, name: str, start: int, count: int, submitted: float) -> None:
        self.name = name
        self.start = start
        self.count = count  # iterations in all
        self.fed = 0  # iterations handed over so far, from ``start`` on
        self.ended = 0
        self.not_succeeded = 0  # FAILED, CANCELED or OMITTED iterations
        self.submitted = submitted
        self.first_start: Optional[float] = None
        self.last_end: Optional[float] = None
        self.reported = False
        self.removed = False

    def members(self) -> Iterator[str]:
        """The sub-tasks fed so far."""
        return (f"{self.name}:{i}" for i in range(self.start, self.start + self.fed))

    def has_member(self, name: str) -> bool:
        group, _, text = name.rpartition(":")
        index = iteration_index(text)
        return group == self.name and index is not None \
            and self.start <= index < self.start + self.fed

    def record_start(self, when: float) -> None:
        if self.first_start is None:
            self.first_start = when

    def record_end(self, succeeded: bool, when: float) -> bool:
        """Count an iteration's end; True when it was the last one."""
        self.ended += 1
        if not succeeded:
            self.not_succeeded += 1
        self.last_end = when
        return self.done

    @property
    def done(self) -> bool:
        return self.fed == self.count and self.ended == self.count

    def state(self) -> str:
        """QCG's state of the job as a whole: SUCCEED when every iteration succeeded, FAILED
        when one did not, EXECUTING once one started, QUEUED before."""
        if self.done:
            return "SUCCEED" if self.not_succeeded == 0 else "FAILED"
        return "EXECUTING" if self.first_start is not None else "QUEUED"

    def report(self) -> TaskReport:
        history = [(datetime.fromtimestamp(self.submitted), "QUEUED")]
        if self.first_start is not None:
            history.append((datetime.fromtimestamp(self.first_start), "EXECUTING"))
        state = self.state()
        if self.done and self.last_end is not None:
            history.append((datetime.fromtimestamp(self.last_end), state))
        message = None
        if self.not_succeeded:
            message = (f"{self.not_succeeded} of {self.count} iterations did not succeed")
        return TaskReport(name=self.name, state=state, history=tuple(history),
                          message=message)


class LockedTextFile:
    """A private text file appended to from any thread, one lock around every use: a write
    after :meth:`close` is dropped; written out by :meth:`flush`, or at once with
    ``flush=True``."""

    def __init__(self, path: Path, append: bool) -> None:
        self._file = open_private(path, append)
        self._lock = threading.Lock()

    def _append(self, text: str, flush: bool) -> None:
        """Append ``text`` (the caller holds the lock)."""
        if self._file.closed:
            return
        self._file.write(text)
        if flush:
            self._file.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class ReportFile(LockedTextFile):
    """``jobs.report``, appended to entry by entry from any thread."""

    def __init__(self, path: Path, append: bool) -> None:
        # A resumed run continues the report of the run it resumes: what is in it already is
        # not written again.
        self.earlier: Set[str] = _entry_names(path) if append else set()
        super().__init__(path, append)

    def write(self, report: TaskReport, flush: bool = False) -> None:
        text = format_report_entry(report)
        with self._lock:
            if report.name not in self.earlier:
                self._append(text, flush)


def _entry_names(path: Path) -> Set[str]:
    names: Set[str] = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                match = re.match(_ENTRY_START, line)
                if match is not None:
                    names.add(match.group(1))
    except FileNotFoundError:
        pass
    return names
