"""The figures of a run on PBS Pro, Torque, LSF and Flux: read from their status output in the
documented forms (and hostile values, which lose a figure, never the job's end), then end to
end through the fake commands of ``tests/support/fake_site_scheduler.py``, which report what
each job's script really used."""

import json
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from psij import Job, JobSpec, JobState
from psij.executors.batch._figures import FIGURE_KEYS, clean_figures
from psij.executors.batch._figures_sites import lsf_figures
from psij.executors.batch.flux import FluxJobExecutor
from psij.executors.batch.lsf import LsfJobExecutor
from psij.executors.batch.pbs import PBSJobExecutor
from psij.executors.batch.pbs_classic import PBSClassicJobExecutor
from support.batch_sites import WAIT, fake_site

HOSTILE = ["", "nan", "inf", "-5", "1e309", "9" * 5000, "\ud800", "Unknown", "a b c", "\x00"]
# (PBS writes CPU time in whole seconds)
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.2:\n    pass\n"


def _sound(meta: Dict[str, Any]) -> bool:
    return clean_figures(meta) == {key: meta[key] for key in FIGURE_KEYS if key in meta}


def _ctime(text: str) -> float:
    return time.mktime(time.strptime(text, "%a %b %d %H:%M:%S %Y"))


# --------------------------------------------------------------------------- PBS Pro

PBS_DONE = {
    "job_state": "F", "substate": 92, "Exit_status": 0, "qtime": "Tue Dec  8 00:38:50 2026",
    "stime": "Tue Dec  8 00:38:51 2026", "obittime": "Tue Dec  8 00:40:51 2026",
    "mtime": "Tue Dec  8 00:40:52 2026", "exec_host": "node1/0*2+node2/0*2",
    "exec_vnode": "(node1:ncpus=2)+(node2:ncpus=2)",
    "resources_used": {"cpupercent": 180, "cput": "00:03:20", "mem": "307832kb",
                       "ncpus": 4, "vmem": "412000kb", "walltime": "00:02:00"},
    "Resource_List": {"ncpus": 4, "nodect": 2, "walltime": "01:00:00", "mem": "8gb",
                      "select": "2:ncpus=2:mem=4gb", "place": "scatter"},
}


def _pbs(attrs: Dict[str, Any]) -> str:
    return json.dumps({"timestamp": 1796690451, "pbs_version": "2022.1.1",
                       "pbs_server": "pbs1", "Jobs": {"12.pbs1": attrs}}, indent=4) + "\n"


def test_pbs_pro_figures_from_qstat_x() -> None:
    status = PBSJobExecutor().parse_status_output(0, _pbs(PBS_DONE))["12.pbs1"]
    assert status.state is JobState.COMPLETED
    meta = status.metadata or {}
    assert meta["cpu_seconds"] == 200.0 and meta["max_rss_bytes"] == 307832 * 1024
    assert meta["max_vmem_bytes"] == 412000 * 1024
    assert meta["cores"] == 4 and meta["nodes"] == "node1,node2"
    assert meta["requested_seconds"] == 3600.0 and meta["requested_memory_bytes"] == 8 << 30
    assert meta["queued_at"] == _ctime("Tue Dec  8 00:38:50 2026")
    assert meta["started_at"] == _ctime("Tue Dec  8 00:38:51 2026")
    assert meta["ended_at"] == _ctime("Tue Dec  8 00:40:51 2026")  # obittime, not mtime


def test_pbs_running_jobs_carry_no_figures() -> None:
    running = {**PBS_DONE, "job_state": "R", "substate": 42}
    del running["Exit_status"]
    status = PBSJobExecutor().parse_status_output(0, _pbs(running))["12.pbs1"]
    assert status.state is JobState.ACTIVE and "cpu_seconds" not in (status.metadata or {})


@pytest.mark.parametrize("key", ["qtime", "stime", "obittime", "exec_host", "resources_used",
                                 "Resource_List"])
@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_pbs_values_lose_a_figure_not_the_end(key: str, value: str) -> None:
    attrs = {**PBS_DONE, "Exit_status": 3}
    if key in ("resources_used", "Resource_List"):
        attrs[key] = {**attrs[key], **dict.fromkeys(attrs[key], value)}  # type: ignore
    else:
        attrs[key] = value
    status = PBSJobExecutor().parse_status_output(0, _pbs(attrs))["12.pbs1"]
    assert status.state is JobState.FAILED and status.exit_code == 3
    assert _sound(status.metadata or {})


# --------------------------------------------------------------------------- Torque

TORQUE_DONE = """Job Id: 7.host
    Job_Name = STDIN
    job_state = C
    queue = batchq
    qtime = Tue Dec  8 00:38:50 2026
    start_time = Tue Dec  8 00:38:51 2026
    comp_time = Tue Dec  8 00:40:51 2026
    exec_host = node1/0+node1/1+node2/0
    resources_used.cput = 00:00:05
    resources_used.mem = 2048kb
    resources_used.walltime = 00:02:00
    Resource_List.walltime = 00:10:00
    Resource_List.mem = 2gb
    exit_status = 0
"""


def test_torque_figures_from_qstat_f() -> None:
    meta = PBSClassicJobExecutor().parse_status_output(0, TORQUE_DONE)["7.host"].metadata or {}
    assert meta["cpu_seconds"] == 5.0 and meta["max_rss_bytes"] == 2 << 20
    assert meta["cores"] == 3 and meta["nodes"] == "node1,node2"
    assert meta["requested_seconds"] == 600.0 and meta["requested_memory_bytes"] == 2 << 30
    assert meta["started_at"] == _ctime("Tue Dec  8 00:38:51 2026")
    assert meta["ended_at"] == _ctime("Tue Dec  8 00:40:51 2026")


# --------------------------------------------------------------------------- LSF

LSF_DONE = {"JOBID": "1234", "JOBINDEX": "0", "STAT": "DONE", "EXIT_CODE": "",
            "EXIT_REASON": "", "SUBMIT_TIME": "Dec  8 00:38", "START_TIME": "Dec  8 00:39",
            "FINISH_TIME": "Dec  8 00:41 L", "CPU_USED": "200.5 second(s)",
            "MAX_MEM": "300 Mbytes", "NALLOC_SLOT": "4", "EXEC_HOST": "2*hostA:2*hostB",
            "RUNTIMELIMIT": "60.0 min"}
NOW = time.mktime(time.strptime("2026-12-09 12:00", "%Y-%m-%d %H:%M"))


def _lsf_local(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y %b %d %H:%M"))


def test_lsf_asks_bjobs_for_the_figures_fields() -> None:
    argv = LsfJobExecutor().get_status_command(["1"])
    assert argv[:4] == ["bjobs", "-a", "-o", "jobid jobindex stat exit_code exit_reason "
                        "submit_time start_time finish_time cpu_used max_mem nalloc_slot "
                        "exec_host runtimelimit"]


def test_lsf_figures_from_bjobs() -> None:
    out = json.dumps({"COMMAND": "bjobs", "JOBS": 1, "RECORDS": [LSF_DONE]})
    status = LsfJobExecutor().parse_status_output(0, out)["1234"]
    assert status.state is JobState.COMPLETED and status.exit_code == 0
    meta = lsf_figures(LSF_DONE, NOW)
    assert meta == {key: (status.metadata or {})[key] for key in meta}
    assert meta["cpu_seconds"] == 200.5 and meta["max_rss_bytes"] == 300 << 20
    assert meta["cores"] == 4 and meta["nodes"] == "hostA,hostB"
    assert meta["requested_seconds"] == 3600.0
    assert meta["queued_at"] == _lsf_local("2026 Dec 8 00:38")
    assert meta["ended_at"] == _lsf_local("2026 Dec 8 00:41")
    # A time without its year is the latest one not in the future: last year's December.
    early = lsf_figures(LSF_DONE, time.mktime(time.strptime("2027-01-02", "%Y-%m-%d")))
    assert early["queued_at"] == _lsf_local("2026 Dec 8 00:38")
    with_year = lsf_figures({**LSF_DONE, "SUBMIT_TIME": "Dec  8 00:38 2025",
                             "CPU_USED": "00:01:00", "EXEC_HOST": "hostA"}, NOW)
    assert with_year["queued_at"] == _lsf_local("2025 Dec 8 00:38")
    assert with_year["cpu_seconds"] == 60.0 and with_year["cores"] == 4


@pytest.mark.parametrize("key", ["SUBMIT_TIME", "START_TIME", "FINISH_TIME", "CPU_USED",
                                 "MAX_MEM", "NALLOC_SLOT", "EXEC_HOST", "RUNTIMELIMIT"])
@pytest.mark.parametrize("value", [*HOSTILE, 12, None, ["x"]])
def test_hostile_lsf_values_lose_a_figure_not_the_end(key: str, value: Any) -> None:
    record = {**LSF_DONE, "STAT": "EXIT", "EXIT_CODE": "3", key: value}
    out = json.dumps({"COMMAND": "bjobs", "JOBS": 1, "RECORDS": [record]})
    status = LsfJobExecutor().parse_status_output(0, out)["1234"]
    assert status.state is JobState.FAILED and status.exit_code == 3
    assert _sound(status.metadata or {})


# --------------------------------------------------------------------------- Flux


def _flux(figures: str, state: str = "INACTIVE", result: str = "COMPLETED") -> str:
    return f"\u0192D7j8aT|{state}|{result}|0|16|{figures}|||\n"


def test_flux_figures_from_flux_jobs() -> None:
    line = _flux("1796690330.25|1796690331.5|1796690334.75|1796690335.0|4|node[1-2]|600.0")
    status = FluxJobExecutor().parse_status_output(0, line)["7952400384"]
    assert status.state is JobState.COMPLETED
    meta = status.metadata or {}
    assert meta["queued_at"] == 1796690330.25 and meta["started_at"] == 1796690331.5
    assert meta["ended_at"] == 1796690334.75 and meta["cores"] == 4
    assert meta["nodes"] == "node1,node2" and meta["requested_seconds"] == 600.0
    assert "cpu_seconds" not in meta and "max_rss_bytes" not in meta  # Flux keeps none
    never = FluxJobExecutor().parse_status_output(0, _flux(
        "1796690330.25|0.0|0.0|1796690335.0|||0.0", result="CANCELED"))["7952400384"]
    assert never.state is JobState.CANCELED
    assert {k: v for k, v in (never.metadata or {}).items() if k in FIGURE_KEYS} == {
        "queued_at": 1796690330.25, "ended_at": 1796690335.0}


@pytest.mark.parametrize("position", range(7))
@pytest.mark.parametrize("value", [v for v in HOSTILE if "|" not in v and "\n" not in v])
def test_hostile_flux_values_lose_a_figure_not_the_end(position: int, value: str) -> None:
    fields = "1796690330.25|1796690331.5|1796690334.75|1796690335.0|4|node1|600.0".split("|")
    fields[position] = value
    status = FluxJobExecutor().parse_status_output(
        0, _flux("|".join(fields), result="FAILED").replace("|0|16|", "|3|16|"))["7952400384"]
    assert status.state is JobState.FAILED and status.exit_code == 3
    assert _sound(status.metadata or {})


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("name", ["pbs", "pbs_classic", "lsf", "flux"])
def test_the_fake_sites_report_what_the_job_used(name: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site(name, tmp_path, monkeypatch)
    try:
        job = Job(JobSpec(sys.executable, ["-c", BURN]))
        ex.submit(job)
        status = job.wait(WAIT)
    finally:
        ex.close()
    assert status is not None and status.state is JobState.COMPLETED, status
    meta = status.metadata or {}
    assert _sound(meta)
    assert meta["nodes"] == socket.gethostname() and meta["cores"] == 1
    assert meta["queued_at"] <= meta["started_at"] <= meta["ended_at"]
    if name == "flux":
        assert "cpu_seconds" not in meta
    else:
        assert 1.0 <= meta["cpu_seconds"] <= 6, meta
        assert meta["max_rss_bytes"] > 1 << 20
