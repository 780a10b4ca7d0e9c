"""``psij script``: print the submit script a batch executor would write for a job.

It takes the options of ``psij run`` and builds the same JobSpec, without this process's
streams, and prints the script; it never submits anything. It exits with 0, or 2 for bad usage,
including an executor that writes no submit script. It imports only the shared modules of
:mod:`psij.cli`, never another command's.
"""

import sys
from typing import TYPE_CHECKING, Any, List, Optional

from psij.cli._common import EXIT_USAGE, UsageError, add_command, say
from psij.cli._job_options import ATTRIBUTE_HELP, add_job_options, build_spec, check_launcher

if TYPE_CHECKING:
    import argparse

__all__ = ["add_script_command", "script_main"]


def add_script_command(commands: Any) -> None:
    script = add_command(
        commands, "script", "print the submit script a job would get, without submitting it",
        "Print to standard output the submit script that a batch executor (slurm,\n"
        "sge, pbs, lsf, ...) would write for the job, without submitting it. The\n"
        "options are those of `psij run`; without --stdin, --stdout and --stderr\n"
        "the job has no redirections. The scheduler does not need to be installed.",
        usage="psij script --executor NAME [options] [--] EXECUTABLE [ARGUMENT ...]",
        keep_lines=True,
        epilog="exit status:\n"
               "  0  the script was printed\n"
               "  2  bad usage: unknown executor or launcher, an executor without submit\n"
               "     scripts (such as local), bad option value, or a job the executor\n"
               "     rejects as invalid\n\n" + ATTRIBUTE_HELP)
    script.add_argument("--executor", required=True, metavar="NAME",
                        help="batch executor whose submit script to print")
    add_job_options(script)


def script_main(args: "argparse.Namespace") -> int:
    """``psij script``: print the submit script of the job, never submitting it."""
    from psij._plugins import REGISTRY
    from psij.exceptions import InvalidJobException
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
    from psij.job import Job
    from psij.job_executor import JobExecutor

    try:
        spec = build_spec(args, inherit_streams=False)
        # The class is checked before an instance is made: other executors may start work
        # (threads, journal files) as soon as they exist.
        if not _is_batch_executor(REGISTRY.select("executor", args.executor).cls):
            raise UsageError(
                f"executor {args.executor!r} does not submit to a batch scheduler, so it has no "
                f"submit script; executors with one: {', '.join(_batch_executor_names())}")
        check_launcher(args.launcher)
        executor = JobExecutor.get_instance(args.executor)
        assert isinstance(executor, BatchSchedulerExecutor)
        try:
            text = executor.submit_script(Job(spec))
        finally:
            executor.close()
    except (UsageError, ValueError, TypeError, InvalidJobException) as ex:
        say(str(ex), "script: error")
        return EXIT_USAGE
    sys.stdout.write(text)
    return 0


def _is_batch_executor(cls: Optional[type]) -> bool:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

    return isinstance(cls, type) and issubclass(cls, BatchSchedulerExecutor)


def _batch_executor_names() -> List[str]:
    """Names (and aliases) of the installed executors that write submit scripts."""
    from psij._plugins import REGISTRY

    names = []
    for name in REGISTRY.names("executor"):
        try:
            cls = REGISTRY.select("executor", name).cls
        except ValueError:  # a plugin that does not load is listed by `psij plugins`
            continue
        if _is_batch_executor(cls):
            names.append(name)
    return sorted(names)
