"""The remote protocol: what a client and ``psij remote serve`` say to each other, one JSON
value per line (:mod:`psij._line_framing`) over the SSH channel's standard input and output.

The server speaks first, one hello line: ``{"psij_remote": PROTOCOL, "version": ..., "python":
..., "host": ..., "user": ...}``. Then the client sends requests and the server answers each,
in order, and pushes the status changes of the jobs it follows whenever they happen:

* request: ``{"id": n, "op": "submit" | "cancel" | "list" | "attach" | "follow" | "put" |
  "get" | "ping", ...}``; requests that name an executor carry it as ``"ex": {"name": ...,
  "version": ..., "config": {...}}``;
* answer: ``{"re": n, "ok": true, "value": ...}`` or ``{"re": n, "ok": false, "kind": ...,
  "error": ...}``;
* event: ``{"ev": "status", "job": id, "native_id": ..., "state": ..., "time": ...,
  "exit_code": ..., "message": ..., "metadata": {...}}``.

Every request may be sent again after a dropped connection and means the same: a submission
names its jobs' ids, and a server submits a job id once whatever the number of connections.
Pure: no I/O.
"""

import math
import re
from typing import Any, Dict, Mapping, Optional

from psij.exceptions import InvalidJobException, SubmitException
from psij.job_state import JobState
from psij.job_status import JobStatus

PROTOCOL = 1
"""Changed whenever a message changes meaning; client and server must agree on it."""

HELLO_KEY = "psij_remote"
MAX_LINE = 64 * 1024 * 1024
"""The longest line either side accepts (a staged file travels in pieces far smaller)."""
PIECE = 1024 * 1024
"""Bytes of a file in one ``put``/``get`` message (before base64)."""

# The exception kinds an answer may name, raised again on the client as the same class.
ERROR_KINDS: Dict[str, type] = {
    "SubmitException": SubmitException,
    "InvalidJobException": InvalidJobException,
    "ValueError": ValueError,
    "TypeError": TypeError,
    "KeyError": KeyError,
}


JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def job_id(value: Any) -> str:
    """``value`` if it is a job id a server takes; ValueError otherwise."""
    if not isinstance(value, str) or not JOB_ID.fullmatch(value):
        raise ValueError(f"job id: expected 1 to 128 letters, digits or '._:-', got "
                         f"{str(value)[:80]!r}")
    return value


class RemoteError(Exception):
    """Something between this process and the remote host went wrong: no connection could be
    made, the remote ``psij`` is missing or of another protocol, or it answered what this
    ``psij`` cannot read."""


class RemoteConnectError(RemoteError):
    """SSH could not connect, log in or start the remote ``psij`` (the message says which)."""


class RemoteVersionError(RemoteError):
    """The remote ``psij`` speaks another protocol; the message names both versions."""


class RemoteProtocolError(RemoteError):
    """The remote side sent something that is not this protocol."""


def status_to_wire(job_id: str, native_id: Optional[str], status: JobStatus) -> Dict[str, Any]:
    """The event line of one status change."""
    metadata = status.metadata
    return {"ev": "status", "job": job_id, "native_id": native_id,
            "state": status.state.name, "time": status.time, "exit_code": status.exit_code,
            "message": status.message,
            "metadata": _plain(metadata) if metadata else None}


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` made of what JSON carries (other objects as their text)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > 8:
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    return str(value)


def status_from_wire(message: Mapping[str, Any]) -> JobStatus:
    """The JobStatus an event or answer describes; ValueError naming the field that is not one."""
    state_name = message.get("state")
    if not isinstance(state_name, str) or state_name not in JobState.__members__:
        raise ValueError(f"status.state: expected the name of a JobState, got "
                         f"{str(state_name)[:80]!r}")
    state = JobState[state_name]
    time = message.get("time")
    if isinstance(time, bool) or not isinstance(time, (int, float)) or not math.isfinite(time):
        raise ValueError(f"status.time: expected seconds since the epoch, got {time!r}")
    exit_code = message.get("exit_code")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise ValueError(f"status.exit_code: expected a whole number or null, got {exit_code!r}")
    text = message.get("message")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"status.message: expected text or null, got {text!r}")
    metadata = message.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"status.metadata: expected an object or null, got {metadata!r}")
    return JobStatus(state, time=float(time), message=text, exit_code=exit_code,
                     metadata=metadata)


def error_answer(request_id: Any, ex: BaseException) -> Dict[str, Any]:
    """The answer telling that a request failed with ``ex``."""
    kind = type(ex).__name__ if type(ex).__name__ in ERROR_KINDS else "RemoteError"
    return {"re": request_id, "ok": False, "kind": kind, "error": str(ex) or kind}


def raised(answer: Mapping[str, Any], host: str) -> Exception:
    """The exception a failed answer stands for, saying it came from ``host``."""
    kind = answer.get("kind")
    text = answer.get("error")
    message = f"{text if isinstance(text, str) else 'failed'} (on {host})"
    cls = ERROR_KINDS.get(kind, RemoteError) if isinstance(kind, str) else RemoteError
    return cls(message)  # type: ignore[no-any-return]
