"""``psij supervise CONFIG.json``: run a server job and the client jobs it asks for (see
:mod:`psij.supervise`). The configuration is read and checked whole before anything is
submitted; each wrong field gives one line naming it and what is accepted. The supervision
itself is :func:`psij.supervise.run`; this module only reads the command line and the file, and
imports only :mod:`psij.cli._common` of the command's modules.
"""

import json
import sys
from typing import TYPE_CHECKING, Any, Optional

from psij.cli._common import EXIT_USAGE, add_command

if TYPE_CHECKING:  # loaded when the command runs, not with the command line
    import logging

__all__ = ["add_supervise_command", "supervise_main"]


def add_supervise_command(commands: Any) -> None:
    from psij.version import __version__

    parser = add_command(
        commands, "supervise",
        "run a server job and the client jobs it asks for, restarting it when it dies",
        "Submit the server job of CONFIG.json, submit the client jobs it asks for over its "
        "connection, tell it how they end, ping it, and when it dies cancel every job and "
        "submit a new server (fault_tolerance). Ctrl+C or SIGTERM cancel every job submitted. "
        "With --cleanup, only cancel the jobs that an earlier run in the same output_dir left "
        "behind.",
        epilog="exit status: 0 when the server finished (--cleanup: when every job left was "
               "cancelled); 1 when the study failed (--cleanup: when some job could not be "
               "settled); 2 for a bad configuration or usage; 130/143 after SIGINT/SIGTERM")
    parser.add_argument("config", nargs="?", metavar="CONFIG.json",
                        help="the study's configuration (a JSON object of options)")
    parser.add_argument("--print-options", action="store_true",
                        help="list every option with its default and meaning, and exit")
    parser.add_argument("--cleanup", action="store_true",
                        help="submit nothing: cancel the jobs the journal of output_dir names "
                             "as left behind by an earlier run (killed, or stopped while a "
                             "submission was running), wait for them to end (at most "
                             "stop_grace seconds), and exit")
    parser.add_argument("--version", action="version", version=f"psij {__version__}")


def _load(path: str) -> Any:
    from psij.supervise import ConfigError

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(16 * 1024 * 1024 + 1)
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError([f"{path}: cannot read: {error}"]) from None
    if len(text) > 16 * 1024 * 1024:
        raise ConfigError([f"{path}: larger than 16 MiB; not a configuration"])
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ConfigError([f"{path}: not JSON: {error}"]) from None


def _log_to_stderr(verbose: int) -> "Optional[logging.Handler]":
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("psij supervise: %(message)s"))
    handler.setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
    for name in ("psij.controller", "psij.supervise"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(handler.level)
    return handler


def supervise_main(args: Any) -> int:
    from psij.supervise import ConfigError, read_config, run
    from psij.supervise._config import options_text

    if args.print_options:
        print(options_text())
        return 0
    if args.config is None:
        print("psij supervise: a configuration file is required (see --print-options)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        document = _load(args.config)
        if args.cleanup and isinstance(document, dict) and "output_dir" not in document:
            raise ConfigError(["output_dir: --cleanup needs the output_dir of the run to "
                               "clean up (the configuration gives none, so each run made its "
                               "own)"])
        config = read_config(document)
        _log_to_stderr(config.verbose)
        return run(config, cleanup=args.cleanup)
    except KeyboardInterrupt:  # before the loop caught signals: nothing was submitted
        return 130
    except ConfigError as error:
        for problem in error.problems:
            print(f"psij supervise: {problem}", file=sys.stderr)
        return EXIT_USAGE
