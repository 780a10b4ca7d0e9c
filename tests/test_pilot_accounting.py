"""What a pilot task's run used, checked against what it really did: a task that burns about
2 s of CPU on one core and one that touches 300 MB, on the ``pilot`` executor (the figures in
their final status, and in the pilot's journal, read back as one row per run); the figures
that cross a process or a file (a worker's report, an agent's message, a served pilot's event,
a journal line) are left out when they cannot be read, and never stop the pilot."""

import json
import math
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1
from psij.executors.pilot._local_workers import LocalWorkers, _Worker
from psij.executors.pilot.executor import PilotJobExecutorConfig, job_status_of
from psij.executors.pilot.journal import end_line, read_journal, start_line, task_runs
from psij.executors.pilot.scheduler import TaskState
from psij.executors.pilot.tasks import TaskEvent, TaskShare, TaskUse, reported_use

MB = 1 << 20
BURN = ("import time\nstart = time.process_time()\n"
        "while time.process_time() - start < 2.0:\n    pass\n")
TOUCH = ("b = bytearray(300 * 1024 * 1024)\n"
         "for i in range(0, len(b), 4096):\n    b[i] = 1\n")
HOSTILE: List[Any] = [float("nan"), float("inf"), -1, -0.5, 1 << 70, "3", True, None, [1],
                      {"a": 1}, "\ud800"]


def own_peak() -> int:
    """This process's peak resident memory (VmHWM), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def test_a_pilot_job_reports_the_cpu_and_memory_it_used(tmp_path: Path) -> None:
    journal = tmp_path / "pilot.journal"
    ex = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(
        cores=3, journal=journal))  # both at once: the burn on one core, the touch on two
    burn = Job(JobSpec(sys.executable, ["-c", BURN], attributes=JobAttributes(
        custom_attributes={"pilot.time_limit": 120})))
    touch = Job(JobSpec(sys.executable, ["-c", TOUCH], resources=ResourceSpecV1(
        cpu_cores_per_process=2, memory=400 * MB)))
    try:
        for job in (burn, touch):
            ex.submit(job)
        for job in (burn, touch):
            assert job.wait(timedelta(seconds=60)) is not None
            assert job.status.state is JobState.COMPLETED, job.status
    finally:
        ex.close()
    used = {}
    for job in (burn, touch):
        meta = job.status.metadata or {}
        assert meta["queued_at"] <= meta["started_at"] <= meta["ended_at"]
        assert isinstance(meta["nodes"], str) and meta["nodes"] and meta["run"] == 1
        used[job.id] = meta
    assert 1.5 <= used[burn.id]["cpu_seconds"] <= 6
    assert used[burn.id]["cores"] == 1 and used[burn.id]["requested_seconds"] == 120
    assert "requested_memory_bytes" not in used[burn.id]
    assert used[touch.id]["max_rss_bytes"] >= 300 * MB
    # The burn's peak is its own, or the floor of this process's peak (a 3-core pilot starts
    # its tasks from the program that runs it; Linux carries that peak into the task's).
    assert used[burn.id]["max_rss_bytes"] <= max(100 * MB, own_peak() + 16 * MB)
    assert used[touch.id]["cpu_seconds"] < used[burn.id]["cpu_seconds"]
    assert used[touch.id]["cores"] == 2
    assert used[touch.id]["requested_memory_bytes"] == 400 * MB
    # The journal tells the same run after the fact: one row per run, with its cores.
    rows = {row["id"]: row for row in task_runs(read_journal(journal))}
    for job in (burn, touch):
        row, meta = rows[job.id], used[job.id]
        assert row["state"] == "SUCCEEDED" and row["exit_code"] == 0 and row["run"] == 1
        for key in ("queued_at", "started_at", "ended_at", "cpu_seconds", "max_rss_bytes",
                    "nodes", "cores"):
            assert row[key] == meta[key], key
        assert row["core_ids"].startswith(f"{meta['nodes']}[")
    assert len(rows[touch.id]["core_ids"].partition("[")[2].split(":")) == 2
    assert rows[touch.id]["requested_memory_bytes"] == 400 * MB
    assert rows[burn.id]["requested_seconds"] == 120


def test_figures_that_cannot_be_read_are_left_out() -> None:
    for value in HOSTILE:
        # A served pilot's event (the client reads it from a socket).
        event = TaskEvent.from_json({"task_id": "t", "state": "SUCCEEDED", "time": 1.0,
                                     "use": {"cpu_seconds": value, "max_rss_bytes": value,
                                             "started_at": value, "cores": value}})
        assert event.use == TaskUse(), value
        # What a worker or an agent reports.
        assert reported_use(value, value) is None, value
    assert TaskEvent.from_json({"task_id": "t", "state": "FAILED", "time": 1.0,
                                "use": "garbage"}).use is None
    assert reported_use(1, 2) == (1.0, 2) and reported_use("x", 5) == (None, 5)
    status = job_status_of(TaskState.SUCCEEDED, None, 0, ("n1", "n2"), 5.0,
                           TaskUse(1.0, 2.0, 4.0, 1.5, None, 3), 2)
    assert status.metadata == {"pilot_state": "SUCCEEDED", "nodes": "n1,n2", "queued_at": 1.0,
                               "started_at": 2.0, "ended_at": 4.0, "cpu_seconds": 1.5,
                               "cores": 3, "run": 2}


def test_a_worker_report_with_hostile_figures_ends_the_task_without_them() -> None:
    ends: Dict[str, Any] = {}
    workers = LocalWorkers(Path("/nonexistent"), "run", None, None, lambda e: None,  # type: ignore
                           lambda t, p: None, lambda *end: ends.__setitem__(end[0], end[1:]),
                           lambda ids, why: None, 1, 1, 1.0, {})
    worker = _Worker(1, 0, -1, -1)
    names = [f"t{i}" for i in range(len(HOSTILE))]
    worker.tasks.update({name: 100 for name in [*names, "ok", "short"]})
    # As read from the pipe: json reads NaN and Infinity too.
    line = json.dumps({"op": "report", "ended": [
        *([n, 0, None, v, v] for n, v in zip(names, HOSTILE)),
        ["ok", 0, None, 1.25, 4096], ["short", 0, None]]})
    workers._handle(worker, json.loads(line))
    assert all(ends[n] == (0, None, None) for n in names)
    assert ends["ok"] == (0, None, (1.25, 4096)) and ends["short"] == (0, None, None)


def test_hostile_journal_lines_give_rows_without_those_figures(tmp_path: Path) -> None:
    share = TaskShare(("n1",), (1,), ((3,),))
    lines = [
        json.dumps({"e": "submit", "task": {"name": "a", "executable": "x"}, "t": 10.0}) + "\n",
        start_line("a", "n1", 42, "r", 11.0, share),
        end_line("a", "SUCCEEDED", 0, 12.5, (0.25, 1 << 20)),
        '{"e":"submit","task":{"name":"b","executable":"x","time_limit":"soon"},"t":NaN}\n',
        '{"e":"start","id":"b","node":"n2","t":-3,"share":{"nodes":"n2","cores":5}}\n',
        '{"e":"end","id":"b","state":7,"code":"x","t":"later","cpu_seconds":Infinity,'
        '"max_rss_bytes":-1}\n',
        '{"e":"end","id":"b","state":"FAILED","code":1}\n',  # a second end of one run
        '{"e":"submit","task":{"name":"c","executable":"x"}}\n',
        '{"e":"end","id":"c","state":"CANCELED","code":null}\n',
        '"not a record"\n', '{"e":"start"}\n', "not json\n",
    ]
    path = tmp_path / "journal"
    path.write_text("".join(lines))
    rows = task_runs(read_journal(path))
    assert rows == [
        {"id": "a", "run": 1, "queued_at": 10.0, "started_at": 11.0, "nodes": "n1",
         "cores": 1, "core_ids": "n1[3]", "state": "SUCCEEDED", "exit_code": 0,
         "ended_at": 12.5, "cpu_seconds": 0.25, "max_rss_bytes": 1 << 20},
        {"id": "b", "run": 1, "nodes": "n2"},
        {"id": "c", "run": 1, "state": "CANCELED"}]
    assert all(not isinstance(v, float) or math.isfinite(v) for row in rows
               for v in row.values())
