"""The PBS base classes under the module path psij-python keeps them at, for a site's executor
derived from them (``from psij.executors.batch.pbs_base import GenericPBSJobExecutor,
PBSExecutorConfig, check_status_exit_code``).

:class:`GenericPBSJobExecutor` is the class psij's own PBS Pro and Torque executors derive
from (:mod:`psij.executors.batch.pbs`). Constructed as psij-python's PBS executors construct
it, ``GenericPBSJobExecutor(generator, url=url, config=config)`` with a
:class:`~psij.executors.batch.script_generator.TemplatedScriptGenerator` of the site's
template, it submits that template's script with ``qsub``, follows the job with
``qstat -f -F json -x`` (PBS Pro's JSON status, finished jobs included), cancels with ``qdel``
and lists with ``qselect -u <user>``. A job that left the queue is resolved from the
``<native id>.ec`` file its script writes, as for every batch executor.
"""

from typing import TYPE_CHECKING

from psij._reexports import lazy_names
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor as BatchSchedulerExecutor,
)
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutorConfig as BatchSchedulerExecutorConfig,
)
from psij.executors.batch.batch_scheduler_executor import (
    check_status_exit_code as check_status_exit_code,
)
from psij.executors.batch.pbs import GenericPBSJobExecutor as GenericPBSJobExecutor
from psij.executors.batch.pbs import PBSExecutorConfig as PBSExecutorConfig

__all__ = ["BatchSchedulerExecutor", "BatchSchedulerExecutorConfig", "GenericPBSJobExecutor",
           "PBSExecutorConfig", "check_status_exit_code"]

# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "Job": "psij.job",
        "JobState": "psij.job_state",
        "JobStatus": "psij.job_status",
        "SubmitException": "psij.exceptions",
        "TemplatedScriptGenerator": "psij._scripts.generator",
    })
