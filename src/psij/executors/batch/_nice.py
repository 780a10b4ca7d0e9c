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
equal values, and priorities beyond the range share its end. A queued job's value is changed
(``set_priority``) with ``scontrol update JobId=ID Nice=N`` (Slurm), ``qalter -p N ID`` (Grid
Engine, PBS) or ``bmod -sp N ID`` (LSF): :func:`nice_update_command`. Pure: nothing here runs
commands.
"""

import math
from typing import TYPE_CHECKING, List, Optional, Tuple, Union

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
    "chosen_mapping",
    "declared_nice",
    "nice_mapping",
    "nice_update_command",
    "priority_value",
]


class NiceMapping(Record):
    """``origin + direction * floor(priority)`` clamped to ``[low, high]``, and the command that
    changes a queued job's value (``{id}`` and ``{value}`` stand for the native id and the
    value)."""

    origin: int
    direction: int
    low: int
    high: int
    update: Tuple[str, ...]

    def value(self, priority: Union[int, float]) -> int:
        """The scheduler's value for ``priority`` (a finite number)."""
        whole = math.floor(priority)
        return max(self.low, min(self.high, self.origin + self.direction * whole))


SLURM_NICE = NiceMapping(10000, -1, 0, 2147483645,
                         ("scontrol", "update", "JobId={id}", "Nice={value}"))
SGE_NICE = NiceMapping(-512, 1, -1023, 0, ("qalter", "-p", "{value}", "{id}"))
PBS_NICE = NiceMapping(0, 1, -1024, 1023, ("qalter", "-p", "{value}", "{id}"))
LSF_NICE = NiceMapping(50, 1, 1, 100, ("bmod", "-sp", "{value}", "{id}"))


def declared_nice(config: object, executor_class: type
                  ) -> Tuple[bool, Optional[NiceMapping]]:
    """Whether ``use_nice`` is on in ``config``, and the mapping the executor's class declares
    (``NICE``) if any."""
    mapping = getattr(executor_class, "NICE", None)
    return (bool(getattr(config, "use_nice", False)),
            mapping if isinstance(mapping, NiceMapping) else None)


def chosen_mapping(use_nice: bool, mapping: Optional[NiceMapping], name: str
                   ) -> Optional[NiceMapping]:
    """The mapping when ``use_nice`` is on (None when it is off); InvalidJobException when the
    scheduler (of the executor ``name``) has no priority option."""
    if not use_nice:
        return None
    if mapping is None:
        raise InvalidJobException(f"use_nice: the {name} executor has no way to give "
                                  "a job's priority to its scheduler; turn use_nice off")
    return mapping


def nice_mapping(executor: "BatchSchedulerExecutor") -> Optional[NiceMapping]:
    """The executor's mapping when ``use_nice`` is on (None when it is off);
    InvalidJobException when the scheduler has no priority option."""
    return chosen_mapping(*declared_nice(executor.batch_config, type(executor)), executor.name)


def priority_value(use_nice: bool, mapping: Optional[NiceMapping], name: str, spec: JobSpec
                   ) -> Optional[str]:
    """The value of the scheduler's priority option for a job, as text; None when
    ``use_nice`` is off. InvalidJobException when the scheduler has no such option."""
    chosen = chosen_mapping(use_nice, mapping, name)
    return None if chosen is None else str(chosen.value(job_priority(spec.attributes)))


def nice_update_command(executor: "BatchSchedulerExecutor", native_id: str,
                        priority: Union[int, float]) -> Optional[List[str]]:
    """The command giving the queued job ``native_id`` the value for ``priority``; None when
    ``use_nice`` is off. InvalidJobException when the scheduler has no such option."""
    mapping = nice_mapping(executor)
    if mapping is None:
        return None
    value = str(mapping.value(priority))
    return [word.format(id=native_id, value=value) for word in mapping.update]
