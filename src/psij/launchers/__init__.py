"""The launchers shipped with psij; each one is declared in ``psij-descriptors/psij_launchers.py``.

Re-exports the classes so that ``from psij.launchers import MultipleLauncher`` works, as plugin
code written for the PSI/J API expects. Each is imported when first asked for, so that a job
using one launcher does not wait for the modules of all the others.
"""

import importlib
from typing import TYPE_CHECKING, Any, List

if TYPE_CHECKING:
    from psij.launchers.aprun import AprunLauncher
    from psij.launchers.jsrun import JsrunLauncher
    from psij.launchers.mpirun import MPILauncher
    from psij.launchers.multiple import MultipleLauncher
    from psij.launchers.script_based_launcher import ScriptBasedLauncher
    from psij.launchers.single import SingleLauncher
    from psij.launchers.srun import SrunLauncher

__all__ = [
    "AprunLauncher",
    "JsrunLauncher",
    "MPILauncher",
    "MultipleLauncher",
    "ScriptBasedLauncher",
    "SingleLauncher",
    "SrunLauncher",
]

_MODULES = {
    "AprunLauncher": "aprun",
    "JsrunLauncher": "jsrun",
    "MPILauncher": "mpirun",
    "MultipleLauncher": "multiple",
    "ScriptBasedLauncher": "script_based_launcher",
    "SingleLauncher": "single",
    "SrunLauncher": "srun",
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
