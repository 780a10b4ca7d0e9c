"""The Python client of a flow service (``psij flow serve``): one method per verb of the wire
protocol, each answering the service's reply as a dict or raising :class:`FlowError`.

Example (against a service already running; the flows guide tells the whole story)::

    from psij.flows.client import FlowClient

    with FlowClient() as flows:
        handle = flows.create(spec, count=4, executor="slurm", lease=3600,
                              provisioning_lease=600)["handle"]
        print(flows.status(handle))
        flows.renew(handle, lease=3600, provisioning_lease=600)
        flows.destroy(handle)

The socket is found as :func:`default_socket` says unless one is given.
"""

import base64
import itertools
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from psij._line_framing import LineFramer, decode_line, encode_line

__all__ = [
    "ROOT_SOCKET",
    "FlowClient",
    "FlowError",
    "FlowUnavailable",
    "default_socket",
    "user_socket",
]

ROOT_SOCKET = "/run/psij-flow/flow.sock"
"""Where a flow service started by root listens unless told otherwise."""

_MAX_REPLY = 64 * 1024 * 1024


def user_socket() -> str:
    """Where a user's own flow service listens unless told otherwise:
    ``~/.psij/flow/flow.sock``."""
    return str(Path.home() / ".psij" / "flow" / "flow.sock")


def default_socket() -> str:
    """``$PSIJ_FLOW_SOCKET`` when set; else the user's own service's socket when it exists;
    else the root service's (:data:`ROOT_SOCKET`)."""
    env = os.environ.get("PSIJ_FLOW_SOCKET")
    if env:
        return env
    mine = user_socket()
    return mine if os.path.exists(mine) else ROOT_SOCKET


class FlowError(Exception):
    """The service refused a request: ``code`` is machine-parsable (``unknown_handle``,
    ``bad_request``, ``refused``, ...), the message says what and what is accepted.

    ``reason`` is the wire's reason code of a ``refused`` request (``over_handle_max``,
    ``over_user_max``, ``over_service_max``, ``too_many_handles``, ``unknown_executor``,
    ``unknown_payload``), ``field`` the request field a ``bad_request`` names
    (``intervals.unknown``); None where the service gave none. Both are in the text too:
    ``MESSAGE [CODE: REASON]``.
    """

    def __init__(self, code: str, message: str, reason: Optional[str] = None,
                 field: Optional[str] = None) -> None:
        super().__init__(f"{message} [{code}: {reason}]" if reason else f"{message} [{code}]")
        self.code = code
        self.message = message
        self.reason = reason
        self.field = field


class FlowUnavailable(FlowError):
    """No service answers on the socket, or the connection broke."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


class FlowClient:
    """One connection to a flow service; thread-safe (one request at a time)."""

    def __init__(self, path: Optional[str] = None, timeout: Optional[float] = 60.0) -> None:
        self.path = path or default_socket()
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._framer = LineFramer(_MAX_REPLY)
        self._lines: List[bytes] = []
        self._closed = False

    def __enter__(self) -> "FlowClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection for good: a request after it raises FlowUnavailable (a thread
        still using the client must not open a connection nobody closes)."""
        self._closed = True
        sock = self._sock
        if sock is not None:
            # A request waiting for its answer (a watch) holds the lock: it is woken first.
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _connect(self) -> socket.socket:
        if self._closed:
            raise FlowUnavailable(f"the client of the flow service on {self.path} is closed")
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
            except OSError as ex:
                sock.close()
                raise FlowUnavailable(f"no flow service answers on {self.path}: "
                                      f"{ex.strerror or ex}") from ex
            self._sock = sock
            self._framer = LineFramer(_MAX_REPLY)
            self._lines = []
        return self._sock

    def request(self, op: str, **fields: Any) -> Dict[str, Any]:
        """Send ``{"op": op, **fields}`` and return the reply (its ``ok`` true), or raise
        :class:`FlowError` with the service's error."""
        request_id = next(self._ids)
        with self._lock:
            sock = self._connect()
            try:
                sock.sendall(encode_line({"id": request_id, "op": op, **fields}))
                reply = self._read_reply(sock, request_id)
            except (OSError, ValueError) as ex:
                sock.close()
                self._sock = None
                raise FlowUnavailable(f"the flow service on {self.path}: {ex}") from ex
        if not reply.get("ok"):
            error = reply.get("error") or {}
            if not isinstance(error, dict):
                error = {"code": "error", "message": str(error)}
            reason, field = error.get("reason"), error.get("field")
            raise FlowError(str(error.get("code", "error")), str(error.get("message", error)),
                            str(reason) if reason is not None else None,
                            str(field) if field is not None else None)
        return reply

    def _read_reply(self, sock: socket.socket, request_id: int) -> Dict[str, Any]:
        while True:
            while self._lines:
                message = decode_line(self._lines.pop(0))
                if not isinstance(message, dict):
                    continue
                # One request at a time: an error without an id is about the line just sent
                # (the service could not read it far enough to find its id).
                if message.get("id") == request_id or (message.get("id") is None
                                                       and message.get("ok") is False):
                    return message
            data = sock.recv(256 * 1024)
            if not data:
                raise ValueError("connection closed before the answer came")
            self._lines.extend(line for line in self._framer.feed(data) if line.strip())
            if self._framer.too_long:
                raise ValueError(f"an answer longer than {_MAX_REPLY} bytes")

    # -- the verbs --------------------------------------------------------------------------

    def create(self, spec: Any, count: int, executor: str, **options: Any) -> Dict[str, Any]:
        """A new handle keeping ``count`` instances of ``spec`` (a :class:`~psij.JobSpec` or
        its :mod:`psij.serialize` dict) running on ``executor``; options as in the wire
        protocol (``lease``, ``provisioning_lease``, ``rate``, ``max_count``, ``payload``,
        ``termination_map``, ``quota_bytes``, ``quota_policy``, ``keep_classes``)."""
        if not isinstance(spec, dict):
            from psij.serialize import JSONSerializer

            spec = json.loads(JSONSerializer().dumps(spec))
        return self.request("create", spec=spec, count=count, executor=executor, **options)

    def grow(self, handle: str, n: int) -> Dict[str, Any]:
        """Ask for ``n`` more instances: ``accepted`` says whether, ``reason`` why not."""
        return self.request("grow", handle=handle, n=n)

    def shrink(self, handle: str, n: int, victims: str = "not_running",
               signal: Union[str, int, None] = "SIGTERM",
               grace: Optional[float] = None, end_if_zero: bool = False) -> Dict[str, Any]:
        """Ask for ``n`` fewer instances, chosen by ``victims``; with ``end_if_zero`` a
        handle shrunk to 0 ends (its victims keep their grace, unlike with a destroy)."""
        more = {"end_if_zero": True} if end_if_zero else {}
        return self.request("shrink", handle=handle, n=n, victims=victims, signal=signal,
                            grace=grace, **more)

    def renew(self, handle: str, lease: Optional[float] = None,
              provisioning_lease: Optional[float] = None) -> Dict[str, Any]:
        """Extend the leases; the answer says what was granted."""
        fields: Dict[str, Any] = {"handle": handle}
        if lease is not None:
            fields["lease"] = lease
        if provisioning_lease is not None:
            fields["provisioning_lease"] = provisioning_lease
        return self.request("renew", **fields)

    def status(self, handle: str) -> Dict[str, Any]:
        return self.request("status", handle=handle)

    def problems(self, handle: str) -> List[Dict[str, Any]]:
        return list(self.request("problems", handle=handle).get("problems", []))

    def instances(self, handle: str) -> List[Dict[str, Any]]:
        return list(self.request("instances", handle=handle).get("instances", []))

    def output(self, handle: str, instance: str, stream: str = "stdout",
               max_bytes: int = 1024 * 1024) -> str:
        """The end (at most ``max_bytes``) of an ended instance's stdout or stderr."""
        return str(self.request("output", handle=handle, instance=instance, stream=stream,
                                max_bytes=max_bytes).get("data", ""))

    def delete(self, handle: str, ids: Sequence[str]) -> List[str]:
        """Forget instance records and remove their files; the ids that went."""
        return list(self.request("delete", handle=handle, ids=list(ids)).get("deleted", []))

    def destroy(self, handle: str) -> Dict[str, Any]:
        return self.request("destroy", handle=handle)

    def upload(self, data: Union[bytes, str, Path]) -> str:
        """Store a payload (bytes, or the file at a path); its sha256."""
        if not isinstance(data, bytes):
            data = Path(data).read_bytes()
        return str(self.request("upload", data=base64.b64encode(data).decode("ascii"))["sha256"])

    def watch(self, handle: Optional[str] = None, after: int = 0) -> int:
        """Wait until a change later than ``after`` is made to ``handle`` (None: to any of
        the caller's handles); the number of the latest change, to give as ``after`` next.
        The answer may take as long as nothing changes: use a client of its own, whose
        ``timeout`` bounds the wait (FlowUnavailable when it passes)."""
        fields: Dict[str, Any] = {"after": after}
        if handle is not None:
            fields["handle"] = handle
        return int(self.request("watch", **fields)["change"])

    def list(self) -> List[Dict[str, Any]]:
        """The caller's handles: ``{"handle", "valid", "requested"}`` each (ended ones too,
        while the service still keeps them)."""
        return list(self.request("list").get("handles", []))
