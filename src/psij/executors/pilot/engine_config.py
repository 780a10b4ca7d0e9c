"""How a pilot engine runs its tasks: :class:`EngineConfig`, checked when made.

Values only; the engine (:mod:`psij.executors.pilot.engine`) applies them.
"""

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from psij import _check
from psij.executors.pilot.tasks import Prepare

if TYPE_CHECKING:
    from psij.executors.pilot.allocation_policy import AllocationPolicy

__all__ = ["EngineConfig"]


class EngineConfig:
    """How an engine runs its tasks (see the module documentation)."""

    def __init__(self, work_directory: Optional[Path] = None, journal: Optional[Path] = None,
                 resume: bool = False, cancel_grace_period: float = 5.0,
                 tmp_root: Optional[Path] = None, agent_transport: str = "auto",
                 agent_host: Optional[str] = None, agent_python: str = sys.executable,
                 agent_connect_timeout: float = 60.0, prepare: Optional[Prepare] = None,
                 slurm_variables: Optional[bool] = True, workers: Optional[int] = None,
                 allocation_policy: "Optional[AllocationPolicy]" = None) -> None:
        self.work_directory: Path = _check.opt_path("EngineConfig.work_directory",
                                                    work_directory) or Path(os.getcwd())
        self.journal = _check.opt_path("EngineConfig.journal", journal)
        self.tmp_root = _check.opt_path("EngineConfig.tmp_root", tmp_root)
        self.resume = _check.opt_bool("EngineConfig.resume", resume)
        if self.resume and self.journal is None:
            raise ValueError("EngineConfig.resume: resuming needs a journal; set journal")
        self.cancel_grace_period = _check.seconds("EngineConfig.cancel_grace_period",
                                                  cancel_grace_period)
        self.agent_connect_timeout = _check.seconds("EngineConfig.agent_connect_timeout",
                                                    agent_connect_timeout)
        if agent_transport not in ("auto", "unix", "tcp"):
            raise ValueError(f"EngineConfig.agent_transport: {agent_transport!r}; "
                             "accepted: auto, unix, tcp")
        self.agent_transport = agent_transport
        self.agent_host = agent_host
        self.agent_python = agent_python
        self.prepare = prepare
        # SLURM_* variables for tasks: always, never, or (None) inside a Slurm allocation.
        if slurm_variables is not None:
            _check.opt_bool("EngineConfig.slurm_variables", slurm_variables)
        self.slurm_variables = slurm_variables
        # Worker processes for the tasks of the engine's own node, at most; None: the
        # PSIJ_PILOT_WORKERS variable, else one per three cores (see _local_workers).
        self.workers = _check.opt_int("EngineConfig.workers", workers, minimum=1)
        if self.workers is not None and self.workers > 1024:
            raise ValueError(f"EngineConfig.workers: at most 1024, got {self.workers}")

        # An elastic pilot's: allocations asked for and given back (see allocation_policy).
        if allocation_policy is not None:
            from psij.executors.pilot.allocation_policy import AllocationPolicy as Policy
            _check.instance("EngineConfig.allocation_policy", allocation_policy, Policy,
                            "AllocationPolicy")
        self.allocation_policy = allocation_policy

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"EngineConfig({shown})"
