"""A MultipleLauncher with its own script and one more deployed file, in psij-python's style."""

from pathlib import Path
from typing import List, Optional

from psij import Job, JobExecutorConfig, ResourceSpecV1
from psij.launchers import MultipleLauncher

FILES = Path(__file__).parent / "files"


class ReferenceTestLauncher(MultipleLauncher):
    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(FILES / "launcher.sh", config)

    def _files_to_deploy(self) -> List[Path]:
        return [*super()._files_to_deploy(), FILES / "hostname"]

    def get_additional_args(self, job: Job) -> List[str]:
        args = super().get_additional_args(job)
        resources = job.spec.resources if job.spec is not None else None
        nodes = resources.computed_node_count if isinstance(resources, ResourceSpecV1) else 1
        per_node = int(args[0]) // nodes
        if nodes * per_node != int(args[0]):
            raise ValueError("the processes cannot be spread evenly over the nodes")
        return [*args, str(nodes), str(per_node)]
