"""Executors shipped with psij (read by psij._plugins; no __init__.py in this folder)."""

from packaging.version import Version

from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="local", nice_name="Local", version=Version("0.1.0"),
               cls="psij.executors.local.LocalJobExecutor"),
]
