"""``psij remote serve`` (the remote side of an ``ssh://`` executor, started by the client
through ssh) and ``psij --host [user@]host[:port] COMMAND ...`` (any command run by the psij of
that host, over the same kind of SSH connection: ``psij --host me@cluster submit ...``)."""

import sys
from typing import TYPE_CHECKING, List, Optional, Tuple

from psij._spawn import popen
from psij.cli._common import EXIT_CANCELED, EXIT_USAGE, say

if TYPE_CHECKING:
    import argparse

HELP = "serve this host's executors to psij on another machine (run through ssh)"


def add_remote_command(commands: "argparse._SubParsersAction[argparse.ArgumentParser]"
                       ) -> None:
    parser = commands.add_parser("remote", help=HELP, description=(
        "The remote side of an executor reached with url='ssh://...': 'psij remote serve' "
        "reads requests on standard input and answers on standard output. A client starts "
        "it through ssh; it is not meant to be run by hand."))
    verbs = parser.add_subparsers(dest="remote_command", metavar="VERB")
    verbs.add_parser("serve", help="speak the remote protocol on standard input and output")


def remote_main(args: "argparse.Namespace") -> int:
    if getattr(args, "remote_command", None) != "serve":
        say("a verb is required: serve", "remote")
        return EXIT_USAGE
    return serve_main()


def serve_main() -> int:
    from psij.remote._server import serve

    return serve()


def split_host(argv: List[str]) -> Optional[Tuple[str, List[str]]]:
    """(host, the rest) when ``argv`` starts with ``--host HOST`` or ``--host=HOST``."""
    if argv[:1] == ["--host"] and len(argv) >= 2:
        return argv[1], argv[2:]
    if argv and argv[0].startswith("--host="):
        return argv[0][len("--host="):], argv[1:]
    return None


def host_main(host: str, rest: List[str]) -> int:
    """Run ``psij REST...`` on ``host`` through ssh, with this terminal's streams; its status."""
    from psij.remote._target import parse

    if not rest:
        say("a command to run there is required (psij --host HOST submit ...)", "--host")
        return EXIT_USAGE
    try:
        target = parse(host if host.lower().startswith("ssh://") else f"ssh://{host}")
    except (TypeError, ValueError) as ex:
        say(str(ex), "--host")
        return EXIT_USAGE
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        proc = popen(target.argv(rest), env=None, stdin=0, stdout=1, stderr=2, session=False)
    except OSError as ex:
        say(f"cannot run {target.ssh[0]!r}: {ex.strerror or ex}", "--host")
        return EXIT_USAGE
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return EXIT_CANCELED  # 130, as a shell reports a command ended by SIGINT
