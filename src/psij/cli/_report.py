"""``psij report``: what happened to a set of jobs, in the terminal or as one HTML file.

The jobs are those of the registry chosen as ``psij list`` chooses them (ids as ``psij
status`` takes them, ``--tag``, ``--executor``, ``--state``) and submitted within ``--since``
and ``--until``; or the tasks of a pilot run (``--pilot``: its ``jobs.report``, its journal
or its working directory). The figures are computed by :mod:`psij.report`; ``--html`` writes
the self-contained page, which needs the ``psij[report]`` extra (matplotlib), loaded only
then. The registry is only read: no executor is asked, so a job not final is shown as last
recorded.

Imports the shared modules of :mod:`psij.cli` (``_common``, ``_names``) and no other
command's.
"""

import sys
from pathlib import Path
from typing import Any, List, Tuple

from psij.cli._common import EXIT_FAILED, EXIT_USAGE, add_command, say

__all__ = ["add_report_command", "report_main"]

_LINE = "summarize what happened to jobs: states, causes, waits, run times, efficiency"
_EPILOG = (
    "Figures: counts by state and by cause; queue wait (start - queued, or - submitted when "
    "the scheduler's queue time is unknown) and run time as p50/p90/p99/max; CPU efficiency "
    "(CPU time / (cores x elapsed)) and memory efficiency (peak RSS / requested memory) as "
    "Slurm's seff computes them, with the lowest jobs named; core-hours used and requested. "
    "A figure no run knows is printed as 'unknown', never 0. "
    "Exit status: 0 when the report was made; 1 when no job matches, the registry or pilot "
    "files cannot be read, the HTML file cannot be written or the psij[report] extra is "
    "missing; 2 for bad usage.")


def add_report_command(commands: Any) -> None:
    report = add_command(
        commands, "report", _LINE,
        "Summarize what happened to recorded jobs (chosen as psij list chooses them) or to "
        "the tasks of a pilot run: in the terminal, and with --html as one self-contained "
        "HTML file (timeline, cores busy, histograms, efficiency per job, failures).",
        epilog=_EPILOG)
    report.add_argument("ids", nargs="*", metavar="ID",
                        help="job ids as psij status takes them (default: every job chosen "
                             "by the options)")
    report.add_argument("--tag", metavar="TAG", help="only jobs with this tag")
    report.add_argument("--executor", metavar="NAME", help="only this executor's jobs")
    report.add_argument("--state", metavar="STATE", action="append",
                        help="only jobs in this state (repeatable)")
    report.add_argument("--since", metavar="WHEN",
                        help="only jobs submitted at or after WHEN: ISO 8601 (2026-12-08, "
                             "2026-12-08T10:30, local time unless a zone is given) or an age "
                             "(90m, 2h, 7d ago)")
    report.add_argument("--until", metavar="WHEN", help="only jobs submitted at or before WHEN")
    report.add_argument("--pilot", metavar="PATH",
                        help="report on a pilot run instead: its jobs.report, its journal "
                             "(psij-pilot.journal) or its working directory")
    report.add_argument("--html", metavar="FILE",
                        help="also write the report as one self-contained HTML file (0600; "
                             "needs pip install 'psij[report]')")
    report.add_argument("--title", metavar="TEXT", help="the title of the report")


def _runs(args: Any) -> Tuple[List[Any], str, bool]:
    from psij.report import from_pilot, from_registry, parse_time

    if args.pilot is not None:
        mixed = [name for name, value in (("ID", args.ids), ("--tag", args.tag),
                                          ("--executor", args.executor),
                                          ("--since", args.since), ("--until", args.until))
                 if value]
        if mixed:
            raise ValueError(f"--pilot reports on a pilot run's tasks; {', '.join(mixed)} "
                             "choose registry jobs and cannot be used with it")
        path = Path(args.pilot)
        runs = from_pilot(path)
        if args.state:
            from psij.report._runs import STATE_ORDER

            wanted = {s.upper() for s in args.state}
            unknown = sorted(wanted - set(STATE_ORDER))
            if unknown:
                raise ValueError(f"--state: {unknown[0]!r} is not a state of a pilot's task; "
                                 f"accepted: {', '.join(STATE_ORDER)}")
            runs = [r for r in runs if r.state in wanted]
        return runs, f"pilot run {path.resolve()}", True
    ids = None
    if args.ids:
        from psij.cli._names import resolve

        ids = resolve(args.ids)
    since = None if args.since is None else parse_time("--since", args.since)
    until = None if args.until is None else parse_time("--until", args.until)
    runs = from_registry(ids, args.tag, args.executor, args.state, since, until)
    from psij import registry

    chosen = [f"tag {args.tag!r}" if args.tag else "", f"executor {args.executor}"
              if args.executor else "", f"state {'/'.join(args.state)}" if args.state else "",
              f"since {args.since}" if args.since else "",
              f"until {args.until}" if args.until else "",
              f"{len(ids)} named" if ids else ""]
    what = "; ".join(c for c in chosen if c) or "all jobs"
    return runs, f"registry {registry.registry_file()} ({what})", False


def report_main(args: Any) -> int:
    from psij.registry import RegistryError
    from psij.report import SourceError, summarize, text_report

    try:
        runs, source, pilot = _runs(args)
    except (RegistryError, SourceError) as ex:
        say(str(ex), "report")
        return EXIT_FAILED
    except (ValueError, TypeError) as ex:
        say(str(ex), "report: error")
        return EXIT_USAGE
    if not runs:
        say(f"no job to report on in the {source}", "report")
        return EXIT_FAILED
    title = args.title or ("psij report: pilot run" if pilot else "psij report")
    summary = summarize(runs)
    sys.stdout.write(text_report(summary, f"{title}\n  {source}"))
    sys.stdout.flush()
    if args.html is None:
        return 0
    return _write_html(args.html, runs, summary, title, source, pilot)


def _write_html(target: str, runs: List[Any], summary: Any, title: str, source: str,
                pilot: bool) -> int:
    import os

    from psij.report import html_report, write_html

    try:
        page = html_report(runs, title, source, pilot, summary)
    except ImportError as ex:
        say(str(ex), "report")
        return EXIT_FAILED
    try:
        write_html(target, page)
    except OSError as ex:
        say(f"--html: cannot write {target}: {ex.strerror or ex}", "report")
        return EXIT_FAILED
    say(f"wrote {os.path.abspath(target)} ({len(page.encode('utf-8')) / 1e6:.2f} MB)",
        "report")
    return 0
