"""``psij status --runs ID``: the runs of one recorded job (its first, and each after a
requeue or retry), as a table or as JSON (:func:`psij.registry.runs`)."""

import json
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, List, Optional, Sequence

if TYPE_CHECKING:
    import argparse

    from psij.registry import RunRecord

__all__ = ["HELP", "JSON_HELP", "print_runs"]

HELP = ("list the runs of one job instead (its first, and each after a requeue or retry): "
        "a table, or JSON with --json")
JSON_HELP = ("With --runs, --json prints a JSON array with one object per run: job_id, run "
             "(1, 2, ...), native_id, state, exit_code, cause, message, updated, queued_at, "
             "started_at, ended_at, held_from, held_to (ISO 8601, UTC, or null), "
             "cpu_seconds, max_rss_bytes, nodes, cores, requested_memory_bytes, "
             "requested_seconds, stdout_path and stderr_path (where that run's output is: "
             "<path>.<run> for an earlier run of a batch job).")
_HEAD = ("RUN", "NATIVE_ID", "STATE", "EXIT", "CAUSE", "STARTED", "WAIT_S", "RUN_S", "CPU_S",
         "MAX_RSS", "NODES", "STDOUT")


def print_runs(args: "argparse.Namespace") -> int:
    """Print the runs of the one job ``args.ids`` names (as every command names jobs, or by
    the native id of one of its earlier runs); ValueError for anything else."""
    from psij import registry
    from psij.cli._names import resolve

    ids = list(args.ids or [])
    if args.tag is not None or getattr(args, "all", False) or len(ids) != 1:
        raise ValueError("--runs: name exactly one job (its psij id, a prefix of it, or its "
                         "native id), not --tag or --all")
    try:
        [job_id] = resolve(ids)
    except ValueError:
        # The native id of an earlier run (psij submitted the next one under a new id).
        found = _of_earlier_run(ids[0])
        if found is None:
            raise
        job_id = found
    runs = registry.runs(job_id)
    if args.json:
        sys.stdout.write(json.dumps([r.to_json() for r in runs], indent=1) + "\n")
    else:
        _table(runs)
    return 0


def _of_earlier_run(word: str) -> Optional[str]:
    """The one job an earlier run of which had the native id ``word``, else None."""
    from psij import registry
    from psij._registry.store import open_store

    jobs = open_store(registry._work_directory(None)).run_jobs(word)
    return jobs[0] if len(jobs) == 1 else None


def _cell(text: Optional[str]) -> str:
    """``text`` on one line, control characters (a terminal's escapes) shown escaped."""
    if not text:
        return ""
    words = " ".join(text.split())
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in words)


def _table(runs: "List[RunRecord]") -> None:
    rows = [(str(r.run), _cell(r.native_id) or "-", r.state, _number(r.exit_code),
             _cell(r.cause) or "-", _time(r.started_at), _span(r.queued_at, r.started_at),
             _span(r.started_at, r.ended_at), _seconds(r.cpu_seconds), _size(r.max_rss_bytes),
             _cell(r.nodes) or "-", _cell(r.stdout_path) or "-") for r in runs]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(_HEAD)]
    last = len(_HEAD) - 1

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:last], widths)) + "  " + cells[last]
    sys.stdout.write("\n".join([line(_HEAD), *(line(row) for row in rows)]) + "\n")


def _number(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


def _time(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(start: Optional[float], end: Optional[float]) -> str:
    if start is None or end is None or end < start:
        return "-"
    return f"{end - start:.1f}"


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def _size(value: Optional[int]) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{value}B" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{value}B"  # (not reached)
