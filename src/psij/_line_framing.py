"""Newline-delimited framing of a byte stream: the lines of every socket protocol of psij
(the pilot's, the controllers').

The cost is linear in the bytes fed however the stream is cut: each byte is searched for a
newline once and moved at most once (only the unfinished tail of a chunk is kept), never the
whole buffer again for every chunk. With a limit, a line longer than the limit stops the
framing: the lines before it are still returned, :attr:`LineFramer.too_long` becomes true, and
nothing more is kept, so a peer cannot make the reader hold more than the limit.

:func:`encode_line` is the other direction: the one way every peer (the pilot's agents, the served
pilot and its clients, the controllers and theirs) puts a message on a line.

Pure: no sockets, no clock; the caller reads and writes.
"""

import json
from typing import Any, List, Optional

__all__ = ["DEFAULT_MAX_LINE_BYTES", "LineFramer", "encode_line"]

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
"""The default longest request line a served pilot accepts (``--max-request-bytes``)."""


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


# One encoder for every message: ``json.dumps`` with separators would build one per call.
_encode_compact = json.JSONEncoder(separators=(",", ":")).encode


def encode_line(message: Any) -> bytes:
    """``message`` as one compact JSON line (with its ``\\n``), as every peer sends it."""
    return _encode_compact(message).encode() + b"\n"
