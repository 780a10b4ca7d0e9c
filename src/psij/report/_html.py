"""The report as one self-contained HTML page: the figures of the terminal report as tables,
the plots of :mod:`psij.report._plots` as inline SVG, the failures with their messages.

The page loads nothing: no script, no font, no style sheet or image from elsewhere (images are
``data:`` URLs inside the SVG); its Content-Security-Policy forbids any fetch, so it opens the
same without a network. Every text that comes from a job (names, messages, causes) is escaped.
The file is written 0600, through a new file in the same directory renamed into place.
"""

import html
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from psij.report._figures import Summary
from psij.report._plots import COLOURS, Plots, colour
from psij.report._runs import JobRun
from psij.report._text import UNKNOWN, duration, hours, percent, spread_cells, when

__all__ = ["html_report", "write_private"]

_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        "base-uri 'none'; form-action 'none'")
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;
color:#222;max-width:1040px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:28px;
border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#666;font-size:12px}.chip{display:inline-block;width:10px;height:10px;
margin-right:4px;border-radius:2px}
svg{max-width:100%;height:auto}.msg{font-family:ui-monospace,monospace;font-size:12px;
white-space:pre-wrap;word-break:break-word}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()
           ) -> str:
    """An HTML table; cells are given escaped already."""
    def cell(tag: str, i: int, text: str) -> str:
        return f'<{tag}{" class=n" if i in numeric else ""}>{text}</{tag}>'

    lines = ["<table><tr>" + "".join(cell("th", i, _e(h)) for i, h in enumerate(head))
             + "</tr>"]
    lines += ["<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>"
              for row in rows]
    return "\n".join(lines) + "</table>"


def _counts(pairs: Sequence[Tuple[str, int]], chips: bool) -> str:
    rows = [[(f'<span class=chip style="background:{colour(name)}"></span>'
              if chips and name in COLOURS else "") + _e(name), str(count)]
            for name, count in pairs]
    return _table(["", "runs"], rows, numeric=(1,))


def _summary(s: Summary) -> str:
    timing = [[_e(label), *map(_e, spread_cells(spread)),
               "0" if spread is None else str(spread.count)]
              for label, spread in (("queue wait", s.wait), ("held by psij", s.held),
                                    ("run time", s.run))
              if spread is not None or label != "held by psij"]
    efficiency = []
    for label, overall, spread in (("CPU", s.cpu_overall, s.cpu),
                                   ("memory", s.memory_overall, s.memory)):
        efficiency.append([label, percent(overall),
                           *(percent(None if spread is None else v)
                             for v in ((spread.p50, spread.min, spread.max) if spread
                                       else (None, None, None))),
                           "0" if spread is None else str(spread.count)])
    use = [["core-hours used (cores x elapsed)", hours(s.core_hours_used), str(s.used_known)],
           ["core-hours requested (cores x time limit)", hours(s.core_hours_requested),
            str(s.requested_known)],
           ["CPU hours (user + system)", hours(s.cpu_hours), str(s.cpu_known)]]
    span = "" if s.first is None or s.last is None else \
        f" ({_e(duration(max(0.0, s.last - s.first)))})"
    return "\n".join([
        f"<p>{s.total} runs, {s.final} ended; from {_e(when(s.first))} to "
        f"{_e(when(s.last))}{span}. A figure no run knows is shown as <b>{UNKNOWN}</b>, "
        "never as 0; the last column says over how many runs each was taken.</p>",
        "<div style='display:flex;gap:40px;flex-wrap:wrap'><div><h3>By state</h3>",
        _counts(s.by_state, True), "</div><div><h3>By cause (ended runs)</h3>",
        _counts(s.by_cause, False), "</div></div>",
        "<h3>Queue wait and run time</h3>",
        _table(["", "p50", "p90", "p99", "max", "runs"], timing, numeric=(1, 2, 3, 4, 5)),
        "<h3>Efficiency (as Slurm's seff)</h3>",
        _table(["", "overall", "median", "lowest", "highest", "runs"],
               [[_e(c) for c in row] for row in efficiency], numeric=(1, 2, 3, 4, 5)),
        "<p class=muted>CPU = CPU time (user + system) / (cores x elapsed); memory = peak "
        "resident memory / requested memory. Overall: the sums over the runs that know "
        "both.</p>",
        "<h3>Core-hours</h3>", _table(["", "hours", "runs"],
                                      [[_e(c) for c in row] for row in use], numeric=(1, 2))])


def _worst(s: Summary, by_name: Dict[str, JobRun]) -> str:
    parts = []
    for label, worst in (("CPU", s.worst_cpu), ("memory", s.worst_memory)):
        if not worst:
            parts.append(f"<p>Lowest {label} efficiency: {UNKNOWN} for every run.</p>")
            continue
        rows = []
        for name, value in worst:
            run = by_name.get(name)
            rows.append([_e(name), _e(percent(value)),
                         _e(run.native_id or "") if run else "",
                         _e(run.cores if run and run.cores is not None else UNKNOWN),
                         _e(duration(None if run is None or run.started_at is None
                                     or run.ended_at is None
                                     else run.ended_at - run.started_at))])
        parts.append(f"<h3>Lowest {label} efficiency</h3>" + _table(
            ["job", "efficiency", "native id", "cores", "run time"], rows, numeric=(1, 3, 4)))
    return "\n".join(parts)


def _failures(s: Summary) -> str:
    if not s.failures:
        return "<p>No run failed, was cancelled or was omitted.</p>"
    rows = []
    for failure in s.failures:
        messages = "<br>".join(f"{count} &times; <span class=msg>{_e(_cut(m, 400))}</span>"
                               for m, count in failure.messages)
        rows.append([_e(failure.cause), str(failure.count), messages,
                     _e(", ".join(failure.names))])
    return _table(["cause", "runs", "messages (most frequent first)", "e.g."], rows,
                  numeric=(1,))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def html_report(runs: Sequence[JobRun], summary: Summary, title: str, source: str,
                pilot: bool = False) -> str:
    """The whole page."""
    plots = Plots(runs, pilot)
    timeline, note = plots.timeline()
    by_name = {r.name: r for r in runs}
    sections: List[Tuple[str, str, str]] = [
        ("summary", "Summary", _summary(summary)),
        ("timeline", "Timeline", f"<p class=muted>{_e(note)}</p>{timeline}"),
        ("cores", "Cores busy over time", plots.busy()),
        ("waits", "Queue wait and run time", plots.histograms()),
        ("efficiency", "Efficiency per job", plots.efficiency() + _worst(summary, by_name)),
        ("failures", "Failures by cause", _failures(summary)),
    ]
    body = "\n".join(f'<section id="{key}"><h2>{_e(head)}</h2>\n{content}\n</section>'
                     for key, head, content in sections)
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            "<meta name=viewport content='width=device-width,initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=muted>{_e(source)}</p>\n{body}\n</body></html>\n")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a 0600 file: a new file made next to it (never
    following a link), then renamed over it."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with open(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
