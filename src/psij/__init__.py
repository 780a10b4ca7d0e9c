"""Portable job submission: one API for local runs, batch schedulers and pilots (PSI/J).

``import psij`` loads this file and ``psij.version``, nothing else: every name in
``__all__`` is imported from its module the first time it is read (PEP 562), so a program that
only asks for ``psij.__version__`` or imports one submodule does not pay for the whole model.
``from psij import Job``, ``from psij import *`` and ``dir(psij)`` behave as if the names were
imported eagerly. Executors and launchers are plugins found through ``psij-descriptors`` files
on ``sys.path`` the first time one is asked for.
"""

# Nothing may be imported here at module level but psij.version: tests/test_import.py checks
# that a fresh ``import psij`` loads no other module.

from psij.version import __version__

# Type checkers treat any constant named TYPE_CHECKING as true; reading it from ``typing``
# would import ``typing``, which alone costs more than the rest of ``import psij``.
TYPE_CHECKING = False
if TYPE_CHECKING:
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

# Where each lazily loaded public name is defined.
_LAZY_NAMES = {
    "Descriptor": "psij.descriptor",
    "InvalidJobException": "psij.exceptions",
    "Job": "psij.job",
    "JobAttributes": "psij.job_attributes",
    "JobExecutor": "psij.job_executor",
    "JobExecutorConfig": "psij.job_executor_config",
    "JobSpec": "psij.job_spec",
    "JobState": "psij.job_state",
    "JobStatus": "psij.job_status",
    "JobStatusCallback": "psij.job",
    "Launcher": "psij.job_launcher",
    "ResourceSpec": "psij.resource_spec",
    "ResourceSpecV1": "psij.resource_spec",
    "SubmitException": "psij.exceptions",
}


def _load_public_name(name: str) -> object:
    """Import a public name from its module on first use and keep it as a module global.

    Any other name raises :class:`AttributeError`, which is also what lets
    ``from psij import some_submodule`` fall back to importing the submodule.
    """
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'psij' has no attribute {name!r}")
    from importlib import import_module

    value: object = getattr(import_module(module_name), name)
    # Later reads find the global and no longer come here.
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(__all__))


# Hidden from type checkers: a module ``__getattr__`` would make them accept any attribute of
# ``psij``, typos included, instead of only the names imported above.
if not TYPE_CHECKING:
    __getattr__ = _load_public_name
