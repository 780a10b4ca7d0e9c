"""The report as text for a terminal: :func:`text_report` formats a
:class:`~psij.report._figures.Summary`; the small formatters are shared with the HTML page.

A figure that is not known is written ``unknown``, never 0; each figure says over how many
runs it was taken when that is not all of them.
"""

import time
from typing import List, Optional, Sequence, Tuple

from psij.report._figures import Spread, Summary

__all__ = ["UNKNOWN", "duration", "percent", "text_report", "when"]

UNKNOWN = "unknown"


def duration(seconds: Optional[float]) -> str:
    """``seconds`` in a short human form: 0.35 s, 42 s, 3m05s, 2h04m, 3d04h."""
    if seconds is None:
        return UNKNOWN
    if seconds < 0.01:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    whole = round(seconds)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def percent(fraction: Optional[float]) -> str:
    return UNKNOWN if fraction is None else f"{100 * fraction:.1f}%"


def hours(value: Optional[float]) -> str:
    if value is None:
        return UNKNOWN
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.2g}"


def when(epoch: Optional[float]) -> str:
    """An epoch time as local date and time (the zone named)."""
    if epoch is None:
        return UNKNOWN
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(epoch))
    except (OverflowError, OSError, ValueError):
        return f"{epoch:.0f} s after the epoch"


def _of(known: int, total: int) -> str:
    return "" if known == total else f" ({known} of {total} runs known)"


def spread_cells(spread: Optional[Spread]) -> List[str]:
    """p50, p90, p99, max of a spread of seconds, each formatted; unknown when none."""
    if spread is None:
        return [UNKNOWN] * 4
    return [duration(v) for v in (spread.p50, spread.p90, spread.p99, spread.max)]


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> List[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.rjust(w) if i else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def _counts(pairs: Sequence[Tuple[str, int]]) -> str:
    return ", ".join(f"{_one_line(name, 80)} {count}" for name, count in pairs) or "none"


def text_report(summary: Summary, title: str) -> str:
    """The report as lines of text, ending with a newline."""
    s = summary
    lines = [title, f"  runs: {s.total} ({s.final} ended)",
             f"  from {when(s.first)} to {when(s.last)}"
             + ("" if s.first is None or s.last is None
                else f" ({duration(max(0.0, s.last - s.first))})"),
             "", "by state: " + _counts(s.by_state),
             "by cause (ended runs): " + _counts(s.by_cause), ""]
    timing = [["", "p50", "p90", "p99", "max", "runs"]]
    for label, spread in (("queue wait", s.wait), ("held by psij", s.held),
                          ("run time", s.run)):
        if label == "held by psij" and spread is None:
            continue
        timing.append([label, *spread_cells(spread),
                       "0" if spread is None else str(spread.count)])
    lines += _table(timing, "")
    lines += ["", "efficiency (as seff: CPU = CPU time / (cores x elapsed), "
                  "memory = peak RSS / requested memory):"]
    for label, overall, spread, worst in (("CPU", s.cpu_overall, s.cpu, s.worst_cpu),
                                          ("memory", s.memory_overall, s.memory,
                                           s.worst_memory)):
        if spread is None:
            lines.append(f"  {label}: {UNKNOWN} (no ended run knows "
                         + ("its CPU time, cores and elapsed time)" if label == "CPU"
                            else "its peak memory and requested memory)"))
            continue
        lines.append(f"  {label}: overall {percent(overall)}, median {percent(spread.p50)}, "
                     f"lowest {percent(spread.min)}, highest {percent(spread.max)}"
                     f"{_of(spread.count, s.final)}")
        lines.append("    lowest: " + ", ".join(f"{_one_line(name, 60)} {percent(v)}"
                                             for name, v in worst))
    lines += ["", "core-hours: used " + hours(s.core_hours_used) + _of(s.used_known, s.final)
              + ", requested " + hours(s.core_hours_requested)
              + _of(s.requested_known, s.final),
              "CPU hours (user + system): " + hours(s.cpu_hours) + _of(s.cpu_known, s.final)]
    if s.failures:
        lines += ["", "failures by cause:"]
        for failure in s.failures:
            names = ", ".join(_one_line(name, 60) for name in failure.names)
            lines.append(f"  {_one_line(failure.cause, 80)}: {failure.count} (e.g. {names})")
            for message, count in failure.messages:
                lines.append(f"    {count} x {_one_line(message, 200)}")
    return "\n".join(lines) + "\n"


def _one_line(text: str, width: int) -> str:
    words = " ".join(text.split())
    if not words.isprintable():
        words = "".join(c if c.isprintable() else repr(c)[1:-1] for c in words)
    return words if len(words) <= width else words[:width - 3] + "..."
