"""The ``rp`` executor (RADICAL-Pilot tasks), declared only where ``radical.pilot`` can be
imported, as psij-python does (read by psij._plugins; no __init__.py here)."""

from importlib.util import find_spec
from typing import List

from packaging.version import Version

from psij.descriptor import Descriptor


def _importable(name: str) -> bool:
    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False


__PSI_J_EXECUTORS__: List[Descriptor] = []
if _importable("radical.pilot"):
    __PSI_J_EXECUTORS__.append(
        Descriptor(name="rp", nice_name="RADICAL-Pilot", version=Version("0.1.0"),
                   cls="psij.executors.rp.RPJobExecutor"))
