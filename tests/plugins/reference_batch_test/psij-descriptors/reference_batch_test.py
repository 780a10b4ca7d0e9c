"""The batch-test launcher of psij-python's test plugins, as a third party declares it."""

from packaging.version import Version

from psij.descriptor import Descriptor

__PSI_J_LAUNCHERS__ = [
    Descriptor(name="batch-test", version=Version("0.0.1"),
               cls="_psij_reference_batch_test.launcher.ReferenceTestLauncher"),
]
