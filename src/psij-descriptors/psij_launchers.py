"""Launchers shipped with psij (read by psij._plugins; no __init__.py in this folder)."""

from packaging.version import Version

from psij.descriptor import Descriptor

__PSI_J_LAUNCHERS__ = [
    Descriptor(name="single", nice_name="Single process", version=Version("0.1.0"),
               cls="psij.launchers.single.SingleLauncher"),
    Descriptor(name="multiple", nice_name="Multiple local copies", version=Version("0.1.0"),
               cls="psij.launchers.multiple.MultipleLauncher"),
    Descriptor(name="mpirun", nice_name="MPI (mpirun)", version=Version("0.1.0"),
               cls="psij.launchers.mpirun.MPILauncher"),
    Descriptor(name="srun", nice_name="Slurm (srun)", version=Version("0.1.0"),
               cls="psij.launchers.srun.SrunLauncher"),
    Descriptor(name="aprun", nice_name="Cray ALPS (aprun)", version=Version("0.1.0"),
               cls="psij.launchers.aprun.AprunLauncher"),
    Descriptor(name="jsrun", nice_name="IBM LSF (jsrun)", version=Version("0.1.0"),
               cls="psij.launchers.jsrun.JsrunLauncher"),
]
