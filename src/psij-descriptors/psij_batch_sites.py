"""Batch executors for schedulers without a local test installation: PBS Pro, Torque, LSF,
Cobalt, Flux and NQSV (read by psij._plugins; no __init__.py here)."""

from packaging.version import Version

from psij.descriptor import Descriptor

__PSI_J_EXECUTORS__ = [
    Descriptor(name="pbs", nice_name="PBS Pro", version=Version("0.1.0"),
               cls="psij.executors.batch.pbs.PBSJobExecutor", aliases=["pbspro"]),
    Descriptor(name="pbs_classic", nice_name="PBS Classic (Torque)", version=Version("0.1.0"),
               cls="psij.executors.batch.pbs_classic.PBSClassicJobExecutor",
               aliases=["torque"]),
    Descriptor(name="lsf", nice_name="LSF", version=Version("0.1.0"),
               cls="psij.executors.batch.lsf.LsfJobExecutor"),
    Descriptor(name="cobalt", nice_name="Cobalt", version=Version("0.1.0"),
               cls="psij.executors.batch.cobalt.CobaltJobExecutor"),
    Descriptor(name="flux", nice_name="Flux", version=Version("0.1.0"),
               cls="psij.executors.batch.flux.FluxJobExecutor"),
    Descriptor(name="nqsv", nice_name="NEC NQSV", version=Version("0.1.0"),
               cls="psij.executors.batch.nqsv.NQSVJobExecutor"),
]
