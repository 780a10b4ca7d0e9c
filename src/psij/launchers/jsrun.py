"""The ``jsrun`` launcher: the job runs through IBM's jsrun (LSF) inside its allocation.

Turns the resource spec into jsrun's resource sets; never calls LSF itself.
"""

from typing import TYPE_CHECKING, List, Optional

from psij._data import data_dir
from psij.job_executor_config import JobExecutorConfig
from psij.launchers.multiple import (
    MultipleLauncher,
    job_resources,
    optional_count,
    process_count,
)

if TYPE_CHECKING:
    from psij.job import Job

__all__ = ["JsrunLauncher"]


class JsrunLauncher(MultipleLauncher):
    """Runs ``jsrun -n <processes> -a 1``: one resource set per process, with ``-c <cores>`` and
    ``-g <GPUs>`` per set when the spec asks for them."""

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(data_dir("launchers") / "jsrun_launch.sh", config)

    def get_additional_args(self, job: "Job") -> List[str]:
        """``[<processes>, <cores per process|''>, <GPUs per process|''>]``."""
        resources = job_resources(job)
        cores = None if resources is None else resources.cpu_cores_per_process
        gpus = None if resources is None else resources.gpu_cores_per_process
        return [str(process_count(job)), optional_count(cores), optional_count(gpus)]
