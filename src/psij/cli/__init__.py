"""The ``psij`` command: list the installed plugins, run one job and exit with its exit code, or
print the submit script a job would get from a batch executor.

``psij run`` only turns its arguments into a :class:`psij.JobSpec`, submits it and waits. It
never reads or forwards the job's output: unless redirected with ``--stdout``/``--stderr``/
``--stdin``, the job is given this process's own standard streams and writes to them directly.
``psij script`` takes the same job options, builds the same JobSpec (without this process's
streams) and prints the script; it never submits anything.
Nothing here is imported by ``import psij``.

Exit status of ``psij run``: the job's exit code; 1 when the job failed without one or could not
be submitted; 130 when it was canceled (Ctrl-C, SIGTERM or SIGHUP cancel the job first); 2 for
bad usage (unknown executor or launcher, bad option value, invalid job). ``psij script`` exits
with 0, or 2 for bad usage, including an executor that writes no submit script.
"""

import functools
import os
import signal
import stat
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from psij._declared_attributes import from_text
from psij._stop_signals import StopSignals
from psij.cli._broken_pipe import silence_stdout, stdout_reader_gone
from psij.cli._config import add_config_command, config_main
from psij.cli._flow import FLOW_VERBS, add_flow_commands, flow_main
from psij.cli._job_streams import OutputCopies, StreamRefused, inherited_stream_path, same_open_file
from psij.cli._jobs import JOB_COMMANDS, add_job_commands, jobs_main
from psij.cli._pilot import add_pilot_commands, pilot_main, plain_pilot_run, whole_number
from psij.cli._supervise import add_supervise_command, supervise_main
from psij.exceptions import InvalidJobException, SubmitException
from psij.job import Job
from psij.job_attributes import JobAttributes
from psij.job_executor import JobExecutor
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1
from psij.version import __version__

if TYPE_CHECKING:
    import argparse

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_CANCELED = 130
EXIT_BROKEN_PIPE = 141
_CANCEL_WAIT_SECONDS = 30

DEFAULT_EXECUTOR = "local"

# --attr key -> JobAttributes field; any "<executor>.<option>" key is a custom attribute.
_ATTRIBUTE_FIELDS = {
    "duration": "duration",
    "queue": "queue_name",
    "account": "account",
    "reservation": "reservation_id",
}
_ACCEPTED_ATTRIBUTES = ", ".join(_ATTRIBUTE_FIELDS) + " or <executor>.<option>"

_ATTRIBUTE_HELP = ("--attr keys:\n"
                   "  duration=WALLTIME    hh:mm:ss, hh:mm, mm, or N followed by h, m or s\n"
                   "  queue=NAME, account=NAME, reservation=ID\n"
                   "  EXECUTOR.OPTION=VALUE  a custom attribute used only by that executor,\n"
                   "                       e.g. slurm.qos=debug\n"
                   "  psij.priority=N      higher goes first; psij.tmp=BYTES temporary disk\n"
                   "                       per node (numbers, checked on every executor)")

class UsageError(Exception):
    """A command line that cannot be turned into a job; reported with exit status 2."""


class _Stop(Exception):
    """Raised in the main thread when a stop signal arrives while the job runs."""


# -- argument parsing ------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    value = whole_number(text)
    if value is None:
        import argparse

        raise argparse.ArgumentTypeError(
            f"expected a whole number of processes of at least 1, got {text!r}")
    return value


def _terminal_width() -> int:
    """Columns for help text, found as ``shutil.get_terminal_size`` finds them (argparse
    would import shutil, a large module, to ask it each time it makes a formatter)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        stdout = sys.__stdout__
        try:
            columns = 0 if stdout is None else os.get_terminal_size(stdout.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


@functools.cache
def _formatters() -> Tuple[Any, Any]:
    """argparse's help formatters (plain, and keeping the description's lines), given the
    terminal's width at once."""
    import argparse

    class Formatter(argparse.HelpFormatter):
        def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                     width: Optional[int] = None) -> None:
            super().__init__(prog, indent_increment, max_help_position,
                             _terminal_width() if width is None else width)

    class RawDescriptionFormatter(argparse.RawDescriptionHelpFormatter, Formatter):
        pass

    return Formatter, RawDescriptionFormatter


_COMMANDS = ("plugins", "run", "script", "pilot", "flow", "config", *JOB_COMMANDS, "supervise")
_PILOT_COMMANDS = ("serve", "run")


def _named(argv: Sequence[str], known: Sequence[str]) -> Optional[str]:
    """The command ``argv`` names with its first word that is not an option, if it is one of
    ``known`` (None otherwise, or when help is asked for at this level)."""
    for word in argv:
        if word.startswith("-"):
            if word in ("-h", "--help"):
                return None
            continue
        return word if word in known else None
    return None


def _build_parser(argv: Optional[Sequence[str]] = None) -> "argparse.ArgumentParser":
    """The ``psij`` parser. Given the command line, it holds only the command that line
    names (building every parser costs a noticeable part of a short command's run); without,
    or when no command is named, every command."""
    import argparse

    command = None if argv is None else _named(argv, _COMMANDS)
    parser = argparse.ArgumentParser(
        prog="psij", formatter_class=_formatters()[0],
        description="Portable job submission (PSI/J): run jobs locally or through a batch "
                    "scheduler, and inspect the installed executors and launchers.")
    parser.add_argument("--version", action="version", version=f"psij {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command in (None, "plugins"):
        _add_plugins(commands)
    if command in (None, "run"):
        _add_run(commands)
    if command in (None, "script"):
        _add_script(commands)
    if command is None or command in JOB_COMMANDS:
        add_job_commands(commands, command)
    if command in (None, "config"):
        add_config_command(commands)
    if command in (None, "supervise"):
        add_supervise_command(commands)
    if command is None:
        add_pilot_commands(commands)
    elif command == "pilot" and argv is not None:
        words = list(argv)
        add_pilot_commands(commands, _named(words[words.index("pilot") + 1:],
                                             _PILOT_COMMANDS))
    if command is None:
        add_flow_commands(commands)
    elif command == "flow" and argv is not None:
        words = list(argv)
        add_flow_commands(commands, _named(words[words.index("flow") + 1:], FLOW_VERBS))
    return parser


def _add_plugins(commands: Any) -> None:
    commands.add_parser(
        "plugins", formatter_class=_formatters()[0],
        help="list executors and launchers with versions, files and load errors",
        description="List every executor and launcher found in psij-descriptors folders on "
                    "sys.path: name, version, descriptor file, class and class file, whether "
                    "it loads, and clashes between declarations. Descriptor files that could "
                    "not be read are listed at the end.")


def _add_run(commands: Any) -> None:
    run = commands.add_parser(
        "run", help="run one job and exit with its exit code",
        usage="psij run [options] [--] EXECUTABLE [ARGUMENT ...]",
        formatter_class=_formatters()[1],
        description="Submit one job, wait for it and exit with its exit code.\n\n"
                    "The job writes to this command's standard output and error (and reads its\n"
                    "standard input) unless --stdout, --stderr or --stdin name files. On\n"
                    "local the job writes to these very descriptors, after what a makefile,\n"
                    "script or nohup wrote; elsewhere output that an executor's reopening\n"
                    "would overwrite (>> or a file already written to) is copied back when the\n"
                    "job ends. A terminal is not given as standard input, because the job runs\n"
                    "in its own process group.",
        epilog="exit status:\n"
               "  the job's exit code  when the job ran to completion or failed with one\n"
               "  1                    the job failed without an exit code (its status message\n"
               "                       is printed), or it could not be submitted\n"
               "  2                    bad usage: unknown executor or launcher, bad option\n"
               "                       value, or a job the executor rejects as invalid\n"
               "  130                  the job was canceled; Ctrl-C, SIGTERM and SIGHUP cancel\n"
               "                       the job before this command exits\n\n" + _ATTRIBUTE_HELP)
    run.add_argument("--executor", default=DEFAULT_EXECUTOR, metavar="NAME",
                     help=f"executor to submit to (default: {DEFAULT_EXECUTOR})")
    _add_job_options(run)


def _add_script(commands: Any) -> None:
    script = commands.add_parser(
        "script", help="print the submit script a job would get, without submitting it",
        usage="psij script --executor NAME [options] [--] EXECUTABLE [ARGUMENT ...]",
        formatter_class=_formatters()[1],
        description="Print to standard output the submit script that a batch executor (slurm,\n"
                    "sge, pbs, lsf, ...) would write for the job, without submitting it. The\n"
                    "options are those of `psij run`; without --stdin, --stdout and --stderr\n"
                    "the job has no redirections. The scheduler does not need to be installed.",
        epilog="exit status:\n"
               "  0  the script was printed\n"
               "  2  bad usage: unknown executor or launcher, an executor without submit\n"
               "     scripts (such as local), bad option value, or a job the executor\n"
               "     rejects as invalid\n\n" + _ATTRIBUTE_HELP)
    script.add_argument("--executor", required=True, metavar="NAME",
                        help="batch executor whose submit script to print")
    _add_job_options(script)


def _add_job_options(parser: "argparse.ArgumentParser") -> None:
    """The options describing a job, shared by ``run`` and ``script``."""
    import argparse

    parser.add_argument("--launcher", metavar="NAME",
                        help="launcher that starts the job's processes (default: single)")
    parser.add_argument("-n", "--processes", type=_positive_int, metavar="N",
                        help="number of processes to start")
    parser.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                        help="job attribute (repeatable); see below")
    parser.add_argument("--dir", metavar="DIR", help="working directory of the job")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment variable for the job (repeatable)")
    parser.add_argument("--stdin", metavar="FILE", help="file the job reads as standard input")
    parser.add_argument("--stdout", metavar="FILE", help="file for the job's standard output")
    parser.add_argument("--stderr", metavar="FILE", help="file for the job's standard error")
    parser.add_argument("job_command", nargs=argparse.REMAINDER,
                        metavar="EXECUTABLE [ARGUMENT ...]", help=argparse.SUPPRESS)


# -- building the job ------------------------------------------------------------------------


def _split_assignment(option: str, text: str) -> Tuple[str, str]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"{option}: expected KEY=VALUE, got {text!r}")
    return key, value


def build_attributes(assignments: Sequence[str]) -> JobAttributes:
    """JobAttributes from ``--attr`` values (``duration=10m``, ``queue=debug``, ``slurm.qos=x``)."""
    attrs = JobAttributes()
    for text in assignments:
        key, value = _split_assignment("--attr", text)
        field = _ATTRIBUTE_FIELDS.get(key)
        if field is None and "." not in key:
            raise UsageError(f"--attr: unknown attribute {key!r}; accepted: "
                             f"{_ACCEPTED_ATTRIBUTES}")
        try:
            if field is None:  # by its declared kind (psij.tmp is a number)
                attrs.set_custom_attribute(key, from_text(key, value))
            else:
                parsed: Any = JobAttributes.parse_walltime(value) if field == "duration" \
                    else value
                setattr(attrs, field, parsed)
        except (ValueError, TypeError) as ex:
            raise UsageError(f"--attr {text!r}: {ex}") from ex
    return attrs


def build_environment(assignments: Sequence[str]) -> Optional[Dict[str, Union[str, int]]]:
    """The job's extra environment from ``--env NAME=VALUE`` values (None when there are none)."""
    if not assignments:
        return None
    env: Dict[str, Union[str, int]] = {}
    for text in assignments:
        name, value = _split_assignment("--env", text)
        env[name] = value
    return env


def _abspath(path: Optional[str]) -> Optional[str]:
    return None if path is None else os.path.abspath(path)


def build_spec(args: "argparse.Namespace", inherit_streams: bool = True,
               copies: Optional[OutputCopies] = None) -> JobSpec:
    """The JobSpec described by parsed ``psij run`` or ``psij script`` arguments.

    With ``inherit_streams`` the job gets this process's standard streams where no file is
    named (``run``; through ``copies`` where the executor would truncate them, see
    :mod:`psij.cli._job_streams`); without, those streams are left unset (``script``: the job runs
    elsewhere, later). Raises UsageError, StreamRefused, or the ValueError/TypeError/
    InvalidJobException of the core classes.
    """
    command: List[str] = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError(f"no executable given; usage: psij {args.command} [options] [--] "
                         "EXECUTABLE [ARGUMENT ...]")
    resources = None if args.processes is None else ResourceSpecV1(process_count=args.processes)
    stdin, stdout, stderr = _abspath(args.stdin), _abspath(args.stdout), _abspath(args.stderr)
    if inherit_streams:
        stdin = stdin or inherited_stream_path(0, copies)
        stdout = stdout or inherited_stream_path(1, copies)
        if stderr is None:
            if args.stdout is None and same_open_file(1, 2):
                # One path for both lets the executor give the job a single descriptor, so
                # the two streams do not overwrite each other in a shared file.
                stderr = stdout
            else:
                stderr = inherited_stream_path(2, copies)
    return JobSpec(
        executable=command[0],
        arguments=command[1:],
        directory=_abspath(args.dir),
        environment=build_environment(args.env),
        stdin_path=stdin,
        stdout_path=stdout,
        stderr_path=stderr,
        resources=resources,
        attributes=build_attributes(args.attr),
        launcher=args.launcher,
    )


def _check_launcher(name: Optional[str]) -> None:
    # Asked here so that a misspelt launcher is a usage error before anything is submitted.
    if name is not None:
        from psij._plugins import REGISTRY

        REGISTRY.select("launcher", name)


# -- running the job -------------------------------------------------------------------------


def exit_status(status: Optional[JobStatus]) -> Tuple[int, Optional[str]]:
    """The command's exit status for a job's final status, and why it failed if it says nothing.
    """
    if status is None:
        return EXIT_FAILED, "the job ended without a final status"
    if status.state is JobState.CANCELED:
        return EXIT_CANCELED, None
    code = status.exit_code
    if code is not None and code < 0:
        # Killed by signal -code: report it as a shell does.
        return min(128 - code, 255), None
    if status.state is JobState.FAILED and (not code or code in (126, 127)):  # 126/127: not run
        return code or EXIT_FAILED, f"job failed: {status.message or 'no reason given'}"
    if code is None:
        return 0, None
    return (code, None) if code <= 255 else (EXIT_FAILED, f"job exited with code {code}")


def _output_copies(executor: JobExecutor, launcher: Optional[str]) -> Optional[OutputCopies]:
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

    def say(self, message: str) -> None:
        self.catch_up()
        _say(message, "run")

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
        args = self.args
        # Held during submission, so that submit is never cut in half.
        with StopSignals(_raise_stop, hold=True) as stop:
            copies: Optional[OutputCopies] = None
            try:
                try:
                    executor = JobExecutor.get_instance(args.executor)
                    copies = _output_copies(executor, args.launcher)
                    spec = build_spec(args, copies=copies)
                    _check_launcher(args.launcher)
                    job = Job(spec)
                    executor.submit(job)
                except (UsageError, StreamRefused, ValueError, TypeError,
                        InvalidJobException) as ex:
                    _say(str(ex), "run: error")
                    return EXIT_USAGE
                except SubmitException as ex:
                    _say(f"could not submit the job: {ex}", "run")
                    return EXIT_FAILED
                code = self.wait_or_cancel(job, stop)
                if copies is not None:
                    copies.copy_back()
            finally:
                if copies is not None:
                    copies.remove()
        self.catch_up()
        return code

    def wait_or_cancel(self, job: Job, stop: StopSignals) -> int:
        try:
            stop.release()
            status = job.wait()
        except (_Stop, KeyboardInterrupt):
            self.say("stopping: canceling the job")
            try:
                job.cancel()
                status = job.wait(timeout=timedelta(seconds=_CANCEL_WAIT_SECONDS))
            except (_Stop, KeyboardInterrupt):
                return EXIT_CANCELED
            except SubmitException as ex:
                self.say(f"could not cancel the job: {ex}")
                return EXIT_FAILED
            if status is None:
                self.say(f"the job did not stop within {_CANCEL_WAIT_SECONDS} s of being "
                         "canceled")
                return EXIT_CANCELED
        code, why = exit_status(status)
        if why is not None:
            self.say(why)
        return code


# -- printing a submit script ----------------------------------------------------------------


def _print_script(args: "argparse.Namespace") -> int:
    """``psij script``: print the submit script of the job, never submitting it."""
    from psij._plugins import REGISTRY
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

    try:
        spec = build_spec(args, inherit_streams=False)
        # The class is checked before an instance is made: other executors may start work
        # (threads, journal files) as soon as they exist.
        if not _is_batch_executor(REGISTRY.select("executor", args.executor).cls):
            raise UsageError(
                f"executor {args.executor!r} does not submit to a batch scheduler, so it has no "
                f"submit script; executors with one: {', '.join(_batch_executor_names())}")
        _check_launcher(args.launcher)
        executor = JobExecutor.get_instance(args.executor)
        assert isinstance(executor, BatchSchedulerExecutor)
        try:
            text = executor.submit_script(Job(spec))
        finally:
            executor.close()
    except (UsageError, ValueError, TypeError, InvalidJobException) as ex:
        _say(str(ex), "script: error")
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


# -- plugins ---------------------------------------------------------------------------------


def _plugin_lines(kind: str) -> Iterator[str]:
    from psij._plugins import describe

    records = describe(kind)
    yield f"{kind.capitalize()}s:"
    if not records:
        yield "  (none)"
    for rec in records:
        title = f"  {rec['name']} {rec['version']}"
        if rec["alias_of"]:
            title += f" (alias of {rec['alias_of']})"
        yield title
        yield f"    descriptor: {rec['descriptor']}"
        yield f"    class:      {rec['class']}"
        yield f"    class file: {rec['class_file'] or '(not found)'}"
        yield f"    status:     {rec['error'] or 'ok'}"
        for note in rec["notes"]:
            yield f"    note:       {note}"


def _plugins() -> int:
    from psij._plugins import KINDS, REGISTRY

    lines: List[str] = []
    for kind in KINDS:
        lines.extend(_plugin_lines(kind))
    broken = REGISTRY.broken_files
    lines.append("Broken descriptor files:")
    if not broken:
        lines.append("  (none)")
    for item in broken:
        lines.append(f"  {item.path}")
        lines.append(f"    error: {type(item.error).__name__}: {_one_line(str(item.error))}")
    print("\n".join(lines))
    return 0


# -- entry point -----------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _say(message: str, what: str = "") -> None:
    prefix = f"psij {what}: " if what else "psij: "
    print(prefix + _one_line(message), file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the ``psij`` command with ``argv`` (default: ``sys.argv[1:]``); return its status.

    Output read by a command that stops early (``psij plugins | head``) ends the command quietly
    with status 141, as a shell reports a command ended by SIGPIPE, instead of a traceback.
    """
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        silence_stdout()
        return EXIT_BROKEN_PIPE


def _main(argv: Optional[List[str]]) -> int:
    if argv is None:
        argv = sys.argv[1:]
    plain = plain_pilot_run(argv)
    if plain is not None:
        return pilot_main(plain)
    parser = _build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as ex:  # --help, --version and usage errors end parsing this way
        return ex.code if isinstance(ex.code, int) else EXIT_USAGE
    if args.command == "plugins":
        return _plugins()
    if args.command == "run":
        return _JobRun(args)()
    if args.command == "script":
        return _print_script(args)
    if args.command == "pilot":
        return pilot_main(args)
    if args.command == "flow":
        return flow_main(args)
    if args.command in JOB_COMMANDS:
        return jobs_main(args)
    if args.command == "config":
        return config_main(args)
    if args.command == "supervise":
        return supervise_main(args)
    parser.print_usage(sys.stderr)
    _say(f"a command is required: {', '.join(_COMMANDS)}")
    return EXIT_USAGE
