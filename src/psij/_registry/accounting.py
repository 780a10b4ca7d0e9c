"""The figures of a job's run that the registry keeps, taken from the metadata of its statuses
under the same names (:data:`USE_KEYS`): when the run was queued (by its scheduler), started
and ended (seconds since the epoch), its CPU time (user + system) and peak memory (max RSS),
the nodes it ran on, the cores it had, and the memory and duration it asked for.

Only sound figures are kept, whatever the executor or plugin that made the status: a number
that is not finite, is negative, is a bool or of the wrong type, or is too large to be true
(a time past the year 9999, a count past 2**63 - 1) is left out (NULL), as is a node list that
is empty, too long or holds control characters."""

import math
from typing import Any, Callable, Mapping, Optional, Tuple

__all__ = ["NO_USE", "USE_KEYS", "Use", "use_of"]

# The figures, in the order of a ``Use`` (and of the registry's columns of the same names).
USE_KEYS = ("started_at", "ended_at", "cpu_seconds", "max_rss_bytes", "queued_at", "nodes",
            "cores", "requested_memory_bytes", "requested_seconds")
# The figures of :data:`USE_KEYS`, each None when not known.
Use = Tuple[Any, ...]
NO_USE: Use = (None,) * len(USE_KEYS)
_MAX_INT = (1 << 63) - 1
# 9999-12-31T23:59:59Z: a later time is no time of a job (nor can it be printed as a date).
MAX_EPOCH = 253402300799.0
_MAX_CORES = (1 << 31) - 1
_MAX_NODES_TEXT = 100_000


def _seconds(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) and 0 <= number <= MAX_EPOCH else None


def _bytes(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int(value) if 0 <= value <= _MAX_INT else None


def _cores(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int(value) if 1 <= value <= _MAX_CORES else None


def _nodes(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > _MAX_NODES_TEXT or not text.isprintable():
        return None
    # A lone surrogate cannot be stored as UTF-8: written as its escape.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_CHECKS: Tuple[Callable[[Any], Any], ...] = (_seconds, _seconds, _seconds, _bytes, _seconds,
                                             _nodes, _cores, _bytes, _seconds)


def use_of(meta: Optional[Mapping[str, Any]], final: bool) -> Use:
    """The run's figures (:data:`USE_KEYS`) a final status's metadata ``meta`` holds
    (:data:`NO_USE` for a status that is not final: pass ``final=True`` to take what any
    status says)."""
    if not final or not meta:
        return NO_USE
    try:
        return tuple(check(meta.get(key)) for key, check in zip(USE_KEYS, _CHECKS))
    except Exception:  # a mapping whose get raises: nothing from it is kept
        return NO_USE
