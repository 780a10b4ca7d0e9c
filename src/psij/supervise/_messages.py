"""The supervisor's wire messages: reading a server's request (every fault named, never an
exception other than :class:`RequestError`) and making the job of a submission.

Pure: nothing here does I/O.
"""

import re
from enum import Enum
from typing import Any, Dict, List, Optional

from psij._record import Record

__all__ = [
    "ENV_ADDRESS", "ENV_CLIENT", "ENV_FAULT_TOLERANCE", "ENV_GENERATION", "ENV_GROUP_SIZE",
    "ENV_MELISSA_FAULT_TOLERANCE", "ENV_TOKEN", "ENV_UID", "KINDS", "MAX_CLIENT_ID", "Request",
    "RequestError", "RequestKind", "build_spec", "check_strings", "check_text", "marked_name",
    "read_request", "safe_name",
]

ENV_ADDRESS = "PSIJ_SUPERVISOR"
ENV_TOKEN = "PSIJ_SUPERVISOR_TOKEN"
ENV_GENERATION = "PSIJ_SUPERVISOR_GENERATION"
ENV_UID = "PSIJ_SUPERVISE_UID"
ENV_CLIENT = "PSIJ_SUPERVISE_CLIENT"
ENV_GROUP_SIZE = "PSIJ_SUPERVISE_GROUP_SIZE"
# The server's: whether a dead server is replaced ("1") or ends the study ("0"), so that it
# can decide to end the study itself when a client fails; and the same in the words of the
# Melissa launcher ("ON" / "OFF"), for servers written for it.
ENV_FAULT_TOLERANCE = "PSIJ_FAULT_TOLERANCE"
ENV_MELISSA_FAULT_TOLERANCE = "MELISSA_FAULT_TOLERANCE"



class RequestKind(str, Enum):
    """What a server's request asks (its ``"type"`` on the wire, the value)."""

    SUBMIT = "submit"
    CANCEL = "cancel"
    PING = "ping"
    PONG = "pong"
    DONE = "done"
    HELLO = "hello"


KINDS = tuple(kind.value for kind in RequestKind)
MAX_CLIENT_ID = 256
MAX_GROUP_SIZE = 1_000_000
MAX_ARGUMENTS = 100_000

_BY_TYPE = {kind.value: kind for kind in RequestKind}
_KEYS = {
    RequestKind.SUBMIT: ("type", "ref", "client", "spec", "arguments", "group_size"),
    RequestKind.CANCEL: ("type", "ref", "client"),
    RequestKind.PING: ("type", "ref"),
    RequestKind.PONG: ("type", "ref"),
    RequestKind.DONE: ("type", "ref"),
    RequestKind.HELLO: ("type", "ref", "token"),
}

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
_NOT_PLAIN = re.compile(r"[^A-Za-z0-9_.-]")
_NAME_LIMIT = 64  # what every scheduler accepts (psij._scripts.quoting)


class RequestError(ValueError):
    """A request that cannot be carried out; the text is the refusal's reason."""


class Request(Record):
    """One request of a server, checked."""

    kind: RequestKind
    ref: Any
    client: Optional[str]
    spec: Optional[Dict[str, Any]]
    arguments: Optional[List[str]]
    group_size: int


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_text(field: str, value: Any, longest: int = MAX_CLIENT_ID) -> str:
    """``value`` if it is a non-empty string of at most ``longest`` characters without NUL
    that is valid UTF-8 (no lone surrogates); :class:`RequestError` otherwise."""
    accepted = (f"a non-empty string of at most {longest} characters, valid UTF-8, "
                f"without NUL")
    if not isinstance(value, str) or not value or len(value) > longest or "\0" in value:
        raise RequestError(f"{field}: expected {accepted}, got {_describe(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{field}: expected {accepted}, got a lone surrogate "
                           f"in {_describe(value)}") from None
    return value


def check_strings(field: str, value: Any, depth: int = 0) -> None:
    """:class:`RequestError` naming the place of the first string in ``value`` (a decoded JSON
    value) that no process or file can receive: a lone surrogate other than those that stand
    for undecodable bytes (U+DC80 to U+DCFF, as ``os.fsdecode`` makes them)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as error:
            raise RequestError(f"{field}: {_describe(value)} holds a lone surrogate at "
                               f"position {error.start}; accepted: text without lone "
                               f"surrogates") from None
    elif depth > 32:
        raise RequestError(f"{field}: nested more than 32 levels deep")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_strings(f"{field} key", key, depth + 1)
            check_strings(f"{field}.{key}", item, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_strings(f"{field}[{i}]", item, depth + 1)


def read_request(message: Any) -> Request:
    """The request ``message`` (a decoded JSON value) makes, or :class:`RequestError`."""
    if not isinstance(message, dict):
        raise RequestError(f"a message must be a JSON object with a 'type', got "
                           f"{type(message).__name__}")
    given = message.get("type")
    kind = _BY_TYPE.get(given) if isinstance(given, str) else None
    if kind is None:
        raise RequestError(f"type: expected one of {', '.join(KINDS)}, got "
                           f"{_describe(given)}")
    extra = [k for k in message if k not in _KEYS[kind]]
    if extra:
        raise RequestError(f"{kind.value}: unknown field(s) "
                           f"{', '.join(_describe(k) for k in extra)}"
                           f"; accepted: {', '.join(_KEYS[kind])}")
    ref = message.get("ref")
    if kind is not RequestKind.SUBMIT and kind is not RequestKind.CANCEL:
        return Request(kind, ref, None, None, None, 1)
    client = check_text(f"{kind.value}: client", message.get("client"))
    if kind is RequestKind.CANCEL:
        return Request(kind, ref, client, None, None, 1)
    spec = message.get("spec")
    arguments = message.get("arguments")
    if (spec is None) == (arguments is None):
        raise RequestError("submit: give the job either as 'spec' (a JobSpec in JSON form) "
                           "or as 'arguments' (a list of strings for the client template)")
    if spec is not None and not isinstance(spec, dict):
        raise RequestError(f"submit: spec: expected a JSON object (a JobSpec), got "
                           f"{type(spec).__name__}")
    if arguments is not None:
        if not isinstance(arguments, list) or len(arguments) > MAX_ARGUMENTS:
            raise RequestError(f"submit: arguments: expected a list of at most "
                               f"{MAX_ARGUMENTS} strings, got {_describe(arguments)}")
        for i, argument in enumerate(arguments):
            if not isinstance(argument, str) or "\0" in argument:
                raise RequestError(f"submit: arguments[{i}]: expected a string without NUL, "
                                   f"got {_describe(argument)}")
    check_strings("submit: spec" if spec is not None else "submit: arguments",
                  spec if spec is not None else arguments)
    size = message.get("group_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_GROUP_SIZE:
        raise RequestError(f"submit: group_size: expected a whole number from 1 to "
                           f"{MAX_GROUP_SIZE}, got {_describe(size)}")
    return Request(kind, ref, client, spec, arguments, size)


def safe_name(name: str) -> str:
    """``name`` made fit for a file name: other characters than letters, digits and ``._+-``
    become ``_``, at most 64 characters."""
    return _UNSAFE.sub("_", name)[:64] or "_"


def marked_name(name: str, uid: int, marker: str) -> str:
    """The job name of submission ``uid``: ``name`` made plain (letters, digits, ``_ . -``,
    starting with a letter: as every scheduler writes it) and ended by ``.u<uid>.<marker>``,
    at most 64 characters. Unique to this submission (``marker`` is the supervisor's own), so
    that a job whose submission was interrupted can be found by its name."""
    suffix = f".u{uid}.{marker}"
    plain = _NOT_PLAIN.sub("_", name)
    if not plain[:1].isalpha():
        plain = "j" + plain
    return plain[:_NAME_LIMIT - len(suffix)] + suffix


def build_spec(doc: Dict[str, Any], uid: int, name: str, env: Dict[str, str],
               output_dir: str, std_output: bool, marker: Optional[str] = None) -> Any:
    """The :class:`~psij.JobSpec` of a submission: ``doc`` (a JobSpec in JSON form) with
    ``env`` added to its environment, its name defaulting to ``name`` (and, with ``marker``,
    made :func:`marked_name`), and its output going to ``<output_dir>/job.<uid>.<name>.out`` /
    ``.err`` unless it names files itself (none when ``std_output`` is false)."""
    from psij.serialize import _spec_from_json

    doc = dict(doc)
    environment = doc.get("environment")
    if environment is not None and not isinstance(environment, dict):
        raise RequestError(f"spec: environment: expected an object of strings, got "
                           f"{type(environment).__name__}")
    merged = dict(environment or {})
    merged.update(env)
    doc["environment"] = merged
    given = str(doc.get("name") or name)
    label = safe_name(given)
    if marker is not None:
        doc["name"] = marked_name(given, uid, marker)
    else:
        doc.setdefault("name", label)
    if std_output:
        doc.setdefault("stdout_path", f"{output_dir}/job.{uid}.{label}.out")
        doc.setdefault("stderr_path", f"{output_dir}/job.{uid}.{label}.err")
    try:
        return _spec_from_json(doc)
    except (TypeError, ValueError, OverflowError, RecursionError) as error:
        raise RequestError(f"spec: {error}") from None

