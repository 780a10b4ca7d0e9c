"""The figures of a Grid Engine job's run from one ``qacct -j`` record (see
:mod:`~psij.executors.batch._figures` for the keys).

- ``cpu_seconds``: ``cpu`` (else ``ru_utime`` + ``ru_stime``);
- ``max_vmem_bytes``: ``maxvmem``, the peak *virtual* memory of the job (sampled by the
  execution daemon about every second: a peak shorter than that may be missed);
- ``max_rss_bytes``: ``ru_maxrss``, the peak resident memory of the job's largest process
  (the rusage of the job's processes). Grid Engine keeps the kilobytes the kernel gives and
  prints them as if they were bytes (``307.789KB`` is 315,176 KiB, some 308 MiB): read so;
  absent when 0;
- ``cores``: ``slots``; ``nodes``: ``hostname`` (the master host of the job);
- ``requested_seconds`` and ``requested_memory_bytes``: ``h_rt`` and ``h_vmem`` (a limit per
  slot: times ``slots``) of the request qacct shows in ``category``;
- ``queued_at``, ``started_at``, ``ended_at``: ``qsub_time``, ``start_time``, ``end_time``, local
  times as qacct writes them (``-/-`` when never started); whole seconds.

Sizes are in binary multiples (``MB``: MiB), as Grid Engine computes them.
"""

import re
from typing import Any, Dict, Mapping, Optional

from psij.executors.batch._figures import (
    clean_figures,
    clock_seconds,
    local_time,
    memory_bytes,
    number,
)

__all__ = ["qacct_figures"]

_TIME_FORMATS = ("%a %b %d %H:%M:%S %Y", "%m/%d/%Y %H:%M:%S", "%m/%d/%Y %H:%M:%S.%f",
                 "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f")
_REQUEST = re.compile(r"(?:^|\s)-l\s+(\S+)")


def _seconds(text: Optional[str]) -> Optional[float]:
    """Seconds written ``2.344s``, ``2.344`` or ``HH:MM:SS``."""
    if text is None:
        return None
    text = text.strip()
    return number(text[:-1] if text.endswith("s") else text) if ":" not in text \
        else clock_seconds(text)


def _requests(category: str) -> Dict[str, str]:
    """The ``-l`` resources of a job's category (``-l h_rt=120,h_vmem=2G -pe smp 2``)."""
    found: Dict[str, str] = {}
    for match in _REQUEST.finditer(category):
        for item in match.group(1).split(","):
            name, equals, value = item.partition("=")
            if equals:
                found.setdefault(name.strip(), value.strip())
    return found


def qacct_figures(fields: Mapping[str, str]) -> Dict[str, Any]:
    """The figures of one qacct record (its fields by name)."""
    cpu = _seconds(fields.get("cpu"))
    if cpu is None:
        user, system = _seconds(fields.get("ru_utime")), _seconds(fields.get("ru_stime"))
        cpu = None if user is None or system is None else user + system
    rss = memory_bytes(fields.get("ru_maxrss"))
    slots = number(fields.get("slots", ""))
    requests = _requests(fields.get("category", ""))
    vmem_limit = memory_bytes(requests.get("h_vmem"))
    host = (fields.get("hostname") or "").strip()
    figures: Dict[str, Any] = {
        "cpu_seconds": cpu,
        "max_vmem_bytes": memory_bytes(fields.get("maxvmem")) or None,
        "max_rss_bytes": rss * 1024 if rss else None,
        "cores": slots,
        "nodes": host if host and host.lower() not in ("undefined", "none") else None,
        "requested_seconds": _seconds(requests.get("h_rt")),
        "requested_memory_bytes": None if vmem_limit is None or not slots
        else vmem_limit * int(slots),
        "queued_at": local_time(fields.get("qsub_time"), _TIME_FORMATS),
        "started_at": local_time(fields.get("start_time"), _TIME_FORMATS),
        "ended_at": local_time(fields.get("end_time"), _TIME_FORMATS),
    }
    return clean_figures({key: value for key, value in figures.items() if value is not None})
