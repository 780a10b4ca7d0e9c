"""What happened to a set of jobs: the figures behind ``psij report``.

The report is computed from a list of :class:`JobRun` (one per run: its state, cause, times,
CPU time, peak memory, cores, requests), read from the job registry (:func:`from_registry`,
choosing jobs as ``psij list`` does) or from a pilot run (:func:`from_pilot`: its
``jobs.report`` or journal). :func:`summarize` gives the figures (counts by state and cause,
percentiles of wait and run time, CPU and memory efficiency as Slurm's ``seff`` computes
them, the worst jobs, core-hours, failures with their messages); :func:`text_report` formats
them for a terminal and :func:`html_report` makes the self-contained HTML page (with plots:
needs the ``psij[report]`` extra, matplotlib, imported only then).

``import psij`` does not load this package, and loading it does not load matplotlib.
"""

from typing import List, Optional

from psij.report._figures import Failure, Spread, Summary, percentile, summarize
from psij.report._runs import (
    JobRun,
    cpu_efficiency,
    held_seconds,
    memory_efficiency,
    run_seconds,
    wait_seconds,
)
from psij.report._sources import (
    SourceError,
    from_jobs_report,
    from_journal,
    from_pilot,
    from_registry,
    parse_time,
)
from psij.report._text import text_report

__all__ = ["Failure", "JobRun", "SourceError", "Spread", "Summary", "cpu_efficiency",
           "from_jobs_report", "from_journal", "from_pilot", "from_registry", "held_seconds",
           "html_report", "memory_efficiency", "parse_time", "percentile", "run_seconds",
           "summarize", "text_report", "wait_seconds", "write_html"]


def html_report(runs: List[JobRun], title: str, source: str = "", pilot: bool = False,
                summary: Optional[Summary] = None) -> str:
    """The HTML page of ``runs`` (``summary``: their :func:`summarize`, when made already);
    raises :class:`ImportError` saying how to install the ``psij[report]`` extra when
    matplotlib is missing."""
    from psij.report._html import html_report as page

    return page(runs, summary if summary is not None else summarize(runs), title, source,
                pilot)


def write_html(path: str, text: str) -> None:
    """Write a page made by :func:`html_report` to ``path``, 0600."""
    from pathlib import Path

    from psij.report._html import write_private

    write_private(Path(path), text)
