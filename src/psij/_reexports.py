"""Names that a module offers on first use, taken from the module that defines them.

psij-python's modules import one another's classes at their top, so code written for it finds
``Job`` in ``psij.job_launcher``, ``ResourceSpecV1`` in ``psij.job_executor``, and so on. Our
modules import most of those only for type checks (to keep ``import psij`` cheap and free of
import cycles); :func:`lazy_names` gives such a module a ``__getattr__`` that imports the
defining module when one of those names is read and gives its object (the import system keeps
the module, so later reads cost a lookup; the name is not added to the offering module).
"""

import importlib
import sys
from typing import Callable, Dict, Mapping, Optional

__all__ = ["lazy_names"]


def lazy_names(module_name: str, sources: Mapping[str, str],
               computed: Optional[Mapping[str, Callable[[], object]]] = None
               ) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``module_name``: each name of ``sources`` is read from the
    module named there, each of ``computed`` is the value its function returns; other names
    raise :class:`AttributeError` (which also lets submodules be imported as usual)."""
    table: Dict[str, str] = dict(sources)
    makers: Dict[str, Callable[[], object]] = dict(computed or {})

    def __getattr__(name: str) -> object:
        if name in table:  # the defining module's object, not kept here: a module that
            # re-exports only (psij.executors.batch.script_generator) keeps defining nothing
            return getattr(importlib.import_module(table[name]), name)
        if name not in makers:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = makers[name]()
        setattr(sys.modules[module_name], name, value)  # made once
        return value

    return __getattr__
