"""Functions offered to submit-script templates as ``psij.lib`` (kept for plugin templates).

Batch executors put ``ALL`` in every script context; plugins import the same objects from
``psij._scripts.template_functions``, which re-exports them. Pure conversions;
nothing here reads files or runs commands.
"""

from datetime import timedelta
from typing import Any, Callable, Dict, Union

from psij.job_attributes import JobAttributes

__all__ = ["ALL", "walltime_to_minutes"]


def walltime_to_minutes(walltime: Union[timedelta, int, str]) -> int:
    """Whole minutes (rounded up) of a timedelta, a number of minutes, or a walltime string
    accepted by :meth:`psij.JobAttributes.parse_walltime`."""
    if isinstance(walltime, bool):
        raise TypeError(f"walltime: expected timedelta, int or str, got {walltime!r}")
    if isinstance(walltime, int):
        return walltime
    if isinstance(walltime, str):
        walltime = JobAttributes.parse_walltime(walltime)
    if isinstance(walltime, timedelta):
        return -(-int(walltime.total_seconds()) // 60)
    raise TypeError(f"walltime: expected timedelta, int or str, got {walltime!r} "
                    f"({type(walltime).__name__})")


ALL: Dict[str, Callable[..., Any]] = {"walltime_to_minutes": walltime_to_minutes}
