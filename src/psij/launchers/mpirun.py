"""The ``mpirun`` launcher: the job's processes are started by the MPI implementation on PATH.

Only names its script; the MPI flavour is recognised by the script at run time.
"""

from typing import Optional

from psij._data import data_dir
from psij.job_executor_config import JobExecutorConfig
from psij.launchers.multiple import MultipleLauncher

__all__ = ["MPILauncher"]


class MPILauncher(MultipleLauncher):
    """Runs ``mpirun -n <process count>`` (Open MPI, MPICH, Intel MPI and other Hydra MPIs).

    With Open MPI, oversubscription is allowed and, for root, running as root. A host file
    named by ``PSIJ_NODEFILE`` is passed on when that file exists.
    """

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(data_dir("launchers") / "mpi_launch.sh", config)
