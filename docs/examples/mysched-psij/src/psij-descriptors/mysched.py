from packaging.version import Version

from psij import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="mysched", version=Version("1.0.0"),
               cls="mysched_psij.executor.MySchedExecutor", aliases=["ms"]),
]

__PSI_J_LAUNCHERS__ = [
    Descriptor(name="myrun", version=Version("1.0.0"),
               cls="mysched_psij.launcher.MyRunLauncher"),
]
