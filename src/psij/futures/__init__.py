"""Python functions as jobs: a ``concurrent.futures.Executor`` over every PSI/J executor.

``FunctionExecutor("local")`` (or ``"pilot"``, ``"slurm"``, ...) runs ``fn(*args, **kwargs)``
as a PSI/J job and returns a :class:`FunctionFuture`; :func:`reattach` makes the futures of
recorded function jobs again after the client restarted. See ``docs/futures.rst``.

Not loaded by ``import psij``. The names below are imported from their modules when first read
(PEP 562), so that the compute side (``python -m psij.futures._run``), which imports this
package first, loads none of psij's executor machinery.
"""

# The exceptions are plain classes and load nothing; the rest is imported on first use.
from psij.futures.errors import (
    FunctionJobError,
    FunctionResultError,
    RemoteException,
    RemoteTraceback,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from psij.futures._executor import FunctionExecutor
    from psij.futures._future import FunctionFuture
    from psij.futures._reattach import reattach

__all__ = ["FunctionExecutor", "FunctionFuture", "FunctionJobError", "FunctionResultError",
           "RemoteException", "RemoteTraceback", "reattach"]


def _first_use(name: str) -> object:
    """The executor, the future and ``reattach``, imported when first read (then kept)."""
    value: object
    if name == "FunctionExecutor":
        from psij.futures._executor import FunctionExecutor as value
    elif name == "FunctionFuture":
        from psij.futures._future import FunctionFuture as value
    elif name == "reattach":
        from psij.futures._reattach import reattach as value
    else:
        raise AttributeError(f"module 'psij.futures' has no attribute {name!r}")
    globals()[name] = value
    return value


# Hidden from type checkers, which would otherwise accept any attribute of the package.
if not TYPE_CHECKING:
    __getattr__ = _first_use
