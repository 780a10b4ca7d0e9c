"""A ``local`` job with ``stage_in`` is staged in by the submitting process before a keeper takes
it: until then it is recorded as held by psij in that process, so that a client killed
(``kill -9``) during the stage-in loses no job: ``psij list`` says the jobs were never started
and ``psij release`` stages them in and runs each exactly once. A job that ends while held
(stage-in failed, cancelled) has its final state written at once, and one started is held no
more."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import psij.registry
from psij import Job, JobExecutor, JobSpec, JobState
from psij._registry import held
from psij.executors.local import _stage_in
from psij.executors.local._worker import WORKER
from psij.staging import StageIn

PSIJ = str(Path(sys.executable).parent / "psij")
WAIT = timedelta(seconds=120)

# Holds the worker thread (which does the stage-ins) with a task that never ends, submits
# N jobs one by one and N with submit_many, each staging SRC in and appending its number and
# what it staged to OUT, and kills itself (-9) the instant the last submit returned.
CHILD = textwrap.dedent("""
    import os, signal, sys, threading
    import psij
    from psij.staging import StageIn
    from psij.executors.local._worker import WORKER
    src, out, ids, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    WORKER.put(threading.Event().wait)
    ex = psij.JobExecutor.get_instance("local")
    jobs = []
    for i in range(2 * n):
        jobs.append(psij.Job(psij.JobSpec(
            "/bin/sh", ["-c", f"echo {i} $(cat in{i}.txt) >> {out}"],
            directory=os.path.dirname(out),
            stage_in={StageIn(src, f"in{i}.txt")})))
    with open(ids, "w") as f:
        f.write("\\n".join(j.id for j in jobs))
    for job in jobs[:n]:
        ex.submit(job)
    ex.submit_many(jobs[n:])
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _psij(home: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PSIJ, *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=300)


def _listed(home: Path) -> Dict[str, Dict[str, Any]]:
    done = _psij(home, "list", "--json")
    assert done.returncode == 0, done.stderr
    return {j["id"]: j for j in json.loads(done.stdout)}


def test_jobs_staging_in_when_their_client_is_killed_are_released_and_run_once(
        tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    src, out, ids = tmp_path / "source.txt", work / "ran", tmp_path / "ids"
    src.write_text("staged\n")
    n = 10
    child = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out), str(ids), str(n)],
                           env=dict(os.environ, HOME=str(home)), capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr
    job_ids = ids.read_text().split("\n")
    jobs = _listed(home)
    assert sorted(jobs) == sorted(job_ids)  # every job is in the registry
    for job in jobs.values():
        assert job["state"] == "QUEUED" and job["native_id"] is None, job
        assert job["held"]["phase"] == "held" and job["held"]["running"] is False, job
    assert not out.exists()  # none ran
    # One is cancelled while held by the dead process: it never runs.
    gone = job_ids[3]
    cancelled = _psij(home, "cancel", gone)
    assert cancelled.returncode == 0, cancelled.stderr
    released = _psij(home, "release")
    assert released.returncode == 0, released.stderr
    submitted = dict(line.split() for line in released.stdout.splitlines())
    assert sorted(submitted) == sorted(set(job_ids) - {gone})
    again = _psij(home, "release")  # released once: nothing is left
    assert (again.returncode, again.stdout) == (0, ""), again.stderr
    waited = _psij(home, "wait", *submitted, "--json")
    assert waited.returncode == 0, waited.stderr
    for job in json.loads(waited.stdout):
        assert job["state"] == "COMPLETED" and job["held"] is None, job
        assert job["native_id"] == submitted[job["id"]]
    lines = sorted(out.read_text().splitlines(), key=lambda line: int(line.split()[0]))
    assert lines == [f"{i} staged" for i in range(2 * n) if i != 3]
    assert _listed(home)[gone]["state"] == "CANCELED"


def _row(work: Path, job: Job) -> Any:
    psij.registry.flush()
    [record] = psij.registry.find(job.id, work_directory=work)
    return record


def _executor(work: Path) -> JobExecutor:
    from psij import JobExecutorConfig

    return JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=work))


class _Gate:
    """Holds the worker thread until opened."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.open = threading.Event()
        WORKER.put(self._hold)

    def _hold(self) -> None:
        self.entered.set()
        self.open.wait(60)


def _staging_job(tmp_path: Path, source: Optional[Path] = None) -> Job:
    if source is None:
        source = tmp_path / "source.txt"
        source.write_text("x")
    return Job(JobSpec("/bin/true", directory=tmp_path, stage_in={StageIn(source, "in.txt")}))


def test_a_live_holder_marks_the_job_held_until_a_keeper_has_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    ex = _executor(work)
    gate = _Gate()
    try:
        assert gate.entered.wait(30)
        job = _staging_job(tmp_path)
        ex.submit(job)
        assert _stage_in.held_here(job)
        record = _row(work, job)
        assert (record.held, record.state) == (held.HELD, JobState.QUEUED)
        assert held.holder_of(record.holder) == held.holder_of(held.this_holder())
    finally:
        gate.open.set()
    job.wait(WAIT)
    assert job.status.state is JobState.COMPLETED
    assert not _stage_in.held_here(job)
    record = _row(work, job)
    assert (record.held, record.native_id) == (None, job.native_id)


@pytest.mark.parametrize("how", ["missing source", "cancel"])
def test_a_job_ending_while_held_has_its_final_state_written_at_once(tmp_path: Path,
                                                                     how: str) -> None:
    work = tmp_path / "work"
    ex = _executor(work)
    gate = _Gate()
    written: List[Any] = []
    real = held.mark

    def spy(executor: Any, jobs: Any, marker: Any, final: Any = None) -> None:
        written.append((marker, final))
        real(executor, jobs, marker, final)

    _stage_in.mark_held, saved = spy, _stage_in.mark_held  # type: ignore[assignment]
    try:
        assert gate.entered.wait(30)
        job = _staging_job(tmp_path, tmp_path / "absent" if how == "missing source" else None)
        ex.submit(job)
        if how == "cancel":
            ex.cancel(job)
            # Written before cancel returned, the worker still held.
            assert written[-1] == (None, ("CANCELED", JobState.CANCELED.order, ""))
            record = _row(work, job)
            assert (record.held, record.state) == (None, JobState.CANCELED)
    finally:
        gate.open.set()
    try:
        job.wait(WAIT)
    finally:
        _stage_in.mark_held = saved  # type: ignore[assignment]
    expected = JobState.FAILED if how == "missing source" else JobState.CANCELED
    assert job.status.state is expected
    record = _row(work, job)
    assert (record.held, record.state) == (None, expected)
    assert [w for w in written if w[0] is not None] == [(held.HELD, None)]  # never started
    assert written[-1][1][0] == expected.name
