"""``use_nice``: a job's priority given to the scheduler, by a monotonic mapping into the range
of values a user may set.

The value is ``origin + direction * floor(priority)``, clamped to ``[low, high]``
(``psij.priority``, a number, higher first; see :mod:`psij._priority`):

=========== ============ ========= ============== ==============================================
scheduler   option       origin    direction      range
=========== ============ ========= ============== ==============================================
Slurm       ``--nice``   10000     -1             0 .. 2147483645 (a lower nice goes first;
                                                  only administrators may set negative ones)
Grid Engine ``-p``       -512      +1             -1023 .. 0 (users may only lower theirs)
PBS         ``-p``       0         +1             -1024 .. 1023
LSF         ``-sp``      50        +1             1 .. 100 (LSF's default MAX_USER_PRIORITY)
=========== ============ ========= ============== ==============================================

So a higher priority never gets a value that the scheduler ranks lower, equal priorities get
equal values, and priorities beyond the range share its end. Pure: nothing here runs commands.
"""

import math
from typing import TYPE_CHECKING, Optional, Union

from psij._priority import job_priority
from psij._record import Record
from psij.exceptions import InvalidJobException
from psij.job_spec import JobSpec

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = [
    "LSF_NICE",
    "PBS_NICE",
    "SGE_NICE",
    "SLURM_NICE",
    "NiceMapping",
    "scheduler_priority",
]


class NiceMapping(Record):
    """``origin + direction * floor(priority)`` clamped to ``[low, high]``."""

    _fields = ("origin", "direction", "low", "high")
    __slots__ = _fields
    origin: int
    direction: int
    low: int
    high: int

    def value(self, priority: Union[int, float]) -> int:
        """The scheduler's value for ``priority`` (a finite number)."""
        whole = math.floor(priority)
        return max(self.low, min(self.high, self.origin + self.direction * whole))


SLURM_NICE = NiceMapping(10000, -1, 0, 2147483645)
SGE_NICE = NiceMapping(-512, 1, -1023, 0)
PBS_NICE = NiceMapping(0, 1, -1024, 1023)
LSF_NICE = NiceMapping(50, 1, 1, 100)


def scheduler_priority(executor: "BatchSchedulerExecutor", spec: JobSpec) -> Optional[str]:
    """The value of the scheduler's priority option for a job, as text; None when
    ``use_nice`` is off. InvalidJobException when the scheduler has no such option."""
    if not getattr(executor.batch_config, "use_nice", False):
        return None
    mapping = getattr(type(executor), "NICE", None)
    if not isinstance(mapping, NiceMapping):
        raise InvalidJobException(f"use_nice: the {executor.name} executor has no way to give "
                                  "a job's priority to its scheduler; turn use_nice off")
    return str(mapping.value(job_priority(spec.attributes)))
