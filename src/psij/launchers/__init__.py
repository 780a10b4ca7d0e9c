"""The launchers shipped with psij; each one is declared in ``psij-descriptors/psij_launchers.py``.

Re-exports the classes so that ``from psij.launchers import MultipleLauncher`` works, as plugin
code written for the PSI/J API expects.
"""

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
