"""``psij report --html`` (psij.report._html, _plots): the page opened in a real headless
browser (Debian's ``chromium``), for a 20-job registry run and a 100,000-task pilot run: no
console error, every section there with its plots, a screenshot that is not blank and shows
the states' colours; the file private and self-contained; the ``psij[report]`` extra loaded
only by ``--html``, and a clear error without it."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import pytest

from psij.report._html import write_private
from psij.report._plots import COLOURS, MissingExtra, load
from support.report_runs import (
    chromium,
    demo_jobs,
    open_page,
    write_pilot_report,
    write_registry,
)

PSIJ = str(Path(sys.executable).parent / "psij")
SECTIONS = ("summary", "timeline", "cores", "waits", "efficiency", "failures")

needs_browser = pytest.mark.skipif(
    chromium() is None, reason="chromium is not installed (make system-deps installs it)")


def psij_report(home: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PSIJ, "report", *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=600)


def colours_of(png: Path) -> Dict[Tuple[int, int, int], int]:
    from PIL import Image

    with Image.open(png) as image:
        counts = image.convert("RGB").getcolors(maxcolors=1 << 24)
    return {colour: count for count, colour in counts}


def rgb(text: str) -> Tuple[int, int, int]:
    return int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16)


def check_page(page: Path, tmp_path: Path) -> str:
    """Open ``page``: no console error, every section and its plots in the DOM, a screenshot
    of many colours; the DOM returned."""
    shot = tmp_path / "shot.png"
    opened = open_page(page, shot)
    assert opened.returncode == 0, opened.stderr[-2000:]
    console = [line for line in opened.stderr.splitlines() if "CONSOLE" in line
               or "Uncaught" in line or "Refused" in line or "ERR_" in line]
    assert console == []
    dom = opened.stdout
    for section in SECTIONS:
        assert f'<section id="{section}">' in dom
    assert dom.count("<svg") >= 4
    colours = colours_of(shot)
    assert len(colours) > 50  # text, plots, fills: far from blank
    return dom


@needs_browser
def test_a_20_job_run_s_page_opens_in_a_browser_with_every_plot_drawn(tmp_path: Path
                                                                     ) -> None:
    home = tmp_path / "home"
    write_registry(home / ".psij" / "work", demo_jobs(20), tag="demo")
    page = tmp_path / "out" / "report.html"
    page.parent.mkdir()
    done = psij_report(home, "--tag", "demo", "--html", str(page))
    assert done.returncode == 0, done.stderr
    assert "runs: 20 (20 ended)" in done.stdout and "wrote" in done.stderr
    assert stat.S_IMODE(page.stat().st_mode) == 0o600
    text = page.read_text()
    # Nothing to fetch: no script, every reference within the page or a data: URL.
    assert "<script" not in text and "@import" not in text
    links = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", text)
    assert links and all(link.startswith(("#", "data:")) for link in links)
    assert not re.search(r"""(?:src|href)\s*=\s*[^"'\s]""", text)
    assert "url(" not in text.replace("url(#", "")
    dom = check_page(page, tmp_path)
    # The timeline's legend, the failures with their messages, the worst jobs by name.
    for word in ("completed", "failed", "canceled", "out_of_memory", "time_limit",
                 "the job used more memory than it asked for (2 GiB)", "demo-", "CPU"):
        assert word in dom
    # Each bar of the timeline says what it is on hover (an SVG title, no script).
    assert re.search(r"<title>demo-03: failed \d+m\d\ds</title>", dom)
    assert re.search(r"<title>demo-00: waiting [^<]+</title>", dom)
    colours = colours_of(tmp_path / "shot.png")
    for state in ("COMPLETED", "FAILED"):
        assert colours.get(rgb(COLOURS[state]), 0) > 200, state  # bars of that state drawn


@needs_browser
def test_a_100000_task_pilot_run_s_page_is_small_and_drawn(tmp_path: Path) -> None:
    wd = tmp_path / "pilot"
    wd.mkdir()
    write_pilot_report(wd / "jobs.report", 100_000)
    page = tmp_path / "big.html"
    home = tmp_path / "home"
    done = psij_report(home, "--pilot", str(wd), "--html", str(page))
    assert done.returncode == 0, done.stderr
    assert "runs: 100000 (100000 ended)" in done.stdout
    assert page.stat().st_size < 2_000_000  # aggregated: bounded whatever the tasks
    dom = check_page(page, tmp_path)
    assert "cores of the pilot (node/core)" in dom and "drawn as 128 lines" in dom
    colours = colours_of(tmp_path / "shot.png")
    assert colours.get(rgb(COLOURS["COMPLETED"]), 0) > 10_000


def test_the_page_escapes_what_jobs_say_and_is_written_privately(tmp_path: Path) -> None:
    from psij.report import JobRun, html_report

    runs = [JobRun("<b>x</b>", "FAILED", cause="<script>", message="</table><img src=x>",
                   submitted=1.0, started_at=2.0, ended_at=3.0),
            # Dollars would be matplotlib's math notation, a bad one an error.
            JobRun("a$\\frac{$b\\", "COMPLETED", submitted=1.0, started_at=2.0, ended_at=3.0)]
    page = html_report(runs, "t <i>", "s")
    assert "<script>" not in page and "<img src=x>" not in page and "<b>x</b>" not in page
    assert "&lt;script&gt;" in page and "t &lt;i&gt;" in page
    assert ">a$\\frac{$b\\</text>" in page  # the label drawn as written
    target = tmp_path / "p.html"
    target.symlink_to(tmp_path / "elsewhere")
    write_private(target, page)
    assert not target.is_symlink() and not (tmp_path / "elsewhere").exists()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["p.html"]  # no temporary file left


def test_unknown_figures_are_drawn_as_unknown_and_no_time_leaves_an_empty_timeline() -> None:
    from psij.report import JobRun, html_report

    page = html_report([JobRun("a", "COMPLETED"), JobRun("b", "QUEUED")], "t")
    assert "nothing to draw" in page and "not known for any run" in page


def test_huge_times_and_figures_make_a_page() -> None:
    from psij.report import JobRun, html_report

    page = html_report([JobRun("a", "COMPLETED", submitted=0.0, started_at=9e10,
                               ended_at=1e11, cpu_seconds=1e11, cores=1 << 62,
                               max_rss_bytes=1 << 62, requested_memory_bytes=1),
                        JobRun("b", "FAILED", submitted=0.0, started_at=1e11 - 1e-5,
                               ended_at=1e11)], "t")
    assert "days since" in page and "nan" not in page.lower()


def test_import_psij_report_does_not_load_matplotlib(tmp_path: Path) -> None:
    code = ("import sys, json\nimport psij.report\n"
            "print(json.dumps([m for m in ('matplotlib', 'numpy') if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert load().__name__ == "matplotlib"


def test_without_the_extra_html_is_a_clear_error_and_the_terminal_report_still_works(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_registry(home / ".psij" / "work", demo_jobs(3))
    code = ("import sys\nsys.modules['matplotlib'] = None\n"
            "from psij.cli import main\n"
            f"sys.exit(main(['report', '--html', {str(tmp_path / 'r.html')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=120)
    assert done.returncode == 1
    assert "runs: 3" in done.stdout
    assert "pip install 'psij[report]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "r.html").exists()
    assert issubclass(MissingExtra, ImportError)
