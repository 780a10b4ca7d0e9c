"""The plots of the HTML report, drawn with matplotlib as SVG text to put inline in the page.

matplotlib (the ``psij[report]`` extra) is imported here only, by :func:`load`, which says
how to install it when it is missing. Figures are made with ``matplotlib.figure.Figure`` and
the SVG canvas directly (no pyplot, no global state, no display). Text stays text in the SVG
(``svg.fonttype`` none), so labels can be searched and the file stays small.

Large runs are aggregated so that a page stays small and opens in seconds whatever the number
of jobs: the timeline turns into an image (rows x :data:`COLUMNS` cells, each cell the state
most runs in it were in) once it has more than :data:`VECTOR_BARS` bars; counts over time are
sampled in :data:`COLUMNS` steps (mean and peak of each); histograms and per-job efficiency
are bins (one bar per job for up to :data:`PER_JOB_BARS` jobs).
"""

import io
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from psij.report._runs import (
    STATE_ORDER,
    JobRun,
    cpu_efficiency,
    memory_efficiency,
    run_seconds,
    wait_seconds,
)
from psij.report._shapes import (
    WAIT,
    Bar,
    busy_changes,
    core_lanes,
    job_rows,
    time_unit,
    waiting_changes,
)

__all__ = ["MissingExtra", "Plots", "load"]

VECTOR_BARS = 3000
MAX_ROWS = 400
COLUMNS = 1000
PER_JOB_BARS = 40  # efficiency drawn job by job up to this many jobs, as histograms beyond
WIDTH = 10.0  # inches at 100 dpi: 1000 pixels

COLOURS = {"COMPLETED": "#2e7d32", "FAILED": "#c62828", "CANCELED": "#ef6c00",
           "OMITTED": "#8d6e63", "RERUN": "#7e57c2", "ACTIVE": "#1565c0", "QUEUED": "#78909c",
           "NEW": "#b0bec5", WAIT: "#cfd8dc"}
OTHER = "#6a1b9a"


class MissingExtra(ImportError):
    """matplotlib, which the HTML report needs, is not installed."""


def load() -> Any:
    """matplotlib, set up for drawing SVG without a display; raises :class:`MissingExtra`
    saying how to install it."""
    try:
        import matplotlib
        from matplotlib.backends.backend_svg import FigureCanvasSVG  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError as ex:
        raise MissingExtra(
            f"the HTML report needs matplotlib, which is not installed ({ex}); install it "
            "with: pip install 'psij[report]' (or pip install matplotlib)") from None
    return matplotlib


def colour(kind: str) -> str:
    return COLOURS.get(kind, OTHER)


class Plots:
    """Draws each plot of a report as SVG text."""

    def __init__(self, runs: Sequence[JobRun], pilot: bool) -> None:
        self.mpl = load()
        self.runs = runs
        self.pilot = pilot
        times = [t for r in runs for t in (r.submitted, r.queued_at, r.started_at, r.ended_at)
                 if t is not None]
        self.t0 = min(times) if times else 0.0
        self.t1 = max(times) if times else 1.0
        if self.t1 <= self.t0:
            self.t1 = self.t0 + 1.0
        self.unit, self.scale = time_unit(self.t1 - self.t0)

    # -- common --------------------------------------------------------------------------

    def _figure(self, height: float, rows: int = 1) -> Tuple[Any, Any]:
        """A figure ``height`` inches high with ``rows`` plots one above the other, with fixed
        margins in inches (the layout engines cost a second a figure on 100,000 jobs)."""
        from matplotlib.backends.backend_svg import FigureCanvasSVG
        from matplotlib.figure import Figure

        figure = Figure(figsize=(WIDTH, height), dpi=100)
        FigureCanvasSVG(figure)
        axes = figure.subplots(rows, 1, squeeze=False)[:, 0]
        figure.subplots_adjust(left=1.25 / WIDTH, right=1 - 0.2 / WIDTH,
                               top=1 - 0.35 / height, bottom=0.55 / height,
                               hspace=0.75 / (height / rows))
        return figure, axes

    def _svg(self, figure: Any, name: str) -> str:
        buffer = io.StringIO()
        with self.mpl.rc_context({"svg.fonttype": "none", "svg.hashsalt": name,
                                  "font.size": 9}):
            figure.savefig(buffer, format="svg", metadata={"Date": None})
        text = buffer.getvalue()
        text = text[text.index("<svg"):]  # inline: no XML declaration nor doctype
        text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.DOTALL)
        # Each figure's ids unique in the page (clip paths, images are referred to by id).
        return re.sub(r'(id="|url\(#|href="#)([A-Za-z0-9_-]+)', rf"\g<1>{name}-\g<2>", text)

    def _x(self, t: Any) -> Any:
        """Time ``t`` (epoch seconds, or an array of them) on the time axis."""
        return (t - self.t0) / self.scale

    def _time_axis(self, ax: Any) -> None:
        from psij.report._text import when

        ax.set_xlabel(f"{self.unit} since {when(self.t0)}")
        ax.set_xlim(0, self._x(self.t1))

    def _legend(self, ax: Any, kinds: Sequence[str], loc: str = "upper right") -> None:
        from matplotlib.patches import Patch

        handles = [Patch(color=colour(k), label=k.lower()) for k in kinds]
        if handles:
            ax.legend(handles=handles, loc=loc, fontsize=8, ncols=min(len(handles), 7),
                      framealpha=0.9)

    # -- timeline ------------------------------------------------------------------------

    def timeline(self) -> Tuple[str, str]:
        """The timeline and a line saying what it shows."""
        labels, bars = core_lanes(self.runs) if self.pilot else job_rows(self.runs)
        rows = len(labels)
        what = "cores of the pilot (node/core)" if self.pilot else "jobs, in the order queued"
        height = 1.6 + min(rows, 60) * 0.09 if rows else 1.5
        figure, (ax,) = self._figure(max(2.2, height))
        kinds = _kinds(bars)
        tips: Dict[str, str] = {}
        if not bars:
            ax.text(0.5, 0.5, "no start or end time known: nothing to draw", ha="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
            note = "No run has its times recorded."
        elif len(bars) <= VECTOR_BARS and rows <= MAX_ROWS:
            tips = self._bars(ax, bars, labels)
            note = f"{rows} rows: {what}."
        else:
            grouped = rows > MAX_ROWS
            self._raster(ax, bars, rows)
            note = (f"{len(bars)} bars on {rows} rows"
                    + (f", {(rows + MAX_ROWS - 1) // MAX_ROWS} rows to a line" if grouped
                       else "")
                    + f", drawn as {min(rows, MAX_ROWS)} lines x {COLUMNS} time steps: each "
                    "cell shows the state most runs in it had (a run beats a wait).")
        if bars:
            shown = min(rows, MAX_ROWS)
            ax.set_ylim(shown, 0)
            if rows <= 40:
                ax.set_yticks([i + 0.5 for i in range(rows)],
                              [_short(label, 18) for label in labels], fontsize=7)
            else:
                ax.set_ylabel(what)
            self._time_axis(ax)
            self._legend(ax, kinds)
        ax.set_title(f"Timeline: {what}" + ("" if self.pilot else " (light: waiting)"),
                     loc="left")
        svg = self._svg(figure, "timeline")
        if tips:  # a tooltip on each bar: the browser shows it on hover, no script needed
            svg = re.sub(r'<g id="timeline-(bar\d+)">',
                         lambda m: f'{m.group(0)}<title>{_escape(tips.get(m.group(1), ""))}'
                                   '</title>', svg)
        return svg, note

    def _bars(self, ax: Any, bars: Sequence[Bar], labels: Sequence[str]) -> Dict[str, str]:
        """Draw each bar; the tooltip of each, by the id its group gets in the SVG."""
        from psij.report._text import duration

        groups: Dict[str, List[Tuple[float, float, int, int]]] = {}
        for n, (row, start, end, kind) in enumerate(bars):
            groups.setdefault(kind, []).append((self._x(start), self._x(end), row, n))
        import numpy

        tips: Dict[str, str] = {}
        shortest = self._x(self.t1) / COLUMNS
        for kind, spans in groups.items():
            left = numpy.array([s[0] for s in spans])
            width = numpy.maximum(numpy.array([s[1] for s in spans]) - left, shortest)
            drawn = ax.barh(numpy.array([s[2] for s in spans]) + 0.5, width, left=left,
                            height=0.8, color=colour(kind), linewidth=0)
            for patch, (_, _, row, n) in zip(drawn.patches, spans):
                patch.set_gid(f"bar{n}")
                start, end = bars[n][1:3]
                tips[f"bar{n}"] = (f"{labels[row]}: {kind.lower()} "
                                   f"{duration(max(0.0, end - start))}")
        return tips

    def _raster(self, ax: Any, bars: Sequence[Bar], rows: int) -> None:
        import numpy

        kinds = [WAIT, *STATE_ORDER, *sorted({b[3] for b in bars} - set(STATE_ORDER) - {WAIT})]
        index = {k: i for i, k in enumerate(kinds)}
        lines = min(rows, MAX_ROWS)
        data = numpy.array([(b[0], b[1], b[2], index[b[3]]) for b in bars], dtype=float)
        row = (data[:, 0] * lines // rows).astype(numpy.int64)
        span = self.t1 - self.t0
        first = numpy.clip(((data[:, 1] - self.t0) / span * COLUMNS).astype(numpy.int64), 0,
                           COLUMNS - 1)
        last = numpy.clip(((data[:, 2] - self.t0) / span * COLUMNS).astype(numpy.int64),
                          first, COLUMNS - 1)
        kind = data[:, 3].astype(numpy.int64)
        diff = numpy.zeros((len(kinds), lines, COLUMNS + 1), dtype=numpy.int64)
        numpy.add.at(diff, (kind, row, first), 1)
        numpy.add.at(diff, (kind, row, last + 1), -1)
        counts = numpy.cumsum(diff, axis=2)[:, :, :COLUMNS]
        runs = counts[1:]
        best = numpy.argmax(runs, axis=0) + 1
        any_run = runs.max(axis=0) > 0
        choice = numpy.where(any_run, best, numpy.where(counts[0] > 0, 0, -1))
        palette = numpy.array([_rgb(colour(k)) for k in kinds] + [(1.0, 1.0, 1.0)])
        image = palette[choice]  # -1 picks the last: white
        ax.imshow(image, aspect="auto", interpolation="nearest",
                  extent=(0, self._x(self.t1), lines, 0))

    # -- counts over time ----------------------------------------------------------------

    def busy(self) -> str:
        """Cores busy over time and runs waiting over time."""
        figure, axes = self._figure(4.2, rows=2)
        unknown = sum(1 for r in self.runs if r.started_at is not None and not r.cores)
        for ax, changes, label, tint in (
                (axes[0], busy_changes(self.runs), "cores busy", "#1565c0"),
                (axes[1], waiting_changes(self.runs), "runs waiting", "#78909c")):
            times, values = _levels(changes)
            if not len(times):
                ax.text(0.5, 0.5, f"{label}: no times known", ha="center",
                        transform=ax.transAxes)
                ax.set_axis_off()
                continue
            self._steps(ax, times, values, tint)
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            self._time_axis(ax)
        title = "Cores busy and runs waiting over time"
        if unknown:
            title += f" ({unknown} runs of unknown cores counted as 1)"
        axes[0].set_title(title, loc="left")
        return self._svg(figure, "busy")

    def _steps(self, ax: Any, times: Any, values: Any, tint: str) -> None:
        import numpy

        t = numpy.concatenate([[self.t0], times, [self.t1]])
        v = numpy.concatenate([[0.0], values, values[-1:]])
        if len(times) <= 2 * COLUMNS:
            ax.fill_between(self._x(t), v, step="post", color=tint, alpha=0.35, linewidth=0)
            ax.step(self._x(t), v, where="post", color=tint, linewidth=1)
            return
        edges = numpy.linspace(self.t0, self.t1, COLUMNS + 1)
        # Integral of the level up to each change, then up to each edge: the mean per step.
        area = numpy.concatenate([[0.0], numpy.cumsum(v[:-1] * numpy.diff(t))])
        at = numpy.clip(numpy.searchsorted(t, edges, side="right") - 1, 0, len(t) - 1)
        integral = area[at] + v[at] * (edges - t[at])
        mean = numpy.diff(integral) / numpy.diff(edges)
        peak = v[at[:-1]].copy()  # the level each step starts with, then any change inside
        inside = numpy.searchsorted(t, edges, side="left")
        changed = inside[1:] > inside[:-1]
        if changed.any():  # the changes of a step run up to the first change of the next
            highest = numpy.maximum.reduceat(v, inside[:-1][changed])
            peak[changed] = numpy.maximum(peak[changed], highest)
        x = self._x(edges)
        ax.stairs(peak, x, color=tint, linewidth=0.8, label="peak in step")
        ax.stairs(mean, x, fill=True, color=tint, alpha=0.35, label="mean in step")
        ax.legend(loc="upper right", fontsize=8)

    # -- distributions -------------------------------------------------------------------

    def histograms(self) -> str:
        """Histograms of the queue wait and the run time."""
        figure, axes = self._figure(4.4, rows=2)
        for ax, values, label in (
                (axes[0], [w for w in map(wait_seconds, self.runs) if w is not None],
                 "queue wait"),
                (axes[1], [s for s in map(run_seconds, self.runs) if s is not None],
                 "run time")):
            _histogram(ax, values, label)
        axes[0].set_title("Queue wait and run time", loc="left")
        return self._svg(figure, "histograms")

    def efficiency(self) -> str:
        """CPU and memory efficiency: one bar per job for a few jobs, histograms beyond."""
        final = [r for r in self.runs if r.final]
        cpu = [(r.name, cpu_efficiency(r)) for r in final]
        memory = [(r.name, memory_efficiency(r)) for r in final]
        if all(v is None for _, v in (*cpu, *memory)):
            figure, (ax,) = self._figure(1.2)
            ax.text(0.5, 0.5, "CPU and memory efficiency: not known for any run", ha="center",
                    va="center", transform=ax.transAxes)
            ax.set_axis_off()
        elif len(final) <= PER_JOB_BARS:
            figure, (ax,) = self._figure(1.4 + 0.16 * max(len(final), 3))
            self._per_job(ax, final, cpu, memory)
        else:
            figure, axes = self._figure(4.4, rows=2)
            for ax, pairs, label in ((axes[0], cpu, "CPU efficiency"),
                                     (axes[1], memory, "memory efficiency")):
                _efficiency_histogram(ax, [v for _, v in pairs if v is not None],
                                      len(pairs), label)
            ax = axes[0]
        ax.set_title("Efficiency per job (as seff: CPU time / (cores x elapsed); peak RSS / "
                     "requested memory)", loc="left")
        return self._svg(figure, "efficiency")

    def _per_job(self, ax: Any, final: Sequence[JobRun],
                 cpu: Sequence[Tuple[str, Optional[float]]],
                 memory: Sequence[Tuple[str, Optional[float]]]) -> None:
        rows = range(len(final))
        ax.barh([i + 0.3 for i in rows], [100 * (v or 0.0) for _, v in cpu], height=0.38,
                color="#1565c0", label="CPU")
        ax.barh([i + 0.7 for i in rows], [100 * (v or 0.0) for _, v in memory], height=0.38,
                color="#8e24aa", label="memory")
        top = max([100.0] + [100 * v for _, v in (*cpu, *memory) if v is not None])
        for i, ((_, c), (_, m)) in enumerate(zip(cpu, memory)):
            for value, y in ((c, i + 0.3), (m, i + 0.7)):
                ax.text(0.3 if value is None else 100 * value + 0.5, y,
                        "unknown" if value is None else f"{100 * value:.0f}%",
                        va="center", fontsize=6, color="#555555")
        ax.set_yticks([i + 0.5 for i in rows], [_short(r.name, 18) for r in final],
                      fontsize=7)
        ax.set_ylim(len(final), 0)
        ax.set_xlim(0, top * 1.12)
        ax.axvline(100, color="#999999", linewidth=0.8, linestyle="--")
        ax.set_xlabel("percent")
        ax.legend(loc="lower right", fontsize=8)


def _escape(text: str) -> str:
    import html

    return html.escape(text, quote=False)


def _levels(changes: Sequence[Tuple[float, float]]) -> Tuple[Any, Any]:
    """:func:`~psij.report._shapes.levels` with numpy: the times a count changes and its level
    from each on (arrays)."""
    import numpy

    if not changes:
        return numpy.zeros(0), numpy.zeros(0)
    data = numpy.array(changes, dtype=float)
    order = numpy.argsort(data[:, 0], kind="stable")
    times = data[order, 0]
    values = numpy.cumsum(data[order, 1])
    last = numpy.concatenate([times[1:] != times[:-1], [True]])  # the last of equal times
    return times[last], values[last]


def _kinds(bars: Sequence[Bar]) -> List[str]:
    seen = {b[3] for b in bars}
    return [k for k in (*STATE_ORDER, WAIT) if k in seen] + sorted(
        seen - set(STATE_ORDER) - {WAIT})


def _histogram(ax: Any, values: Sequence[float], label: str) -> None:
    import numpy

    if not values:
        ax.text(0.5, 0.5, f"{label}: not known for any run", ha="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    low, high = min(values), max(values)
    positive = [v for v in values if v > 0]
    top = float(numpy.nextafter(high, numpy.inf))  # the largest value inside the last bin
    try:
        if positive and high / min(positive) > 100 and numpy.isfinite(top):
            bottom = min(positive)
            edges = numpy.geomspace(bottom, top, 41)
            counts, _ = numpy.histogram(numpy.clip(values, bottom, None), edges)
            ax.set_xscale("log")
        else:
            counts, edges = numpy.histogram(values, 40, range=(low, high if high > low
                                                              else low + 1))
    except ValueError:  # values too large, or too close, for 40 bins: one holds them all
        pad = max(1.0, abs(high) * 0.01)
        counts, edges = numpy.histogram(values, 1, range=(low - pad, high + pad))
    ax.stairs(counts, edges, fill=True, color="#1565c0", alpha=0.7)
    ax.set_xlabel(f"{label}, seconds ({len(values)} runs)")
    ax.set_ylabel("runs")


def _efficiency_histogram(ax: Any, values: Sequence[float], total: int, label: str) -> None:
    import numpy

    if not values:
        ax.text(0.5, 0.5, f"{label}: not known for any run", ha="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    edges = numpy.arange(0, 155, 5.0)
    counts, _ = numpy.histogram(numpy.clip(numpy.array(values) * 100, 0, 150 - 1e-9), edges)
    ax.stairs(counts, edges, fill=True, color="#1565c0", alpha=0.7)
    ax.axvline(100, color="#999999", linewidth=0.8, linestyle="--")
    ax.set_xlabel(f"{label}, percent (150 and more in the last bin; {len(values)} of "
                  f"{total} ended runs known)")
    ax.set_ylabel("runs")


def _rgb(text: str) -> Tuple[float, float, float]:
    return (int(text[1:3], 16) / 255, int(text[3:5], 16) / 255, int(text[5:7], 16) / 255)


def _short(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width``, as plain text for matplotlib (a ``$`` escaped,
    else two of them would start its math notation)."""
    text = " ".join(text.split())
    text = text if len(text) <= width else text[:width - 1] + "…"
    return text.replace("$", "\\$")
