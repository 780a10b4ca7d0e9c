"""A batch job's start and end, read from the files its submit script writes, as soon as they
appear.

The script (``templates/psij_run_job.mustache``) writes ``<native id>.starts`` as it starts
(``<runs> <start time>``) and ``<native id>.ec`` as it ends (``<exit status> <end time>
<signal received or -> <runs>``), each through a temporary file renamed into place, in the
executor's work directory. :class:`JobFiles` looks for them for the jobs a status poller
follows, at the poller's request, at a cost that does not grow with the number of jobs while
nothing happens: one ``stat`` of the directory per look; only when the directory changed (a
file was created or renamed in it) are its names listed (with their inode numbers, which come
with them), and each file of a followed job read once per write (a new inode). A directory
changed within the last :data:`RACY_SECONDS` is listed again at the next look, since a file
system may keep coarse modification times.

What a file says becomes a :class:`~psij.executors.batch._tracking.FileSeen` event. A file that
cannot be read or parsed (removed, garbled, written by something else) says nothing: the job is
left to the status polls.
"""

import math
import os
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

from psij._clock import wall_time
from psij.executors.batch._tracking import FileSeen

__all__ = ["END_SUFFIX", "RACY_SECONDS", "START_SUFFIX", "JobFiles", "parse_end",
           "parse_start"]

START_SUFFIX = ".starts"
END_SUFFIX = ".ec"
RACY_SECONDS = 2.0
_MOST = 200  # bytes read of a file (more is not one of ours)
_LONGEST_SIGNAL = 16
_T = TypeVar("_T")


def _time(word: str) -> Optional[float]:
    """Seconds since the epoch as a script writes them (a locale may use a comma)."""
    try:
        value = float(word.replace(",", ".", 1))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def parse_start(text: str) -> Optional[Tuple[int, Optional[float]]]:
    """``(runs, start time)`` from a ``.starts`` file (time None if absent or unreadable);
    None when it is not one the script wrote."""
    words = text.split()
    runs = _count(words[0]) if 1 <= len(words) <= 2 else None
    if runs is None:
        return None
    return runs, (_time(words[1]) if len(words) == 2 else None)


def _count(word: str) -> Optional[int]:
    """A run count as a script writes it (1 to 999999); None when it is not one."""
    if not word.isascii() or not word.isdigit() or len(word) > 6 or int(word) < 1:
        return None
    return int(word)


def parse_end(text: str
              ) -> Optional[Tuple[int, Optional[float], Optional[str], Optional[int]]]:
    """``(exit status, end time, signal received, run)`` from a ``.ec`` file; a file of the
    exit status alone (as scripts wrote before) has neither time, signal nor run. None when
    it is not one the script wrote."""
    words = text.split()
    if not 1 <= len(words) <= 4 or not words[0].isascii() or not words[0].isdigit() \
            or len(words[0]) > 3 or int(words[0]) > 255:
        return None
    signal = words[2] if len(words) >= 3 else "-"
    if signal != "-" and (len(signal) > _LONGEST_SIGNAL or not signal.isascii()
                          or not signal.isalnum()):
        return None
    run = _count(words[3]) if len(words) == 4 else None
    if len(words) == 4 and run is None:
        return None
    return (int(words[0]), _time(words[1]) if len(words) >= 2 else None,
            None if signal == "-" else signal, run)


def _read(path: Path) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            data = f.read(_MOST + 1)
    except OSError:
        return None
    if len(data) > _MOST:
        return None
    return data.decode("ascii", errors="replace")


class JobFiles:
    """Looks for the start and end files of followed jobs in one directory (see the module).

    Not thread-safe: one poller thread uses it.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stamp: Optional[Tuple[int, int, int]] = None
        self._racy = True
        # The inode of each followed job's file last read, so that each write is read once.
        self._said: Dict[Tuple[str, str], int] = {}
        self.looks = 0  # stat calls made
        self.listings = 0  # listings made
        self.seen = 0  # events made

    def _changed(self) -> bool:
        self.looks += 1
        try:
            st = os.stat(self.directory)
        except OSError:
            self._stamp = None
            return False
        stamp = (st.st_mtime_ns, st.st_ino, st.st_size)
        changed = stamp != self._stamp or self._racy
        self._stamp = stamp
        self._racy = wall_time() - st.st_mtime_ns / 1e9 < RACY_SECONDS
        return changed

    def look(self, native_ids: Iterable[str]) -> List[FileSeen]:
        """What the files of these jobs say that was not said before (empty when the
        directory did not change)."""
        if not self._changed():
            return []
        self.listings += 1
        try:  # the inode numbers come with the names (no call per file)
            with os.scandir(self.directory) as entries:
                found = {entry.name: entry.inode() for entry in entries
                         if entry.name.endswith((END_SUFFIX, START_SUFFIX))}
        except OSError:
            return []
        events: List[FileSeen] = []
        for native_id in native_ids:
            end = self._new(native_id, END_SUFFIX, found, parse_end)
            if end is not None:
                events.append(FileSeen(native_id, exit_code=end[0], at=end[1],
                                       signal=end[2], run=end[3]))
                continue
            start = self._new(native_id, START_SUFFIX, found, parse_start)
            if start is not None:
                events.append(FileSeen(native_id, started=True, at=start[1], run=start[0]))
        self.seen += len(events)
        return events

    def _new(self, native_id: str, suffix: str, found: Dict[str, int],
             parse: Callable[[str], Optional[_T]]) -> Optional[_T]:
        """What the job's file says, if it is there and was not read before (each write of it
        is a new file, renamed into place: a new inode)."""
        inode = found.get(native_id + suffix)
        if inode is None:  # (removed: a later file of the same inode number is another)
            self._said.pop((native_id, suffix), None)
            return None
        if self._said.get((native_id, suffix)) == inode:
            return None
        self._said[(native_id, suffix)] = inode
        text = _read(self.directory / (native_id + suffix))
        return None if text is None else parse(text)

    def forget(self, native_id: str) -> None:
        """The job is followed no more."""
        self._said.pop((native_id, START_SUFFIX), None)
        self._said.pop((native_id, END_SUFFIX), None)
