"""The ``psij pilot`` commands' options (``serve``, ``run``) and their dispatch.

A plain ``psij pilot run`` line is read here without argparse (:func:`plain_pilot_run`), and
the pilot's modules are loaded only for a pilot command. Nothing here starts a pilot itself:
``run`` and ``serve`` are handed to :mod:`psij.executors.pilot.qcg.run` and
:mod:`psij.executors.pilot.service`. It imports only :mod:`psij.cli._common` of the command's
modules, and nothing at import that a pilot's start-up would pay for.
"""

from types import SimpleNamespace
from typing import Any, Dict, Optional, Sequence

from psij.cli._common import EXIT_USAGE, add_command, positive_int, say, whole_number

__all__ = ["add_pilot_commands", "pilot_main", "plain_pilot_run"]


def add_pilot_commands(commands: Any, only: Optional[str] = None) -> None:
    """The ``pilot`` group; each of its subcommands is added by one function below (``only``
    that one when given)."""
    pilot = add_command(
        commands, "pilot", "run many tasks inside one allocation",
        "Pilot commands: schedule many tasks inside one allocation (this machine, or the nodes "
        "of the Slurm, PBS, Grid Engine or LSF job this runs in).")
    pilot_commands = pilot.add_subparsers(dest="pilot_command", metavar="PILOT_COMMAND")
    if only in (None, "serve"):
        _add_pilot_serve(pilot_commands)
    if only in (None, "run"):
        _add_pilot_run(pilot_commands)
    if only in (None, "status"):
        _add_pilot_status(pilot_commands)


def _add_pilot_status(pilot_commands: Any) -> None:
    status = add_command(
        pilot_commands, "status", "show an elastic served pilot's allocations and backlog",
        "Show the allocations of a pilot served with --allocation-policy: each one's state "
        "(submitting, pending, running, draining, ended), native id, nodes, why it was asked "
        "for and why it ended or was given back; the tasks waiting for room (backlog); and "
        "why the pilot stopped asking for allocations, if it did.",
        epilog="exit status: 0 when shown; 1 when the pilot does not answer or has no "
               "allocation policy")
    status.add_argument("--socket", required=True, metavar="PATH",
                        help="the pilot's Unix socket")
    status.add_argument("--json", action="store_true", help="print the status as JSON")


def _add_pilot_serve(pilot_commands: Any) -> None:
    serve = add_command(
        pilot_commands, "serve", "start a pilot that accepts tasks on a Unix socket",
        "Start a pilot on this allocation and serve it on a Unix socket (mode 0600) until "
        "SIGTERM or SIGINT, which cancel the running tasks and flush the journal. Submit into "
        "it with the 'pilot' executor and the socket as its URL (unix:///PATH). Refuses to "
        "start when a pilot already answers on the socket; a stale socket file is replaced.",
        epilog="exit status: 0 after a clean stop; 1 when the pilot is already running or "
               "cannot start; 2 for bad usage")
    from psij.executors.pilot._serve_options import add_serve_options

    add_serve_options(serve, positive_int)


def _add_pilot_run(pilot_commands: Any) -> None:
    run = add_command(
        pilot_commands, "run",
        "run a QCG-PilotJob request file and exit when every request is handled",
        "Start a pilot on this allocation and handle the requests of a QCG-PilotJob\n"
        "request file (a JSON list of submit, control, jobStatus, jobInfo, cancelJob,\n"
        "removeJob, listJobs, resourcesInfo and finish requests) in file order, one\n"
        "by one as QCG-PilotJob does: a request that cannot run gets an error\n"
        "response and the others still run (--check checks them all instead).\n"
        "After the last request the pilot waits for every task to end ('finish'\n"
        "stops at once instead). The working directory receives service.log (with\n"
        "every response as JSON), jobs.report (one entry per task and iterative job,\n"
        "written as they end) and the journal psij-pilot.journal.", keep_lines=True,
        epilog="exit status:\n"
               "  0        every request was handled (whatever the tasks' own outcomes)\n"
               "  1        the pilot could not run\n"
               "  2        bad usage: a file that is not a JSON list of requests, a bad option,\n"
               "           or with --check a request that cannot run (each one listed)\n"
               "  128+N    stopped by signal N (the tasks were cancelled, the report written)")
    run.add_argument("requests", metavar="REQUESTS.json", help="the request file")
    for option, (kind, metavar, text) in _PILOT_RUN_OPTIONS.items():
        if kind == "flag":
            run.add_argument(option, action="store_true", help=text)
        else:
            run.add_argument(option, metavar=metavar, help=text,
                             type=positive_int if kind == "count" else str)


# ``psij pilot run``'s options: (kind, metavar, help); what argparse builds and what
# :func:`plain_pilot_run` reads.
_PILOT_RUN_OPTIONS = {
    "--cores": ("count", "N", "local cores to use when not inside a batch allocation"),
    "--gpus": ("text", "N|IDS", "GPUs of this node: a count (the first ones found, else ids 0 "
                                "to N-1) or a list of ids such as 0,2,3 (default: those "
                                "found; see the pilot documentation)"),
    "--nodes": ("text", "SPEC", "explicit nodes, NAME:CORES separated by commas (Slurm host "
                                "lists allowed, e.g. n[1-4]:8); nodes other than this host are "
                                "reached through agents"),
    "--wd": ("text", "DIR", "working directory: base of relative task directories, and where "
                            "service.log, jobs.report and the journal go (default: the "
                            "current one)"),
    "--resume": ("flag", "", "read the journal of an earlier run in the same --wd first: "
                             "tasks that succeeded are not run again, the others are"),
    "--check": ("flag", "", "check and plan every request, list each one that cannot run "
                            "with its index, and run nothing (exit status 2 if any)"),
    "--emulate-slurm": ("flag", "", "give tasks the SLURM_* variables of their share even "
                                    "outside a Slurm allocation"),
}


def plain_pilot_run(argv: Sequence[str]) -> Optional[SimpleNamespace]:
    """The arguments of a plain ``pilot run`` line, as argparse would read them, without
    loading argparse (a pilot's start-up is measured in milliseconds): the request file and
    the options of :data:`_PILOT_RUN_OPTIONS`, each value after its option or after ``=``.
    None for any other line (help, an error, an abbreviation, ``--``, a value that looks like
    an option), which argparse then reads and reports."""
    if len(argv) < 3 or argv[0] != "pilot" or argv[1] != "run":
        return None
    values: Dict[str, Any] = {"requests": None, "cores": None, "gpus": None, "nodes": None,
                              "wd": None,
                              "resume": False, "check": False, "emulate_slurm": False}
    words = iter(argv[2:])
    for word in words:
        if not word.startswith("-"):
            if values["requests"] is not None:
                return None
            values["requests"] = word
            continue
        option, given, value = word.partition("=")
        kind = _PILOT_RUN_OPTIONS.get(option, ("",))[0]
        if kind == "flag" and not given:
            values[option[2:].replace("-", "_")] = True
            continue
        if kind not in ("count", "text"):
            return None
        if not given:
            following = next(words, None)
            if following is None or following.startswith("-"):
                return None
            value = following
        if kind == "count":
            number = whole_number(value)
            if number is None:
                return None
            values[option[2:]] = number
        else:
            values[option[2:]] = value
    if values["requests"] is None:
        return None
    return SimpleNamespace(command="pilot", pilot_command="run", **values)


def pilot_main(args: Any) -> int:
    if args.pilot_command == "run":
        from psij.executors.pilot.qcg.run import check_request_file, run_request_file

        if args.check:
            return check_request_file(args.requests, cores=args.cores, nodes=args.nodes,
                                      gpus=args.gpus)
        _freeze_loaded_objects()
        return run_request_file(args.requests, cores=args.cores, nodes=args.nodes, wd=args.wd,
                                resume=args.resume, emulate_slurm=args.emulate_slurm,
                                gpus=args.gpus)
    if args.pilot_command == "serve":
        from psij.executors.pilot.service import serve_main

        _freeze_loaded_objects()
        return serve_main(socket_path=args.socket, cores=args.cores, nodes=args.nodes,
                          work_directory=args.wd, resume=args.resume,
                          max_request_bytes=args.max_request_bytes, gpus=args.gpus,
                          allocation_policy=args.allocation_policy,
                          agent_host=args.agent_host)
    if args.pilot_command == "status":
        return _status(args.socket, args.json)
    say("a pilot command is required: serve, run or status")
    return EXIT_USAGE


def _status(path: str, as_json: bool) -> int:
    import json

    from psij.executors.pilot.service import PilotClient, PilotUnavailable

    try:
        client = PilotClient(path)
        try:
            status = client.request("allocations")["allocations"]
        finally:
            client.close()
    except (PilotUnavailable, OSError, ValueError, TimeoutError) as ex:
        say(str(ex), "pilot status")
        return 1
    if as_json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"backlog: {status['backlog']} tasks waiting for room")
    if status["stopped"]:
        print(f"stopped asking: {status['stopped']}")
    for a in status["allocations"]:
        print(f"{a['name']}  {a['state']:<10} {a['native_id'] or '-':<12} "
              f"nodes: {','.join(a['nodes']) or '-'}  asked: {a['asked_because']}"
              + (f"  ended: {a['ended_because']}" if a["ended_because"] else ""))
    return 0


def _freeze_loaded_objects() -> None:
    """Keep what is loaded so far (modules, classes, functions: they live as long as this
    pilot process) out of the garbage collector's passes, which then cost what the pilot's
    own objects cost, during the run and in the last pass at exit."""
    import gc

    gc.freeze()


