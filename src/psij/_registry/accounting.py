"""The figures of a job's run that the registry keeps (columns ``started_at``, ``ended_at``,
``cpu_seconds``, ``max_rss_bytes``), taken from the metadata of its final status under the same
names. Only figures a final status carries are kept, and only sound ones: a number that is not
finite, is negative or is too large for the column is left out (NULL), whatever the executor
or plugin that made the status."""

import math
from typing import Any, Mapping, Optional, Tuple

# (started_at, ended_at, cpu_seconds, max_rss_bytes), each None when not known.
Use = Tuple[Optional[float], Optional[float], Optional[float], Optional[int]]
NO_USE: Use = (None, None, None, None)
_MAX_INT = (1 << 63) - 1


def _seconds(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _bytes(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= _MAX_INT else None


def use_of(meta: Optional[Mapping[str, Any]], final: bool) -> Use:
    """The run's figures a final status's metadata ``meta`` holds (:data:`NO_USE` for a
    status that is not final)."""
    if not final or not meta:
        return NO_USE
    return (_seconds(meta.get("started_at")), _seconds(meta.get("ended_at")),
            _seconds(meta.get("cpu_seconds")), _bytes(meta.get("max_rss_bytes")))
