"""``psij run``: submit one job, wait for it and exit with its exit code.

It only turns its arguments into a :class:`psij.JobSpec`, submits it and waits. It never reads
or forwards the job's output: unless redirected with ``--stdout``/``--stderr``/``--stdin``, the
job is given this process's own standard streams and writes to them directly (see
:mod:`psij.cli._job_streams`). A stop signal (Ctrl-C, SIGTERM, SIGHUP) cancels the job before the
command exits.

Exit status: the job's exit code; 1 when the job failed without one or could not be submitted;
130 when it was canceled; 2 for bad usage (unknown executor or launcher, bad option value,
invalid job). It imports only the shared modules of :mod:`psij.cli`, never another command's.
"""

import os
import signal
import stat
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Optional

from psij.cli._common import (
    EXIT_CANCELED,
    EXIT_FAILED,
    EXIT_USAGE,
    UsageError,
    add_command,
    exit_status,
    say,
)
from psij.cli._job_options import (
    ATTRIBUTE_HELP,
    DEFAULT_EXECUTOR,
    add_job_options,
    build_spec,
    check_launcher,
)
from psij.cli._job_streams import OutputCopies, StreamRefused

if TYPE_CHECKING:  # loaded when a job runs, not to show help
    import argparse

    from psij._stop_signals import StopSignals
    from psij.job import Job
    from psij.job_executor import JobExecutor

__all__ = ["add_run_command", "run_main"]

_CANCEL_WAIT_SECONDS = 30


class _Stop(Exception):
    """Raised in the main thread when a stop signal arrives while the job runs."""


def add_run_command(commands: Any) -> None:
    run = add_command(
        commands, "run", "run one job and exit with its exit code",
        "Submit one job, wait for it and exit with its exit code.\n\n"
        "The job writes to this command's standard output and error (and reads its\n"
        "standard input) unless --stdout, --stderr or --stdin name files. On\n"
        "local the job writes to these very descriptors, after what a makefile,\n"
        "script or nohup wrote; elsewhere output that an executor's reopening\n"
        "would overwrite (>> or a file already written to) is copied back when the\n"
        "job ends. A terminal is not given as standard input, because the job runs\n"
        "in its own process group.",
        usage="psij run [options] [--] EXECUTABLE [ARGUMENT ...]", keep_lines=True,
        epilog="exit status:\n"
               "  the job's exit code  when the job ran to completion or failed with one\n"
               "  1                    the job failed without an exit code (its status message\n"
               "                       is printed), or it could not be submitted\n"
               "  2                    bad usage: unknown executor or launcher, bad option\n"
               "                       value, or a job the executor rejects as invalid\n"
               "  130                  the job was canceled; Ctrl-C, SIGTERM and SIGHUP cancel\n"
               "                       the job before this command exits\n\n" + ATTRIBUTE_HELP)
    run.add_argument("--executor", default=DEFAULT_EXECUTOR, metavar="NAME",
                     help=f"executor to submit to (default: {DEFAULT_EXECUTOR})")
    add_job_options(run)


def run_main(args: "argparse.Namespace") -> int:
    """Run one ``psij run``; its exit status."""
    return _JobRun(args)()


def _output_copies(executor: "JobExecutor", launcher: Optional[str]) -> Optional[OutputCopies]:
    """None when the executor gives the job our own descriptors (``local`` starting it
    directly); else where the job's output goes until it is copied back."""
    from psij.executors.local import LocalJobExecutor

    if isinstance(executor, LocalJobExecutor) and launcher in (None, "single"):
        return None
    return OutputCopies(executor.config.work_directory)


def _raise_stop(signum: int) -> None:
    # The job runs in its own process group, so it would outlive this process unless it is
    # canceled first: a stop signal interrupts the wait (the only way to) to cancel it.
    raise _Stop(signal.Signals(signum).name)


class _JobRun:
    """One ``psij run``: submit, wait (canceling on a stop signal), report."""

    def __init__(self, args: "argparse.Namespace") -> None:
        self.args = args
        # Our stdout/stderr descriptors that the job writes to through its own opening.
        self.shared_fds = [fd for fd, given in ((1, args.stdout), (2, args.stderr))
                           if given is None]

    def report(self, message: str) -> None:
        self.catch_up()
        say(message, "run")

    def catch_up(self) -> None:
        """Move our shared output descriptors past what the job wrote to the same files.

        The job writes through its own opening of the file, so our offset (shared with the
        shell that started us) stays behind, and our later writes, or the shell's, would
        overwrite the job's output.
        """
        for fd in self.shared_fds:
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.lseek(fd, 0, os.SEEK_END)
            except OSError:
                pass

    def __call__(self) -> int:
        from psij._stop_signals import StopSignals
        from psij.exceptions import InvalidJobException, SubmitException
        from psij.job import Job
        from psij.job_executor import JobExecutor

        args = self.args
        # Held during submission, so that submit is never cut in half.
        with StopSignals(_raise_stop, hold=True) as stop:
            copies: Optional[OutputCopies] = None
            try:
                try:
                    executor = JobExecutor.get_instance(args.executor)
                    copies = _output_copies(executor, args.launcher)
                    spec = build_spec(args, copies=copies)
                    check_launcher(args.launcher)
                    job = Job(spec)
                    executor.submit(job)
                except (UsageError, StreamRefused, ValueError, TypeError,
                        InvalidJobException) as ex:
                    say(str(ex), "run: error")
                    return EXIT_USAGE
                except SubmitException as ex:
                    say(f"could not submit the job: {ex}", "run")
                    return EXIT_FAILED
                code = self.wait_or_cancel(job, stop)
                if copies is not None:
                    copies.copy_back()
            finally:
                if copies is not None:
                    copies.remove()
        self.catch_up()
        return code

    def wait_or_cancel(self, job: "Job", stop: "StopSignals") -> int:
        from psij.exceptions import SubmitException

        try:
            stop.release()
            status = job.wait()
        except (_Stop, KeyboardInterrupt):
            self.report("stopping: canceling the job")
            try:
                job.cancel()
                status = job.wait(timeout=timedelta(seconds=_CANCEL_WAIT_SECONDS))
            except (_Stop, KeyboardInterrupt):
                return EXIT_CANCELED
            except SubmitException as ex:
                self.report(f"could not cancel the job: {ex}")
                return EXIT_FAILED
            if status is None:
                self.report(f"the job did not stop within {_CANCEL_WAIT_SECONDS} s of being "
                         "canceled")
                return EXIT_CANCELED
        code, why = exit_status(status)
        if why is not None:
            self.report(why)
        return code
