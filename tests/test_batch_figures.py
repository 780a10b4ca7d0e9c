"""The figures of a batch job's run read from Slurm's sacct and Grid Engine's qacct: real output
(taken from the test schedulers), the older and rarer forms, and garbled or hostile values,
which leave a figure out and never lose the job's end."""

import math
import time
from typing import Any, Dict

import pytest

from psij import JobState
from psij.executors.batch._figures import (
    FIGURE_KEYS,
    clean_figures,
    clock_seconds,
    figures_of,
    local_time,
    memory_bytes,
    number,
)
from psij.executors.batch._figures_slurm import expand_nodes
from psij.executors.batch.sge import SgeJobExecutor
from psij.executors.batch.slurm import SlurmJobExecutor

HOSTILE = ["", " ", "nan", "NaN", "inf", "-inf", "-5", "1e309", "9" * 5000, "\ud800", "a\nb",
           "12:34:56:78", "--", "\x00", "٣", "None", "Unknown", "UNLIMITED", "INVALID",
           "Partition_Limit", "1:75:00", "00:61", "K", "1.2.3", "0x10"]


# Values that are no figure in any field (a host may be named "nan" or "K", though).
NO_FIGURE = {"", " ", "nan", "NaN", "inf", "-inf", "-5", "1e309", "9" * 5000, "None",
             "Unknown", "UNLIMITED", "INVALID", "\x00", "\ud800", "a\nb", "a b"}
NO_HOST = {"", " ", "\x00", "\ud800", "a\nb", "None", "None assigned"}
SACCT_KEYS = {"TotalCPU": "cpu_seconds", "MaxRSS": "max_rss_bytes", "AllocCPUS": "cores",
              "ReqMem": "requested_memory_bytes", "NodeList": "nodes", "Submit": "queued_at",
              "Start": "started_at", "End": "ended_at", "Timelimit": "requested_seconds"}
QACCT_KEYS = {"cpu": "cpu_seconds", "maxvmem": "max_vmem_bytes", "ru_maxrss": "max_rss_bytes",
              "slots": "cores", "hostname": "nodes", "qsub_time": "queued_at",
              "start_time": "started_at", "end_time": "ended_at"}


def _sound(meta: Dict[str, Any]) -> bool:
    """Whether every figure in ``meta`` is one that clean_figures keeps as it is."""
    return clean_figures(meta) == {key: meta[key] for key in FIGURE_KEYS if key in meta}


def _local(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


# --------------------------------------------------------------------------- readers


@pytest.mark.parametrize("text,seconds", [
    ("00:02.452", 2.452), ("01:30", 90.0), ("00:02:00", 120.0), ("01:02:03", 3723.0),
    ("1-01:02:03", 90123.0), ("100:00:00", 360000.0), ("42", 42.0), ("0:0:5.5", 5.5),
])
def test_durations_in_the_schedulers_forms(text: str, seconds: float) -> None:
    assert clock_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [*HOSTILE, "1-02", "1-02:03"])
def test_garbled_durations_are_no_figure(text: str) -> None:
    value = clock_seconds(text)
    assert value is None or (math.isfinite(value) and value >= 0)
    if text in ("nan", "inf", "-5", "UNLIMITED", "Unknown", "None", "1:75:00", "00:61",
                "9" * 5000, "\ud800", "1-02"):
        assert value is None


@pytest.mark.parametrize("text,default,size", [
    ("16648K", "", 16648 * 1024), ("512M", "", 512 << 20), ("1.5G", "", 3 << 29),
    ("307832kb", "", 307832 << 10), ("10.961MB", "", round(10.961 * 2 ** 20)),
    ("2GiB", "", 2 << 30), ("1024b", "", 1024), ("4000", "M", 4000 << 20), ("0", "K", 0),
])
def test_sizes_in_binary_multiples(text: str, default: str, size: int) -> None:
    assert memory_bytes(text, default) == size


@pytest.mark.parametrize("text", [*HOSTILE, "1e3K", "12Q", "5 pages", "1" * 40 + "E"])
def test_garbled_sizes_are_no_figure(text: str) -> None:
    value = memory_bytes(text)
    assert value is None or (isinstance(value, int) and 0 <= value < 2 ** 63)
    if text not in ("٣",):  # (a digit of another script is a digit)
        assert value is None


def test_numbers_and_times_refuse_nonsense() -> None:
    assert number("2.5") == 2.5 and number(3) == 3.0
    for bad in ("nan", "inf", "-1", True, float("nan"), float("inf"), -2, "1e400", None):
        assert number(bad) is None
    assert local_time("2026-12-08T00:34:54", ("%Y-%m-%dT%H:%M:%S",)) \
        == _local("2026-12-08T00:34:54")
    assert local_time("1796690094", ()) == 1796690094.0
    for bad in ("Unknown", "None", "-/-", "", "2026-13-45T99:99:99", "0", "99999999999999",
                "\ud800", "a\nb"):
        assert local_time(bad, ("%Y-%m-%dT%H:%M:%S",)) is None


def test_only_sound_figures_are_kept() -> None:
    kept = clean_figures({
        "cpu_seconds": float("nan"), "max_rss_bytes": -1, "cores": 0, "nodes": "a\nb",
        "queued_at": float("inf"), "requested_seconds": True, "ended_at": 5,
        "requested_memory_bytes": 2.5, "max_vmem_bytes": 2 ** 64, "started_at": "3",
        "other": 1})
    assert kept == {"ended_at": 5.0}
    assert isinstance(kept["ended_at"], float)
    assert figures_of({"cores": 2.0, "nodes": " n1 ", "native_state": "COMPLETED"}) \
        == {"cores": 2, "nodes": "n1"}


@pytest.mark.parametrize("text,nodes", [
    ("n1", "n1"), ("n[1-3]", "n1,n2,n3"), ("n[1-2,5],m7", "n1,n2,n5,m7"),
    ("gpu[01-03]", "gpu01,gpu02,gpu03"), ("a[1-2]-ib", "a1-ib,a2-ib"),
    ("None assigned", None), ("", None),
    # Forms not read are kept as Slurm writes them.
    ("n[1-999999]", "n[1-999999]"), ("n[", "n["), ("n[x]", "n[x]"), ("n[3-1]", "n[3-1]"),
    ("n[1-2]x[3-4]", "n[1-2]x[3-4]"),
])
def test_slurm_node_lists_are_spelled_out_when_short(text: str, nodes: str) -> None:
    assert expand_nodes(text) == nodes


# --------------------------------------------------------------------------- sacct

SACCT = (
    "25410|COMPLETED|0:0|00:02.452||1|1|512M|n1|2026-12-08T00:34:54|2026-12-08T00:34:54|"
    "2026-12-08T00:34:57|00:02:00|None\n"
    "25410.batch|COMPLETED|0:0|00:02.452|16648K|1|1||n1|2026-12-08T00:34:54|"
    "2026-12-08T00:34:54|2026-12-08T00:34:57||\n"
    "25410.0|COMPLETED|0:0|00:01.000|318580K|1|1||n1|2026-12-08T00:34:55|"
    "2026-12-08T00:34:55|2026-12-08T00:34:56||\n")


@pytest.fixture
def slurm() -> SlurmJobExecutor:
    return SlurmJobExecutor()


def test_sacct_asks_for_the_figures_fields(slurm: SlurmJobExecutor) -> None:
    [argv] = slurm.get_accounting_commands(["7", "8_2"])
    assert argv[-1] == ("--format=JobID,State,ExitCode,TotalCPU,MaxRSS,AllocCPUS,NNodes,"
                        "ReqMem,NodeList,Submit,Start,End,Timelimit,Reason")


def test_sacct_gives_the_runs_figures(slurm: SlurmJobExecutor) -> None:
    status = slurm.parse_accounting_output(0, SACCT)["25410"]
    assert status.state is JobState.COMPLETED and status.exit_code == 0
    meta = status.metadata or {}
    assert meta["cpu_seconds"] == pytest.approx(2.452)
    assert meta["max_rss_bytes"] == 318580 * 1024  # the largest step's, not the batch step's
    assert meta["cores"] == 1 and meta["nodes"] == "n1"
    assert meta["requested_memory_bytes"] == 512 << 20
    assert meta["requested_seconds"] == 120.0
    assert meta["queued_at"] == _local("2026-12-08T00:34:54") == meta["started_at"]
    assert meta["ended_at"] == _local("2026-12-08T00:34:57")


def _sacct_line(**values: str) -> str:
    fields: Dict[str, str] = {
        "JobID": "9", "State": "COMPLETED", "ExitCode": "0:0", "TotalCPU": "01:02:03",
        "MaxRSS": "", "AllocCPUS": "8", "NNodes": "2", "ReqMem": "4000Mc",
        "NodeList": "n[1-2]", "Submit": "2026-12-08T00:00:00", "Start": "2026-12-08T00:01:00",
        "End": "2026-12-08T01:00:00", "Timelimit": "1-00:00:00", "Reason": "None"}
    fields.update(values)
    return "|".join(fields.values()) + "\n"


def test_older_slurms_req_mem_per_cpu_and_per_node(slurm: SlurmJobExecutor) -> None:
    per_cpu = slurm.parse_accounting_output(0, _sacct_line())["9"].metadata or {}
    assert per_cpu["requested_memory_bytes"] == 4000 * 8 << 20
    assert per_cpu["nodes"] == "n1,n2" and per_cpu["cores"] == 8
    assert per_cpu["cpu_seconds"] == 3723.0 and per_cpu["requested_seconds"] == 86400.0
    assert "max_rss_bytes" not in per_cpu  # not gathered: no step has any
    per_node = slurm.parse_accounting_output(0, _sacct_line(ReqMem="2Gn"))["9"].metadata
    assert (per_node or {})["requested_memory_bytes"] == 4 << 30


def test_unlimited_and_unknown_are_left_out(slurm: SlurmJobExecutor) -> None:
    out = _sacct_line(State="CANCELLED by 0", ExitCode="0:0", Start="Unknown", End="Unknown",
                      Timelimit="UNLIMITED", NodeList="None assigned", AllocCPUS="0",
                      TotalCPU="00:00:00")
    status = slurm.parse_accounting_output(0, out)["9"]
    assert status.state is JobState.CANCELED
    meta = status.metadata or {}
    for key in ("started_at", "ended_at", "requested_seconds", "nodes", "cores"):
        assert key not in meta, key
    assert meta["queued_at"] == _local("2026-12-08T00:00:00")
    assert meta["cpu_seconds"] == 0.0


def test_a_record_without_its_start_details_is_not_whole(slurm: SlurmJobExecutor) -> None:
    # Seen on the test Slurm: a job that started and ended at once has a COMPLETED record
    # without Timelimit (and ReqMem "16?") for a moment; its end is not taken from it yet.
    meta = slurm.parse_accounting_output(0, _sacct_line(Timelimit="", ReqMem="16?"))["9"].metadata
    assert meta is not None and "ended_at" not in meta and "requested_memory_bytes" not in meta
    assert meta["cpu_seconds"] == 3723.0


@pytest.mark.parametrize("field", ["TotalCPU", "MaxRSS", "AllocCPUS", "NNodes", "ReqMem",
                                   "NodeList", "Submit", "Start", "End", "Timelimit"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_sacct_values_lose_a_figure_not_the_end(slurm: SlurmJobExecutor, field: str,
                                                        value: str) -> None:
    value = value.replace("\n", " ")  # (sacct writes one line per job)
    line = _sacct_line(ExitCode="3:0", State="FAILED", **{field: value})
    step = _sacct_line(JobID="9.batch", ExitCode="3:0", State="FAILED", MaxRSS=value
                       if field == "MaxRSS" else "10K")
    status = slurm.parse_accounting_output(0, line + step)["9"]
    assert status.state is JobState.FAILED and status.exit_code == 3
    meta: Dict[str, Any] = status.metadata or {}
    assert _sound(meta)
    key = SACCT_KEYS.get(field)
    if key is not None and value in (NO_HOST if field == "NodeList" else NO_FIGURE):
        assert key not in meta or (field == "MaxRSS" and meta[key] == 10240), meta
    if field not in ("Timelimit", "End"):
        assert meta["ended_at"] == _local("2026-12-08T01:00:00")


def test_old_four_field_lines_still_parse(slurm: SlurmJobExecutor) -> None:
    found = slurm.parse_accounting_output(0, "5|COMPLETED|0:0|None\n5.batch|COMPLETED|0:0|\n")
    assert found["5"].state is JobState.COMPLETED
    assert not any(key in (found["5"].metadata or {}) for key in ("cpu_seconds", "cores"))


def test_running_jobs_carry_no_figures(slurm: SlurmJobExecutor) -> None:
    status = slurm.parse_accounting_output(0, _sacct_line(State="RUNNING", End="Unknown"))["9"]
    assert status.state is JobState.ACTIVE
    assert "cpu_seconds" not in (status.metadata or {})


# --------------------------------------------------------------------------- qacct

QACCT = """==============================================================
qname        all.q
hostname     vm
group        root
owner        root
jobname      mem.sh
jobnumber    1468
taskid       undefined
qsub_time    Tue Dec  8 00:38:51 2026
start_time   Tue Dec  8 00:38:51 2026
end_time     Tue Dec  8 00:38:54 2026
granted_pe   NONE
slots        1
failed       0
exit_status  0
ru_wallclock 3s
ru_utime     0.090s
ru_stime     0.200s
ru_maxrss    307.789KB
cpu          0.290s
mem          36.963MBs
maxvmem      311.102MB
arid         undefined
category     -l h_rt=120,h_vmem=2G
"""


@pytest.fixture
def sge() -> SgeJobExecutor:
    return SgeJobExecutor()


def test_qacct_gives_the_runs_figures(sge: SgeJobExecutor) -> None:
    status = sge.parse_accounting_output(0, QACCT)["1468"]
    assert status.state is JobState.COMPLETED
    meta: Dict[str, Any] = status.metadata or {}
    assert meta["cpu_seconds"] == pytest.approx(0.29)
    # maxvmem is virtual memory; ru_maxrss is kilobytes written as if bytes.
    assert meta["max_vmem_bytes"] == round(311.102 * 2 ** 20)
    assert meta["max_rss_bytes"] == round(307.789 * 1024) * 1024
    assert meta["cores"] == 1 and meta["nodes"] == "vm"
    assert meta["requested_seconds"] == 120.0 and meta["requested_memory_bytes"] == 2 << 30
    assert meta["queued_at"] == _local("2026-12-08T00:38:51") == meta["started_at"]
    assert meta["ended_at"] == _local("2026-12-08T00:38:54")


def test_qacct_older_forms_and_parallel_jobs(sge: SgeJobExecutor) -> None:
    text = (QACCT.replace("cpu          0.290s", "cpu          12.5")
            .replace("slots        1", "slots        4")
            .replace("ru_maxrss    307.789KB", "ru_maxrss    0")
            .replace("category     -l h_rt=120,h_vmem=2G",
                     "category     -l h_rt=01:00:00,h_vmem=1G -pe smp 4")
            .replace("qsub_time    Tue Dec  8 00:38:51 2026", "qsub_time    12/08/2026 00:38:50"))
    meta = sge.parse_accounting_output(0, text)["1468"].metadata or {}
    assert meta["cpu_seconds"] == 12.5 and meta["cores"] == 4
    assert meta["requested_seconds"] == 3600.0 and meta["requested_memory_bytes"] == 4 << 30
    assert "max_rss_bytes" not in meta  # not measured
    assert meta["queued_at"] == _local("2026-12-08T00:38:50")


def test_qacct_of_a_job_that_never_started(sge: SgeJobExecutor) -> None:
    text = (QACCT.replace("start_time   Tue Dec  8 00:38:51 2026", "start_time   -/-")
            .replace("failed       0", "failed       1  : assumedly before job")
            .replace("cpu          0.290s\n", ""))
    status = sge.parse_accounting_output(0, text)["1468"]
    assert status.state is JobState.FAILED
    meta = status.metadata or {}
    assert "started_at" not in meta
    assert meta["cpu_seconds"] == pytest.approx(0.29)  # ru_utime + ru_stime


@pytest.mark.parametrize("field", ["cpu", "maxvmem", "ru_maxrss", "slots", "hostname",
                                   "category", "qsub_time", "start_time", "end_time"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_qacct_values_lose_a_figure_not_the_end(sge: SgeJobExecutor, field: str,
                                                        value: str) -> None:
    lines = [f"{field:<12} {value}" if line.split(" ")[0] == field else line
             for line in QACCT.replace("exit_status  0", "exit_status  3").splitlines()]
    status = sge.parse_accounting_output(0, "\n".join(lines) + "\n")["1468"]
    assert status.state is JobState.FAILED and status.exit_code == 3
    meta: Dict[str, Any] = status.metadata or {}
    assert _sound(meta)
    key = QACCT_KEYS.get(field)
    if field == "cpu":  # then the rusage's user and system time
        read = number(value)
        assert meta["cpu_seconds"] == pytest.approx(0.29 if read is None else read)
    elif key is not None and "\n" not in value \
            and value.strip() in (NO_HOST if field == "hostname" else NO_FIGURE):
        assert key not in meta, meta
    if field == "category":
        assert "requested_seconds" not in meta or value == "-l h_rt=120"
