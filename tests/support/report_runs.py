"""Runs for the tests and the bench of ``psij report``: registry rows written through the
registry's own store (by column name, so rows stay right when columns are added), a small
hand-computed run, a 20-job demo run and a large pilot ``jobs.report`` written as the pilot
writes it (:mod:`psij.executors.pilot.qcg._report`), and headless Chromium to open a page."""

import json
import os
import random
import shutil
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from psij._registry import store as _store
from psij.executors.pilot.qcg._report import TaskReport, format_report_entry

T0 = 1_765_000_000.0  # a fixed start, so figures are the same in every run
GIB = 1 << 30

# The small run whose figures the tests compute by hand (docs: tests/test_report_figures.py).
# cores and time limits come from the JobSpec, as for a local job.
SMALL = [
    dict(id="job-1", state="COMPLETED", submitted=T0, started_at=T0 + 10, ended_at=T0 + 110,
         cpu_seconds=90.0, max_rss_bytes=GIB, spec={"resources": {"process_count": 1},
                                                    "attributes": {"duration": 200}},
         requested_memory_bytes=2 * GIB, exit_code=0),
    dict(id="job-2", state="COMPLETED", submitted=T0, started_at=T0 + 20, ended_at=T0 + 70,
         cpu_seconds=100.0, max_rss_bytes=GIB, spec={"resources": {"process_count": 2},
                                                     "attributes": {"duration": 100}},
         requested_memory_bytes=4 * GIB, exit_code=0, held_from=T0, held_to=T0 + 8),
    dict(id="job-3", state="FAILED", cause="out_of_memory", message="killed: out of memory",
         submitted=T0 + 5, started_at=T0 + 35, ended_at=T0 + 45, cpu_seconds=5.0,
         spec={}, exit_code=137),
    dict(id="job-4", state="FAILED", cause="time_limit", message="time limit reached",
         submitted=T0 + 5, started_at=T0 + 65, ended_at=T0 + 125, cpu_seconds=30.0,
         spec={"resources": {"cpu_cores_per_process": 4}, "attributes": {"duration": 60}}),
    dict(id="job-5", state="CANCELED", message="canceled by the user", submitted=T0 + 10,
         spec={}),
    dict(id="job-6", state="ACTIVE", submitted=T0 + 10, spec={}),
]

_FINAL = {"COMPLETED", "FAILED", "CANCELED"}
_RANK = {"NEW": 0, "QUEUED": 1, "ACTIVE": 3, "COMPLETED": 6, "FAILED": 6, "CANCELED": 6}


def registry_columns() -> Sequence[str]:
    """The columns a status recording writes in this version of the registry."""
    return _store.STATUS_COLUMNS


def write_registry(work_directory: Path, jobs: Sequence[Dict[str, Any]],
                   executor: str = "local", tag: Optional[str] = None) -> None:
    """Write ``jobs`` (dicts of column values; ``spec`` a JobSpec's JSON as a dict) to the
    registry of ``work_directory`` through its store; a value for a column this registry has
    not is dropped."""
    store = _store.open_store(work_directory)
    rows = []
    for job in jobs:
        values = dict(job)
        values.setdefault("executor", executor)
        values.setdefault("executor_version", "0")
        values.setdefault("config", "{}")
        values.setdefault("tag", tag)
        values["spec"] = json.dumps(values.get("spec") or {})
        values.setdefault("updated", values.get("ended_at") or values["submitted"])
        values["final"] = int(values["state"] in _FINAL)
        values["rank"] = _RANK[values["state"]]
        values.setdefault("attempt", 1)
        rows.append(tuple(values.get(c) for c in _store.STATUS_COLUMNS))
    store.write(rows, [])


_RUNS_TABLE = """CREATE TABLE IF NOT EXISTS runs (job_id TEXT NOT NULL, run INTEGER NOT NULL,
    native_id TEXT, state TEXT NOT NULL, rank INTEGER NOT NULL, exit_code INTEGER, cause TEXT,
    message TEXT, updated REAL NOT NULL, started_at REAL, ended_at REAL, cpu_seconds REAL,
    max_rss_bytes INTEGER, PRIMARY KEY (job_id, run))"""


def write_runs(work_directory: Path, runs: Sequence[Dict[str, Any]]) -> None:
    """Rows of the registry's ``runs`` table (one per run of a job), made if this version of
    the registry has none; a value for a column the table has not is dropped."""
    import sqlite3

    _store.open_store(work_directory)
    conn = sqlite3.connect(str(_store.registry_path(work_directory)))
    try:
        with conn:
            conn.execute(_RUNS_TABLE)
            present = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
            for run in runs:
                values = dict(run, rank=_RANK[run["state"]], updated=T0)
                names = [n for n in values if n in present]
                conn.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES "
                             f"({', '.join('?' * len(names))})", [values[n] for n in names])
    finally:
        conn.close()


def demo_jobs(count: int = 20, seed: int = 7) -> List[Dict[str, Any]]:
    """A run of ``count`` jobs as a small cluster might give them: most complete, some fail
    for a cause, one is cancelled while queued."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        submitted = T0 + i * 3.0
        cores = rng.choice((1, 1, 2, 4))
        wait = rng.uniform(2, 90)
        run = rng.uniform(30, 600)
        job: Dict[str, Any] = dict(
            id=f"demo-{i:02d}", native_id=str(41000 + i), submitted=submitted,
            started_at=submitted + wait, ended_at=submitted + wait + run,
            cpu_seconds=run * cores * rng.uniform(0.15, 0.98),
            max_rss_bytes=int(rng.uniform(0.1, 1.9) * GIB), requested_memory_bytes=2 * GIB,
            spec={"resources": {"cpu_cores_per_process": cores},
                  "attributes": {"duration": 900}}, state="COMPLETED", exit_code=0)
        if i % 7 == 3:
            job.update(state="FAILED", cause="out_of_memory", exit_code=137,
                       message="the job used more memory than it asked for (2 GiB)")
        elif i % 9 == 5:
            job.update(state="FAILED", cause="time_limit", exit_code=None,
                       message="the job ran past its time limit")
        elif i == count - 1:
            job.update(state="CANCELED", message="canceled by the user", started_at=None,
                       ended_at=None, cpu_seconds=None, max_rss_bytes=None)
        elif i % 8 == 6:
            job.update(state="FAILED", exit_code=2, message="exited with code 2")
        jobs.append(job)
    return jobs


def write_pilot_report(path: Path, tasks: int, cores: int = 64, nodes: int = 2,
                       seed: int = 3) -> None:
    """A ``jobs.report`` of ``tasks`` tasks run on ``nodes`` nodes of ``cores`` cores each,
    entry by entry as the pilot writes it, tasks of 1 to 4 cores started as cores free up."""
    rng = random.Random(seed)
    free = {f"node{n}": [T0] * cores for n in range(nodes)}
    with open(path, "w", encoding="utf-8") as f:
        for i in range(tasks):
            node = f"node{i % nodes}"
            want = rng.choice((1, 1, 1, 2, 4))
            lanes = free[node]
            lanes.sort()
            start = lanes[want - 1] + rng.uniform(0.0, 0.05)
            run = rng.uniform(0.5, 20.0)
            for k in range(want):
                lanes[k] = start + run
            state = "FAILED" if i % 97 == 5 else "SUCCEED"
            queued = T0 + i * 0.001
            report = TaskReport(
                name=f"task:{i}", state=state,
                history=((_local(queued), "QUEUED"), (_local(start), "EXECUTING"),
                         (_local(start + run), state)),
                allocation=f"{node}:{want}", wd="/tmp", runtime=timedelta(seconds=run),
                exit_code=1 if state == "FAILED" else 0,
                message="the job exited with code 1" if state == "FAILED" else None)
            f.write(format_report_entry(report))


def _local(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch)


def chromium() -> Optional[str]:
    """The headless browser the tests open pages in (Debian's ``chromium``), if installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def open_page(page: Path, screenshot: Path, height: int = 3200,
              timeout: float = 120) -> "subprocess.CompletedProcess[str]":
    """Open ``page`` in headless Chromium, with its console on standard error: the DOM as it
    stands after loading on standard output, and a screenshot written to ``screenshot``."""
    browser = chromium()
    assert browser is not None
    profile = screenshot.parent / f"{screenshot.stem}-profile"
    common = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
              "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
              "--enable-logging=stderr", "--v=0", f"--window-size=1100,{height}"]
    env = dict(os.environ, HOME=str(screenshot.parent))
    shot = subprocess.run([*common, f"--screenshot={screenshot}", page.as_uri()],
                          capture_output=True, text=True, timeout=timeout, env=env)
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=timeout, env=env)
    return subprocess.CompletedProcess(dom.args, dom.returncode or shot.returncode,
                                       dom.stdout, shot.stderr + dom.stderr)
