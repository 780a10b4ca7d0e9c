"""Reading the fields of a flow request: every bad value becomes :class:`BadRequest`, which
names the field and what is accepted. Nothing here raises anything else on any JSON value."""

import math
import re
import signal
from typing import Any, List, Mapping, Optional, Sequence

from psij._line_framing import path_of

__all__ = ["BadRequest", "Fields", "lone_surrogate_path", "request_id", "shown"]

_MAX_SECONDS = 10 * 365 * 86400.0
_SIGNALS = {s.name: int(s) for s in signal.Signals}
_SIGNAL_NUMBERS = set(_SIGNALS.values())
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BadRequest(Exception):
    """A request field that cannot be accepted (``code`` is the wire error code)."""

    def __init__(self, field: str, message: str, code: str = "bad_request",
                 reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.code = code
        self.reason = reason


def shown(value: Any) -> str:
    """``value`` for a message: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _not_utf8(value: Any) -> bool:
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
    return False


def lone_surrogate_path(value: Any) -> Optional[str]:
    """The path of the first string (or key) in ``value`` that holds a lone surrogate (such
    text cannot be written as UTF-8), or None."""
    where = path_of(value, _not_utf8)
    return None if where is None else where or "request"


def request_id(message: Any) -> Any:
    """The id to answer with: a string (up to 200 characters), a whole number, or None."""
    if not isinstance(message, dict):
        return None
    rid = message.get("id")
    if isinstance(rid, bool) or rid is None:
        return None
    if isinstance(rid, int) and abs(rid) < 2**63:
        return rid
    if isinstance(rid, str) and len(rid) <= 200 and lone_surrogate_path(rid) is None:
        return rid
    return None


class Fields:
    """The fields of one request (a JSON object), read one by one."""

    def __init__(self, message: Mapping[str, Any]) -> None:
        self.message = message

    def has(self, name: str) -> bool:
        return self.message.get(name) is not None

    def raw(self, name: str) -> Any:
        return self.message.get(name)

    def text(self, name: str, default: Optional[str] = None, max_len: int = 200) -> str:
        value = self.message.get(name, default)
        if not isinstance(value, str) or not value or len(value) > max_len:
            if value is None:
                raise BadRequest(name, f"{name}: missing; expected a string")
            raise BadRequest(name, f"{name}: expected a non-empty string of at most {max_len} "
                             f"characters, got {shown(value)}")
        return value

    def count(self, name: str, default: Optional[int] = None, maximum: int = 10**9) -> int:
        value = self.message.get(name, default)
        if value is None:
            raise BadRequest(name, f"{name}: missing; expected a whole number from 0 to "
                             f"{maximum}")
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
            raise BadRequest(name, f"{name}: expected a whole number from 0 to {maximum}, "
                             f"got {shown(value)}")
        return value

    def seconds(self, name: str, default: Optional[float] = None, nullable: bool = False,
                minimum: float = 0.0) -> Optional[float]:
        if name not in self.message or (self.message[name] is None and not nullable):
            return default
        value = self.message[name]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not minimum <= value <= _MAX_SECONDS:
            also = " or null" if nullable else ""
            raise BadRequest(name, f"{name}: expected seconds from {minimum:g} to "
                             f"{_MAX_SECONDS:g}{also}, got {shown(value)}")
        return float(value)

    def positive(self, name: str, default: Optional[float]) -> Optional[float]:
        value = self.seconds(name, default)
        if value is not None and value <= 0:
            raise BadRequest(name, f"{name}: expected a number above 0, got {shown(value)}")
        return value

    def choice(self, name: str, accepted: Sequence[str], default: Optional[str] = None) -> str:
        value = self.message.get(name, default)
        if value not in accepted:
            raise BadRequest(name, f"{name}: expected one of {', '.join(accepted)}, "
                             f"got {shown(value)}")
        return str(value)

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.message.get(name, default)
        if not isinstance(value, bool):
            raise BadRequest(name, f"{name}: expected true or false, got {shown(value)}")
        return value

    def signal(self, name: str = "signal") -> Optional[int]:
        """A signal by name (``"SIGTERM"``, ``"TERM"``) or number, or null (none)."""
        value = self.message.get(name, "SIGTERM")
        if value is None:
            return None
        if isinstance(value, str):
            upper = value.upper()
            number = _SIGNALS.get(upper, _SIGNALS.get("SIG" + upper))
            if number is not None:
                return number
        elif isinstance(value, int) and not isinstance(value, bool) \
                and value in _SIGNAL_NUMBERS:
            return value
        raise BadRequest(name, f"{name}: expected a signal name (SIGTERM, TERM, ...), a signal "
                         f"number of this system or null, got {shown(value)}")

    def sha256(self, name: str) -> Optional[str]:
        value = self.message.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or _SHA256.fullmatch(value) is None:
            raise BadRequest(name, f"{name}: expected a sha256 as 64 lowercase hex digits, "
                             f"got {shown(value)}")
        return value

    def strings(self, name: str, accepted: Optional[Sequence[str]] = None,
                max_items: int = 10000, max_len: int = 200) -> List[str]:
        value = self.message.get(name, [])
        what = f"one of {', '.join(accepted)}" if accepted else "strings"
        if not isinstance(value, list) or len(value) > max_items:
            raise BadRequest(name, f"{name}: expected a list of at most {max_items} {what}, "
                             f"got {shown(value)}")
        for item in value:
            if not isinstance(item, str) or not item or len(item) > max_len \
                    or (accepted is not None and item not in accepted):
                raise BadRequest(name, f"{name}: expected a list of {what}, got the item "
                                 f"{shown(item)}")
        return list(value)
