"""Batch scheduler executors shipped with psij (read by psij._plugins; no __init__.py here)."""

from packaging.version import Version

from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="slurm", nice_name="Slurm", version=Version("0.1.0"),
               cls="psij.executors.batch.slurm.SlurmJobExecutor"),
    Descriptor(name="sge", nice_name="Grid Engine", version=Version("0.1.0"),
               cls="psij.executors.batch.sge.SgeJobExecutor", aliases=["gridengine"]),
    Descriptor(name="batch-test", nice_name="Fake batch scheduler for tests",
               version=Version("0.1.0"),
               cls="psij.executors.batch.batch_test.BatchTestJobExecutor"),
]
