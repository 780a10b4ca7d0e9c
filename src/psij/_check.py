"""Argument checks shared by the core model classes and the executors' settings.

Every check raises a ``TypeError`` or ``ValueError`` whose message names the field, shows the
offending value and says what is accepted. The checks are plain ``isinstance`` tests so that
they stay cheap and also run under ``python -O``; no I/O happens here.
"""

import os
import sys
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    AbstractSet,
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Tuple,
    Type,
    Union,
)

if TYPE_CHECKING:
    from datetime import timedelta

    from typing_extensions import TypeGuard

PathLike = Union[str, Path]


def _is_timedelta(value: Any) -> "TypeGuard[timedelta]":
    """Whether ``value`` is a ``datetime.timedelta``, without loading :mod:`datetime` (1 ms of
    a pilot's start): there is none before the module is loaded."""
    datetime = sys.modules.get("datetime")
    return datetime is not None and isinstance(value, datetime.timedelta)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def fail_type(field: str, value: Any, accepted: str) -> TypeError:
    return TypeError(f"{field}: expected {accepted}, got {_describe(value)}")


def no_nul(field: str, value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{field}: NUL characters cannot be passed to a process: {value!r}")
    return value


def opt_str(field: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str):
        raise fail_type(field, value, "str or None")
    return no_nul(field, value)


def opt_name(field: str, value: Any) -> Optional[str]:
    """A name (a job name, a queue, an account, a reservation): text, or a whole number written
    as text (``5`` is ``"5"``, as a scheduler reads it and as psij-python renders it), or
    None."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not -10 ** 100 < value < 10 ** 100:
            raise ValueError(f"{field}: a number as a name has at most 100 digits")
        return str(value)
    if value is not None and not isinstance(value, str):
        raise fail_type(field, value, "str, int or None")
    return opt_str(field, value)


def req_str(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise fail_type(field, value, "str")
    return no_nul(field, value)


def text(field: str, value: Any, raw: bool = False) -> str:
    """``value`` as text for a process: a ``str``, or a path-like object (``pathlib.Path`` or
    any ``os.PathLike``) turned into its ``os.fspath`` text, as ``subprocess`` takes it; with
    ``raw``, also ``bytes`` (decoded as the file system does, ``os.fsdecode``: what a process
    receives is the same bytes). Refused: other types and NUL characters. (Lone surrogates are
    refused at submit, by each executor's checks.)"""
    if not isinstance(value, str):
        if raw and isinstance(value, bytes):
            value = os.fsdecode(value)
        elif not isinstance(value, os.PathLike):
            raise fail_type(field, value, "str, bytes or a path-like object (os.PathLike)"
                            if raw else "str or a path-like object (os.PathLike)")
        else:
            path = os.fspath(value)
            if not isinstance(path, str):
                raise fail_type(field, value, "str or a path-like object whose __fspath__ "
                                              "gives str")
            value = path
    return no_nul(field, value)


def opt_text(field: str, value: Any, raw: bool = False) -> Optional[str]:
    """:func:`text`, or None."""
    return None if value is None else text(field, value, raw)


def opt_path(field: str, value: Any, empty: Optional[str] = None) -> Optional[Path]:
    """A ``pathlib.Path`` from text or a path-like object, or None. ``""`` is refused (it is
    no path), unless ``empty`` names the path it stands for."""
    if value is None:
        return None
    if isinstance(value, Path):
        no_nul(field, str(value))
        return value
    if isinstance(value, (str, os.PathLike)):
        given = value
        value = text(field, value)
        if value == "" and empty is not None:
            return Path(empty)
        if value == "":
            raise ValueError(f"{field}: an empty string is not a path; use None for no path "
                             f"(got {given!r})")
        return Path(value)
    raise fail_type(field, value, "str, a path-like object (pathlib.Path, os.PathLike) or None")


def opt_bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail_type(field, value, "bool")
    return value


def flag(field: str, value: Any) -> bool:
    """A flag of the job model: a bool, or the ints 0 and 1 (as psij-python, which tests their
    truth, reads them); anything else is refused rather than read by its truth (``"no"`` would
    be true)."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if not isinstance(value, bool):
        raise fail_type(field, value, "bool (or 0 or 1)")
    return value


def opt_int(field: str, value: Any, minimum: Optional[int] = None) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail_type(field, value, "int or None")
    if minimum is not None and value < minimum:
        raise ValueError(f"{field}: must be at least {minimum}, got {value}")
    return value


def opt_str_list(field: str, value: Any, raw: bool = False) -> Optional[List[str]]:
    """A new list of the texts of ``value``'s items (see :func:`text`: ``str`` or path-like,
    and with ``raw`` bytes), or None. ``value`` may be any ordered iterable (a list, a tuple,
    a generator); text, bytes, mappings and sets are refused (no order, or not a list of
    words)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, bytearray, Mapping, AbstractSet)) or not isinstance(
            value, Iterable):
        raise fail_type(field, value, "a list (or other ordered iterable) of str or "
                                      "path-like items, or None")
    return [text(f"{field}[{i}]", item, raw) for i, item in enumerate(value)]


def env_dict(field: str, value: Any) -> Optional[Dict[str, str]]:
    """Environment mapping: str keys; values str, int (``True`` counts as an int, as in
    psij-python: ``"True"``) or path-like, all stored as text."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise fail_type(field, value, "a dict of str to str, int or path-like, or None")
    out: Dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise fail_type(f"{field} key", k, "str")
        if k == "" or "=" in k:
            raise ValueError(f"{field}: {k!r} is not a valid variable name (empty or has '=')")
        no_nul(f"{field} key", k)
        label = f"{field}[{k!r}]"
        if isinstance(v, int):
            try:
                out[k] = str(v)
            except ValueError as ex:  # over sys.get_int_max_str_digits() digits
                raise ValueError(f"{label}: {ex}") from None
        elif isinstance(v, (str, os.PathLike)):
            out[k] = text(label, v)
        else:
            raise fail_type(label, v, "str, int or a path-like object")
    return out


def instance(field: str, value: Any, cls: Union[Type[Any], Tuple[Type[Any], ...]],
             accepted: str, allow_none: bool = True) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, cls):
        raise fail_type(field, value, accepted + (" or None" if allow_none else ""))
    return value


def duration(field: str, value: Any) -> "timedelta":
    """A length of time at least 0: a ``datetime.timedelta`` or a finite number of seconds
    (a number is turned into a timedelta)."""
    if _is_timedelta(value):
        if value.total_seconds() < 0:
            raise ValueError(f"{field}: must not be negative, got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail_type(field, value, "datetime.timedelta or a number of seconds")
    if 0 <= value < _MAX_TIMEDELTA_SECONDS:
        from datetime import timedelta
        try:
            return timedelta(seconds=value)
        except OverflowError:
            pass
    raise ValueError(f"{field}: expected a number of seconds at least 0 and below "
                     f"{_MAX_TIMEDELTA_SECONDS:.0f} (what a timedelta holds), got {value!r}")


_MAX_TIMEDELTA_SECONDS = 86400000000000.0
"""``datetime.timedelta.max.total_seconds()`` (tests/test_import.py compares them)."""


def timeout(field: str, value: Any) -> Optional[float]:
    """A wait's limit in seconds, None for no limit. Accepts None, a ``datetime.timedelta``
    (a negative one counts as 0, as a condition variable's wait does) or a number of seconds
    at least 0 (``inf`` means no limit)."""
    if value is None:
        return None
    if _is_timedelta(value):
        return max(0.0, value.total_seconds())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail_type(field, value, "None, datetime.timedelta or a number of seconds")
    if value == float("inf"):
        return None
    if not value >= 0:
        raise ValueError(f"{field}: expected a number of seconds at least 0 (or None or "
                         f"inf for no limit), got {value!r}")
    return float(value)


MAX_SECONDS = 2147483.647
"""The longest delay accepted for a timer (2**31 ms, what one ``select``/``epoll`` wait takes)."""


def seconds(field: str, value: Any, positive: bool = False) -> float:
    """A finite number of seconds, at least 0 (above 0 if ``positive``), at most MAX_SECONDS;
    a ``datetime.timedelta`` is accepted too and turned into its seconds."""
    given = value
    if _is_timedelta(value):
        value = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail_type(field, value, "a number of seconds or a datetime.timedelta")
    if not 0 <= value <= MAX_SECONDS or (positive and value == 0):
        low = "above 0" if positive else "at least 0"
        raise ValueError(f"{field}: expected a number of seconds {low} and at most "
                         f"{MAX_SECONDS} (about 24 days), got {given!r}")
    return float(value)


def os_text(field: str, value: str) -> str:
    """Refuse text that cannot be passed to a process or used as a file name: one holding a
    lone surrogate (such as ``"\\ud800"``), which has no encoding in bytes."""
    if not value.isascii():
        try:
            value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as ex:
            raise ValueError(f"{field}: {value!r} holds a lone surrogate at position "
                             f"{ex.start}, which no process or file name can receive; "
                             "accepted: text that has an encoding (UTF-8)") from ex
    return value


RESOURCE_POOL = "LocalJobExecutorConfig.resource_pool"
"""The field a ``resource_pool`` setting is named by in its errors."""
_POOL_KEYS = {"cores": 1, "memory": 0, "tmp": 0, "gpus": 0}  # and the least value of each
_POOL_MOST = 2 ** 62  # more than any machine has, in cores or bytes


def resource_pool(value: Any) -> Union[bool, Dict[str, Any]]:
    """``value`` as the local executor's ``resource_pool`` setting (a copy), checked alike for
    its configuration and for the site configuration files: ``False``, ``True`` or a mapping
    of ``cores``, ``memory``, ``tmp`` (ints) and ``gpus`` (a count or GPU ids). GPU ids are
    only checked: the machine's GPUs are not looked for."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, Mapping):
        raise fail_type(RESOURCE_POOL, value, "False, True or a dict of 'cores', 'memory', "
                                              "'tmp' (ints) and 'gpus' (an int or GPU ids)")
    checked: Dict[str, Any] = {}
    for key, amount in value.items():
        if key not in _POOL_KEYS:
            raise ValueError(f"{RESOURCE_POOL}: unknown key {key!r}; accepted keys are "
                             "'cores', 'memory' and 'tmp' (bytes), and 'gpus'")
        field = f"{RESOURCE_POOL}[{key!r}]"
        if key == "gpus":
            from psij._gpu_ids import gpu_setting

            setting = gpu_setting(field, amount)
            checked[key] = amount if isinstance(amount, int) else (
                [str(i) for i in range(setting)] if isinstance(setting, int) else list(setting))
            continue
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise fail_type(field, amount, "an int" + (" (bytes)" if key in (
                "memory", "tmp") else ""))
        if not _POOL_KEYS[key] <= amount <= _POOL_MOST:
            raise ValueError(f"{field}: expected an int from {_POOL_KEYS[key]} to "
                             f"{_POOL_MOST}, got {amount}")
        checked[key] = amount
    return checked
