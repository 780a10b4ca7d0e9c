"""The ``srun`` launcher: the job runs as a Slurm job step inside its allocation.

Turns the resource spec into srun's counts; never calls Slurm itself.
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

__all__ = ["SrunLauncher"]


class SrunLauncher(MultipleLauncher):
    """Runs ``srun -n <processes>`` plus ``-N``/``--ntasks-per-node`` when the spec fixes the
    layout and ``--cpus-per-task`` when it asks for cores per process."""

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(data_dir("launchers") / "srun_launch.sh", config)

    def get_additional_args(self, job: "Job") -> List[str]:
        """``[<processes>, <nodes|''>, <processes per node|''>, <cores per process|''>]``."""
        resources = job_resources(job)
        nodes = ppn = cores = None
        if resources is not None:
            if layout_given(resources):
                nodes = resources.computed_node_count
                ppn = resources.computed_processes_per_node
            cores = resources.cpu_cores_per_process
        return [str(process_count(job)), optional_count(nodes), optional_count(ppn),
                optional_count(cores)]
