"""The pilot's agent: runs the tasks the pilot places on one node that is not its own.

Started by the pilot through the allocation's launcher (``srun``, ``mpirun``, ``ssh``, or
directly for virtual nodes) as ``python -m psij.executors.pilot.agent --connect ADDRESS
--node NAME``, with the pilot's token as the first line of its standard input, or in a file
named by ``--token-file PATH`` (0600, owned by the user, not a symbolic link: see
:mod:`~psij.executors.pilot._token_file`; an elastic pilot's allocations start agents so). It
connects
back (``unix:PATH`` or ``tcp:HOST:PORT``), says hello, and then follows the pilot's requests.

Protocol: one JSON object per line, both ways.

- agent to pilot: ``{"op": "hello", "node", "token", "pid"}`` first (with ``"allocation"``,
  ``"cores"`` and ``"gpus"`` for an agent that joins an elastic pilot, ``--allocation``), then
  ``{"op": "started", "id", "pid"}`` when a task's process started, and
  ``{"op": "exited", "id", "code", "message"}`` when a task ends (with a message when it could
  not be started, and ``code`` 127 or 126 for a program not found or not executable, else null),
  always after its ``started`` if it had one; with ``cpu_seconds`` and ``max_rss_bytes``, the
  use of the task's process as the agent reaped it (``wait4``), when known; and
  ``{"op": "leaving", "why"}`` when it got SIGTERM, before it stops its tasks.
- pilot to agent: ``{"op": "spawn", "launch": {...}}`` (see ``_task_process.Launch``),
  ``{"op": "signal", "id", "grace"}`` (TERM now, KILL after ``grace`` seconds; with
  ``"signum"`` instead, that signal alone: the one asked for before the time limit),
  ``{"op": "stop"}``.

When the connection ends (the pilot stopped or died), or the agent gets SIGTERM (its job was
cancelled), the agent stops every task it runs (TERM, KILL after a short grace) and exits. It
never decides what to run.
"""

import argparse
import os
import queue
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from psij._clock import Clock, MonotonicClock
from psij._line_framing import (
    DEFAULT_MAX_LINE_BYTES,
    BadLine,
    LineFramer,
    decode_line,
    encode_line,
)
from psij.executors.pilot._engine_events import TaskExited
from psij.executors.pilot._task_process import Launch, LaunchError, TaskProcesses

__all__ = ["connect", "main"]

_STOP_GRACE = 2.0
_MAX_BATCH = 256  # task ends sent in one write, at most


def connect(address: str, timeout: float = 30.0) -> socket.socket:
    """A connected socket for ``unix:PATH`` or ``tcp:HOST:PORT``."""
    kind, _, rest = address.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: Any = rest
    elif kind == "tcp":
        host, _, port = rest.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"--connect: {address!r} has no port; expected tcp:HOST:PORT")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        target = (host, int(port))
    else:
        raise ValueError(f"--connect: {address!r} is neither unix:PATH nor tcp:HOST:PORT")
    sock.settimeout(timeout)
    sock.connect(target)
    sock.settimeout(None)
    return sock


class _Agent:
    def __init__(self, sock: socket.socket, tmp_root: Path, clock: Optional[Clock] = None
                 ) -> None:
        self._sock = sock
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        # Reentrant: a start may report an exit at once, on this thread (see _exited).
        self._lock = threading.RLock()
        # A task's end to settle and report, a message to send, or None: the sender stops.
        self._outgoing: queue.SimpleQueue[Union[TaskExited, Dict[str, Any], None]] = \
            queue.SimpleQueue()
        self._processes = TaskProcesses(tmp_root, self._exited)
        self._ended = threading.Condition(self._lock)
        self._sender = threading.Thread(target=self._send_loop, name="psij-agent-sender",
                                        daemon=True)
        self._sender.start()

    def _exited(self, task_id: str, code: Optional[int]) -> None:
        # On the ProcessWatch thread: clean-up and sending happen on the sender thread. Under
        # the lock, so that the end of a task that exits at once queues after its start.
        with self._lock:
            self._outgoing.put(TaskExited(task_id, code))

    def send(self, message: Dict[str, Any]) -> None:
        self._outgoing.put(message)

    def _send_loop(self) -> None:
        outgoing = self._outgoing
        while True:
            # What has queued up meanwhile goes in one write: many short tasks end together.
            items = [outgoing.get()]
            while not outgoing.empty() and len(items) < _MAX_BATCH:
                items.append(outgoing.get())
            lines: List[bytes] = []
            stop = False
            for item in items:
                if item is None:
                    stop = True
                    break
                if isinstance(item, TaskExited):
                    task_id, code = item.task_id, item.code
                    with self._lock:
                        message, use = self._processes.finish_run(task_id, code)
                        self._ended.notify_all()
                    payload: Dict[str, Any] = {"op": "exited", "id": task_id, "code": code,
                                               "message": message}
                    if use is not None:
                        payload["cpu_seconds"], payload["max_rss_bytes"] = use
                else:
                    payload = item
                lines.append(encode_line(payload))
            try:
                self._sock.sendall(b"".join(lines))
            except OSError:
                pass  # the pilot is gone; the reader sees the end of the connection
            if stop:
                return

    def handle(self, message: Dict[str, Any]) -> bool:
        """Follow one request; False when the agent should stop."""
        op = message.get("op")
        if op == "spawn":
            launch = Launch.from_json(message["launch"])
            try:
                with self._lock:
                    pid = self._processes.start(launch)
                    self._outgoing.put({"op": "started", "id": launch.task_id, "pid": pid})
            except LaunchError as ex:
                self.send({"op": "exited", "id": launch.task_id, "code": ex.exit_code,
                           "message": f"could not start the task: {ex}"})
        elif op == "signal":
            with self._lock:
                if message.get("signum") is not None:
                    self._processes.send(str(message.get("id")), int(message["signum"]))
                else:
                    self._processes.signal(str(message.get("id")),
                                           float(message.get("grace", 5)))
        elif op == "stop":
            return False
        return True

    def stop(self) -> None:
        """Stop every task, wait for their ends to be sent, remove the TMPDIRs."""
        clock = self._clock
        deadline = clock.now() + _STOP_GRACE + 3.0
        with self._lock:
            self._processes.signal_all(_STOP_GRACE)
            while self._processes.running() and clock.now() < deadline:
                clock.wait(self._ended, deadline - clock.now())
        self._outgoing.put(None)
        self._sender.join(2.0)
        self._processes.remove_tmp_root()


def _serve(agent: _Agent, sock: socket.socket) -> None:
    framer = LineFramer(DEFAULT_MAX_LINE_BYTES)
    while True:
        try:
            data = sock.recv(65536)
        except OSError:
            return
        if not data:
            return
        for line in framer.feed(data):
            if not line.strip():
                continue
            try:
                message = decode_line(line, surrogates=True)
                if not isinstance(message, dict):
                    raise BadLine("expected a JSON object")
            except BadLine as bad:
                print(f"psij pilot agent: a request from the pilot cannot be read ({bad}); "
                      "skipped", file=sys.stderr, flush=True)
                continue
            if not agent.handle(message):
                return
        if framer.too_long:
            print(f"psij pilot agent: a request longer than {DEFAULT_MAX_LINE_BYTES} bytes "
                  "from the pilot; stopping", file=sys.stderr, flush=True)
            return


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psij.executors.pilot.agent",
                                     description="Run a pilot's tasks on this node (started "
                                                 "by the pilot; the token comes on stdin, or "
                                                 "in --token-file).")
    parser.add_argument("--connect", required=True, metavar="ADDRESS",
                        help="the pilot's address: unix:PATH or tcp:HOST:PORT")
    parser.add_argument("--node", help="the node name the pilot knows (needed unless "
                                       "--allocation is given)")
    parser.add_argument("--allocation", metavar="NAME",
                        help="join an elastic pilot as a node of its allocation NAME: the "
                             "node is named NAME-<host name> unless --node is given, and "
                             "offers --cores cores and --gpus GPUs")
    parser.add_argument("--cores", type=int, metavar="N",
                        help="with --allocation: cores offered (default: those this process "
                             "may use)")
    parser.add_argument("--gpus", type=int, default=0, metavar="N",
                        help="with --allocation: GPUs offered (default: 0)")
    parser.add_argument("--tmp-root", metavar="DIR",
                        help="where the tasks' TMPDIRs are made (default: a new folder in "
                             "this node's temporary directory)")
    parser.add_argument("--token-file", metavar="PATH",
                        help="read the pilot's token from this file (mode 0600, owned by "
                             "this user, not a symbolic link) instead of standard input")
    args = parser.parse_args(argv)
    hello: Dict[str, Any] = {"op": "hello", "pid": os.getpid()}
    if args.allocation is not None:
        if args.node is None:
            args.node = f"{args.allocation}-{socket.gethostname().split('.')[0]}"
        cores = args.cores if args.cores is not None else _usable_cores()
        if cores < 1 or args.gpus < 0:
            parser.error("--cores must be at least 1 and --gpus at least 0")
        hello.update(allocation=args.allocation, cores=cores, gpus=args.gpus)
    elif args.node is None:
        parser.error("--node is needed unless --allocation is given")
    hello["node"] = args.node
    if args.token_file is not None:
        from psij.executors.pilot._token_file import TokenFileError, read_token_file

        try:
            token = read_token_file(args.token_file)
        except TokenFileError as ex:
            print(f"psij pilot agent on {args.node}: {ex}", file=sys.stderr)
            return 2
    else:
        token = sys.stdin.readline().strip()
    tmp_root = Path(args.tmp_root) if args.tmp_root else Path(tempfile.mkdtemp(
        prefix=f"psij-agent-{args.node}-"))
    try:
        sock = connect(args.connect)
    except (OSError, ValueError) as ex:
        print(f"psij pilot agent on {args.node}: cannot connect to {args.connect}: {ex}",
              file=sys.stderr)
        return 1
    agent = _Agent(sock, tmp_root)
    hello["token"] = token
    agent.send(hello)
    previous = _stop_on_sigterm()
    code = 0
    try:
        _serve(agent, sock)
    except _Terminated:
        code = 128 + signal.SIGTERM
        # Before its tasks' ends: the pilot places nothing more here.
        agent.send({"op": "leaving", "why": "its agent got SIGTERM (its job was cancelled "
                                            "or reached its end)"})
    finally:
        agent.stop()
        sock.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return code


class _Terminated(Exception):
    """SIGTERM reached the agent (its job was cancelled): its tasks are stopped first."""


def _stop_on_sigterm() -> Any:
    """On the main thread: SIGTERM ends the agent's loop (once; later ones are ignored while
    it stops its tasks). The handler it replaces, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Terminated()

    return signal.signal(signal.SIGTERM, terminated)


def _usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
