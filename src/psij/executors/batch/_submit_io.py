"""Writing a batch job's submit script and running its submit command.

A scheduler that reads the script on its standard input (``SCRIPT_ON_STDIN``: Slurm's
``sbatch``, LSF's ``bsub``) gets it from memory, and the file ``<job.id>.job`` is written only
when the submission failed (so that the error can name it) or with ``keep_files``; other
schedulers get the path of the file, written first (0600, or the executor's ``SCRIPT_MODE``).
A script on standard input goes to a submit command started ahead of need when one fits
(``spare_submit_commands``; :mod:`psij.executors.batch._spares`), or, where the executor
has a faster way to the scheduler than its submit command (Slurm's ``rest_submit``), there.
The work directory is checked once per executor, and again if it has vanished since. Commands
run only through the executor's runner, the submit command as one that
:meth:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutor.stop_submitting`
stops.
"""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Tuple

from psij.executors.batch._runner import (
    MAY_HAVE_BEEN_SUBMITTED,
    CommandResult,
    SubprocessRunner,
    script_bytes,
)
from psij.job import Job

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = ["is_transient", "run_submit", "write_script"]


def run_submit(executor: "BatchSchedulerExecutor", job: Job,
               text: str) -> Tuple[CommandResult, Path]:
    """Run the submit command for ``text``, the script of ``job``; the result and the path
    of the script (which exists only if it was written, see the module's docstring)."""
    path = executor.work_directory / f"{job.id}.job"
    in_memory = (executor.SCRIPT_ON_STDIN and not executor.batch_config.keep_files
                 and executor._stock("get_submit_stdin"))
    if in_memory:
        if not executor._work_dir_checked:
            executor._ensure_work_dir()  # the job writes its files there
    else:
        write_script(executor, job, text)
    argv = executor.get_submit_command(job, path)
    spares = executor.batch_config.spare_submit_commands
    runner = executor._runner
    direct = executor._direct_submit(argv, text) \
        if in_memory and isinstance(runner, SubprocessRunner) else None
    if direct is not None:
        result = direct
    elif in_memory and spares and isinstance(runner, SubprocessRunner):
        result = runner.run_spared(argv, executor.batch_config.command_timeout, text, spares)
    else:
        data = text if in_memory else executor.get_submit_stdin(job, path)
        if isinstance(runner, SubprocessRunner) and executor._stock("_run"):
            # As a submit command: SubprocessRunner.stop_submits stops it.
            result = runner.run(argv, executor.batch_config.command_timeout, data, submit=True)
        else:
            result = executor._run(argv, stdin=data)
    if in_memory and not (result.ok and result.stdout.strip()):
        write_script(executor, job, text)  # kept for the failure message
    return result, path


def write_script(executor: "BatchSchedulerExecutor", job: Job, text: str) -> Path:
    """Write ``text`` as the submit script of ``job``: ``<work directory>/<job.id>.job``."""
    if not executor._work_dir_checked:
        executor._ensure_work_dir()
    path = executor.work_directory / f"{job.id}.job"
    mode = executor.SCRIPT_MODE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    except FileNotFoundError:  # removed since it was checked: made and checked again
        executor._ensure_work_dir()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, mode)  # exactly, whatever the umask or an older file
        f.write(script_bytes(text))
    return path


def is_transient(result: CommandResult, markers: Sequence[str]) -> bool:
    """Whether a failed submission may work when tried again: the command timed out or was
    killed, or said one of ``markers`` (the executor's ``TRANSIENT_SUBMIT_ERRORS``); never
    when the job may have been submitted (trying again could submit it twice)."""
    if result.failure is not None and MAY_HAVE_BEEN_SUBMITTED in result.failure:
        return False
    if result.exit_code is None and result.failure is not None \
            and "could not be started" not in result.failure:
        return True
    return any(marker in result.output for marker in markers)
