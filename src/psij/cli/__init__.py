"""The ``psij`` command: read the command line, build the parser of the command it names, and
hand the parsed arguments to that command's module.

Each command family has its own module, imported here only when its command is named (or when
the whole parser is built, by code that asks for it), so that a short command loads only what it
uses; a line naming no command (``psij --help``, a mistyped command) is parsed with each command
as one line of help from a table kept here, and ``psij --version`` builds no parser at all. The
families: ``_plugins`` (``psij plugins``), ``_run`` (``psij run``), ``_script`` (``psij script``),
``_jobs`` (``submit``, ``status``, ``wait``, ``cancel``, ``priority``, ``list``, ``attach``,
``release``), ``_report`` (``psij report``),
``_config``, ``_supervise``, ``_pilot`` and ``_flow``. They share ``_common`` (exit codes,
reporting, help formatters), ``_job_options`` (the options describing a job and the JobSpec
they build), ``_names`` (the jobs a command line names), ``_job_streams``, ``_wait_progress``
and ``_broken_pipe``. The dependency goes one
way: this module imports the families, the families import the shared modules, and no module of
the package imports this one. Nothing here runs a job itself, and nothing here is imported by
``import psij``.

:func:`main` is the console script's entry point and the one public name; the other names below
stay importable from here for code written against the single-module command.
"""

import sys
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

# EXIT_*, UsageError and exit_status stay importable from here, as with the single-module
# command (re-exported by name); the job-building names of _KEPT_ON_USE on first use.
from psij.cli._common import EXIT_BROKEN_PIPE as EXIT_BROKEN_PIPE
from psij.cli._common import EXIT_CANCELED as EXIT_CANCELED
from psij.cli._common import EXIT_FAILED as EXIT_FAILED
from psij.cli._common import EXIT_USAGE as EXIT_USAGE
from psij.cli._common import UsageError as UsageError
from psij.cli._common import exit_status as exit_status
from psij.cli._common import formatters, say
from psij.version import __version__

if TYPE_CHECKING:
    import argparse

__all__ = ["main"]

# Loaded with _job_options, only when asked for: ``import psij.cli`` stays light.
_KEPT_ON_USE = ("DEFAULT_EXECUTOR", "build_attributes", "build_environment", "build_spec")

# The registry commands of ``_jobs`` (its handlers, one per name), known here without loading it.
_JOB_COMMANDS = ("submit", "status", "wait", "cancel", "priority", "list", "attach",
                 "release")
_COMMANDS = ("plugins", "run", "script", "pilot", "flow", "config", *_JOB_COMMANDS, "report",
             "supervise", "remote")
_PILOT_COMMANDS = ("serve", "run")

# Each command with its line in ``psij --help``, in the order listed there: the parser of a
# line naming no command is built from this table alone, without loading any family's module.
# The families give their commands the same help (tests/test_cli_layout.py checks).
_COMMAND_LINES = (
    ("plugins", "list executors and launchers with versions, files and load errors"),
    ("run", "run one job and exit with its exit code"),
    ("script", "print the submit script a job would get, without submitting it"),
    ("submit", "submit one job, print its id and return at once"),
    ("status", "show the current state of recorded jobs"),
    ("wait", "wait until recorded jobs are final"),
    ("cancel", "cancel recorded jobs"),
    ("priority", "change the priority of recorded jobs"),
    ("list", "list recorded jobs as last recorded"),
    ("attach", "adopt a job submitted elsewhere into the registry"),
    ("release", "submit jobs psij held back in a process that has ended"),
    ("report", "summarize what happened to jobs: states, causes, waits, run times, efficiency"),
    ("config", "show the site defaults in effect and where each comes from"),
    ("supervise", "run a server job and the client jobs it asks for, restarting it when it dies"),
    ("pilot", "run many tasks inside one allocation"),
    ("flow", "keep N jobs running: the flow service and its client"),
    ("remote", "serve this host's executors to psij on another machine (run through ssh)"),
)


def __getattr__(name: str) -> Any:
    """The names of ``_KEPT_ON_USE``, from the module that defines them."""
    if name in _KEPT_ON_USE:
        from psij.cli import _job_options

        return getattr(_job_options, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    names (building every parser costs a noticeable part of a short command's run), or, when
    the line names none (``psij --help``, a mistyped command), every command as one line of
    ``_COMMAND_LINES`` with no options of its own; without the line, every command in
    full."""
    import argparse

    command = None if argv is None else _named(argv, _COMMANDS)
    parser = argparse.ArgumentParser(
        prog="psij", formatter_class=formatters()[0],
        description="Portable job submission (PSI/J): run jobs locally or through a batch "
                    "scheduler, and inspect the installed executors and launchers.")
    parser.add_argument("--version", action="version", version=f"psij {__version__}")
    parser.add_argument("--host", metavar="[USER@]HOST[:PORT]", default=argparse.SUPPRESS,
                        help="run the command with the psij of another host, over ssh "
                             "(first option only)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command is None and argv is not None:
        for name, line in _COMMAND_LINES:
            commands.add_parser(name, help=line, add_help=False)
        return parser
    if command in (None, "plugins"):
        from psij.cli._plugins import add_plugins_command

        add_plugins_command(commands)
    if command in (None, "run"):
        from psij.cli._run import add_run_command

        add_run_command(commands)
    if command in (None, "script"):
        from psij.cli._script import add_script_command

        add_script_command(commands)
    if command is None or command in _JOB_COMMANDS:
        from psij.cli._jobs import add_job_commands

        add_job_commands(commands, command)
    if command in (None, "report"):
        from psij.cli._report import add_report_command

        add_report_command(commands)
    if command in (None, "config"):
        from psij.cli._config import add_config_command

        add_config_command(commands)
    if command in (None, "supervise"):
        from psij.cli._supervise import add_supervise_command

        add_supervise_command(commands)
    if command in (None, "pilot"):
        from psij.cli._pilot import add_pilot_commands

        if command is None:
            add_pilot_commands(commands)
        elif argv is not None:
            words = list(argv)
            add_pilot_commands(commands, _named(words[words.index("pilot") + 1:],
                                                 _PILOT_COMMANDS))
    if command in (None, "flow"):
        from psij.cli._flow import FLOW_VERBS, add_flow_commands

        if command is None:
            add_flow_commands(commands)
        elif argv is not None:
            words = list(argv)
            add_flow_commands(commands, _named(words[words.index("flow") + 1:], FLOW_VERBS))
    if command in (None, "remote"):
        from psij.cli._remote import add_remote_command

        add_remote_command(commands)
    return parser


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
        from psij.cli._broken_pipe import silence_stdout, stdout_reader_gone

        if not stdout_reader_gone():
            raise
        silence_stdout()
        return EXIT_BROKEN_PIPE


def _main(argv: Optional[List[str]]) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--version"]:  # what argparse would print, without building a parser
        print(f"psij {__version__}")
        return 0
    if argv[:2] == ["remote", "serve"] and len(argv) == 2:
        from psij.cli._remote import serve_main

        return serve_main()
    if argv[:1] == ["--host"] or (argv[:1] and argv[0].startswith("--host=")):
        from psij.cli._remote import host_main, split_host

        split = split_host(argv)
        if split is not None:
            return host_main(*split)
    if argv[:1] == ["pilot"]:
        from psij.cli._pilot import pilot_main, plain_pilot_run

        plain = plain_pilot_run(argv)
        if plain is not None:
            return pilot_main(plain)
    parser = _build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as ex:  # --help, --version and usage errors end parsing this way
        return ex.code if isinstance(ex.code, int) else EXIT_USAGE
    return _dispatch(args, parser)


def _dispatch(args: "argparse.Namespace", parser: "argparse.ArgumentParser") -> int:
    """Hand the parsed command line to the module of the command it names."""
    if args.command == "plugins":
        from psij.cli._plugins import plugins_main

        return plugins_main()
    if args.command == "run":
        from psij.cli._run import run_main

        return run_main(args)
    if args.command == "script":
        from psij.cli._script import script_main

        return script_main(args)
    if args.command == "pilot":
        from psij.cli._pilot import pilot_main

        return pilot_main(args)
    if args.command == "flow":
        from psij.cli._flow import flow_main

        return flow_main(args)
    if args.command in _JOB_COMMANDS:
        from psij.cli._jobs import jobs_main

        return jobs_main(args)
    if args.command == "report":
        from psij.cli._report import report_main

        return report_main(args)
    if args.command == "config":
        from psij.cli._config import config_main

        return config_main(args)
    if args.command == "supervise":
        from psij.cli._supervise import supervise_main

        return supervise_main(args)
    if args.command == "remote":
        from psij.cli._remote import remote_main

        return remote_main(args)
    parser.print_usage(sys.stderr)
    say(f"a command is required: {', '.join(_COMMANDS)}")
    return EXIT_USAGE
