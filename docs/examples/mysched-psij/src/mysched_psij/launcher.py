"""psij launcher that starts a job's processes with MySched's ``myrun`` command."""

from pathlib import Path
from typing import List, Optional

from psij import Job, JobExecutorConfig, ResourceSpecV1
from psij.launchers.script_based_launcher import ScriptBasedLauncher


class MyRunLauncher(ScriptBasedLauncher):
    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        # The script ships inside this package, next to this module.
        super().__init__(Path(__file__).parent / "myrun_launch.sh", config=config)

    def get_additional_args(self, job: Job) -> List[str]:
        # Passed to the script after the seven fixed arguments, before the executable.
        resources = (job.spec and job.spec.resources) or ResourceSpecV1()
        return [str(resources.computed_process_count)]
