"""The figures of ``psij report`` (psij.report._figures, _runs, _text) checked against a small
run computed by hand, its rows written to a real registry through its store.

The run (tests/support/report_runs.py, SMALL; times from T0, seconds):

====== ========= ============= ========= ======= ===== ===== ===== ===== ======
job    state     cause         submitted started ended  cpu  cores limit  wait
====== ========= ============= ========= ======= ===== ===== ===== ===== ======
job-1  COMPLETED               0         10      110    90    1    200    10
job-2  COMPLETED               0         20      70     100   2    100    20
job-3  FAILED    out_of_memory 5         35      45     5     1    -      30
job-4  FAILED    time_limit    5         65      125    30    4    60     60
job-5  CANCELED                10        -       -      -     1    -      -
job-6  ACTIVE                  10        -       -      -     1    -      -
====== ========= ============= ========= ======= ===== ===== ===== ===== ======

- waits 10, 20, 30, 60: nearest-rank p50 = the 2nd = 20, p90 = p99 = max = 60;
- run times 100, 50, 10, 60 (sorted 10, 50, 60, 100): p50 = 50, p90 = p99 = max = 100;
- CPU efficiency = cpu / (cores x run): 90/100 = 0.9, 100/(2x50) = 1.0, 5/10 = 0.5,
  30/(4x60) = 0.125; overall 225 / 450 = 0.5; median (2nd of 4) 0.5; lowest job-4;
- core-hours used 450 s / 3600 = 0.125 over 4 runs; requested 200 + 200 + 240 = 640 s over 3
  (job-3 and job-5 have no time limit); CPU hours 225/3600 over 4 runs;
- memory (when the registry has requested_memory_bytes): job-1 1 GiB of 2 = 0.5, job-2 1 of 4
  = 0.25; overall 2/6.
"""

import math
from pathlib import Path

import pytest

from psij.report import (
    JobRun,
    cpu_efficiency,
    from_registry,
    memory_efficiency,
    percentile,
    summarize,
    text_report,
    wait_seconds,
)
from psij.report._figures import spread
from psij.report._sources import from_rows
from psij.report._text import duration
from support.report_runs import GIB, SMALL, T0, registry_columns, write_registry, write_runs

HAS_MEMORY = "requested_memory_bytes" in registry_columns()
HAS_HELD = "held_from" in registry_columns() and "held_to" in registry_columns()


@pytest.fixture
def small(tmp_path: Path) -> Path:
    wd = tmp_path / "work"
    write_registry(wd, SMALL, tag="small")
    return wd


def test_the_small_run_s_figures_are_those_computed_by_hand(small: Path) -> None:
    runs = from_registry(work_directory=str(small))
    assert [r.name for r in runs] == [f"job-{i}" for i in range(1, 7)]
    s = summarize(runs)
    assert (s.total, s.final) == (6, 5)
    assert s.by_state == (("COMPLETED", 2), ("FAILED", 2), ("CANCELED", 1), ("ACTIVE", 1))
    assert s.by_cause == (("(no cause given)", 3), ("out_of_memory", 1), ("time_limit", 1))
    assert s.wait is not None and s.run is not None and s.cpu is not None
    assert (s.wait.count, s.wait.p50, s.wait.p90, s.wait.p99, s.wait.max) == (4, 20, 60, 60, 60)
    assert (s.run.count, s.run.p50, s.run.p90, s.run.max, s.run.min) == (4, 50, 100, 100, 10)
    assert s.cpu.count == 4 and s.cpu.p50 == 0.5 and s.cpu.min == 0.125 and s.cpu.max == 1.0
    assert s.cpu_overall == 0.5
    assert s.worst_cpu[:2] == (("job-4", 0.125), ("job-3", 0.5))
    assert s.core_hours_used == 0.125 and s.used_known == 4
    assert math.isclose(s.core_hours_requested or 0, 640 / 3600) and s.requested_known == 3
    assert math.isclose(s.cpu_hours or 0, 225 / 3600) and s.cpu_known == 4
    assert (s.first, s.last) == (T0, T0 + 125)
    assert [(f.cause, f.count, f.names) for f in s.failures] == [
        ("(no cause given)", 1, ("job-5",)), ("out_of_memory", 1, ("job-3",)),
        ("time_limit", 1, ("job-4",))]
    assert s.failures[1].messages == (("killed: out of memory", 1),)
    if HAS_MEMORY:
        assert s.memory is not None and s.memory.count == 2 and s.memory.p50 == 0.25
        assert math.isclose(s.memory_overall or 0, 2 / 6)
        assert s.worst_memory == (("job-2", 0.25), ("job-1", 0.5))
    else:  # a registry without the column: unknown, never 0
        assert s.memory is None and s.memory_overall is None and s.worst_memory == ()
    if HAS_HELD:
        assert s.held is not None and (s.held.count, s.held.max) == (1, 8)
    else:
        assert s.held is None


def test_the_terminal_report_shows_the_figures_and_unknown_ones_as_unknown(small: Path
                                                                           ) -> None:
    text = text_report(summarize(from_registry(work_directory=str(small))), "title")
    assert "by state: COMPLETED 2, FAILED 2, CANCELED 1, ACTIVE 1" in text
    assert "by cause (ended runs): (no cause given) 3, out_of_memory 1, time_limit 1" in text
    wait_line = next(line for line in text.splitlines() if line.startswith("queue wait"))
    assert wait_line.split() == ["queue", "wait", "20", "s", "1m00s", "1m00s", "1m00s", "4"]
    assert "CPU: overall 50.0%, median 50.0%, lowest 12.5%, highest 100.0% (4 of 5 runs " \
           "known)" in text
    assert "lowest: job-4 12.5%, job-3 50.0%, job-1 90.0%, job-2 100.0%" in text
    assert "core-hours: used 0.12 (4 of 5 runs known), requested 0.18 (3 of 5 runs known)" \
        in text
    assert "time_limit: 1 (e.g. job-4)" in text and "1 x time limit reached" in text
    if not HAS_MEMORY:
        assert "memory: unknown" in text
    assert " 0.0%" not in text and "memory: overall 0" not in text


def test_registry_filters_are_those_of_psij_list(small: Path, tmp_path: Path) -> None:
    write_registry(small, [dict(id="other", state="COMPLETED", submitted=T0 + 500)],
                   executor="slurm", tag="later")
    assert [r.name for r in from_registry(tag="later", work_directory=str(small))] == ["other"]
    assert [r.name for r in from_registry(executor="slurm", work_directory=str(small))] == [
        "other"]
    assert [r.name for r in from_registry(states=["FAILED"], work_directory=str(small))] == [
        "job-3", "job-4"]
    assert [r.name for r in from_registry(ids=["job-2", "job-4"],
                                          work_directory=str(small))] == ["job-2", "job-4"]
    assert [r.name for r in from_registry(since=T0 + 5, until=T0 + 5,
                                          work_directory=str(small))] == ["job-3", "job-4"]
    assert [r.name for r in from_registry(since=T0 + 400, work_directory=str(small))] == [
        "other"]


def test_each_run_of_a_job_run_again_is_counted(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    write_registry(wd, [dict(id="again", state="COMPLETED", submitted=T0, started_at=T0 + 100,
                             ended_at=T0 + 160, cpu_seconds=60.0, attempt=3, spec={}),
                        dict(id="once", state="COMPLETED", submitted=T0, started_at=T0 + 1,
                             ended_at=T0 + 2, spec={})])
    write_runs(wd, [
        dict(job_id="again", run=1, state="ACTIVE", cause="preempted", native_id="11",
             started_at=T0 + 10, ended_at=T0 + 40, cpu_seconds=30.0),
        dict(job_id="again", run=2, state="FAILED", cause="out_of_memory", message="oom",
             native_id="12", started_at=T0 + 50, ended_at=T0 + 70),
        dict(job_id="again", run=3, state="COMPLETED", native_id="13", started_at=T0 + 100),
        dict(job_id="once", run=1, state="COMPLETED", started_at=T0 + 1)])
    runs = from_registry(work_directory=str(wd))
    assert [(r.name, r.state, r.cause) for r in runs] == [
        ("again (run 1)", "RERUN", "preempted"), ("again (run 2)", "FAILED", "out_of_memory"),
        ("again", "COMPLETED", None), ("once", "COMPLETED", None)]
    # Each run waits from the end of the one before it.
    assert [wait_seconds(r) for r in runs] == [10, 10, 30, 1]
    assert [r.native_id for r in runs[:2]] == ["11", "12"]
    s = summarize(runs)
    assert s.by_state == (("COMPLETED", 2), ("FAILED", 1), ("RERUN", 1))
    assert s.run is not None and s.run.count == 4 and s.run.max == 60


def test_columns_a_registry_lacks_are_unknown_and_those_it_has_are_used() -> None:
    base = ("id", "state", "final", "submitted", "started_at", "ended_at", "cpu_seconds",
            "max_rss_bytes", "spec")
    old = from_rows(base, [("a", "COMPLETED", 1, T0, T0 + 30, T0 + 130, 50.0, GIB, None)])[0]
    assert old.queued_at is None and old.cores is None and old.requested_memory_bytes is None
    assert wait_seconds(old) == 30  # from the submission
    assert cpu_efficiency(old) is None and memory_efficiency(old) is None
    new = from_rows((*base, "queued_at", "cores", "requested_memory_bytes", "held_from",
                     "held_to", "nodes", "requested_seconds"),
                    [("a", "COMPLETED", 1, T0, T0 + 30, T0 + 130, 50.0, GIB, None, T0 + 20, 2,
                      4 * GIB, T0, T0 + 18, "n1,n2", 600.0)])[0]
    assert wait_seconds(new) == 10  # from the scheduler's queue time
    assert cpu_efficiency(new) == 0.25 and memory_efficiency(new) == 0.25
    assert new.nodes == "n1,n2" and new.requested_seconds == 600.0
    s = summarize([new])
    assert s.held is not None and s.held.max == 18
    assert s.core_hours_requested == 2 * 600 / 3600


def test_the_spec_gives_cores_and_limit_only_when_no_column_does() -> None:
    spec = '{"resources": {"node_count": 2, "processes_per_node": 3, ' \
           '"cpu_cores_per_process": 2}, "attributes": {"duration": 120}}'
    run = from_rows(("id", "state", "final", "spec"), [("a", "FAILED", 1, spec)])[0]
    assert (run.cores, run.requested_seconds) == (12, 120)
    given = from_rows(("id", "state", "final", "spec", "cores", "requested_seconds"),
                      [("a", "FAILED", 1, spec, 5, 60.0)])[0]
    assert (given.cores, given.requested_seconds) == (5, 60)
    for bad in ("not json", "[1]", '{"resources": 3}', None, 7):
        unknown = from_rows(("id", "state", "final", "spec"), [("a", "FAILED", 1, bad)])[0]
        assert unknown.requested_seconds is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1, -0.5, True, "12", None])
def test_hostile_numbers_are_unknown_never_nan_or_negative(value: object) -> None:
    columns = ("id", "state", "final", "submitted", "started_at", "ended_at", "cpu_seconds",
               "cores", "max_rss_bytes", "requested_memory_bytes")
    run = from_rows(columns, [("a", "COMPLETED", 1, *[value] * 7)])[0]
    assert [getattr(run, c) for c in columns[3:]] == [None] * 7
    text = text_report(summarize([run]), "t")
    assert "nan" not in text.lower() and "inf" not in text.lower()


def test_huge_values_are_reported_without_failing() -> None:
    columns = ("id", "state", "final", "submitted", "started_at", "ended_at", "cpu_seconds",
               "cores", "max_rss_bytes")
    run = from_rows(columns, [("a", "COMPLETED", 1, 1e300, 1e300, 1e301, 1e308, 1 << 80,
                               1 << 62)])[0]
    assert run.cores is None and run.max_rss_bytes == 1 << 62  # past 2**63-1: unknown
    # No clock gives such times, nor a job such CPU times: unknown.
    assert (run.submitted, run.started_at, run.ended_at, run.cpu_seconds) == (None,) * 4
    assert from_rows(columns[:4], [("a", "COMPLETED", 1, 1 << 2000)])[0].submitted is None
    text = text_report(summarize([run]), "t")
    assert "from " in text and "nan" not in text.lower()


def test_a_run_not_ended_has_no_end_nor_use_even_if_a_row_says_so() -> None:
    run = from_rows(("id", "state", "final", "started_at", "ended_at", "cpu_seconds"),
                    [("a", "ACTIVE", 0, T0, T0 + 5, 3.0)])[0]
    assert (run.ended_at, run.cpu_seconds) == (None, None)


def test_text_from_jobs_is_written_safely() -> None:
    run = JobRun(name="x\udcff\x1b[2J", state="FAILED", cause="c\n", message="a\x1b]0;\x07 b")
    text = text_report(summarize(from_rows(("id", "state", "final", "message", "cause"),
                                           [(run.name, "FAILED", 1, run.message, "c")])), "t")
    assert "\x1b" not in text and "\x07" not in text
    text.encode("utf-8")  # no lone surrogate left


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert percentile([3.0], 50) == 3.0 and percentile([1.0, 2.0], 50) == 1.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="p must be"):
        percentile([1.0], 0)
    assert spread([None, None]) is None


def test_durations_read_as_people_write_them() -> None:
    assert [duration(v) for v in (None, 0.0004, 0.35, 42.2, 185, 7440, 3 * 86400 + 4 * 3600)] \
        == ["unknown", "0.40 ms", "0.35 s", "42 s", "3m05s", "2h04m", "3d04h"]
