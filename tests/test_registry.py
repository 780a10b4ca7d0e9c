"""The job registry: every job of every executor gets one row in a private SQLite file (WAL),
many processes write at once, old final jobs are pruned, and a damaged or locked file gives a
clear error or a wait with a message, losing nothing.

Everything runs on real files; concurrency and locking use real processes.
"""

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, List

import pytest

import psij.registry
from psij import Job, JobExecutor, JobExecutorConfig, JobSpec, JobState, JobStatus
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.registry import RegistryError

WAIT = timedelta(seconds=60)


def rows(wd: Path, sql: str = "SELECT id, executor, native_id, state, exit_code, tag, spec, "
                               "message FROM jobs") -> List[Any]:
    conn = sqlite3.connect(wd / "jobs.sqlite")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def local(wd: Path) -> JobExecutor:
    return JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=wd))


class SideLoaded(JobExecutor):
    """An executor written as a third party writes one: it only calls _set_job_status."""

    def submit(self, job: Job) -> None:
        job.executor = self
        job._native_id = "side-1"
        self._set_job_status(job, JobStatus(JobState.QUEUED))
        self._set_job_status(job, JobStatus(JobState.FAILED, exit_code=3,
                                            message="broke: \ud800 lone"))

    def cancel(self, job: Job) -> None:
        pass

    def list(self) -> List[str]:
        return []

    def attach(self, job: Job, native_id: str) -> None:
        pass


def test_a_local_job_gets_one_row_with_its_fields(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = local(wd)
    job = Job(JobSpec("/bin/sh", ["-c", "exit 4"]))
    psij.registry.set_tag(job, "batch-a")
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.FAILED
    assert psij.registry.flush(WAIT)
    [(jid, executor, native_id, state, code, tag, spec, _msg)] = rows(wd)
    assert (jid, executor, native_id, state, code, tag) == (
        job.id, "local", job.native_id, "FAILED", 4, "batch-a")
    assert '"arguments": ["-c", "exit 4"]' in spec
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert rec.spec is not None and rec.spec.arguments == ["-c", "exit 4"]
    assert rec.executor_version and rec.submitted <= rec.updated
    assert f'"work_directory": "{wd}"' in (rec.config or "")


def test_the_registry_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = local(wd)
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    job.wait(WAIT)
    psij.registry.flush(WAIT)
    assert stat.S_IMODE(os.stat(wd).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(wd / "jobs.sqlite").st_mode) == 0o600
    assert rows(wd, "PRAGMA journal_mode") == [("wal",)]


def test_batch_and_side_loaded_executors_are_recorded_too(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    cfg = BatchTestExecutorConfig(work_directory=wd, queue_polling_interval=0.2,
                                  initial_queue_polling_delay=0.1)
    batch = JobExecutor.get_instance("batch-test", config=cfg)
    side = SideLoaded(config=JobExecutorConfig(work_directory=wd))
    try:
        bjob, sjob = Job(JobSpec("/bin/true")), Job(JobSpec("/bin/true"))
        batch.submit(bjob)
        side.submit(sjob)
        assert bjob.wait(WAIT).state is JobState.COMPLETED
    finally:
        batch.close()
    psij.registry.flush(WAIT)
    found = {r[0]: r for r in rows(wd)}
    assert found[bjob.id][1:5] == ("batch-test", bjob.native_id, "COMPLETED", 0)
    assert found[sjob.id][1:5] == ("sideloaded", "side-1", "FAILED", 3)
    # A lone surrogate in a status message is kept as its escape, not lost.
    assert found[sjob.id][7] == "broke: \\ud800 lone"


def test_a_status_change_updates_the_one_row(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = local(wd)
    job = Job(JobSpec("/bin/sleep", ["30"]))
    ex.submit(job)
    # The keeper answers the start after submit returns; a flush lets that answer arrive
    # first, so the row has the native id a synchronous submit would have given.
    psij.registry.flush(WAIT)
    assert [(r[2], r[3]) for r in rows(wd)] == [(job.native_id, "ACTIVE")]
    job.cancel()
    job.wait(WAIT)
    psij.registry.flush(WAIT)
    assert [(r[0], r[3]) for r in rows(wd)] == [(job.id, "CANCELED")]


SUBMITTER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from psij import Job, JobExecutor, JobExecutorConfig, JobSpec
    import psij.registry
    ex = JobExecutor.get_instance("local",
                                  config=JobExecutorConfig(work_directory=Path(sys.argv[1])))
    jobs = [Job(JobSpec("/bin/sh", ["-c", "exit " + sys.argv[2]])) for _ in range(15)]
    for j in jobs:
        psij.registry.set_tag(j, "many")
        ex.submit(j)
    for j in jobs:
        j.wait()
    print(" ".join(j.id for j in jobs))
""")


def test_many_processes_submit_at_once(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    procs = [subprocess.Popen([sys.executable, "-c", SUBMITTER, str(wd), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(8)]
    ids = {}
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "job registry" not in err, err
        for jid in out.split():
            ids[jid] = i
    assert len(ids) == 120
    recorded = psij.registry.find(tag="many", work_directory=wd)
    assert sorted(r.id for r in recorded) == sorted(ids)
    for r in recorded:
        expected = JobState.COMPLETED if ids[r.id] == 0 else JobState.FAILED
        assert (r.state, r.exit_code) == (expected, ids[r.id])


def _fill(wd: Path, ages: List[Any]) -> None:
    from psij._registry.accounting import NO_USE
    from psij._registry.store import open_store

    now = time.time()
    store = open_store(wd)
    store.write([(f"job-{i}", "local", "0", None, "{}", str(i), None, "old", now - age, state,
                  6 if final else 3, None, None, now - age, int(final), 1, None, None, *NO_USE)
                 for i, (age, state, final) in enumerate(ages)], [])


def test_final_jobs_older_than_the_prune_age_are_pruned(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    day = 24 * 3600
    _fill(wd, [(40 * day, "COMPLETED", True), (40 * day, "ACTIVE", False),
               (2 * day, "FAILED", True), (10, "COMPLETED", True)])
    # A fresh process prunes when it first records a job, by the default age (30 days).
    code = (f"import psij.registry as r; print(len(r.find(work_directory={str(wd)!r})))\n"
            f"from psij import *\n"
            f"ex = JobExecutor.get_instance('local', config=JobExecutorConfig("
            f"work_directory={str(wd)!r}))\n"
            f"j = Job(JobSpec('/bin/true')); ex.submit(j); j.wait(); r.flush()\n"
            f"print(len(r.find(work_directory={str(wd)!r})))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["4", "4"], done.stderr  # one pruned, one recorded
    assert sorted(r[0] for r in rows(wd) if r[0].startswith("job-")) == [
        "job-1", "job-2", "job-3"]
    conn = sqlite3.connect(wd / "jobs.sqlite")
    conn.execute("DELETE FROM jobs WHERE id NOT LIKE 'job-%'")
    conn.commit()
    conn.close()
    assert psij.registry.prune(timedelta(days=1), work_directory=wd) == 1
    assert sorted(r[0] for r in rows(wd)) == ["job-1", "job-3"]  # never a job not final


@pytest.mark.parametrize("bad", [float("nan"), -1, "1d"])
def test_a_bad_prune_age_is_refused_naming_it(tmp_path: Path, bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="older_than"):
        psij.registry.prune(bad if not isinstance(bad, int) else timedelta(seconds=bad),
                            work_directory=tmp_path)


@pytest.mark.parametrize("tag,word", [("\ud800", "tag"), ("x" * 5000, "tag"), ("", "tag"),
                                      (3, "tag"), ("two\nlines", "tag")])
def test_a_hostile_tag_is_refused_naming_the_field(tag: Any, word: str) -> None:
    job = Job(JobSpec("/bin/true"))
    with pytest.raises((TypeError, ValueError), match=word):
        psij.registry.set_tag(job, tag)


@pytest.mark.parametrize("kwargs,word", [({"state": "BOGUS"}, "state"),
                                         ({"tag": "\udfff"}, "tag"),
                                         ({"ids": ["ok", 5]}, "ids"),
                                         ({"executor": "a\0b"}, "executor")])
def test_hostile_filters_are_refused_naming_the_field(tmp_path: Path, kwargs: Any,
                                                      word: str) -> None:
    with pytest.raises((TypeError, ValueError), match=word):
        psij.registry.find(work_directory=tmp_path, **kwargs)


def _recorded_registry(wd: Path, n: int) -> bytes:
    _fill(wd, [(10, "COMPLETED", True)] * n)
    conn = sqlite3.connect(wd / "jobs.sqlite")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return (wd / "jobs.sqlite").read_bytes()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_registry_is_a_clear_error_and_is_left_as_it_is(tmp_path: Path,
                                                                   damage: str) -> None:
    source = tmp_path / "source"
    data = _recorded_registry(source, 3000)
    wd = tmp_path / "work"
    wd.mkdir(mode=0o700)
    path = wd / "jobs.sqlite"
    damaged = b"this is not a database\n" * 200 if damage == "garbage" else data[:len(data) // 2]
    path.write_bytes(damaged)
    path.chmod(0o600)
    code = f"import psij.registry as r; r.find(work_directory={str(wd)!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "RegistryError" in done.stderr and str(path) in done.stderr
    assert path.read_bytes() == damaged
    with pytest.raises(RegistryError, match=str(path)):
        psij.registry.find(work_directory=wd)
    # A job submitted meanwhile still runs; the registry problem is only reported.
    ex = local(wd)
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.COMPLETED
    psij.registry.flush(WAIT)
    assert path.read_bytes() == damaged


LOCKER = textwrap.dedent("""
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE jobs SET message = 'held' WHERE id = 'job-1'")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("COMMIT")
""")


def test_a_locked_registry_makes_a_writer_wait_with_a_message(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    _fill(wd, [(40 * 24 * 3600, "COMPLETED", True), (10, "ACTIVE", False)])
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(wd / "jobs.sqlite"), "8"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        # Reading is not blocked (WAL); pruning (a write) waits for the lock, saying so.
        code = (f"import psij.registry as r, datetime as d\n"
                f"print(len(r.find(work_directory={str(wd)!r})))\n"
                f"print(r.prune(d.timedelta(days=1), work_directory={str(wd)!r}))\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["2", "1"]
        assert "is locked by another process; waiting" in done.stderr
        assert str(wd / "jobs.sqlite") in done.stderr
    finally:
        locker.communicate(timeout=60)
    assert locker.returncode == 0
    assert [r[7] for r in rows(wd)] == ["held"]  # the other process's write is kept


def test_recording_can_be_turned_off(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    psij.registry.set_recording(False)
    try:
        job = Job(JobSpec("/bin/true"))
        local(wd).submit(job)
        job.wait(WAIT)
    finally:
        psij.registry.set_recording(True)
    psij.registry.flush(WAIT)
    assert not (wd / "jobs.sqlite").exists()


def test_the_registry_benchmark_runs_and_prints_its_figures() -> None:
    bench = Path(__file__).resolve().parent.parent / "bench" / "registry.py"
    done = subprocess.run([sys.executable, str(bench), "--jobs", "20", "--rounds", "1",
                           "--status-jobs", "2000"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(",")[0].split(":")[0] for line in lines] == [
        "load average before", "registry cost per job",
        "registry cost per later status change (queued)", "local throughput", "local",
        "local", "psij status --all", "load average after"]
    assert "keeper off" in lines[4] and "keeper on" in lines[5]


def _writer_threads() -> List[Any]:
    return [t for t in threading.enumerate() if t.name == "psij-registry-writer"]


def _until(check: Any, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_writer_thread_ends_when_idle_and_starts_again(tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    from psij._registry import recorder

    monkeypatch.setattr(recorder._WRITER, "idle_seconds", 0.2)
    wd = tmp_path / "work"
    side = SideLoaded(config=JobExecutorConfig(work_directory=wd))
    first, second = Job(JobSpec("/bin/true")), Job(JobSpec("/bin/true"))
    side.submit(first)
    assert psij.registry.flush(WAIT)
    assert _until(lambda: not _writer_threads()), "the idle writer thread never ended"
    side.submit(second)  # a new record starts a writer again
    assert psij.registry.flush(WAIT)
    assert {r[0] for r in rows(wd)} == {first.id, second.id}
    assert _until(lambda: not _writer_threads()), "the idle writer thread never ended"


def test_records_arriving_as_the_idle_writer_ends_are_all_written(monkeypatch: Any) -> None:
    from psij._registry import recorder

    written: List[Any] = []
    monkeypatch.setattr(recorder, "_resolve", lambda queued: (queued, list(range(len(queued))),
                                                              []))
    writer = recorder._Writer(idle_seconds=0.0005)
    monkeypatch.setattr(writer, "_write", written.extend)
    for n in range(300):
        writer.put(n)  # type: ignore[arg-type]
        time.sleep(0.0005 * (n % 4))  # about the idle time: some land as the thread ends
    assert writer.flush(60)
    assert sorted(written) == list(range(300))


def test_changes_queued_out_of_order_never_put_a_final_job_back(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    # Two threads may queue one job's changes out of order: the one that saw ACTIVE can put
    # after the one that saw FAILED. Within one batch, as across batches, the later state
    # (by rank) is the one written, for a new row as for an update.
    from psij._registry import recorder

    wd = tmp_path / "work"
    ex = SideLoaded(config=JobExecutorConfig(work_directory=wd))
    puts: List[Any] = []
    writer = recorder._Writer()
    monkeypatch.setattr(recorder, "_WRITER", writer)
    monkeypatch.setattr(writer, "put", puts.append)
    fresh, known = Job(JobSpec("/bin/true")), Job(JobSpec("/bin/true"))
    for job in (fresh, known):
        job.executor = ex
        ex._set_job_status(job, JobStatus(JobState.QUEUED))
        ex._set_job_status(job, JobStatus(JobState.ACTIVE))
        ex._set_job_status(job, JobStatus(JobState.FAILED, exit_code=4))
    first_known = next(c for c in puts if c[1] is known)
    writer._write(recorder._resolved([first_known]))  # known's row exists
    for job in (fresh, known):
        mine = [c for c in puts if c[1] is job and c is not first_known]
        # FAILED queued before ACTIVE (and QUEUED last for the fresh row)
        writer._write(recorder._resolved(mine[::-1]))
    recorded = {r[0]: (r[3], r[4]) for r in rows(wd)}
    assert recorded == {fresh.id: ("FAILED", 4), known.id: ("FAILED", 4)}


def test_an_attached_job_follows_the_recorded_settings_of_its_executor(tmp_path: Path) -> None:
    # Settings a subclass of the batch configuration passes on through **kwargs (use_nice,
    # the polling interval) come back too, and fallback does not (where new jobs go is no
    # concern of a job being followed).
    from psij.executors.batch.slurm import SlurmExecutorConfig
    from psij.registry import _recorded_config

    recorded = json.dumps({"use_nice": True, "queue_polling_interval": 7.5,
                           "rest_submit": False, "fallback": "local", "unknown": 1,
                           "work_directory": "/elsewhere"})
    config = _recorded_config(SlurmExecutorConfig, recorded, str(tmp_path))
    assert isinstance(config, SlurmExecutorConfig)
    assert (config.use_nice, config.queue_polling_interval, config.rest_submit,
            config.fallback) == (True, 7.5, False, None)
    assert config.work_directory == tmp_path


def test_the_registry_benchmark_s_large_runs_print_every_job_recorded() -> None:
    bench = Path(__file__).resolve().parent.parent / "bench" / "registry.py"
    done = subprocess.run([sys.executable, str(bench), "--large", "40", "--processes", "2",
                           "--skip-small"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    runs = [line for line in lines if line.startswith("large run")]
    assert len(runs) == 2 and "from 1 process(es)" in runs[0] and "from 2 process" in runs[1]
    for line in runs:
        assert "flush() returned [True]" in line
        assert "registry rows {'COMPLETED': 40} (40 in all)" in line
        assert "registry messages: 0" in line
    assert any(line.startswith("registry writer alone, 40 jobs") for line in lines)
