"""The pilot executor shipped with psij: many jobs inside one allocation (read by
psij._plugins; no __init__.py in this folder)."""

from packaging.version import Version

from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="pilot", nice_name="Pilot (tasks inside one allocation)",
               version=Version("0.1.0"), cls="psij.executors.pilot.executor.PilotJobExecutor"),
]
