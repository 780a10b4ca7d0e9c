"""The executors shipped with psij; each one is declared in a ``psij-descriptors`` file.

Re-exports the executor classes so that ``from psij.executors import SlurmJobExecutor`` works,
as code written for the PSI/J API expects (psij-python offers ``LocalJobExecutor``,
``SlurmJobExecutor``, ``LsfJobExecutor`` and ``CobaltJobExecutor`` here). Each is imported
when first asked for: ``import psij.executors`` loads none of them.
"""

import importlib
from typing import TYPE_CHECKING, Any, List

if TYPE_CHECKING:
    from psij.executors.batch.cobalt import CobaltJobExecutor
    from psij.executors.batch.lsf import LsfJobExecutor
    from psij.executors.batch.nqsv import NQSVJobExecutor
    from psij.executors.batch.pbs import PBSJobExecutor
    from psij.executors.batch.pbs_classic import PBSClassicJobExecutor
    from psij.executors.batch.sge import SgeJobExecutor
    from psij.executors.batch.slurm import SlurmJobExecutor
    from psij.executors.local import LocalJobExecutor

__all__ = [
    "CobaltJobExecutor",
    "LocalJobExecutor",
    "LsfJobExecutor",
    "NQSVJobExecutor",
    "PBSClassicJobExecutor",
    "PBSJobExecutor",
    "SgeJobExecutor",
    "SlurmJobExecutor",
]

_MODULES = {
    "CobaltJobExecutor": "batch.cobalt",
    "LocalJobExecutor": "local",
    "LsfJobExecutor": "batch.lsf",
    "NQSVJobExecutor": "batch.nqsv",
    "PBSClassicJobExecutor": "batch.pbs_classic",
    "PBSJobExecutor": "batch.pbs",
    "SgeJobExecutor": "batch.sge",
    "SlurmJobExecutor": "batch.slurm",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted({*globals(), *__all__})
