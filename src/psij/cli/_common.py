"""What every ``psij`` command shares: the exit codes (defined here and nowhere else), the exit
status of a job's final status, the one way of reporting on standard error, help formatters sized
to the terminal, the one way of adding a command's parser with its help texts, and the reading of
whole numbers on the command line.

Every other module of :mod:`psij.cli` may import this one; this one imports none of them (nor
:mod:`psij.cli` itself), so no command's module is ever loaded through it. It loads nothing heavy
at import: ``argparse`` and the job model are imported by the functions that need them, so that a
plain ``psij pilot run`` starts without them.
"""

import functools
import os
import sys
from typing import TYPE_CHECKING, Any, Optional, Tuple

if TYPE_CHECKING:
    from psij.job_status import JobStatus

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_CANCELED", "EXIT_FAILED", "EXIT_TIMEOUT", "EXIT_USAGE",
           "UsageError", "add_command", "exit_status", "formatters", "one_line", "positive_int",
           "say", "whole_number"]

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_CANCELED = 130
EXIT_TIMEOUT = 124  # psij wait --timeout: time ran out with jobs not final (as timeout(1))
EXIT_BROKEN_PIPE = 141


class UsageError(Exception):
    """A command line that cannot be turned into a job; reported with exit status 2."""


# -- reporting -------------------------------------------------------------------------------


def one_line(text: str) -> str:
    return " ".join(text.split())


def say(message: str, what: str = "") -> None:
    """Write ``psij WHAT: MESSAGE`` (the message on one line) on standard error."""
    prefix = f"psij {what}: " if what else "psij: "
    print(prefix + one_line(message), file=sys.stderr)


def exit_status(status: "Optional[JobStatus]") -> Tuple[int, Optional[str]]:
    """The command's exit status for a job's final status, and why it failed if it says nothing.
    """
    from psij.job_state import JobState

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


# -- reading the command line ----------------------------------------------------------------


def whole_number(text: str) -> Optional[int]:
    """``text`` as an int of at least 1, or None."""
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number of processes of at least 1."""
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
def formatters() -> Tuple[Any, Any]:
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


def add_command(commands: Any, name: str, line: str, description: str,
                epilog: Optional[str] = None, usage: Optional[str] = None,
                keep_lines: bool = False) -> Any:
    """Add the parser of command ``name`` to ``commands`` (what argparse's ``add_subparsers``
    gave) and return it: ``line`` is the command's line in its group's list of commands, the
    ``description`` comes before its options and the ``epilog`` after them, both wrapped to the
    terminal, or with ``keep_lines`` printed with their own line breaks."""
    return commands.add_parser(name, help=line, usage=usage, description=description,
                               epilog=epilog, formatter_class=formatters()[int(keep_lines)])
