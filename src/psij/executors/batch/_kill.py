"""``kill`` for batch executors: a cancel without the scheduler's wait between TERM and KILL.

A scheduler's cancel command gives a running job a grace of its own before KILL (Slurm's
``KillWait``, PBS's ``kill_delay``, LSF's ``JOB_TERMINATE_INTERVAL``). A caller that already
gave the job its grace (a flow's shrink, a destroy) asks for :meth:`KillFirst.kill`: the
scheduler's command that sends KILL at once (``KILL_COMMAND``, the native id appended) is run
first, then the usual cancel, so that the job still ends CANCELED. A scheduler without one
(Grid Engine has its own ``kill``: see ``sge.py``; the others until one is declared) is only
cancelled.

:meth:`KillFirst._withdraw` cancels, in the scheduler only, a job the tracker has already
finished (``fail_unstartable``: a queued job the scheduler will never start), so that nothing
of it stays in the queue; a cancel that fails is logged.

It holds no state and starts no process but through the executor's command runner.
"""

import logging
from typing import TYPE_CHECKING, Any, List, Tuple

from psij import _check
from psij.job import Job

__all__ = ["KillFirst"]

logger = logging.getLogger(__name__)


class KillFirst:
    """The ``kill`` of :class:`~psij.executors.batch.BatchSchedulerExecutor`."""

    # Sends KILL to every process of a running job now (the native id appended); empty: none.
    KILL_COMMAND: Tuple[str, ...] = ()

    if TYPE_CHECKING:
        def cancel(self, job: Job) -> None: ...

        def _run(self, argv: Any, stdin: Any = None) -> Any: ...

        def _status_poller(self) -> Any: ...

        def get_cancel_command(self, native_id: str) -> List[str]: ...

    def kill(self, job: Job) -> None:
        """Cancel ``job``, its processes killed at once where the scheduler can
        (``KILL_COMMAND``); see :meth:`psij.JobExecutor.kill`."""
        if not isinstance(job, Job):
            raise _check.fail_type("kill job", job, "psij.Job")
        fallback = getattr(self, "_fallback", None)
        if fallback is not None:  # its jobs run here: the local executor's kill
            fallback.local.kill(job)
            return
        native_id = job.native_id
        if self.KILL_COMMAND and native_id is not None and not job.status.final:
            # Asked before the KILL: a job that dies of it before the cancel reaches the
            # scheduler (Slurm then says FAILED, JobLaunchFailure) still ends CANCELED.
            self._status_poller().cancel_asked(native_id)
            result = self._run([*self.KILL_COMMAND, native_id])
            if not result.ok:  # not running yet, or gone: the cancel says what matters
                logger.debug("job %s: %s", job.id, result.describe())
        self.cancel(job)

    def _withdraw(self, native_id: str) -> None:
        """Cancel the job ``native_id`` in the scheduler, leaving its status alone (the
        tracker has ended it); a failure is logged, as the job may have gone meanwhile."""
        try:
            result = self._run(self.get_cancel_command(native_id))
        except Exception as e:
            logger.warning("job %s: could not cancel it in the scheduler: %r", native_id, e)
            return
        if not result.ok:
            logger.warning("job %s: cancelling it in the scheduler failed: %s", native_id,
                           result.describe())
