"""The ``psij flow`` commands: ``serve`` starts the flow service, every other one is a client
of it (one request of the wire protocol, its answer printed as JSON on standard output).

Exit status: 0 when the service said ok; 1 when it refused (its error is printed on standard
error as ``psij flow VERB: MESSAGE [CODE]``) or cannot be reached; 2 for bad usage.

The flows themselves are :mod:`psij.flows`; this module only reads the command line, sends and
prints. It imports the shared modules of :mod:`psij.cli` (``_common``, ``_job_options``) and no
other command's.
"""

import json
import sys
from typing import Any, Dict, List, Optional

from psij.cli._common import UsageError, add_command

__all__ = ["FLOW_VERBS", "add_flow_commands", "flow_main"]

FLOW_VERBS = ("create", "grow", "shrink", "renew", "status", "problems", "instances", "output",
              "delete", "destroy", "upload", "list", "watch", "serve")

_SIMPLE = {
    "status": "show whether a handle is valid and its counts and leases",
    "problems": "list a handle's problems (machine-parsable codes with a message each)",
    "instances": "list the ended instances of a handle (ids, exit codes, classes, times)",
    "destroy": "kill every instance of a handle, remove its queued jobs, end it",
}


def _seconds(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (a number), got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _count(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def add_flow_commands(commands: Any, only: Optional[str] = None) -> None:
    """The ``flow`` group (only the subcommand ``only`` when given)."""
    from psij.cli._job_options import add_job_options

    flow = add_command(
        commands, "flow", "keep N jobs running: the flow service and its client",
        "Flows keep a number of instances of one job running on an executor, replacing those "
        "that end. 'serve' runs the service; the other commands send it one request each and "
        "print its answer as JSON.",
        epilog="exit status: 0 when the service answered ok; 1 when it refused or cannot be "
               "reached; 2 for bad usage")
    verbs = flow.add_subparsers(dest="flow_command", metavar="FLOW_COMMAND")
    parsers: Dict[str, Any] = {}

    def verb(name: str, text: str, usage: Optional[str] = None) -> Any:
        if only not in (None, name):
            return None
        parser = add_command(verbs, name, text, text + ".", usage=usage)
        if name != "serve":
            parser.add_argument("--socket", metavar="PATH",
                                help="the service's socket (default: $PSIJ_FLOW_SOCKET, "
                                     "~/.psij/flow/flow.sock, /run/psij-flow/flow.sock)")
        parsers[name] = parser
        return parser

    p = verb("create", "create a handle keeping N instances of a job running",
             usage="psij flow create --count N --executor NAME [options] [--] EXECUTABLE "
                   "[ARGUMENT ...]")
    if p is not None:
        p.add_argument("--count", type=_count, required=True, metavar="N")
        p.add_argument("--executor", required=True, metavar="NAME",
                       help="the executor the instances are submitted to (local, slurm, ...)")
        p.add_argument("--lease", type=_seconds, metavar="S", help="cleanup lease asked for")
        p.add_argument("--provisioning-lease", type=_seconds, metavar="S",
                       help="provisioning lease asked for")
        p.add_argument("--rate", type=_seconds, metavar="R", help="most restarts per second")
        p.add_argument("--max-count", type=_count, metavar="N")
        p.add_argument("--payload", metavar="FILE|SHA256",
                       help="an executable uploaded first (or a payload's sha256); it replaces "
                            "EXECUTABLE, whose arguments it gets")
        p.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                       help="any other field of the create request (repeatable), e.g. "
                            "quota_bytes=1000000")
        add_job_options(p)
    p = verb("grow", "ask for N more instances")
    if p is not None:
        p.add_argument("handle")
        p.add_argument("n", type=_count)
    p = verb("shrink", "ask for N fewer instances")
    if p is not None:
        p.add_argument("handle")
        p.add_argument("n", type=_count)
        p.add_argument("--victims", default="not_running",
                       choices=("not_running", "shortest", "longest"))
        p.add_argument("--signal", default="SIGTERM", metavar="SIG")
        p.add_argument("--grace", type=_seconds, metavar="S",
                       help="kill victims still running after S seconds (default: never)")
    p = verb("renew", "extend a handle's leases")
    if p is not None:
        p.add_argument("handle")
        p.add_argument("--lease", type=_seconds, metavar="S")
        p.add_argument("--provisioning-lease", type=_seconds, metavar="S")
    for name, text in _SIMPLE.items():
        p = verb(name, text)
        if p is not None:
            p.add_argument("handle")
    p = verb("output", "print the stdout or stderr of an ended instance")
    if p is not None:
        p.add_argument("handle")
        p.add_argument("instance")
        p.add_argument("--stream", default="stdout", choices=("stdout", "stderr"))
        p.add_argument("--max-bytes", type=_count, default=1024 * 1024, metavar="N")
    p = verb("delete", "forget instance records and remove their output")
    if p is not None:
        p.add_argument("handle")
        p.add_argument("ids", nargs="+", metavar="ID")
    p = verb("upload", "store an executable payload; prints its sha256")
    if p is not None:
        p.add_argument("file")
    verb("list", "list your handles (ended ones too, while the service keeps them)")
    p = verb("watch", "wait until one of your handles (or HANDLE) changes; prints the "
                      "change's number, to give as --after next")
    if p is not None:
        p.add_argument("handle", nargs="?")
        p.add_argument("--after", type=_count, default=0, metavar="N",
                       help="wait for a change later than N (default 0: any change made)")
    p = verb("serve", "run the flow service on a Unix socket until SIGTERM or SIGINT")
    if p is not None:
        from psij.flows.service import add_serve_options

        add_serve_options(p)


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def flow_main(args: Any) -> int:
    """Run a parsed ``psij flow`` command."""
    from psij.flows.client import FlowClient, FlowError

    command = getattr(args, "flow_command", None)
    if command is None:
        print("psij flow: a command is required: " + ", ".join(FLOW_VERBS), file=sys.stderr)
        return 2
    if command == "serve":
        from psij.flows.service import serve_main

        return serve_main(args)
    try:
        request = _request(args)
    except (ValueError, OSError) as ex:
        print(f"psij flow {command}: {ex}", file=sys.stderr)
        return 2
    try:
        # A watch waits as long as nothing changes (Ctrl+C stops it).
        with FlowClient(args.socket, timeout=None if command == "watch" else 60.0) as client:
            if command == "create" and request.pop("_upload", None):
                request["payload"] = client.upload(request["payload"])
            reply = client.request(command, **request)
    except FlowError as ex:
        print(f"psij flow {command}: {ex}", file=sys.stderr)
        return 1
    if command == "output":
        sys.stdout.write(str(reply.get("data", "")))
        return 0
    reply.pop("id", None)
    reply.pop("ok", None)
    _print(reply)
    return 0


def _request(args: Any) -> Dict[str, Any]:
    command = args.flow_command
    fields: Dict[str, Any] = {}
    for name in ("handle", "n", "victims", "signal", "grace", "lease", "instance", "stream",
                 "max_bytes", "ids", "after"):
        if hasattr(args, name):
            value = getattr(args, name)
            if value is not None or name == "grace":
                fields[name] = value
    if getattr(args, "provisioning_lease", None) is not None:
        fields["provisioning_lease"] = args.provisioning_lease
    if command == "upload":
        import base64
        from pathlib import Path

        return {"data": base64.b64encode(Path(args.file).read_bytes()).decode("ascii")}
    if command == "create":
        fields.update(_create_fields(args))
    return fields


def _create_fields(args: Any) -> Dict[str, Any]:
    import os
    import re

    from psij.cli._job_options import build_spec
    from psij.serialize import JSONSerializer

    fields: Dict[str, Any] = {"count": args.count, "executor": args.executor}
    command: List[str] = list(args.job_command)
    if command and command[0] == "--":
        command = command[1:]
    if args.payload is not None and not command:
        args.job_command = ["payload"]
    try:
        spec = build_spec(args, inherit_streams=False)
    except UsageError as ex:
        raise ValueError(str(ex)) from ex
    fields["spec"] = json.loads(JSONSerializer().dumps(spec))
    for name in ("rate", "max_count"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    if args.payload is not None:
        if re.fullmatch(r"[0-9a-f]{64}", args.payload) and not os.path.exists(args.payload):
            fields["payload"] = args.payload
        else:
            fields["payload"] = os.path.abspath(args.payload)
            fields["_upload"] = True
    for text in args.option:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise ValueError(f"--option: expected KEY=JSON, got {text!r}")
        try:
            fields[key] = json.loads(value)
        except ValueError as ex:
            raise ValueError(f"--option {key}: the value is not JSON: {ex}") from ex
    return fields
