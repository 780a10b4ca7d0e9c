"""Benchmark of ``psij report``: the time to make the report of 100,000 jobs and the size of its
HTML page, for a pilot run (``jobs.report``) and for the job registry, and the time headless
Chromium takes to open the page.

Prints figures; asserts nothing. The runs are made up (tests/support/report_runs.py): a pilot
run of ``--jobs`` tasks of 1 to 4 cores on 2 nodes of 64 cores, written entry by entry as the
pilot writes ``jobs.report``, and ``--jobs`` registry rows written through the registry's
store. Each phase is timed on its own in this process: reading the runs, computing the figures
and the terminal text, drawing the page (matplotlib: its import is counted in the first page),
and the whole ``psij report --html`` command in a fresh process.

    .venv/bin/python bench/report_size.py [--jobs 100000] [--screenshot docs/report.png]

``--screenshot FILE`` also writes the screenshot of the documentation: the page of a 20-job
demo run with every figure known, opened in Chromium.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Tuple

from _help import description

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the made-up runs

from support.report_runs import (  # noqa: E402
    chromium,
    demo_jobs,
    write_pilot_report,
    write_registry,
)

PSIJ = str(Path(sys.executable).parent / "psij")


def timed(what: Callable[[], Any]) -> Tuple[Any, float]:
    start = time.perf_counter()
    result = what()
    return result, time.perf_counter() - start


def open_seconds(page: Path, work: Path) -> str:
    browser = chromium()
    if browser is None:
        return "chromium not installed"
    start = time.perf_counter()
    done = subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox",
                           f"--user-data-dir={work / 'profile'}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, HOME=str(work)))
    took = time.perf_counter() - start
    return f"{took:.2f} s" if done.returncode == 0 else f"failed ({done.returncode})"


def measure(label: str, load: Callable[[], Any], pilot: bool, command: list, work: Path,
            env: dict) -> None:
    from psij.report import html_report, summarize, text_report, write_html

    runs, read_s = timed(load)
    _, figures_s = timed(lambda: text_report(summarize(runs), "t"))
    page, html_s = timed(lambda: html_report(runs, label, "bench", pilot))
    target = work / f"{label}.html"
    write_html(str(target), page)
    done, command_s = timed(lambda: subprocess.run(
        [PSIJ, "report", *command, "--html", str(work / f"{label}-cli.html")],
        capture_output=True, text=True, env=env, timeout=900))
    size = target.stat().st_size
    print(f"{label}: {len(runs)} runs")
    print(f"  read the runs         {read_s:7.2f} s")
    print(f"  figures + text        {figures_s:7.2f} s")
    print(f"  HTML page             {html_s:7.2f} s")
    print(f"  page size             {size / 1e6:7.3f} MB ({size} bytes)")
    print(f"  psij report --html    {command_s:7.2f} s (whole command, fresh process; "
          f"status {done.returncode})")
    print(f"  Chromium opens it in  {open_seconds(target, work)} (headless, --dump-dom)")


def screenshot(path: Path, work: Path) -> None:
    from psij.report import html_report, write_html
    from psij.report._sources import from_rows

    jobs = demo_jobs(20)
    columns = ("id", "state", "final", "cause", "message", "submitted", "queued_at",
               "started_at", "ended_at", "cpu_seconds", "max_rss_bytes", "cores",
               "requested_memory_bytes", "requested_seconds", "exit_code", "native_id")
    rows = []
    for job in jobs:
        cores = job["spec"]["resources"]["cpu_cores_per_process"]
        rows.append((job["id"], job["state"], 1, job.get("cause"), job.get("message"),
                     job["submitted"], job["submitted"] + 1.0, job["started_at"],
                     job["ended_at"], job["cpu_seconds"], job["max_rss_bytes"], cores,
                     job["requested_memory_bytes"], 900.0, job.get("exit_code"),
                     job["native_id"]))
    runs = from_rows(columns, rows)
    page = work / "demo.html"
    write_html(str(page), html_report(runs, "psij report --tag demo", "a 20-job demo run"))
    browser = chromium()
    if browser is None:
        print("screenshot: chromium is not installed")
        return
    shot = work / "demo.png"
    subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                    f"--user-data-dir={work / 'profile'}", "--window-size=1060,2000",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=300,
                   env=dict(os.environ, HOME=str(work)), check=True)
    shutil.copyfile(shot, path)
    print(f"screenshot: {path} ({path.stat().st_size} bytes)")


def main() -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--screenshot", type=Path, metavar="FILE")
    args = parser.parse_args()
    from psij.report import from_pilot, from_registry

    with tempfile.TemporaryDirectory(prefix="psij-bench-report-") as tmp:
        work = Path(tmp)
        if args.screenshot is not None:
            screenshot(args.screenshot.resolve(), work)
        pilot = work / "pilot"
        pilot.mkdir()
        write_pilot_report(pilot / "jobs.report", args.jobs)
        home = work / "home"
        env = dict(os.environ, HOME=str(home))
        measure("pilot", lambda: from_pilot(pilot), True, ["--pilot", str(pilot)], work, env)
        wd = home / ".psij" / "work"
        jobs = demo_jobs(args.jobs)
        for i, job in enumerate(jobs):
            job["id"] = f"job-{i:06d}"
        write_registry(wd, jobs, tag="bench")
        measure("registry", lambda: from_registry(tag="bench", work_directory=str(wd)), False,
                ["--tag", "bench"], work, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
