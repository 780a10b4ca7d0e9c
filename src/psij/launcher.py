"""The launcher base class under the module path psij-python also has (``psij.launcher``).

The same class as :class:`psij.job_launcher.Launcher` (``psij.Launcher``): a launcher written
against either path is found by both.
"""

from psij.descriptor import Descriptor as Descriptor
from psij.job import Job as Job
from psij.job_executor_config import JobExecutorConfig as JobExecutorConfig
from psij.job_launcher import Launcher as Launcher

__all__ = ["Descriptor", "Job", "JobExecutorConfig", "Launcher"]
