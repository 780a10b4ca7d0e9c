"""The job registry under load: many jobs' status changes from several threads, several
processes writing one file at once, a writer thread that cannot start, and a registry that
cannot be written. Every job ends up with its final state, and ``psij.registry.flush()`` says
True only when that is so, and False, saying why, when it is not.

Real recorder, real SQLite files on disk, real processes; no real jobs (the status changes are
reported as an executor reports them), so that tens of thousands take seconds.
"""

import logging
import sqlite3
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import psij.registry
from psij import Job, JobExecutor, JobExecutorConfig, JobSpec, JobState, JobStatus
from psij._registry import recorder
from psij._registry.accounting import NO_USE

WAIT = timedelta(seconds=300)


class Reporting(JobExecutor):
    """An executor that only reports the statuses it is told (as every executor does, through
    ``_set_job_status``)."""

    def submit(self, job: Job) -> None:
        job.executor = self
        job._native_id = f"n-{job.id}"

    def cancel(self, job: Job) -> None:
        pass

    def list(self) -> List[str]:
        return []

    def attach(self, job: Job, native_id: str) -> None:
        pass


def final_of(i: int) -> JobStatus:
    """Job i's final status: most complete, every seventh fails with its own exit code."""
    if i % 7:
        return JobStatus(JobState.COMPLETED, exit_code=0)
    return JobStatus(JobState.FAILED, exit_code=i % 250 + 1, message=f"job {i} failed")


def run_jobs(ex: Reporting, jobs: List[Job], first: int) -> None:
    """Each job's four changes: QUEUED, ACTIVE, its final state, and then a late ACTIVE (a
    thread that saw it earlier reporting last), which must not replace the final state."""
    for job in jobs:
        ex.submit(job)
        ex._set_job_status(job, JobStatus(JobState.QUEUED))
    for job in jobs:
        ex._set_job_status(job, JobStatus(JobState.ACTIVE))
    for i, job in enumerate(jobs, first):
        ex._set_job_status(job, final_of(i))
        recorder._WRITER.put((ex, job, False, (job._native_id, "ACTIVE", JobState.ACTIVE.order,
                                               None, None, 0.0, False, 1, None, None,
                                               NO_USE)))


def recorded(wd: Path) -> Dict[str, Tuple[str, Any, Any, Any]]:
    conn = sqlite3.connect(wd / "jobs.sqlite")
    try:
        return {r[0]: tuple(r[1:]) for r in conn.execute(
            "SELECT id, state, exit_code, final, native_id FROM jobs")}
    finally:
        conn.close()


def expected(jobs: List[Job]) -> Dict[str, Tuple[str, Any, Any, Any]]:
    out = {}
    for i, job in enumerate(jobs):
        status = final_of(i)
        out[job.id] = (status.state.name, status.exit_code, 1, f"n-{job.id}")
    return out


def test_twenty_thousand_jobs_from_four_threads_are_all_recorded_final(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    jobs = [Job(JobSpec("/bin/true", ["x"])) for _ in range(20000)]
    threads = [threading.Thread(target=run_jobs, args=(ex, jobs[k * 5000:(k + 1) * 5000],
                                                       k * 5000)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert psij.registry.flush(WAIT)
    assert recorded(wd) == expected(jobs)


def test_a_writer_thread_that_cannot_start_loses_nothing_and_flush_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # With too many threads or processes (or at interpreter shutdown) a thread cannot start:
    # the changes stay queued, flush() writes them itself, and a later change starts a writer.
    assert psij.registry.flush(WAIT)
    start = threading.Thread.start

    def refused(self: threading.Thread) -> None:
        if self.name == "psij-registry-writer":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refused)
    monkeypatch.setattr(recorder, "_THREAD_RETRY_SECONDS", 0.0)
    monkeypatch.setattr(recorder._WRITER, "idle_seconds", 0.05)
    _until_no_writer()
    caplog.set_level(logging.WARNING, "psij.registry")
    wd = tmp_path / "work"
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    jobs = [Job(JobSpec("/bin/true")) for _ in range(3000)]
    run_jobs(ex, jobs[:2000], 0)
    assert psij.registry.flush(WAIT)
    assert recorded(wd) == expected(jobs[:2000])
    assert "writer thread cannot start (can't start new thread)" in caplog.text
    monkeypatch.setattr(threading.Thread, "start", start)
    run_jobs(ex, jobs[2000:], 2000)
    assert _writer_threads(), "a later change started no writer"
    assert psij.registry.flush(WAIT)
    assert recorded(wd) == expected(jobs)


def _writer_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "psij-registry-writer"]


def _until_no_writer() -> None:
    for t in _writer_threads():
        t.join(60)
    assert not _writer_threads()


PROCESS = textwrap.dedent("""
    import sys
    from pathlib import Path
    import psij.registry
    from psij import Job, JobExecutorConfig, JobSpec
    sys.path.insert(0, sys.argv[3])
    from test_registry_scale import Reporting, run_jobs
    wd, first, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
    run_jobs(ex, jobs, first)
    print(psij.registry.flush(), flush=True)
    print(" ".join(j.id for j in jobs))
""")


def test_six_processes_writing_one_registry_at_once_record_every_job(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    n = 2500
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS, str(wd), str(k * n),
                               str(Path(__file__).parent), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(6)]
    want: Dict[str, Any] = {}
    for k, p in enumerate(procs):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        said, ids = out.splitlines()
        assert said == "True", err
        assert "could not" not in err, err
        for i, jid in enumerate(ids.split(), k * n):
            want[jid] = (final_of(i).state.name, final_of(i).exit_code, 1, f"n-{jid}")
    assert len(want) == 6 * n
    assert recorded(wd) == want


LOCKER = textwrap.dedent("""
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("COMMIT")
""")


def test_flush_is_false_saying_why_while_the_registry_is_locked_and_true_once_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from psij._registry import store

    monkeypatch.setattr(store, "LOCK_WAIT_SECONDS", 0.2)
    caplog.set_level(logging.WARNING, "psij.registry")
    wd = tmp_path / "work"
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    early = [Job(JobSpec("/bin/true")) for _ in range(10)]
    run_jobs(ex, early, 0)
    assert psij.registry.flush(WAIT)  # the file exists, with these jobs
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(wd / "jobs.sqlite")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert locker.stdin is not None and locker.stdout is not None
    try:
        assert locker.stdout.readline() == "locked\n"
        late = [Job(JobSpec("/bin/true")) for _ in range(500)]
        run_jobs(ex, late, 10)
        assert not psij.registry.flush(WAIT)
        assert "still locked by another process" in caplog.text
        assert "status changes of 500 job(s) could not be written" in caplog.text
        assert not psij.registry.flush(WAIT)  # tried again: still locked, still not written
    finally:
        locker.communicate("go\n", timeout=60)
    assert locker.returncode == 0
    # Nothing was given up: the next flush writes every kept change.
    assert psij.registry.flush(WAIT)
    assert recorded(wd) == expected(early + late)


def test_flush_is_false_for_a_registry_that_cannot_be_opened_and_never_true_after(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    wd = tmp_path / "work"
    wd.mkdir(mode=0o700)
    path = wd / "jobs.sqlite"
    path.write_bytes(b"not a database\n" * 300)
    path.chmod(0o600)
    caplog.set_level(logging.WARNING, "psij.registry")
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    jobs = [Job(JobSpec("/bin/true")) for _ in range(50)]
    run_jobs(ex, jobs, 0)
    assert not psij.registry.flush(WAIT)
    assert f"status changes of 50 job(s) could not be written ({wd}: job registry {path}" \
        in caplog.text
    assert not psij.registry.flush(WAIT)
    # A registry elsewhere is written, but flush still answers for the jobs above.
    other = Reporting(config=JobExecutorConfig(work_directory=tmp_path / "other"))
    fine = [Job(JobSpec("/bin/true")) for _ in range(5)]
    run_jobs(other, fine, 0)
    assert not psij.registry.flush(WAIT)
    assert recorded(tmp_path / "other") == expected(fine)


def test_a_flush_that_runs_out_of_time_says_so(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    wd = tmp_path / "work"
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    caplog.set_level(logging.WARNING, "psij.registry")
    jobs = [Job(JobSpec("/bin/true")) for _ in range(3000)]
    run_jobs(ex, jobs, 0)
    done = psij.registry.flush(timedelta(0))
    assert done or "of the status changes queued were still being written after 0 s" \
        in caplog.text
    assert psij.registry.flush(WAIT)
    assert recorded(wd) == expected(jobs)


AT_EXIT = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    import psij.registry
    from psij import Job, JobExecutorConfig, JobSpec, JobState, JobStatus
    from psij._registry import recorder
    sys.path.insert(0, sys.argv[2])
    from test_registry_scale import Reporting
    recorder._WRITER.idle_seconds = 0.05
    ex = Reporting(config=JobExecutorConfig(work_directory=Path(sys.argv[1])))
    jobs = [Job(JobSpec("/bin/true")) for _ in range(300)]
    for job in jobs:
        ex.submit(job)
        ex._set_job_status(job, JobStatus(JobState.QUEUED))
    assert psij.registry.flush()
    while any(t.name == "psij-registry-writer" for t in threading.enumerate()):
        time.sleep(0.01)  # the idle writer ends

    def late():  # the jobs' ends, reported at exit, where Python 3.12 starts no thread
        start = threading.Thread.start

        def refused(self):
            if self.name == "psij-registry-writer":
                raise RuntimeError("can't create new thread at interpreter shutdown")
            start(self)
        threading.Thread.start = refused
        for job in jobs:
            ex._set_job_status(job, JobStatus(JobState.COMPLETED, exit_code=0))
    atexit.register(late)  # runs before the registry's exit flush (registered earlier)
""")


def test_changes_at_exit_where_no_thread_can_start_are_written_without_a_warning(
        tmp_path: Path) -> None:
    wd = tmp_path / "work"
    done = subprocess.run([sys.executable, "-c", AT_EXIT, str(wd), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "registry" not in done.stderr, done.stderr
    states = {row[0] for row in recorded(wd).values()}
    assert len(recorded(wd)) == 300 and states == {"COMPLETED"}


def test_changes_failing_for_two_minutes_are_given_up_and_said_so_and_later_ones_insert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from psij._clock import ManualClock

    clock = ManualClock(1000.0)
    monkeypatch.setattr(recorder, "_CLOCK", clock)
    wd = tmp_path / "work"
    wd.mkdir(mode=0o700)
    path = wd / "jobs.sqlite"
    path.write_bytes(b"not a database\n" * 300)
    path.chmod(0o600)
    caplog.set_level(logging.WARNING, "psij.registry")
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    jobs = [Job(JobSpec("/bin/true")) for _ in range(20)]
    run_jobs(ex, jobs, 0)
    assert not psij.registry.flush(WAIT)
    assert "tried again with the next write" in caplog.text
    clock.advance(recorder._GIVE_UP_SECONDS + 1)
    assert not psij.registry.flush(WAIT)  # tried once more, failed: given up
    assert "status changes of 20 job(s) or local run(s) could not be written and were given up" \
        in caplog.text
    path.unlink()
    clock.advance(recorder._RETRY_SECONDS + 1)  # the file is opened again
    for job in jobs:  # their next changes make their rows again
        recorder.record(ex, job)
    assert not psij.registry.flush(WAIT)  # what was given up stays unwritten
    assert recorded(wd) == expected(jobs)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_writer_thread_ended_by_an_exception_leaves_no_flush_waiting_and_a_new_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    wd = tmp_path / "work"
    ex = Reporting(config=JobExecutorConfig(work_directory=wd))
    real = recorder._Writer._write
    calls: List[int] = []
    ended: List[threading.Thread] = []

    def ends_once(batch: Any) -> Any:
        calls.append(len(batch))
        if len(calls) == 1:
            ended.append(threading.current_thread())
            raise SystemExit("the thread ends")
        return real(batch)

    monkeypatch.setattr(recorder._Writer, "_write", staticmethod(ends_once))
    caplog.set_level(logging.WARNING, "psij.registry")
    jobs = [Job(JobSpec("/bin/true")) for _ in range(200)]
    run_jobs(ex, jobs[:100], 0)
    assert not psij.registry.flush(WAIT)  # returns: what the ended thread held is given up
    assert "given up (interrupted: SystemExit)" in caplog.text
    ended[0].join(10)  # its exception is reported within this test, where it is expected
    assert not ended[0].is_alive()
    run_jobs(ex, jobs[100:], 100)
    assert not psij.registry.flush(WAIT)
    want = expected(jobs)
    got = recorded(wd)
    assert {jid: got.get(jid) for jid in list(want)[100:]} == dict(list(want.items())[100:])


def test_a_process_keeps_a_few_registries_connected_and_uses_the_others_again_later(
        tmp_path: Path) -> None:
    from psij._registry import store as _store

    count = _store.MAX_CONNECTED + 5
    executors = [Reporting(config=JobExecutorConfig(work_directory=tmp_path / f"w{i}"))
                 for i in range(count)]
    jobs = [Job(JobSpec("/bin/true")) for _ in executors]
    for i, (ex, job) in enumerate(zip(executors, jobs)):
        run_jobs(ex, [job], i)
        assert psij.registry.flush(WAIT)
    stores = [_store.open_store(tmp_path / f"w{i}") for i in range(count)]
    assert sum(s.connected for s in stores) <= _store.MAX_CONNECTED  # three descriptors each
    assert not stores[0].connected  # the least used
    for i, ex in enumerate(executors):  # each written again, the closed ones made again
        later = Job(JobSpec("/bin/true"))
        run_jobs(ex, [later], i)
        jobs.append(later)
    assert psij.registry.flush(WAIT)
    for i in range(count):
        rows = recorded(tmp_path / f"w{i}")
        assert sorted(rows) == sorted([jobs[i].id, jobs[count + i].id])
        assert {row[2] for row in rows.values()} == {1}  # both final
    assert sum(s.connected for s in stores) <= _store.MAX_CONNECTED
    # A registry removed while its connection was closed is not made again empty in secret.
    first = stores[0]
    assert first.disconnect()
    (tmp_path / "w0" / "jobs.sqlite").unlink()
    with pytest.raises(psij.registry.RegistryError):
        first.select()
    assert not (tmp_path / "w0" / "jobs.sqlite").exists()
