"""Portable job submission: one API for local runs, batch schedulers and pilots (PSI/J).

``import psij`` loads only the core classes. Executors and launchers are plugins found through
``psij-descriptors`` files on ``sys.path`` the first time one is asked for.
"""

from psij.descriptor import Descriptor
from psij.exceptions import InvalidJobException, SubmitException
from psij.job import Job, JobStatusCallback
from psij.job_attributes import JobAttributes
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_launcher import Launcher
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpec, ResourceSpecV1
from psij.version import __version__

__all__ = [
    "Descriptor",
    "InvalidJobException",
    "Job",
    "JobAttributes",
    "JobExecutor",
    "JobExecutorConfig",
    "JobSpec",
    "JobState",
    "JobStatus",
    "JobStatusCallback",
    "Launcher",
    "ResourceSpec",
    "ResourceSpecV1",
    "SubmitException",
    "__version__",
]
