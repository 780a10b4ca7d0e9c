"""Word from the kernel when a file is created or renamed into a directory (Linux inotify),
so that a status poller looks at its jobs' files at once instead of at its next look.

:class:`DirEvents` runs one thread that sleeps in ``poll`` on an inotify descriptor and a
pipe of its own (written by :meth:`DirEvents.stop`, so that the thread ends at once), and calls
``wake`` once per batch of events. It costs no system call while nothing happens. Where there is
no inotify (another system, a kernel or container without it, too many watches) ``start``
returns False and the poller's periodic look is all there is. A file system shared over the
network only gives events for what this host wrote: the periodic look stays for the rest.
"""

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import sys
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["DirEvents"]

logger = logging.getLogger(__name__)

_IN_CLOEXEC = 0o2000000
_IN_NONBLOCK = 0o4000
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_LIBC: Any = None
_HEADER = struct.Struct("iIII")


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _LIBC


def _names(data: bytes) -> List[bytes]:
    """The file names of a buffer of inotify events (``struct inotify_event``: descriptor,
    mask, cookie and name length, then the name padded with NULs)."""
    names = []
    at = 0
    while at + _HEADER.size <= len(data):
        length = _HEADER.unpack_from(data, at)[3]
        start = at + _HEADER.size
        names.append(data[start:start + length].rstrip(b"\0"))
        at = start + length
    return names


class DirEvents:
    """Calls ``wake`` when files appear in ``directory`` (see the module): any file, or only
    those whose names end with one of ``suffixes``."""

    def __init__(self, directory: Path, wake: Callable[[], None], name: str,
                 suffixes: Tuple[str, ...] = ()) -> None:
        self._directory = directory
        self._suffixes = tuple(os.fsencode(suffix) for suffix in suffixes) or (b"",)
        self._wake = wake
        self._name = name
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._ending: Optional[threading.Thread] = None
        self._stop_w: Optional[int] = None

    def start(self) -> bool:
        """Start the thread (again); False where there are no events to be had."""
        with self._lock:
            if self._thread is not None:
                return True
            if not sys.platform.startswith("linux"):
                return False
            try:
                libc = _libc()
                fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            except (OSError, AttributeError):
                return False
            if fd < 0:
                return False
            wd = libc.inotify_add_watch(fd, os.fsencode(str(self._directory)),
                                        _IN_CREATE | _IN_MOVED_TO | _IN_CLOSE_WRITE)
            if wd < 0:
                os.close(fd)
                return False
            stop_r, stop_w = os.pipe()
            self._stop_w = stop_w
            self._thread = threading.Thread(target=self._run, args=(fd, stop_r),
                                            name=f"{self._name}-files", daemon=True)
            self._thread.start()
            return True

    def stop(self, wait: bool = False) -> None:
        """End the thread (at once; with ``wait``, return once it ended: never while holding a
        lock that ``wake`` takes); ``start`` may start it again."""
        with self._lock:
            thread, stop_w = self._thread or self._ending, self._stop_w
            self._thread = self._stop_w = None
            self._ending = thread  # (a later stop with wait waits for it too)
        if stop_w is not None:
            try:
                os.write(stop_w, b"x")
            except OSError:
                pass  # the thread ended already (its end of the pipe is closed)
            finally:
                os.close(stop_w)
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self, fd: int, stop_r: int) -> None:
        try:
            poller = select.poll()  # (select() refuses descriptors past 1023)
            poller.register(fd, select.POLLIN)
            poller.register(stop_r, select.POLLIN)
            while True:
                ready = {ready_fd for ready_fd, _ in poller.poll()}
                if stop_r in ready:
                    return
                wanted = False
                try:
                    while True:  # every event so far: one wake for them all
                        data = os.read(fd, 65536)
                        if not data:
                            break
                        wanted = wanted or any(name.endswith(self._suffixes)
                                               for name in _names(data))
                except BlockingIOError:
                    pass
                if not wanted:
                    continue
                try:
                    self._wake()
                except ReferenceError:
                    return
                except Exception:
                    logger.exception("%s: could not pass on a file event", self._name)
        except Exception:  # (the poller's periodic look does without)
            logger.exception("%s: file events stopped; the periodic looks go on", self._name)
        finally:
            os.close(fd)
            os.close(stop_r)
