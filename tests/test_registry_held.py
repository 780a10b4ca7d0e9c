"""Jobs psij holds back (``max_queued_per_shape``) in the job registry: recorded as held by
their process before ``submit`` returns (so a ``kill -9`` the next instant loses none), shown
by ``psij list``/``status`` as held by that process or, once it ended, as never submitted, and
submitted by ``psij release`` exactly once; on the batch-test scheduler and (marked slurm) on
the real Slurm; and the jobs a batch executor's local fallback keeps waiting for its resource
pool, which are held the same way."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

import pytest

import psij.registry
from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij._registry import held
from psij.cli._release import Refused, release
from psij.executors.batch.batch_test import BatchTestExecutorConfig

PSIJ = str(Path(sys.executable).parent / "psij")
WAIT = timedelta(seconds=120)

# Submits N jobs (each appends its number to OUT) with max_queued_per_shape=CAP, one by one or
# with submit_many, and kills itself (-9) the instant the last submit returned.
CHILD = textwrap.dedent("""
    import os, signal, sys
    import psij.registry
    from psij import Job, JobAttributes, JobExecutor, JobExecutorConfig, JobSpec
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
    executor, out, n, cap, how, delay = sys.argv[1:7]
    custom = {"batch-test.queue-delay": float(delay)} if executor == "batch-test" else {}
    settings = dict(queue_polling_interval=1, max_queued_per_shape=int(cap))
    if executor == "batch-test":
        from psij.executors.batch.batch_test import BatchTestExecutorConfig
        config = BatchTestExecutorConfig(keep_finished=2, **settings)
    else:
        config = BatchSchedulerExecutorConfig(**settings)
    ex = JobExecutor.get_instance(executor, config=config)
    jobs = []
    for i in range(int(n)):
        job = Job(JobSpec("/bin/sh", ["-c", f"echo {i} >> {out}"], directory=os.path.dirname(out),
                          attributes=JobAttributes(duration=60, custom_attributes=custom)))
        psij.registry.set_tag(job, "kept")
        jobs.append(job)
    if how == "many":
        ex.submit_many(jobs)
    else:
        for job in jobs:
            ex.submit(job)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def psij_cmd(home: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PSIJ, *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=300)


def listed(home: Path) -> Dict[str, Dict[str, Any]]:
    done = psij_cmd(home, "list", "--json")
    assert done.returncode == 0, done.stderr
    return {j["id"]: j for j in json.loads(done.stdout)}


def killed_then_released(home: Path, out: Path, executor: str, n: int, cap: int, how: str,
                         delay: float = 1.0) -> None:
    """The child submits and is killed; its held jobs are listed as never submitted, and
    ``psij release`` submits them; every job then runs exactly once."""
    child = subprocess.run([sys.executable, "-c", CHILD, executor, str(out), str(n), str(cap),
                            how, str(delay)], env=dict(os.environ, HOME=str(home)),
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr
    jobs = listed(home)
    kept = {i: j for i, j in jobs.items() if j["held"] is not None}
    # Every job the cap kept back is recorded, however soon the process was killed.
    assert len(kept) == n - cap, jobs
    for job in kept.values():
        assert job["state"] == "QUEUED" and job["native_id"] is None and job["tag"] == "kept"
        assert job["held"]["phase"] == "held" and job["held"]["running"] is False
        assert job["held"]["message"] == (f"held by psij in process {job['held']['pid']}, "
                                          "which ended; never submitted")
        assert job["held"]["host"] == socket.gethostname()
    table = psij_cmd(home, "list").stdout
    assert table.count("which ended; never submitted (psij release)") == n - cap, table
    # status shows them as list does, without trying to re-attach them (exit 0)
    status = psij_cmd(home, "status", *kept)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("which ended; never submitted") == n - cap
    # One is cancelled: in the registry, since it was never submitted; it never runs.
    gone = sorted(kept)[0]
    [record] = psij.registry.find(gone, work_directory=home / ".psij" / "work")
    never = int(record.spec.arguments[1].split()[1])  # type: ignore[union-attr]
    cancelled = psij_cmd(home, "cancel", gone)
    assert cancelled.returncode == 0, cancelled.stderr
    assert listed(home)[gone]["state"] == "CANCELED" and listed(home)[gone]["held"] is None
    del kept[gone]
    released = psij_cmd(home, "release")
    assert released.returncode == 0, released.stderr
    submitted = dict(line.split() for line in released.stdout.splitlines())
    assert sorted(submitted) == sorted(kept)
    assert all(submitted.values())
    # Released once: nothing is left to release.
    again = psij_cmd(home, "release")
    assert (again.returncode, again.stdout) == (0, ""), again.stderr
    waited = psij_cmd(home, "wait", *kept, "--json")
    assert waited.returncode == 0, waited.stderr
    for job in json.loads(waited.stdout):
        assert job["state"] == "COMPLETED" and job["held"] is None, job
        assert job["native_id"] == submitted[job["id"]]
    deadline = time.monotonic() + WAIT.total_seconds()
    while time.monotonic() < deadline:  # the jobs submitted before the kill end on their own
        lines = out.read_text().split() if out.exists() else []
        if len(lines) >= n - 1:
            break
        time.sleep(0.2)
    assert sorted(map(int, out.read_text().split())) == [i for i in range(n) if i != never]


def test_held_jobs_of_a_killed_process_are_listed_and_released_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    killed_then_released(home, tmp_path / "ran", "batch-test", 7, 2, "one")


@pytest.mark.slurm
def test_held_jobs_of_a_killed_process_are_released_on_slurm(tmp_path: Path) -> None:
    from real.test_batch_real import _scheduler_problem

    problem = _scheduler_problem("slurm")
    if problem:
        pytest.fail(f"Slurm is not usable: {problem}")
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    tmp_path.chmod(0o755)
    killed_then_released(home, tmp_path / "ran", "slurm", 8, 3, "many")


# A batch executor whose scheduler does not answer (its spool is a file) runs its jobs on this
# machine (fallback="local"), through a resource pool; each job asks for every core, so all but
# the first wait in the process, which kills itself once the last submit returned.
FALLBACK_CHILD = textwrap.dedent("""
    import os, signal, sys, warnings
    from psij import Job, JobExecutor, JobSpec, ResourceSpecV1
    from psij.executors.batch.batch_test import BatchTestExecutorConfig
    out, n, spool = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    warnings.simplefilter("ignore")
    ex = JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
        fallback="local", spool_directory=spool))
    cores = os.cpu_count()
    for i in range(n):
        ex.submit(Job(JobSpec("/bin/sh", ["-c", f"sleep 0.3; echo {i} >> {out}"],
                              resources=ResourceSpecV1(cpu_cores_per_process=cores))))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_fallback_jobs_waiting_in_a_killed_process_are_released_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "ran"
    spool = tmp_path / "not-a-directory"
    spool.write_text("")
    child = subprocess.run([sys.executable, "-c", FALLBACK_CHILD, str(out), "4", str(spool)],
                           env=dict(os.environ, HOME=str(home)), timeout=300)
    assert child.returncode == -signal.SIGKILL
    kept = {i: j for i, j in listed(home).items() if j["held"] is not None}
    assert len(kept) == 3
    for job in kept.values():
        assert job["executor"] == "local" and job["held"]["running"] is False
        assert "which ended; never submitted" in job["held"]["message"]
    released = psij_cmd(home, "release")
    assert released.returncode == 0, released.stderr
    assert sorted(line.split()[0] for line in released.stdout.splitlines()) == sorted(kept)
    waited = psij_cmd(home, "wait", *kept)
    assert waited.returncode == 0, waited.stderr
    deadline = time.monotonic() + WAIT.total_seconds()
    while time.monotonic() < deadline and len(out.read_text().split()) < 4:
        time.sleep(0.1)  # the first job, started before the kill, ends on its own
    assert sorted(map(int, out.read_text().split())) == [0, 1, 2, 3]


def test_a_live_holder_keeps_its_jobs_and_records_each_change_at_once(tmp_path: Path) -> None:
    wd = tmp_path / "w"
    ex = JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
        work_directory=wd, queue_polling_interval=0.2, max_queued_per_shape=1))
    jobs = [Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"batch-test.queue-delay": 60}))) for _ in range(4)]
    try:
        for job in jobs:
            ex.submit(job)
        # No flush: the held rows were written before submit returned.
        records = {r.id: r for r in psij.registry.find(work_directory=wd)}
        me = f"held by psij in process {os.getpid()}"
        for job in jobs[1:]:
            record = records[job.id]
            assert (record.held, record.held_by) == ("held", me)
            assert json.loads(record.holder or "")["pid"] == os.getpid()
            assert record.to_json()["held"]["running"] is True
            assert record.spec is not None and record.spec.executable == "/bin/true"
        # Its process runs: release leaves it alone, even by force.
        for force in (False, True):
            [(_, refused)] = release([records[jobs[1].id]], force=force)
            assert isinstance(refused, Refused) and "still runs" in str(refused)
        # A marker left on a job that has a native id (written late, in a race) holds nothing.
        assert psij.registry.flush(WAIT)
        conn = sqlite3.connect(wd / "jobs.sqlite")
        with conn:
            conn.execute("UPDATE jobs SET held = 'held', holder = ? WHERE id = ?",
                         (json.dumps({"pid": 1 << 30, "host": socket.gethostname()}),
                          jobs[0].id))
        conn.close()
        [submitted] = psij.registry.find(jobs[0].id, work_directory=wd)
        assert submitted.native_id == jobs[0].native_id and submitted.held_by is None
        assert submitted.to_json()["held"] is None
        [(_, refused)] = release([submitted])
        assert "it was submitted" in str(refused)
        # Cancelling a held job is recorded at once, final.
        jobs[1].cancel()
        [record] = psij.registry.find(jobs[1].id, work_directory=wd)
        assert (record.state, record.held, record.held_by) == (JobState.CANCELED, None, None)
    finally:
        ex.close()
    # Closing the executor ends the jobs still held, recorded at once as never submitted.
    for job in jobs[2:]:
        [record] = psij.registry.find(job.id, work_directory=wd)
        assert (record.state, record.held) == (JobState.FAILED, None)
        assert "never submitted" in (record.message or "")
    assert psij.registry.flush(WAIT)


def test_a_process_that_ended_while_submitting_is_released_only_by_force(tmp_path: Path
                                                                           ) -> None:
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "ran"
    child = subprocess.run([sys.executable, "-c", CHILD, "batch-test", str(out), "2", "1", "one",
                            "0.5"], env=dict(os.environ, HOME=str(home)), timeout=300)
    assert child.returncode == -signal.SIGKILL
    [kept] = [j for j in listed(home).values() if j["held"] is not None]
    # As if the process had been killed while it submitted the job.
    conn = sqlite3.connect(home / ".psij" / "work" / "jobs.sqlite")
    with conn:
        conn.execute("UPDATE jobs SET held = 'submitting' WHERE id = ?", (kept["id"],))
    conn.close()
    listing = psij_cmd(home, "list").stdout
    assert "which ended while submitting it; it may have reached the scheduler" in listing
    refused = psij_cmd(home, "release", kept["id"])
    assert refused.returncode == 1 and "--force" in refused.stderr, refused
    assert psij_cmd(home, "release").stdout == ""  # not among those released without ids
    forced = psij_cmd(home, "release", "--force", kept["id"])
    assert forced.returncode == 0, forced.stderr
    [(job_id, native_id)] = [line.split() for line in forced.stdout.splitlines()]
    assert job_id == kept["id"]
    waited = psij_cmd(home, "wait", job_id, "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)[0]["native_id"] == native_id


@pytest.mark.parametrize("text", [None, "", "null", "[1]", "{}", '{"pid": -1, "host": "h"}',
                                  '{"pid": true, "host": "h"}', '{"pid": 1e400, "host": "h"}',
                                  '{"pid": 5, "host": 7}', "\ud800"])
def test_a_holder_that_cannot_be_read_is_told_as_such(text: Any) -> None:
    assert held.holder_of(text) is None
    assert held.describe("held", text) == "held by psij in a process that cannot be told"
    assert held.describe(None, text) is None


def test_another_hosts_holder_cannot_be_told_and_needs_force() -> None:
    holder = json.dumps({"pid": os.getpid(), "host": "elsewhere.example", "start": "1"})
    assert held.holder_alive(held.Holder(os.getpid(), "elsewhere.example", "1")) is None
    assert held.describe("held", holder) == (
        f"held by psij in process {os.getpid()} on elsewhere.example (whether it still runs "
        "cannot be told from here)")
    # A reused pid (another start time) is a process that ended.
    assert held.holder_alive(held.Holder(os.getpid(), socket.gethostname(), "1")) is False
    assert held.holder_alive(held.holder_of(held.this_holder())) is True  # type: ignore[arg-type]


OLD_SCHEMA = """
CREATE TABLE jobs (
    id TEXT NOT NULL UNIQUE, executor TEXT NOT NULL, executor_version TEXT, url TEXT,
    config TEXT, native_id TEXT, spec TEXT, tag TEXT, submitted REAL NOT NULL,
    state TEXT NOT NULL, rank INTEGER NOT NULL, exit_code INTEGER, message TEXT,
    updated REAL NOT NULL, final INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,
    rerun TEXT
);
INSERT INTO jobs VALUES ('old-1', 'local', '0.1', NULL, '{}', '4242', NULL, NULL,
                         CAST(strftime('%s', 'now') AS REAL), 'QUEUED', 2, NULL, NULL,
                         CAST(strftime('%s', 'now') AS REAL), 0, 1, NULL);
"""


def test_a_registry_made_before_the_held_marker_gets_its_columns(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    wd.mkdir(mode=0o700)
    path = wd / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("PRAGMA journal_mode=WAL;" + OLD_SCHEMA)
    conn.close()
    path.chmod(0o600)
    [old] = psij.registry.find(work_directory=wd)
    assert (old.id, old.native_id, old.held, old.holder, old.held_by) == (
        "old-1", "4242", None, None, None)
    assert old.to_json()["held"] is None
    conn = sqlite3.connect(path)
    try:
        columns: List[str] = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    finally:
        conn.close()
    assert columns[17:20] == ["held", "holder", "cause"] and len(columns) == 31


@pytest.mark.parametrize("args, text", [
    (["nosuch"], "no recorded job with id nosuch (nor with it as the beginning of an id"),
    (["a\nb"], "ID 'a\\nb': contains a space or a control character"),
    (["\udcff"], "not valid text"),
    (["--tag", "none-such"], "no recorded job has tag 'none-such'"),
])
def test_release_refuses_what_names_no_recorded_job(tmp_path: Path, args: List[str],
                                                     text: str) -> None:
    done = psij_cmd(tmp_path, "release", *args)
    assert done.returncode == 2 and text in done.stderr, done
    assert done.stdout == ""


def test_release_with_nothing_held_does_nothing(tmp_path: Path) -> None:
    done = psij_cmd(tmp_path, "release")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
