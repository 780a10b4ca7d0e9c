"""The library a server job uses to talk to its supervisor (``psij supervise``).

::

    from psij.supervise.client import connect

    with connect() as supervisor:            # PSIJ_SUPERVISOR, PSIJ_SUPERVISOR_TOKEN
        supervisor.submit("c1", arguments=["1"])
        for update in supervisor.updates():  # until every client is final
            print(update.client, update.state, update.exit_code)
    # leaving the block says "done": the supervisor stops once this job ends

A reader thread answers the supervisor's pings at once (so a server busy computing stays
alive), hands the answers to requests back to the calls that wait for them, and queues the
status updates for :meth:`Connection.updates`. Only the standard library and psij's line
framing and clock are used, so a server starts fast.

A server learns whether fault tolerance is on (:func:`fault_tolerance`, or
:attr:`Connection.fault_tolerance`): when it is off, a dead server ends the study rather than
being replaced, so a server may as well end the study itself when a client fails.
"""

import json
import logging
import os
import queue
import socket
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence

from psij._clock import Clock, MonotonicClock
from psij._line_framing import BadLine, decode_line, encode_line

__all__ = ["Connection", "Refused", "SupervisorGone", "Update", "connect", "fault_tolerance"]

_MAX_LINE = 1024 * 1024


def fault_tolerance() -> bool:
    """Whether the supervisor replaces this server when it dies (its ``fault_tolerance``
    option): ``PSIJ_FAULT_TOLERANCE`` ("1" or "0"), else Melissa's ``MELISSA_FAULT_TOLERANCE``
    ("ON" or "OFF"); true when neither is set (the option's default)."""
    value = os.environ.get("PSIJ_FAULT_TOLERANCE")
    if value is not None:
        return value.strip() not in ("0", "")
    return os.environ.get("MELISSA_FAULT_TOLERANCE", "ON").strip().upper() != "OFF"


class Refused(Exception):
    """The supervisor refused a request; the text is its reason."""


class SupervisorGone(ConnectionError):
    """The connection to the supervisor is closed."""


class Update:
    """A client job changed state: ``client`` (its id), ``uid``, ``state`` (a
    :class:`~psij.JobState` name), ``exit_code`` and ``message`` (None when not known)."""

    __slots__ = ("client", "exit_code", "message", "state", "uid")

    def __init__(self, client: str, uid: Optional[int], state: str,
                 exit_code: Optional[int], message: Optional[str]) -> None:
        self.client = client
        self.uid = uid
        self.state = state
        self.exit_code = exit_code
        self.message = message

    @property
    def final(self) -> bool:
        """Whether the client job has ended (COMPLETED, FAILED or CANCELED)."""
        return self.state in ("COMPLETED", "FAILED", "CANCELED")

    def __repr__(self) -> str:
        return (f"Update(client={self.client!r}, uid={self.uid}, state={self.state!r}, "
                f"exit_code={self.exit_code!r}, message={self.message!r})")


def _open(address: str, timeout: float) -> socket.socket:
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(address[len("unix:"):])
        return sock
    if address.startswith("tcp:"):
        host, _, port = address[len("tcp:"):].rpartition(":")
        return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    raise ValueError(f"PSIJ_SUPERVISOR: expected unix:PATH or tcp:HOST:PORT, got {address!r}")


class Connection:
    """A server's connection to its supervisor (made by :func:`connect`)."""

    def __init__(self, sock: Any, token: str, timeout: float = 30.0) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._answers: Dict[int, queue.Queue[Dict[str, Any]]] = {}
        self._answers_lock = threading.Lock()
        self._updates: queue.Queue[Optional[Update]] = queue.Queue()
        self._next_ref = 0
        self._closed = False
        self.pending: Dict[str, int] = {}
        """Clients submitted and not final yet, by id (their uids)."""
        sock.settimeout(timeout)
        self._reader = sock.makefile("rb")
        self._send({"type": "hello", "token": token})
        welcome = self._read_one()
        if welcome is None or welcome.get("type") != "welcome":
            reason = (welcome or {}).get("reason", "connection closed")
            sock.close()
            raise Refused(f"the supervisor refused this server: {reason}")
        sock.settimeout(None)
        self.generation: int = int(welcome.get("generation", 0))
        """The generation of this server (1, then one more after each restart)."""
        self.uid: int = int(welcome.get("uid", -1))
        self.ping_interval: float = float(welcome.get("ping_interval", 0))
        told = welcome.get("fault_tolerance")
        self.fault_tolerance: bool = told if isinstance(told, bool) else fault_tolerance()
        """Whether the supervisor replaces this server when it dies; when false, a dead
        server ends the study (so the server may end it when a client fails)."""
        threading.Thread(target=self._read_all, name="psij-supervise-reader",
                         daemon=True).start()

    # -- requests ---------------------------------------------------------------------------

    def submit(self, client: str, arguments: Optional[Sequence[str]] = None,
               spec: Any = None, group_size: int = 1, timeout: float = 60.0) -> int:
        """Ask for client job ``client``: ``arguments`` for the configured client template,
        or ``spec`` (a :class:`~psij.JobSpec`, or its JSON form); returns its uid, or raises
        :class:`Refused`. ``group_size`` is passed to the job as
        ``PSIJ_SUPERVISE_GROUP_SIZE`` (the job runs that many clients)."""
        message: Dict[str, Any] = {"type": "submit", "client": client,
                                   "group_size": group_size}
        if spec is not None:
            if not isinstance(spec, dict):
                from psij.serialize import JSONSerializer
                spec = json.loads(JSONSerializer().dumps(spec))
            message["spec"] = spec
        else:
            message["arguments"] = list(arguments or [])
        answer = self.request(message, timeout)
        uid = int(answer["uid"])
        self.pending[client] = uid
        return uid

    def cancel(self, client: str, timeout: float = 60.0) -> None:
        """Cancel client ``client`` (its final update follows); :class:`Refused` when it is
        not submitted or already final."""
        self.request({"type": "cancel", "client": client}, timeout)

    def done(self, timeout: float = 60.0) -> None:
        """Say the study is over: the supervisor cancels the clients left and stops when
        this job ends."""
        self.request({"type": "done"}, timeout)

    def request(self, message: Dict[str, Any], timeout: float = 60.0) -> Dict[str, Any]:
        """Send ``message`` and return the supervisor's answer (``accepted``), or raise
        :class:`Refused`, :class:`SupervisorGone` or :class:`TimeoutError`."""
        answers: queue.Queue[Dict[str, Any]] = queue.Queue()
        with self._answers_lock:
            self._next_ref += 1
            ref = self._next_ref
            self._answers[ref] = answers
        try:
            self._send(dict(message, ref=ref))
            try:
                answer = answers.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no answer to {message.get('type')} in {timeout} s") \
                    from None
        finally:
            with self._answers_lock:
                self._answers.pop(ref, None)
        if answer.get("type") == "gone":
            raise SupervisorGone("the supervisor closed the connection")
        if answer.get("type") != "accepted":
            raise Refused(str(answer.get("reason")))
        return answer

    # -- updates ----------------------------------------------------------------------------

    def next_update(self, timeout: Optional[float] = None) -> Optional[Update]:
        """The next status update (None after ``timeout`` seconds without one); raises
        :class:`SupervisorGone` once the connection is closed and every update was read."""
        try:
            update = self._updates.get(timeout=timeout)
        except queue.Empty:
            return None
        if update is None:
            self._updates.put(None)
            raise SupervisorGone("the supervisor closed the connection")
        if update.final:
            self.pending.pop(update.client, None)
        return update

    def updates(self, until_idle: bool = True) -> Iterator[Update]:
        """Status updates as they come; with ``until_idle``, only until no submitted client
        is left without a final update."""
        while not until_idle or self.pending:
            update = self.next_update()
            if update is not None:
                yield update

    # -- the connection ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (without saying done)."""
        if not self._closed:
            self._closed = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        try:
            if kind is None:
                self.done()
        finally:
            self.close()

    def _send(self, message: Dict[str, Any]) -> None:
        data = encode_line(message)
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError as error:
                raise SupervisorGone(f"cannot write to the supervisor: {error}") from None

    def _read_one(self) -> Optional[Dict[str, Any]]:
        """The next message (None at the end); one that cannot be read is ``{"type": "bad"}``
        with the reason, and a line longer than any message is skipped to its end."""
        line = self._reader.readline(_MAX_LINE)
        if not line:
            return None
        if not line.endswith(b"\n") and len(line) >= _MAX_LINE:
            while True:
                more = self._reader.readline(_MAX_LINE)
                if not more or more.endswith(b"\n"):
                    break
            return {"type": "bad", "reason": f"a line longer than {_MAX_LINE} bytes"}
        try:
            message = decode_line(line)
        except BadLine as bad:
            return {"type": "bad", "reason": str(bad)}
        return message if isinstance(message, dict) else {"type": "bad",
                                                          "reason": "not a JSON object"}

    def _read_all(self) -> None:
        try:
            while True:
                try:
                    message = self._read_one()
                except OSError:
                    message = None
                if message is None:
                    break
                try:
                    self._dispatch(message)
                except Exception as error:  # one odd message must not stop the pongs
                    logging.getLogger("psij.supervise.client").warning(
                        "cannot handle %r from the supervisor: %s", message, error)
        finally:
            self._updates.put(None)
            with self._answers_lock:
                waiting: List[queue.Queue[Dict[str, Any]]] = list(self._answers.values())
            for answers in waiting:
                answers.put({"type": "gone"})

    def _dispatch(self, message: Dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "ping":
            try:
                self._send({"type": "pong"})
            except SupervisorGone:
                pass
        elif kind == "update":
            exit_code = message.get("exit_code")
            self._updates.put(Update(str(message.get("client")), message.get("uid"),
                                     str(message.get("state")),
                                     exit_code if isinstance(exit_code, int) else None,
                                     message.get("message")))
        elif kind == "bad":
            logging.getLogger("psij.supervise.client").warning(
                "a line from the supervisor cannot be read: %s", message.get("reason"))
        elif kind in ("accepted", "refused"):
            ref = message.get("ref")
            with self._answers_lock:
                answers = self._answers.get(ref) if isinstance(ref, int) else None
            if answers is not None:
                answers.put(message)


def connect(address: Optional[str] = None, token: Optional[str] = None,
            timeout: float = 30.0, retry_for: float = 10.0,
            clock: Optional[Clock] = None) -> Connection:
    """Connect to the supervisor at ``address`` (default ``$PSIJ_SUPERVISOR``) with ``token``
    (default ``$PSIJ_SUPERVISOR_TOKEN``), retrying for ``retry_for`` seconds of ``clock``
    (default: the monotonic clock) while it cannot be reached; raises :class:`Refused` when the
    supervisor does not accept this server."""
    address = address if address is not None else os.environ.get("PSIJ_SUPERVISOR")
    token = token if token is not None else os.environ.get("PSIJ_SUPERVISOR_TOKEN")
    if not address or not token:
        raise RuntimeError("connect: PSIJ_SUPERVISOR and PSIJ_SUPERVISOR_TOKEN are not set "
                           "(is this job run by psij supervise?)")
    clock = clock if clock is not None else MonotonicClock()
    deadline = clock.now() + retry_for
    while True:
        try:
            sock = _open(address, timeout)
            break
        except (ConnectionRefusedError, FileNotFoundError):
            if clock.now() >= deadline:
                raise
            clock.sleep(0.2)
    return Connection(sock, token, timeout)
