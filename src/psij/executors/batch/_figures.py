"""The figures of a batch job's run (its accounting), as its final status's metadata carries
them, and the readers of the schedulers' ways of writing times, durations and sizes.

The keys (each absent when the scheduler does not say, or says something this module cannot
read; never NaN, infinite or negative): ``queued_at``, ``started_at``, ``ended_at`` (Unix
epoch seconds), ``cpu_seconds`` (user + system), ``max_rss_bytes``, ``max_vmem_bytes``,
``nodes`` (the scheduler's spelling, comma-separated), ``cores``, ``requested_memory_bytes``
(for the whole run) and ``requested_seconds``. The schedulers' parsers put them in the
metadata of the statuses they read from the accounting (or, for PBS, LSF and Flux, the
status command, which shows ended jobs); :func:`figures_of` takes them out again.

Every reader returns None for text it does not understand (a garbled or hostile value is a
missing figure, never an error that would lose the job's end).
"""

import calendar
import math
import re
import time
from typing import Any, Dict, Mapping, Optional

__all__ = ["FIGURE_KEYS", "SCHEDULER_KEYS", "clean_figures", "clock_seconds", "epoch_seconds",
           "figures_of", "has_figures", "local_time", "memory_bytes", "number", "utc_time"]

FIGURE_KEYS = ("queued_at", "started_at", "ended_at", "cpu_seconds", "max_rss_bytes",
               "max_vmem_bytes", "nodes", "cores", "requested_memory_bytes",
               "requested_seconds")
# The keys only the scheduler's record gives (start and end also come from the job's files).
SCHEDULER_KEYS = frozenset(FIGURE_KEYS) - {"started_at", "ended_at"}
_INT_KEYS = frozenset({"max_rss_bytes", "max_vmem_bytes", "cores", "requested_memory_bytes"})
_MAX_INT = (1 << 63) - 1
# Epoch seconds after this (the year 9999) are taken for garbage.
_MAX_EPOCH = 253402300799.0
_NODES_LIMIT = 65536
# Longer text is no figure (and int() of thousands of digits raises).
_TEXT_LIMIT = 64

_UNITS = {"": 0, "B": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
_MEMORY = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGTPE]?)(I?B?)", re.IGNORECASE)
_CLOCK = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(?:(\d+):)?(\d+(?:\.\d+)?)")


def number(text: object) -> Optional[float]:
    """A finite, non-negative number written as ``text`` (None otherwise)."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        stripped = str(text).strip()
        if len(stripped) > _TEXT_LIMIT or not re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", stripped):
            return None
        value = float(stripped)
    return value if math.isfinite(value) and 0 <= value <= _MAX_INT else None


def clock_seconds(text: Optional[str]) -> Optional[float]:
    """Seconds from a duration written ``[DD-][HH:]MM:SS[.mmm]`` (Slurm, PBS, LSF), or as bare
    seconds; None for ``UNLIMITED``, ``Unknown``, ``None``, ``INVALID``, empty or garbled
    text. Slurm writes ``MM:SS.mmm`` for short CPU times and ``HH:MM:SS`` for longer ones, so
    two fields are minutes and seconds; three, hours, minutes and seconds."""
    if text is None or len(text) > _TEXT_LIMIT:
        return None
    match = _CLOCK.fullmatch(text.strip())
    if match is None:
        return None
    days, first, second, seconds = match.groups()
    if second is None:  # one colon: minutes and seconds
        hours, minutes = None, first
    else:
        hours, minutes = first, second
    if days is not None and hours is None:
        # D-HH (Slurm's time limits may be written days-hours alone): not read, too rare to
        # guess at safely.
        return None
    total = float(seconds)
    if minutes is not None:
        if total >= 60 or (hours is not None and int(minutes) >= 60):
            return None
        total += int(minutes) * 60
    if hours is not None:
        total += int(hours) * 3600
    if days is not None:
        total += int(days) * 86400
    return total if math.isfinite(total) else None


def memory_bytes(text: Optional[str], default_unit: str = "") -> Optional[int]:
    """Bytes from a size written with a unit: ``16648K``, ``512M``, ``1.5G``, ``10.961MB``,
    ``307832kb``, ``2GiB`` (binary multiples: Slurm, PBS, LSF and Grid Engine's ``K`` mean
    1024 here); ``default_unit`` applies to a bare number. None for garbled text."""
    if text is None or len(text) > _TEXT_LIMIT:
        return None
    match = _MEMORY.fullmatch(text.strip())
    if match is None:
        return None
    digits, unit, _ = match.groups()
    power = _UNITS[(unit or default_unit).upper()]
    value = float(digits) * (1 << (10 * power))
    if not math.isfinite(value) or value > _MAX_INT:
        return None
    return round(value)


def epoch_seconds(text: object) -> Optional[float]:
    """Unix epoch seconds written as a number (None for 0, which schedulers use for "not
    yet", and for garbage)."""
    value = number(text)
    return value if value is not None and 0 < value <= _MAX_EPOCH else None


def local_time(text: Optional[str], formats: "tuple[str, ...]") -> Optional[float]:
    """Epoch seconds of a local time written in one of ``formats`` (strptime's), or as bare
    epoch seconds; None for ``Unknown``, ``None``, ``-/-`` and anything unreadable. The time
    zone is this process's: the scheduler's commands are taken to run in the same one."""
    if text is None or len(text) > _TEXT_LIMIT:
        return None
    text = " ".join(text.split())
    if text.isdigit():
        return epoch_seconds(text)
    for fmt in formats:
        try:
            parsed = time.strptime(text, fmt)
        except (ValueError, OverflowError):
            continue
        try:
            value = time.mktime(parsed)
        except (OverflowError, ValueError):
            return None
        return value if 0 < value <= _MAX_EPOCH else None
    return None


def utc_time(text: Optional[str], fmt: str) -> Optional[float]:
    """Epoch seconds of a UTC time written in ``fmt`` (strptime's); None if unreadable."""
    if not text or len(text) > _TEXT_LIMIT:
        return None
    try:
        value = float(calendar.timegm(time.strptime(text.strip(), fmt)))
    except (ValueError, OverflowError):
        return None
    return value if 0 < value <= _MAX_EPOCH else None


def clean_figures(figures: Mapping[str, Any]) -> Dict[str, Any]:
    """The sound figures of ``figures``: known keys, numbers finite and non-negative (whole
    ones for counts and bytes, at least 1 for ``cores``), ``nodes`` a non-empty line."""
    sound: Dict[str, Any] = {}
    for key in FIGURE_KEYS:
        value = figures.get(key)
        if value is None or isinstance(value, bool):
            continue
        if key == "nodes":
            if isinstance(value, str) and value.strip() and "\n" not in value \
                    and "\r" not in value and len(value) <= _NODES_LIMIT \
                    and value.isprintable():
                sound[key] = value.strip()
            continue
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                or value > _MAX_INT:
            continue
        if key in _INT_KEYS:
            if value != int(value) or (key == "cores" and value < 1):
                continue
            sound[key] = int(value)
        else:
            sound[key] = float(value)
    return sound


def figures_of(metadata: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The figures a status's metadata carries."""
    return clean_figures(metadata) if metadata else {}


def has_figures(metadata: Optional[Mapping[str, Any]]) -> bool:
    """Whether the metadata carries figures only the scheduler's record gives (it was read
    from that record)."""
    return metadata is not None and any(key in metadata for key in SCHEDULER_KEYS)
