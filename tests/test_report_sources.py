"""Where ``psij report --pilot`` reads a pilot run (psij.report._sources): a ``jobs.report``
written by a real ``psij pilot run``, one written entry by entry as the pilot writes it, a
served pilot's journal, and files that cannot be read; and the cores of a pilot run laid out
one row per core (psij.report._shapes)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psij.report import SourceError, from_jobs_report, from_journal, from_pilot, summarize
from psij.report._runs import JobRun
from psij.report._shapes import WAIT, core_lanes, job_rows, levels
from psij.report._sources import parse_time
from support.report_runs import T0, write_pilot_report

PSIJ = str(Path(sys.executable).parent / "psij")


def test_a_real_pilot_run_s_report_gives_each_task_its_times_cores_and_state(
        tmp_path: Path) -> None:
    requests = [{"request": "submit", "jobs": [
        {"name": "two", "execution": {"exec": "/bin/sleep", "args": ["0.3"]},
         "resources": {"numCores": {"exact": 2}}},
        {"name": "bad", "execution": {"exec": "/bin/sh", "args": ["-c", "exit 3"]}},
        {"name": "it", "iteration": {"start": 0, "stop": 3},
         "execution": {"exec": "/bin/true"}}]},
        {"request": "finishAfterAllTasksDone"}]
    (tmp_path / "req.json").write_text(json.dumps(requests))
    done = subprocess.run([PSIJ, "pilot", "run", "--cores", "4", "--wd", str(tmp_path),
                           str(tmp_path / "req.json")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    runs = {r.name: r for r in from_pilot(tmp_path)}
    # The iterative job's own entry is left out: its iterations are there.
    assert sorted(runs) == ["bad", "it:0", "it:1", "it:2", "two"]
    two, bad = runs["two"], runs["bad"]
    assert (two.state, two.cores, two.exit_code) == ("COMPLETED", 2, 0)
    assert (bad.state, bad.cores, bad.exit_code) == ("FAILED", 1, 3)
    assert bad.message == "the job exited with code 3"
    assert two.placement and two.nodes == two.placement[0][0]
    for run in runs.values():
        assert run.queued_at is not None and run.started_at is not None
        assert run.ended_at is not None
        assert run.queued_at <= run.started_at <= run.ended_at
    assert two.ended_at - two.started_at >= 0.25  # type: ignore[operator]
    s = summarize(list(runs.values()))
    assert s.by_state == (("COMPLETED", 4), ("FAILED", 1))
    if "cpu_seconds:" in (tmp_path / "jobs.report").read_text():  # a pilot that measures use
        assert s.cpu is not None and s.cpu.count == 5
    else:  # one that does not: unknown, never 0
        assert s.cpu is None
    journal = from_pilot(tmp_path / "psij-pilot.journal")
    assert sorted(r.name for r in journal) == ["bad", "it:0", "it:1", "it:2", "two"]
    assert {r.name: (r.state, r.exit_code, r.cores) for r in journal}["bad"] == (
        "FAILED", 3, 1)
    assert {r.name: r.cores for r in journal}["two"] == 2
    timed = '"t":' in (tmp_path / "psij-pilot.journal").read_text()
    # Times where the pilot's journal keeps them, unknown where it does not.
    assert all((r.started_at is not None) == timed for r in journal)


def test_entries_as_the_pilot_writes_them_are_read_back(tmp_path: Path) -> None:
    path = tmp_path / "jobs.report"
    write_pilot_report(path, 500, cores=8, nodes=2)
    runs = from_jobs_report(path)
    assert len(runs) == 500
    assert sum(r.state == "FAILED" for r in runs) == len([i for i in range(500) if i % 97 == 5])
    assert all(r.cores in (1, 2, 4) and r.nodes in ("node0", "node1") for r in runs)
    assert all(r.started_at is not None and r.ended_at is not None for r in runs)
    labels, bars = core_lanes(runs)
    # No two tasks on one core at once, and no node given more rows than it had cores.
    by_row: dict = {}
    for row, start, end, _ in bars:
        by_row.setdefault(row, []).append((start, end))
    for spans in by_row.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    assert sum(label.startswith("node0/#") for label in labels) <= 8
    assert len(bars) == sum(r.cores or 0 for r in runs)


def test_core_ids_a_pilot_wrote_place_each_task_on_its_own_cores(tmp_path: Path) -> None:
    path = tmp_path / "jobs.report"
    path.write_text(
        "a (SUCCEED)\n    2026-12-08 10:00:00: QUEUED\n    2026-12-08 10:00:01: EXECUTING\n"
        "    2026-12-08 10:00:03: SUCCEED\n    allocation: n1:2,n2:1\n"
        "    core_ids: n1[4:7],n2[0]\n    cpu_seconds: 3.500\n    max_rss_bytes: 1000\n"
        "b (SUCCEED)\n    2026-12-08 10:00:00: QUEUED\n    2026-12-08 10:00:02: EXECUTING\n"
        "    2026-12-08 10:00:04: SUCCEED\n    allocation: n1:1\n    core_ids: n1[5]\n")
    a, b = from_jobs_report(path)
    assert a.core_ids == (("n1", (4, 7)), ("n2", (0,))) and a.cores == 3
    assert (a.cpu_seconds, a.max_rss_bytes) == (3.5, 1000)
    labels, bars = core_lanes([a, b])
    assert labels == ["n1/4", "n1/5", "n1/7", "n2/0"]
    assert sorted((labels[row], kind) for row, _, _, kind in bars) == [
        ("n1/4", "COMPLETED"), ("n1/5", "COMPLETED"), ("n1/7", "COMPLETED"),
        ("n2/0", "COMPLETED")]


def test_a_journal_with_times_and_shares_gives_runs(tmp_path: Path) -> None:
    path = tmp_path / "psij-pilot.journal"
    share = {"nodes": ["n1"], "processes": [2], "cores": [[2, 3]], "gpus": [[]]}
    path.write_text("\n".join(json.dumps(r) for r in [
        {"e": "submit", "task": {"name": "a", "time_limit": 30}, "t": T0},
        {"e": "start", "id": "a", "node": "n1", "t": T0 + 4, "share": share},
        {"e": "end", "id": "a", "state": "SUCCEEDED", "code": 0, "t": T0 + 10,
         "cpu_seconds": 5.0, "max_rss_bytes": 2048}]) + "\n")
    (run,) = from_journal(path)
    assert (run.name, run.state, run.exit_code, run.nodes) == ("a", "COMPLETED", 0, "n1")
    assert (run.queued_at, run.started_at, run.ended_at) == (T0, T0 + 4, T0 + 10)
    assert (run.cpu_seconds, run.max_rss_bytes, run.requested_seconds) == (5.0, 2048, 30)


def test_a_later_entry_of_a_name_replaces_the_earlier_and_odd_lines_are_skipped(
        tmp_path: Path) -> None:
    path = tmp_path / "jobs.report"
    path.write_text(
        "a (FAILED)\n    2026-12-08 10:00:00: QUEUED\n    2026-12-08 10:00:01: EXECUTING\n"
        "    2026-12-08 10:00:03: FAILED\n    allocation: n1:2,n2:3\n    exit_code: 1\n"
        "garbage line\n    2026-99-99 10:00:00: QUEUED\n"
        "a (SUCCEED)\n    2026-12-08 11:00:00: QUEUED\n    not-a-time: EXECUTING\n"
        "    2026-12-08 11:00:02: EXECUTING\n    2026-12-08 11:00:07: SUCCEED\n"
        "    allocation: n1:2,n2:3\n    cpu_seconds: 12.5\n    max_rss_bytes: -4\n"
        "    message: line one\n")
    (run,) = from_jobs_report(path)
    assert (run.state, run.cores, run.nodes) == ("COMPLETED", 5, "n1,n2")
    assert run.ended_at - run.started_at == 5  # type: ignore[operator]
    assert run.cpu_seconds == 12.5 and run.max_rss_bytes is None
    assert run.message == "line one"


def test_files_that_cannot_be_read_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        from_pilot(tmp_path / "missing")
    with pytest.raises(SourceError, match="neither jobs.report nor psij-pilot.journal"):
        from_pilot(tmp_path)
    (tmp_path / "jobs.report").write_bytes(b"\xff\xfe not a report\n")
    with pytest.raises(SourceError, match="no jobs.report entry"):
        from_pilot(tmp_path)
    assert from_journal(tmp_path / "none.journal") == []


def test_a_journal_s_bad_records_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j"
    share = {"nodes": ["n7"], "processes": [3], "cores": [[0, 1, 2, 3, 4, 5]]}
    path.write_text("\n".join([
        json.dumps({"e": "submit", "task": {"name": "a", "resources": {
            "processes": [3, 3, None], "cores_per_process": 2, "memory_per_process": 100},
            "time_limit": 60}, "t": T0}),
        "not json", "[1, 2]", json.dumps({"e": "end", "id": 5}),
        json.dumps({"e": "start", "id": "a", "node": "n7", "t": T0 + 1, "share": share}),
        json.dumps({"e": "end", "id": "a", "state": "SUCCEEDED", "code": 0, "t": T0 + 10,
                    "cpu_seconds": float("nan"), "max_rss_bytes": -1})]) + "\n")
    (run,) = from_journal(path)
    assert (run.name, run.state, run.nodes, run.cores) == ("a", "COMPLETED", "n7", 6)
    assert (run.requested_memory_bytes, run.requested_seconds) == (300, 60)
    assert (run.queued_at, run.started_at, run.ended_at) == (T0, T0 + 1, T0 + 10)
    assert run.cpu_seconds is None and run.max_rss_bytes is None


def test_rows_of_jobs_show_the_wait_and_the_run() -> None:
    runs = [JobRun("a", "COMPLETED", submitted=T0, started_at=T0 + 5, ended_at=T0 + 9),
            JobRun("b", "CANCELED", submitted=T0 + 1, ended_at=T0 + 3),
            JobRun("c", "ACTIVE", queued_at=T0 + 2, started_at=T0 + 4)]
    labels, bars = job_rows(runs)
    assert labels == ["a", "b", "c"]
    assert sorted(bars) == [(0, T0, T0 + 5, WAIT), (0, T0 + 5, T0 + 9, "COMPLETED"),
                            (1, T0 + 1, T0 + 3, WAIT), (2, T0 + 2, T0 + 4, WAIT),
                            (2, T0 + 4, T0 + 9, "ACTIVE")]
    assert levels([(5.0, 2), (1.0, 1), (5.0, -1), (7.0, -2)]) == ([1.0, 5.0, 7.0],
                                                                  [1.0, 2.0, 0.0])


def test_times_on_the_command_line() -> None:
    assert parse_time("--since", "2h", now=10_000.0) == 2800.0
    assert parse_time("--since", "1.5d", now=200_000.0) == 200_000.0 - 129_600
    assert parse_time("--until", "2026-12-08T10:30:00+00:00") == 1796725800.0
    for bad in ("yesterday", "", "5x", "1e400d", "2026-13-01", "\udcff"):
        with pytest.raises(ValueError, match="--since: expected a date"):
            parse_time("--since", bad)
