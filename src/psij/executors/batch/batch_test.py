"""The ``batch-test`` executor: the real batch code path against a fake scheduler on this machine.

Its commands run ``python -m psij.executors.batch.batch_test_tool`` (a small scheduler kept in a
spool folder); everything else is the shared batch machinery, so tests of this executor test submit
scripts, polling, accounting, cancel and fault handling without a cluster. Not for production
use.
"""

import re
import sys
from pathlib import Path
from typing import Any, Collection, Dict, List, Sequence, Union

from psij import _check
from psij.executors.batch import batch_test_tool
from psij.executors.batch._signals import FORWARDABLE, PASS
from psij.executors.batch._status_table import StateMap, status_from_map
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    check_status_exit_code,
)
from psij.job import Job
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["BatchTestExecutorConfig", "BatchTestJobExecutor"]

STATE_MAP: StateMap = {
    "PENDING": (JobState.QUEUED, None),
    "HELD": (JobState.QUEUED, None),
    "RUNNING": (JobState.ACTIVE, None),
    "COMPLETED": (JobState.COMPLETED, None),
    "FAILED": (JobState.FAILED, None),
    "CANCELLED": (JobState.CANCELED, None),
    "TIMEOUT": (JobState.FAILED, "time_limit"),
}
_ACCT_LINE = re.compile(r"(\d+)\|([A-Z]+)\|(\d*)\|([A-Za-z]*)")


class BatchTestExecutorConfig(BatchSchedulerExecutorConfig):
    """batch-test settings: ``spool_directory`` (default ``<work_directory>/batch-test-spool``)
    and ``keep_finished`` (seconds a finished job stays in the fake queue). The other
    parameters are the batch ones, with shorter polling by default (every 0.5 s, the first
    0.2 s after a submit)."""

    def __init__(self, *args: Any, spool_directory: Union[str, Path, None] = None,
                 keep_finished: float = 5.0, **kwargs: Any) -> None:
        if len(args) < 3:
            kwargs.setdefault("queue_polling_interval", 0.5)
        if len(args) < 4:
            kwargs.setdefault("initial_queue_polling_delay", 0.2)
        super().__init__(*args, **kwargs)
        spool = _check.opt_path("BatchTestExecutorConfig.spool_directory", spool_directory)
        self.spool_directory: Path = spool if spool is not None \
            else self.work_directory / "batch-test-spool"
        if isinstance(keep_finished, bool) or not isinstance(keep_finished, (int, float)) \
                or keep_finished < 0:
            raise ValueError(f"BatchTestExecutorConfig.keep_finished: expected a number of "
                             f"seconds >= 0, got {keep_finished!r}")
        self.keep_finished = float(keep_finished)


class BatchTestJobExecutor(BatchSchedulerExecutor):
    """Submits to the ``batch-test`` fake scheduler. Custom attributes ``batch-test.<option>``
    become directives; ``batch-test.queue-delay`` keeps a job QUEUED for that many seconds,
    ``batch-test.hold`` keeps it HELD until ``batch_test_tool.py release``."""

    _NAME_ = "batch-test"
    CONFIG_CLASS = BatchTestExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES = ("batch-test",)

    TEMPLATE = "batch-test.mustache"
    JOB_ID_PATTERN = re.compile(r"\A\d+\Z")
    CANCEL_GONE_PATTERN = re.compile("already finished")
    STATUS_LINE_PATTERN = re.compile(r"(\d+)\|([A-Z]+)\|([A-Za-z]*)")
    STATE_MAP = STATE_MAP
    HELD_STATES = ("HELD",)
    # Like Slurm, the fake signals the script alone (a cancel's TERM too): it passes them on.
    SCRIPT_SIGNALS = dict.fromkeys(FORWARDABLE, PASS)

    @property
    def _cfg(self) -> BatchTestExecutorConfig:
        assert isinstance(self.config, BatchTestExecutorConfig)
        return self.config

    def _tool(self, *args: str) -> List[str]:
        return [sys.executable, "-S", batch_test_tool.__file__, "--spool",
                str(self._cfg.spool_directory.absolute()), *args]

    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        return self._tool("submit", str(submit_file_path.absolute()))

    def get_cancel_command(self, native_id: str) -> List[str]:
        return self._tool("cancel", native_id)

    def get_signal_command(self, native_id: str, signum: int) -> List[str]:
        return self._tool("signal", str(signum), native_id)

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        return self._tool("status", "--keep-finished", repr(self._cfg.keep_finished),
                          *native_ids)

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        return [self._tool("acct", *native_ids)]

    def parse_accounting_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        check_status_exit_code("batch-test acct", exit_code, out)
        found: Dict[str, JobStatus] = {}
        for line in out.splitlines():
            match = _ACCT_LINE.fullmatch(line.strip())
            if match is None:
                raise ValueError(f"unexpected accounting line {line!r}")
            native_id, native_state, code, reason = match.groups()
            found[native_id] = status_from_map(STATE_MAP, native_state, reason,
                                               int(code) if code else None)
        return found

    def get_list_command(self) -> List[str]:
        return self._tool("list")
