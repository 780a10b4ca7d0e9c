"""The client's side of the call files: a call serialized with cloudpickle (with an error
naming the argument that cannot be), and a result file read back into a value or the exception
the future gets.

cloudpickle is imported on the first call serialized, never at import. A result is unpickled
only after ``_wire`` checked its signature and this side checked that the same Python
(major.minor) wrote it.
"""

import pickle
from typing import Any, Callable, Dict, Optional, Tuple

from psij.futures import _wire
from psij.futures.errors import (
    FunctionJobError,
    FunctionResultError,
    RemoteException,
    RemoteTraceback,
)

__all__ = ["Outcome", "call_header", "describe", "dumps_call", "function_name", "load_result"]

Outcome = Tuple[bool, Any]
"""``(True, value)`` or ``(False, exception)``: what a future is given."""


def describe(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def function_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def _pickler() -> Any:
    import cloudpickle

    return cloudpickle


def _cannot(field: str, value: Any, ex: BaseException) -> TypeError:
    shown = repr(ex) if not str(ex) else f"{type(ex).__name__}: {ex}"
    return TypeError(f"{field} ({describe(value)}) cannot be serialized with cloudpickle: "
                     f"{shown}; accepted: values cloudpickle can pickle (no locks, open "
                     f"files, sockets or generators)")


def dumps_call(where: str, fn: Callable[..., Any], args: Tuple[Any, ...],
               kwargs: Dict[str, Any]) -> Tuple[bytes, bool]:
    """The pickle of ``(fn, args, kwargs)`` and whether loading it needs cloudpickle.
    TypeError naming the function or the first argument that cannot be pickled (``where``
    starts the message: ``submit``, ``map item 3``)."""
    cloudpickle = _pickler()
    try:
        data = bytes(cloudpickle.dumps((fn, args, kwargs), pickle.HIGHEST_PROTOCOL))
    except Exception as whole:
        parts = [(f"{where}: the function", fn)]
        parts += [(f"{where}: argument {i}", a) for i, a in enumerate(args)]
        parts += [(f"{where}: keyword argument {k!r}", v) for k, v in kwargs.items()]
        for field, value in parts:
            try:
                cloudpickle.dumps(value, pickle.HIGHEST_PROTOCOL)
            except Exception as ex:
                raise _cannot(field, value, ex) from ex
        raise _cannot(f"{where}: the call", fn, whole) from whole
    # Every reference to cloudpickle's helpers names its module: plain pickle loads the rest.
    return data, b"cloudpickle" in data


def call_header(call: str, needs_cloudpickle: bool, name: str) -> Dict[str, Any]:
    return {"format": _wire.FORMAT, "call": call, "python": _wire.python_version(),
            "cloudpickle": str(_pickler().__version__), "needs_cloudpickle": needs_cloudpickle,
            "function": name}


def load_result(path: str, key: bytes, call: str,
                ident: Callable[[str], FunctionResultError]) -> Outcome:
    """What a future gets from the result file ``path`` of ``call``: ``ident(message)`` makes
    the error for a file that cannot be trusted or read."""
    try:
        header, payload = _wire.read_file(path, key, call)
    except _wire.WireError as ex:
        return False, ident(f"the result cannot be used: {ex}")
    here = _wire.python_version()
    if header.get("python") != here:
        return False, ident(f"the result was written by Python {header.get('python')}; this "
                            f"side runs Python {here}: use the same major.minor on both sides")
    outcome = header.get("outcome")
    if outcome == "value":
        try:
            return True, pickle.loads(payload)
        except Exception as ex:
            return False, ident(f"the result cannot be unpickled here: "
                                f"{type(ex).__name__}: {ex}")
    if outcome == "raised":
        return False, _raised(header, payload)
    if outcome == "error":
        return False, FunctionJobError(f"the call could not be run: {header.get('message')}")
    return False, ident(f"the result has an unknown outcome {outcome!r}")


def _raised(header: Dict[str, Any], payload: bytes) -> BaseException:
    exception: Optional[BaseException] = None
    if payload:
        try:
            loaded = pickle.loads(payload)
            if isinstance(loaded, BaseException):
                exception = loaded
        except Exception:
            exception = None
    if exception is None:
        exception = RemoteException(str(header.get("type")), str(header.get("message")))
    text = header.get("traceback")
    if isinstance(text, str):
        exception.__cause__ = RemoteTraceback(text)
    return exception
