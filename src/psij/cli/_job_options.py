"""The options that describe one job (``--launcher``, ``-n``, ``--attr``, ``--dir``, ``--env``,
``--stdin/--stdout/--stderr`` and the command after them), shared by ``psij run``, ``psij
script``, ``psij submit`` and ``psij flow create``, and the :class:`psij.JobSpec` they build.

It builds a JobSpec and checks names; it never submits a job, starts an executor or prints
anything. It imports only :mod:`psij.cli._common` and :mod:`psij.cli._job_streams` of the
command's modules, and the job model only when a job is built (not to show help).
"""

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from psij.cli._common import UsageError, positive_int
from psij.cli._job_streams import OutputCopies, inherited_stream_path, same_open_file

if TYPE_CHECKING:
    import argparse

    from psij.job_attributes import JobAttributes
    from psij.job_spec import JobSpec

__all__ = ["ATTRIBUTE_HELP", "DEFAULT_EXECUTOR", "add_job_options", "build_attributes",
           "build_environment", "build_spec", "check_launcher"]

DEFAULT_EXECUTOR = "local"

# --attr key -> JobAttributes field; any "<executor>.<option>" key is a custom attribute.
_ATTRIBUTE_FIELDS = {
    "duration": "duration",
    "queue": "queue_name",
    "account": "account",
    "reservation": "reservation_id",
}
_ACCEPTED_ATTRIBUTES = ", ".join(_ATTRIBUTE_FIELDS) + " or <executor>.<option>"

ATTRIBUTE_HELP = ("--attr keys:\n"
                  "  duration=WALLTIME    hh:mm:ss, hh:mm, mm, or N followed by h, m or s\n"
                  "  queue=NAME, account=NAME, reservation=ID\n"
                  "  EXECUTOR.OPTION=VALUE  a custom attribute used only by that executor,\n"
                  "                       e.g. slurm.qos=debug\n"
                  "  psij.priority=N      higher goes first; psij.tmp=BYTES temporary disk\n"
                  "                       per node (numbers, checked on every executor)")


def add_job_options(parser: "argparse.ArgumentParser") -> None:
    """The options describing a job, shared by ``run``, ``script``, ``submit`` and
    ``flow create``."""
    import argparse

    parser.add_argument("--launcher", metavar="NAME",
                        help="launcher that starts the job's processes (default: single)")
    parser.add_argument("-n", "--processes", type=positive_int, metavar="N",
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


def build_attributes(assignments: Sequence[str]) -> "JobAttributes":
    """JobAttributes from ``--attr`` values (``duration=10m``, ``queue=debug``, ``slurm.qos=x``)."""
    from psij._declared_attributes import from_text
    from psij.job_attributes import JobAttributes

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
               copies: Optional[OutputCopies] = None) -> "JobSpec":
    """The JobSpec described by parsed ``psij run`` or ``psij script`` arguments.

    With ``inherit_streams`` the job gets this process's standard streams where no file is
    named (``run``; through ``copies`` where the executor would truncate them, see
    :mod:`psij.cli._job_streams`); without, those streams are left unset (``script``: the job
    runs elsewhere, later). Raises UsageError, StreamRefused, or the ValueError/TypeError/
    InvalidJobException of the core classes.
    """
    from psij.job_spec import JobSpec
    from psij.resource_spec import ResourceSpecV1

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


def check_launcher(name: Optional[str]) -> None:
    """Refuse (with the registry's ValueError) a launcher that is not installed."""
    # Asked here so that a misspelt launcher is a usage error before anything is submitted.
    if name is not None:
        from psij._plugins import REGISTRY

        REGISTRY.select("launcher", name)
