"""Newline-delimited JSON, the lines of every socket protocol of psij (the pilot's, its
agents', the controllers'): cutting a byte stream into lines, reading one line as the JSON
value a peer sent, and writing one.

The cost of :class:`LineFramer` is linear in the bytes fed however the stream is cut: each
byte is searched for a newline once and moved at most once (only the unfinished tail of a
chunk is kept), never the whole buffer again for every chunk. With a limit, a line longer than
the limit stops the framing: the lines before it are still returned, :attr:`LineFramer.too_long`
becomes true, and nothing more is kept, so a peer cannot make the reader hold more than the
limit.

:func:`decode_line` is the one way a line from another process becomes a value: whatever the
line holds, it returns a value or raises :class:`BadLine` (a ``ValueError``) saying why, and
never anything else. It refuses what would hurt the reader or whoever it passes the value on
to: text that is not UTF-8; nesting deeper than :data:`MAX_DEPTH` (measured without recursion,
before the parser runs); a number with more than :data:`MAX_DIGITS` digits in a row;
``NaN``, ``Infinity`` and numbers too large for a float; a lone surrogate escape (``\\ud800``)
other than those that stand for undecodable bytes (U+DC80 to U+DCFF, as ``os.fsdecode`` makes
them, which psij's JSON carries for file names), unless the caller refuses those itself, one
value at a time (the pilot's tasks). Where the line was JSON and one value in it
was refused, :attr:`BadLine.field` names that value's place (``intervals.unknown``,
``tasks[3].name``) and :attr:`BadLine.value` holds what was read, so that a protocol can still
answer with the request's id. The checks are a few passes over the line in C; the slower ones
run only when those find what they look for, and a hostile line is refused early.

:func:`encode_line` is the other direction: the one way every peer puts a message on a line.

Pure: no sockets, no clock; the caller reads and writes.
"""

import json
import math
import re
from itertools import accumulate, count
from operator import sub
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["DEFAULT_MAX_LINE_BYTES", "MAX_DEPTH", "MAX_DIGITS", "BadLine", "LineFramer",
           "decode_line", "encode_line", "path_of"]

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
"""The default longest request line a served pilot accepts (``--max-request-bytes``)."""

MAX_DEPTH = 64
"""The deepest nesting of lists and objects :func:`decode_line` accepts (``[[1]]`` is 2)."""

MAX_DIGITS = 100
"""The most digits in a row a number read by :func:`decode_line` may have."""


class LineFramer:
    """Cuts fed bytes into lines (without their ``\\n``); see the module documentation."""

    __slots__ = ("_buffer", "_scanned", "limit", "too_long", "work")

    def __init__(self, limit: Optional[int] = None) -> None:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise ValueError(f"line limit: expected a whole number of bytes >= 1 or None, "
                             f"got {limit!r}")
        self.limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self.too_long = False
        self.work = 0  # bytes searched, copied or moved so far: the measure of the cost

    @property
    def pending(self) -> int:
        """Bytes of the line not finished yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> List[bytes]:
        """The lines that ``data`` completes, in order; [] once a line was too long."""
        if self.too_long:
            return []
        buffer = self._buffer
        buffer += data
        self.work += len(data)
        lines: List[bytes] = []
        start = 0
        search = self._scanned
        limit = self.limit
        while True:
            end = buffer.find(b"\n", search)
            self.work += (end if end >= 0 else len(buffer)) - search
            if end < 0:
                break
            if limit is not None and end - start > limit:
                return self._overflow(lines)
            lines.append(bytes(buffer[start:end]))
            self.work += end - start
            start = search = end + 1
        if start:
            # What is left follows the last newline, so it came with this chunk.
            self.work += len(buffer) - start
            del buffer[:start]
        self._scanned = len(buffer)
        if limit is not None and len(buffer) > limit:
            return self._overflow(lines)
        return lines

    def _overflow(self, lines: List[bytes]) -> List[bytes]:
        self.too_long = True
        self._buffer = bytearray()
        self._scanned = 0
        return lines


# -- reading a line -------------------------------------------------------------------------


class BadLine(ValueError):
    """A line that :func:`decode_line` refuses; the message says why.

    ``field`` is the place of the refused value in the message (``"line"`` when the line as a
    whole is refused); ``value`` is the value read when the line was JSON and only some value
    in it was refused (None otherwise; a number that was not finite is a float NaN or infinity
    there).
    """

    def __init__(self, message: str, field: str = "line", value: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % (MAX_DIGITS + 1))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# What numbers are made of, each digit as 0, any other byte as a space: long runs of digits
# and large exponents are then substring searches.
_NUMBER_CHARS = bytes.maketrans(
    bytes(range(256)),
    bytes(48 if 48 <= b <= 57 else b if b in b"eE+-" else 32 for b in range(256)).lower())
_DIGIT_RUN = b"0" * (MAX_DIGITS + 1)
_BIG_EXPONENTS = (b"e000", b"e+000")
# The structure of a line: openings as (, closings as ), quotes kept, all else deleted.
_STRUCTURE = bytes.maketrans(b"[{]}", b"(())")
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_SIGNED = bytes.maketrans(b"()", b"\x02\x00")  # for a running sum: +2 and 0, less 1 each
_PASSES = 8
_CHUNK = 65536


def _nesting_refused(line: bytes, limit: int) -> Optional[str]:
    """Why the lists and objects of ``line`` (brackets in strings left out) cannot be read:
    nested deeper than ``limit``, or brackets that do not pair up; None when they can.

    Without recursion, and in C but for the last step: the structure alone (escaped
    backslashes and quotes removed, then all but brackets and quotes, then the strings); then
    the innermost pairs removed, one level a pass, for the few levels usual messages have (a
    run of openings longer than the levels left ends it early); what is left, deeper, is
    measured by a running sum, a chunk at a time, so that a hostile line stops early."""
    if b"\\" in line:
        line = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = line.translate(_STRUCTURE, _NOT_STRUCTURE)
    bare = structure.replace(b'""', b"")  # strings without brackets, the usual case
    if b'"' in bare:
        bare = b"".join(structure.split(b'"')[::2])
    too_deep = f"line is nested more than {limit} lists or objects deep"
    unpaired = "line is not JSON: its brackets do not pair up"
    level = 0
    while bare and level < _PASSES:
        if b"(" * (limit + 1 - level) in bare:
            return too_deep
        inner = bare.replace(b"()", b"")
        if len(inner) == len(bare):
            return unpaired
        bare, level = inner, level + 1
    marks = bare.translate(_SIGNED)
    depth = 0
    for start in range(0, len(marks), _CHUNK):
        chunk = marks[start:start + _CHUNK]
        # After the i-th bracket (from 1): twice the openings so far, less i.
        if depth + max(map(sub, accumulate(chunk), count(1))) > limit - level:
            return too_deep
        depth += sum(chunk) - len(chunk)
    return unpaired if depth else None


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _unwritable(value: Any) -> bool:
    """A string no UTF-8 text can hold: a lone surrogate that stands for no byte."""
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return True
    return False


def path_of(value: Any, bad: Callable[[Any], bool]) -> Optional[str]:
    """The place (``a.b[2].c``; ``""`` for ``value`` itself, ``a.<key>`` for a key) of the
    first item of the decoded JSON ``value`` (objects' keys included) for which ``bad`` is
    true, or None. Walks without recursion, so any depth is safe."""
    stack: List[Tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if bad(item):
            return path
        if isinstance(item, dict):
            inner: List[Tuple[str, Any]] = []
            for key, child in item.items():
                if bad(key):
                    return f"{path}.<key>" if path else "<key>"
                inner.append((f"{path}.{key}" if path else str(key), child))
            stack.extend(reversed(inner))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def decode_line(line: bytes, max_depth: int = MAX_DEPTH, surrogates: bool = False) -> Any:
    """The JSON value of one line from a peer; :class:`BadLine` naming what is wrong with it
    otherwise (see the module documentation). Never raises anything else.

    ``surrogates``: let lone surrogates through, for a protocol whose reader refuses them
    itself, one value at a time (the pilot fails only the task that holds one).
    """
    try:
        return _decode(line, max_depth, surrogates)
    except MemoryError:  # anywhere: the copies a check makes, the parse, the walk
        raise BadLine("line is too large to read") from None


def _decode(line: bytes, max_depth: int, surrogates: bool) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadLine(f"line is not UTF-8 (byte {error.start}: "
                      f"{line[error.start:error.start + 1]!r})") from None
    # Each check first looks at the whole line, strings included (cheap, in C), and looks
    # closer only when that finds something.
    if line.count(b"[") + line.count(b"{") > max_depth:
        why = _nesting_refused(line, max_depth)
        if why is not None:
            raise BadLine(why)
    numbers = line.translate(_NUMBER_CHARS)
    if _DIGIT_RUN in numbers and _LONG_NUMBER.search(_STRING.sub(b"", line)) is not None:
        raise BadLine(f"line holds a number of more than {MAX_DIGITS} digits")
    big_exponent = any(e in numbers for e in _BIG_EXPONENTS)
    found: List[str] = []  # the numbers that are not finite, as written

    def constant(token: str) -> float:  # NaN, Infinity, -Infinity
        found.append(token)
        return float(token)

    def real(token: str) -> float:
        number = float(token)
        if not math.isfinite(number):
            found.append(token)
        return number

    try:
        value = json.loads(text, parse_constant=constant,
                           parse_float=real if big_exponent else None)
    except ValueError as error:  # JSONDecodeError, and an int past Python's digit limit
        raise BadLine(f"line is not JSON: {error}") from None
    except RecursionError:  # not expected after the check above: a last guard
        raise BadLine(f"line is nested more than {max_depth} lists or objects deep") from None
    if found:
        field = path_of(value, _not_finite) or "line"
        number = _shown_number(found[0]) if len(found) == 1 else "a number"
        raise BadLine(f"{field}: {number} is not a finite number; expected a number a float "
                      f"can hold", field, value)
    where = path_of(value, _unwritable) \
        if not surrogates and _SURROGATE_ESCAPE.search(line) else None
    if where is not None:
        field = where or "line"
        raise BadLine(f"{field}: text with a lone surrogate (not valid Unicode); expected text "
                      f"that can be written as UTF-8", field, value)
    return value


def _shown_number(text: str) -> str:
    return text if len(text) <= 30 else text[:27] + "..."


# -- writing a line -------------------------------------------------------------------------

# One encoder for every message: ``json.dumps`` with separators would build one per call.
_encode_compact = json.JSONEncoder(separators=(",", ":")).encode


def encode_line(message: Any) -> bytes:
    """``message`` as one compact JSON line (with its ``\\n``), as every peer sends it."""
    return _encode_compact(message).encode() + b"\n"
