"""Pieces of the controller loop (:mod:`psij.controller`) that hold no state of the loop: the
worker pool that runs blocking executor calls, and who is at the other end of a connection.
Nothing here calls the machine or touches the loop's connections and timers."""

import errno
import queue
import socket
import struct
import threading
from typing import Any, Callable, List, Optional, Tuple

from psij.controller._values import Peer

__all__ = ["WorkerPool", "describe_error", "peer_of"]

Work = Tuple[Callable[[], Any], Callable[[bool, Any], None]]


class WorkerPool:
    """Daemon threads running blocking calls; each result is handed to ``done``."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._threads: List[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[Optional[Work]] = queue.SimpleQueue()

    def run(self, function: Callable[[], Any], done: Callable[[bool, Any], None]) -> None:
        with self._lock:
            start = self._idle == 0 and len(self._threads) < self._size
            if start:
                thread = threading.Thread(target=self._serve, name="psij-controller-worker",
                                          daemon=True)
                self._threads.append(thread)
            else:
                self._idle -= 1
        self._work.put((function, done))
        if start:
            thread.start()

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            function, done = item
            try:
                result = function()
            except BaseException as error:
                done(False, error)
            else:
                done(True, result)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        for _ in self._threads:
            self._work.put(None)


def peer_of(sock: socket.socket, address: Any, unix: bool) -> Peer:
    if unix:
        so_peercred = getattr(socket, "SO_PEERCRED", None)
        if so_peercred is not None:
            try:
                raw = sock.getsockopt(socket.SOL_SOCKET, so_peercred, struct.calcsize("3i"))
                pid, uid, gid = struct.unpack("3i", raw)
                return Peer(pid, uid, gid, "")
            except OSError:
                pass
        return Peer(-1, -1, -1, "")
    try:
        host, port = address[0], address[1]
        return Peer(-1, -1, -1, f"{host}:{port}")
    except (TypeError, IndexError):
        return Peer(-1, -1, -1, str(address))


def describe_error(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    if isinstance(error, OSError) and error.errno is not None and not str(error):
        text = errno.errorcode.get(error.errno, text)
    return text
