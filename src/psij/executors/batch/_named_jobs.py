"""Jobs found by their name in the scheduler's queue, and stopping submissions for good.

A program that may have been stopped while a submit command ran (``psij supervise`` after
Ctrl+C) cannot know whether that command queued its job. It gives every job a name of its
own, journals the name before submitting, and later asks :meth:`NamedJobs.jobs_named` or
:meth:`NamedJobs.cancel_jobs_named`; :meth:`NamedJobs.stop_submitting` kills the submit
commands still running when it stops. Part of
:class:`~psij.executors.batch.BatchSchedulerExecutor`; it starts no process but through the
executor's command runner.
"""

from typing import TYPE_CHECKING, Any, List, Tuple

from psij import _check
from psij.exceptions import SubmitException
from psij.executors.batch._cancel_output import UNKNOWN_ERROR, InvalidJobStateError

__all__ = ["InvalidJobStateError", "NamedJobs"]


class NamedJobs:
    """The by-name look-up and cancel of :class:`~psij.executors.batch.BatchSchedulerExecutor`."""

    # The command listing the native ids of this user's jobs in the queue named "{name}" (the
    # word "{name}" stands for it), read like the list command's output; () when the scheduler
    # cannot be asked (jobs_named then raises NotImplementedError).
    NAMED_LIST_COMMAND: Tuple[str, ...] = ()

    if TYPE_CHECKING:
        def _declared(self, name: str) -> Tuple[str, ...]: ...

        def _run(self, argv: Any, stdin: Any = None) -> Any: ...

        def parse_list_output(self, out: str) -> List[str]: ...

        def output_means_no_jobs(self, exit_code: int, out: str) -> bool: ...

        def get_cancel_command(self, native_id: str) -> List[str]: ...

        def process_cancel_command_output(self, exit_code: int, out: str) -> None: ...

    def get_named_list_command(self, name: str) -> List[str]:
        """The command listing this user's jobs in the queue named ``name``."""
        return [word.replace("{name}", name) for word in self._declared("NAMED_LIST_COMMAND")]

    def parse_named_list_output(self, out: str, name: str) -> List[str]:
        """Native ids in the named list command's output (as :meth:`parse_list_output`)."""
        return self.parse_list_output(out)

    def jobs_named(self, name: str) -> List[str]:
        """Native ids of this user's jobs in the queue (not ended) named ``name``, as the
        scheduler writes it (a plain name, letters, digits and ``_ . -``, is written as it is
        everywhere); NotImplementedError where the scheduler cannot be asked
        (``NAMED_LIST_COMMAND``), SubmitException when it does not answer."""
        name = _check.req_str("jobs_named name", name)
        if not name or "\n" in name:
            raise ValueError(f"jobs_named name: expected a one-line name, got {name!r}")
        fallback = getattr(self, "_fallback", None)
        if fallback is not None:
            raise NotImplementedError(f"cannot look jobs up by name: {fallback.why}")
        result = self._run(self.get_named_list_command(name))
        if result.exit_code is not None and self.output_means_no_jobs(result.exit_code,
                                                                      result.output):
            return []
        if not result.ok:
            raise SubmitException(f"looking up the jobs named {name!r} failed: "
                                  f"{result.describe()}", transient=result.exit_code is None)
        return self.parse_named_list_output(result.stdout, name)

    def cancel_jobs_named(self, name: str) -> List[str]:
        """Cancel this user's jobs in the queue named ``name`` (:meth:`jobs_named`): those a
        submission that was interrupted may have made. Returns their native ids; a job that
        ended first counts as cancelled. Raises as :meth:`jobs_named`, or SubmitException when
        a cancel fails."""
        found = self.jobs_named(name)
        for native_id in found:
            result = self._run(self.get_cancel_command(native_id))
            if result.ok:
                continue
            if result.exit_code is None:
                raise SubmitException(f"cancelling job {native_id} (named {name!r}) failed: "
                                      f"{result.describe()}", transient=True)
            try:
                self.process_cancel_command_output(result.exit_code,
                                                   result.output or UNKNOWN_ERROR)
            except InvalidJobStateError:
                continue  # it ended first
        return found

    def stop_submitting(self) -> None:
        """Stop for good: kill the submit command of every submission running now (each one
        fails, saying that the job may have been submitted) and make every later submission
        fail before its submit command starts. A program that stops calls it so that no submit
        command it started queues a job after it is gone; the jobs already submitted are
        followed (and can be cancelled) as before."""
        stop = getattr(getattr(self, "_runner", None), "stop_submits", None)
        if stop is not None:
            stop()
