"""The default launcher: one copy of the job's executable.

Only names its script; everything else is in :mod:`psij.launchers.script_based_launcher`.
"""

from typing import Optional

from psij._data import data_dir
from psij.job_executor_config import JobExecutorConfig
from psij.launchers.script_based_launcher import ScriptBasedLauncher

__all__ = ["SingleLauncher"]


class SingleLauncher(ScriptBasedLauncher):
    """Runs one copy of the executable; without a post-launch script the launcher becomes it."""

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(data_dir("launchers") / "single_launch.sh", config)
