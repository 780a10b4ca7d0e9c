"""The ``multiple`` launcher (N local copies of the executable) and the resource arithmetic that
the process-count based launchers (mpirun, srun, aprun, jsrun) share.

Turns a job's resource spec into script arguments; never starts processes.
"""

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Union

from psij._data import data_dir
from psij._reexports import lazy_names
from psij.job_executor_config import JobExecutorConfig
from psij.launchers.script_based_launcher import ScriptBasedLauncher
from psij.resource_spec import ResourceSpecV1

if TYPE_CHECKING:
    from psij.job import Job

__all__ = ["MultipleLauncher", "job_resources", "optional_count"]


def job_resources(job: "Job") -> Optional[ResourceSpecV1]:
    """The job's resource spec, or None when it has none; other spec versions are refused."""
    spec = job.spec
    resources = None if spec is None else spec.resources
    if resources is None:
        return None
    if not isinstance(resources, ResourceSpecV1):
        raise ValueError(f"job {job.id}: JobSpec.resources: this launcher understands only "
                         f"ResourceSpecV1, got {type(resources).__name__} version "
                         f"{getattr(resources, 'version', '?')}")
    return resources


def process_count(job: "Job") -> int:
    """How many processes the job asks for (1 without a resource spec)."""
    resources = job_resources(job)
    return 1 if resources is None else resources.computed_process_count


def layout_given(resources: Optional[ResourceSpecV1]) -> bool:
    """Whether the spec fixes how processes spread over nodes (else the launcher decides)."""
    return resources is not None and (resources.node_count is not None or
                                      resources.processes_per_node is not None)


def optional_count(value: Optional[int]) -> str:
    """A count as a script argument: its digits, or '' to leave it to the tool."""
    return "" if value is None else str(value)


class MultipleLauncher(ScriptBasedLauncher):
    """Runs ``process_count`` copies of the executable side by side on this node.

    Each copy sees ``_PSI_J_PROCESS_INDEX_`` (1 to N); the job's exit status is the first
    non-zero status among the copies, or 0. Subclasses with their own script take the process
    count as the script's first extra argument.
    """

    def __init__(self, script_path: Union[str, Path, None] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        if script_path is None:
            script_path = data_dir("launchers") / "multi_launch.sh"
        super().__init__(script_path, config)

    def get_additional_args(self, job: "Job") -> List[str]:
        """``[<process count>]``."""
        return [str(process_count(job))]


def _script_path() -> Path:
    return data_dir("launchers") / "multi_launch.sh"


# ``SCRIPT_PATH`` (the script of this launcher) and ``Job``/``ResourceSpec``, which psij-python's
# module of the same path also offers; found when first read.
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {"Job": "psij.job", "ResourceSpec": "psij.resource_spec"},
                             {"SCRIPT_PATH": _script_path})
