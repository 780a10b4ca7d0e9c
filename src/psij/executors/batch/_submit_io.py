"""The submit step of a batch submission: writing the submit script, running the submit command
and reading the native id from its output.

Everything it needs from the executor comes in one immutable :class:`SubmitInputs`, made once
per executor and configuration by ``BatchSchedulerExecutor._submit_inputs`` with the backend's
hooks resolved first: a hook the backend overrides (``get_submit_command``,
``get_submit_stdin``, ``job_id_from_submit_output``, ``_direct_submit``, ``_run``) is there as
its bound method, and the stock behaviour, built from the declarations (``SUBMIT_COMMAND``,
``SCRIPT_ON_STDIN``, ``JOB_ID_PATTERN``), as None (or, for the job id, a function of the
pattern). :func:`submit_text` (:func:`run_submit`, then :func:`parse_native_id`) takes those
inputs, the job and the script's text the render step gave, never the executor, and gives the
native id or the SubmitException to raise.

A scheduler that reads the script on its standard input (``SCRIPT_ON_STDIN``: Slurm's
``sbatch``, LSF's ``bsub``) gets it from memory, and the file ``<job.id>.job`` is written only
when the submission failed (so that the error can name it) or with ``keep_files``; other
schedulers get the path of the file, written first (0600, or the executor's ``SCRIPT_MODE``).
A script on standard input goes to a submit command started ahead of need when one fits
(``spare_submit_commands``; :mod:`psij.executors.batch._spares`), or, where the executor
has a faster way to the scheduler than its submit command (Slurm's ``rest_submit``), there.
The work directory is checked when the inputs are made, and again if it has vanished since.
Commands run only through the executor's runner, the submit command as one that
``BatchSchedulerExecutor.stop_submitting`` stops. This module imports nothing of
``batch_scheduler_executor``.
"""

import functools
import os
import shutil
from pathlib import Path
from typing import Callable, List, Optional, Pattern, Sequence, Tuple, Union

from psij._private_dirs import ensure_private_dir
from psij._record import Record
from psij.exceptions import SubmitException
from psij.executors.batch._runner import (
    MAY_HAVE_BEEN_SUBMITTED,
    CommandResult,
    CommandRunner,
    SubprocessRunner,
    script_bytes,
)
from psij.job import Job

__all__ = ["SubmitInputs", "declared_job_id", "is_transient", "not_found_hint",
           "parse_native_id", "run_submit", "submit_argv", "submit_text", "write_script"]


class SubmitInputs(Record):
    """What the submit step takes from a batch executor (see the module's documentation).

    ``name``: the name the executor was asked by; ``owner``: its class's name (in the error
    of a missing declaration); ``script_dir`` and ``work_root``: its work directory and the
    configuration's (under which the first is made); ``script_mode``: the script's
    permissions; ``script_on_stdin``: the stock commands read the script on standard input;
    ``in_memory``: the script goes from memory (``script_on_stdin``, no ``keep_files``, the
    stock ``get_submit_stdin``); ``submit_command``: ``SUBMIT_COMMAND``; ``command_hook``,
    ``stdin_hook``, ``direct_submit``, ``run_hook``: the backend's ``get_submit_command``,
    ``get_submit_stdin``, ``_direct_submit`` and ``_run`` where it overrides them (None: the
    stock behaviour); ``job_id``: the native id in the submit command's stdout (the backend's
    ``job_id_from_submit_output``, or :func:`declared_job_id` of ``JOB_ID_PATTERN``);
    ``runner``, ``command_timeout``, ``spares``: how commands run
    (``spare_submit_commands``); ``transient_markers``: ``TRANSIENT_SUBMIT_ERRORS``.
    """

    name: str
    owner: str
    script_dir: Path
    work_root: Path
    script_mode: int
    script_on_stdin: bool
    in_memory: bool
    submit_command: Tuple[str, ...]
    command_hook: Optional[Callable[[Job, Path], List[str]]]
    stdin_hook: Optional[Callable[[Job, Path], Optional[str]]]
    direct_submit: Optional[Callable[[Sequence[str], str], Optional[CommandResult]]]
    run_hook: Optional[Callable[..., CommandResult]]
    job_id: Callable[[str], str]
    runner: CommandRunner
    command_timeout: float
    spares: int = 0
    transient_markers: Tuple[str, ...] = ()


def missing(owner: str, declaration: str) -> NotImplementedError:
    """The error of a backend that neither declares ``declaration`` nor overrides its hook."""
    return NotImplementedError(f"{owner}: set {declaration} or override the hook that uses it")


def submit_argv(declared: Sequence[str], on_stdin: bool, owner: str,
                script: Path) -> List[str]:
    """The stock submit command: ``declared`` (``SUBMIT_COMMAND``), followed by the script's
    path unless the script goes on its standard input."""
    if not declared:
        raise missing(owner, "SUBMIT_COMMAND")
    return list(declared) if on_stdin else [*declared, str(script.absolute())]


def declared_job_id(pattern: Optional[Pattern[str]], owner: str, out: str) -> str:
    """The native id in a submit command's stdout by ``pattern`` (``JOB_ID_PATTERN``): its
    group 1, or the whole match when it has no group."""
    if pattern is None:
        raise missing(owner, "JOB_ID_PATTERN")
    match = pattern.search(out.strip())
    if match is None:
        raise ValueError(f"no job id (matching {pattern.pattern!r}) in {out.strip()!r}")
    return match.group(1) if pattern.groups else match.group(0)


def job_id_of(pattern: Optional[Pattern[str]], owner: str) -> Callable[[str], str]:
    """:func:`declared_job_id` of ``pattern`` as a function of the output alone."""
    return functools.partial(declared_job_id, pattern, owner)


def submit_text(inputs: SubmitInputs, job: Job, text: str) -> Union[str, SubmitException]:
    """The submit step of one job: run the submit command for ``text``, the script of
    ``job`` (:func:`run_submit`), and read the native id from its output
    (:func:`parse_native_id`); the id, or the SubmitException saying why there is none."""
    result, script = run_submit(inputs, job, text)
    return parse_native_id(result, inputs, job, script)


def run_submit(inputs: SubmitInputs, job: Job, text: str) -> Tuple[CommandResult, Path]:
    """Run the submit command for ``text``, the script of ``job``; the result and the path
    of the script (which exists only if it was written, see the module's docstring)."""
    path = inputs.script_dir / f"{job.id}.job"
    in_memory = inputs.in_memory
    if not in_memory:
        write_script(path, text, inputs.script_mode, inputs.work_root)
    hook = inputs.command_hook
    argv = hook(job, path) if hook is not None else \
        submit_argv(inputs.submit_command, inputs.script_on_stdin, inputs.owner, path)
    runner = inputs.runner
    subprocesses = isinstance(runner, SubprocessRunner)
    direct = inputs.direct_submit(argv, text) \
        if in_memory and subprocesses and inputs.direct_submit is not None else None
    if direct is not None:
        result = direct
    elif in_memory and inputs.spares and isinstance(runner, SubprocessRunner):
        result = runner.run_spared(argv, inputs.command_timeout, text, inputs.spares)
    else:
        data = text if in_memory else _stdin(inputs, job, path)
        if inputs.run_hook is not None:
            result = inputs.run_hook(argv, stdin=data)
        elif isinstance(runner, SubprocessRunner):
            # As a submit command: SubprocessRunner.stop_submits stops it.
            result = runner.run(argv, inputs.command_timeout, data, submit=True)
        else:
            result = runner.run(argv, timeout=inputs.command_timeout, stdin=data)
    if in_memory and not (result.ok and result.stdout.strip()):
        write_script(path, text, inputs.script_mode, inputs.work_root)  # kept for the error
    return result, path


def _stdin(inputs: SubmitInputs, job: Job, path: Path) -> Optional[str]:
    """The submit command's standard input when the script is not sent from memory."""
    if inputs.stdin_hook is not None:
        return inputs.stdin_hook(job, path)
    if not inputs.script_on_stdin:
        return None
    return path.read_text(encoding="utf-8", errors="surrogateescape")


def ensure_script_dir(script_dir: Path, work_root: Path) -> None:
    """Make (or check) the folder of the submit scripts: private, under ``work_root``."""
    ensure_private_dir(script_dir, "batch work directory", work_root)


def write_script(path: Path, text: str, mode: int, work_root: Optional[Path] = None) -> Path:
    """Write ``text`` at ``path`` with exactly the permissions ``mode``; the folder, if it has
    vanished, is made again (private, under ``work_root``) when ``work_root`` is given."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    except FileNotFoundError:  # removed since it was checked: made and checked again
        if work_root is None:
            raise
        ensure_script_dir(path.parent, work_root)
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


def not_found_hint(name: str, result: CommandResult) -> str:
    """Words to add to the error of a submit command that could not be started because it
    is not there (not for one that is there but could not start, such as with too large an
    environment); ``name``: the executor's."""
    if result.exit_code is not None or "could not be started" not in (result.failure or "") \
            or shutil.which(result.argv[0]) is not None:
        return ""
    return (f" ({result.argv[0]!r} is not installed here or not on PATH; with the executor "
            f"setting fallback='local' the {name} executor runs jobs on this machine "
            "instead)")


def parse_native_id(result: CommandResult, inputs: SubmitInputs, job: Job, script: Path,
                    array_of: int = 0) -> Union[str, SubmitException]:
    """The native id the submit command gave ``job`` (or, with ``array_of``, the array of
    that many jobs starting with it), or the SubmitException saying why there is none: the
    command failed (transient when :func:`is_transient`), or its output has no id by
    ``inputs.job_id``. Either message names the kept ``script``."""
    if not result.ok:
        if array_of:
            what = f"submitting the array of {array_of} jobs failed: {result.describe()}"
        else:
            what = (f"job {job.id}: submitting failed: {result.describe()}"
                    f"{not_found_hint(inputs.name, result)}")
        return SubmitException(f"{what}; the submit script is kept at {script}",
                               transient=is_transient(result, inputs.transient_markers))
    try:
        native_id = inputs.job_id(result.stdout).strip()
        if not native_id:
            raise ValueError("no job id found")
    except Exception as e:
        what = (f"the submit command of an array of {array_of} jobs" if array_of
                else f"job {job.id}: the submit command")
        error = SubmitException(
            f"{what} seemed to succeed but its output has no job id ({e}): "
            f"{result.stdout.strip()!r}; the submit script is kept at {script}", e)
        error.__cause__ = e
        return error
    return native_id
