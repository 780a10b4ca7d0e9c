"""The resource use of local jobs: each run's start and end (wall clock), CPU time and peak
memory, as the keeper reaps the job's process, in the final status's metadata, the job
registry and ``psij status --json``, also for a job whose submitter was killed (``kill -9``)
before it ended."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

import psij.registry
from psij import Job, JobExecutor, JobSpec, JobState
from psij.job_executor_config import JobExecutorConfig
from support.process_checks import alive, keepers_with

PSIJ = str(Path(sys.executable).parent / "psij")
WAIT_SECONDS = 120.0
# About 2 s of CPU on one core, measured by the process itself.
BURN = ("import time\nt = time.process_time()\n"
        "while time.process_time() - t < 2.0:\n    pass\n")
# 300 MB written (every page touched).
ALLOCATE = "b = b'x' * (300 << 20)\nprint(len(b))\n"
MB = 1 << 20


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


def _status_json(home: Path, *args: str) -> List[Dict[str, Any]]:
    done = subprocess.run([PSIJ, "status", "--json", *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=WAIT_SECONDS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _iso_seconds(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def test_cpu_time_peak_memory_and_times_of_local_jobs(tmp_path: Path) -> None:
    home = _home(tmp_path)
    wd = home / ".psij" / "work"
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=wd))
    before = time.time()
    burn = Job(JobSpec(sys.executable, ["-c", BURN]))
    big = Job(JobSpec(sys.executable, ["-c", ALLOCATE]))
    small = Job(JobSpec("/bin/true"))
    for job in (burn, big, small):
        ex.submit(job)
    for job in (burn, big, small):
        assert job.wait(timeout=WAIT_SECONDS) is not None
        assert job.status.state is JobState.COMPLETED, job.status
    after = time.time()
    meta = {name: job.status.metadata or {} for name, job in
            (("burn", burn), ("big", big), ("small", small))}
    for name, m in meta.items():
        assert before <= m["started_at"] <= m["ended_at"] <= after, (name, m)
    # A single thread cannot use more CPU than the time it ran.
    assert 1.5 <= meta["burn"]["cpu_seconds"] <= 3.0, meta["burn"]
    ran = meta["burn"]["ended_at"] - meta["burn"]["started_at"]
    assert ran >= meta["burn"]["cpu_seconds"] * 0.9, meta["burn"]
    assert meta["big"]["max_rss_bytes"] >= 250 * MB, meta["big"]
    assert 0 < meta["small"]["max_rss_bytes"] < 64 * MB, meta["small"]
    assert meta["small"]["cpu_seconds"] < 0.5, meta["small"]
    assert meta["burn"]["max_rss_bytes"] < 250 * MB

    # The registry and psij status carry them.
    assert psij.registry.flush(timedelta(seconds=WAIT_SECONDS))
    recorded = {r.id: r for r in psij.registry.find(work_directory=wd)}
    for job in (burn, big, small):
        m = job.status.metadata or {}
        r = recorded[job.id]
        assert (r.started_at, r.ended_at, r.cpu_seconds, r.max_rss_bytes) == (
            m["started_at"], m["ended_at"], m["cpu_seconds"], m["max_rss_bytes"])
    listed = subprocess.run([PSIJ, "list", "--json"], capture_output=True, text=True,
                            env=dict(os.environ, HOME=str(home)), timeout=WAIT_SECONDS)
    assert listed.returncode == 0, listed.stderr
    assert {v["id"]: v["max_rss_bytes"] for v in json.loads(listed.stdout)} == {
        job.id: (job.status.metadata or {})["max_rss_bytes"] for job in (burn, big, small)}
    shown = {v["id"]: v for v in _status_json(home, burn.id, big.id, small.id)}
    for job in (burn, big, small):
        m = job.status.metadata or {}
        v = shown[job.id]
        assert (v["cpu_seconds"], v["max_rss_bytes"]) == (m["cpu_seconds"], m["max_rss_bytes"])
        assert abs(_iso_seconds(v["started_at"]) - m["started_at"]) < 0.002
        assert abs(_iso_seconds(v["ended_at"]) - m["ended_at"]) < 0.002


def test_descendants_waited_for_are_counted_and_those_left_running_are_not(
        tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    burn = BURN.replace("2.0", "0.6")
    command = f"{sys.executable} -c '{burn}'"
    waited = Job(JobSpec("/bin/sh", ["-c", f"{command}; true"]))
    left = Job(JobSpec("/bin/sh", ["-c", f"{command} </dev/null >/dev/null 2>&1 & exit 0"]))
    for job in (waited, left):
        ex.submit(job)
    for job in (waited, left):
        assert job.wait(timeout=WAIT_SECONDS) is not None
        assert job.status.state is JobState.COMPLETED, job.status
    assert (waited.status.metadata or {})["cpu_seconds"] >= 0.4, waited.status
    assert (left.status.metadata or {})["cpu_seconds"] < 0.3, left.status


def test_jobs_started_without_a_keeper_are_measured_as_this_process_reaps_them(
        tmp_path: Path) -> None:
    from psij.executors.local import LocalJobExecutorConfig

    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path, keeper=False))
    before = time.time()
    burn = Job(JobSpec(sys.executable, ["-c", BURN.replace("2.0", "0.6")]))
    big = Job(JobSpec(sys.executable, ["-c", ALLOCATE]))
    for job in (burn, big):
        ex.submit(job)
    for job in (burn, big):
        assert job.wait(timeout=WAIT_SECONDS) is not None
        assert job.status.state is JobState.COMPLETED, job.status
    after = time.time()
    burned, allocated = (job.status.metadata or {} for job in (burn, big))
    assert 0.4 <= burned["cpu_seconds"] <= 2.0, burned
    assert allocated["max_rss_bytes"] >= 250 * MB, allocated
    for m in (burned, allocated):
        assert before <= m["started_at"] <= m["ended_at"] <= after, m


def test_a_job_not_final_has_no_figures_in_its_record(tmp_path: Path) -> None:
    from psij._registry.accounting import NO_USE, use_of

    assert use_of({"started_at": 1.0, "cpu_seconds": 2.0}, False) == NO_USE
    # Hostile values are left out, not written.
    assert use_of({"started_at": float("nan"), "ended_at": float("inf"),
                   "cpu_seconds": -1.0, "max_rss_bytes": 1 << 70}, True) == NO_USE
    assert use_of({"started_at": True, "ended_at": "1", "cpu_seconds": None,
                   "max_rss_bytes": 2.5}, True) == NO_USE
    assert use_of({"started_at": 1, "ended_at": 2.5, "cpu_seconds": 0,
                   "max_rss_bytes": 4096}, True)[:4] == (1.0, 2.5, 0.0, 4096)


CHILD = r"""
import os, signal, sys
import psij

ex = psij.JobExecutor.get_instance("local")
job = psij.Job(psij.JobSpec(sys.executable, ["-c", sys.argv[1]]))
ex.submit(job)
print(job.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _keepers_of(home: Path) -> List[int]:
    return keepers_with(f"HOME={home}")


def test_the_keeper_records_the_figures_of_a_job_whose_submitter_was_killed(
        tmp_path: Path) -> None:
    home = _home(tmp_path)
    burn = BURN.replace("2.0", "0.6")
    with subprocess.Popen([sys.executable, "-c", CHILD, burn], stdout=subprocess.PIPE,
                          text=True, env=dict(os.environ, HOME=str(home))) as child:
        assert child.stdout is not None
        job_id = child.stdout.readline().strip()
        assert child.wait(timeout=WAIT_SECONDS) == -signal.SIGKILL
    keepers = _keepers_of(home)
    deadline = time.monotonic() + WAIT_SECONDS
    while any(alive(pid) for pid in keepers):
        assert time.monotonic() < deadline, f"keepers {keepers} still running"
        time.sleep(0.05)
    [record] = psij.registry.find(job_id, work_directory=home / ".psij" / "work")
    assert record.state is JobState.COMPLETED and record.exit_code == 0
    assert record.cpu_seconds is not None and 0.4 <= record.cpu_seconds <= 2.0, record
    assert record.max_rss_bytes is not None and 0 < record.max_rss_bytes < 250 * MB
    assert record.started_at is not None and record.ended_at is not None
    assert record.started_at <= record.ended_at
    # Attached again, the job's final status carries them too.
    attached = psij.registry.attach(psij.registry.find(job_id, work_directory=home / ".psij"
                                                       / "work"))
    meta = attached[0].status.metadata or {}
    assert (meta["cpu_seconds"], meta["max_rss_bytes"]) == (record.cpu_seconds,
                                                            record.max_rss_bytes)
    [shown] = _status_json(home, job_id)
    assert (shown["cpu_seconds"], shown["max_rss_bytes"]) == (record.cpu_seconds,
                                                              record.max_rss_bytes)
