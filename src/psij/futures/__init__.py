"""Python functions as jobs: a :class:`concurrent.futures.Executor` over every PSI/J executor.

``FunctionExecutor("local")`` (or ``"pilot"``, ``"slurm"``, ...) runs ``fn(*args, **kwargs)``
as a PSI/J job and returns a :class:`FunctionFuture`; :func:`reattach` makes the futures of
recorded function jobs again after the client restarted. See ``docs/futures.rst``.

Not loaded by ``import psij``. The names below are imported from their modules when first read
(PEP 562), so that the compute side (``python -m psij.futures._run``), which imports this
package first, loads none of psij's executor machinery.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from psij.futures._executor import FunctionExecutor
    from psij.futures._future import FunctionFuture
    from psij.futures._reattach import reattach
    from psij.futures.errors import (
        FunctionJobError,
        FunctionResultError,
        RemoteException,
        RemoteTraceback,
    )

__all__ = ["FunctionExecutor", "FunctionFuture", "FunctionJobError", "FunctionResultError",
           "RemoteException", "RemoteTraceback", "reattach"]

_LAZY_NAMES = {
    "FunctionExecutor": "psij.futures._executor",
    "FunctionFuture": "psij.futures._future",
    "FunctionJobError": "psij.futures.errors",
    "FunctionResultError": "psij.futures.errors",
    "RemoteException": "psij.futures.errors",
    "RemoteTraceback": "psij.futures.errors",
    "reattach": "psij.futures._reattach",
}


def _load_public_name(name: str) -> object:
    """Import a public name from its module on first use and keep it as a module global."""
    module_name = _LAZY_NAMES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'psij.futures' has no attribute {name!r}")
    from importlib import import_module

    value: object = getattr(import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> "list[str]":
    return sorted(set(globals()) | set(__all__))


if not TYPE_CHECKING:
    __getattr__ = _load_public_name
