"""The ``aprun`` launcher: the job runs through Cray ALPS inside its allocation.

Turns the resource spec into aprun's counts; never calls ALPS itself.
"""

from typing import TYPE_CHECKING, List, Optional

from psij._data import data_dir
from psij.job_executor_config import JobExecutorConfig
from psij.launchers.multiple import (
    MultipleLauncher,
    job_resources,
    layout_given,
    optional_count,
    process_count,
)

if TYPE_CHECKING:
    from psij.job import Job

__all__ = ["AprunLauncher"]


class AprunLauncher(MultipleLauncher):
    """Runs ``aprun -n <processes>`` plus ``-N <processes per node>`` when the spec fixes the
    layout and ``-d <cores per process>`` when it asks for cores per process."""

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(data_dir("launchers") / "aprun_launch.sh", config)

    def get_additional_args(self, job: "Job") -> List[str]:
        """``[<processes>, <processes per node|''>, <cores per process|''>]``."""
        resources = job_resources(job)
        ppn = cores = None
        if resources is not None:
            if layout_given(resources):
                ppn = resources.computed_processes_per_node
            cores = resources.cpu_cores_per_process
        return [str(process_count(job)), optional_count(ppn), optional_count(cores)]
