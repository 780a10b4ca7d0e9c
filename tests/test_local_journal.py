"""Executors made one per job (as workflow tools do) leave a constant number of files: the
records of local jobs go to the work directory's registry (one store per user, no journal
file), and ``list()``/``attach()`` from another process still see every job. When the registry
is off or cannot be written, every local executor of a process shares that process's journal
file instead; journal files of earlier versions are read, never written."""

import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

RUN = r"""
import json, sys
from pathlib import Path
from psij import Job, JobExecutor, JobSpec
from psij.executors.local import LocalJobExecutorConfig
work, count = Path(sys.argv[1]), int(sys.argv[2])
jobs = []
for i in range(count):
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(work_directory=work))
    job = Job(JobSpec("/bin/sh", ["-c", f"exit {i % 3}"]))
    ex.submit(job)
    jobs.append(job)
for job in jobs:
    job.wait()
ended = {j.native_id: [j.id, j.status.exit_code] for j in jobs}
# One more job, still running while another process looks (list() shows running jobs).
ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(work_directory=work))
running = Job(JobSpec("/bin/sleep", ["600"]))
ex.submit(running)
import subprocess
pid = sorted(ended)[7]
looked = subprocess.run([sys.executable, "-c", sys.argv[3], str(work), pid],
                        capture_output=True, text=True, timeout=300)
running.cancel()
running.wait()
print(json.dumps([ended, running.native_id, looked.stdout, looked.stderr]))
"""

LOOK = r"""
import json, sys
from pathlib import Path
from psij import Job, JobExecutor
from psij.executors.local import LocalJobExecutorConfig
ex = JobExecutor.get_instance("local",
                              config=LocalJobExecutorConfig(work_directory=Path(sys.argv[1])))
listed = ex.list()
pid = sys.argv[2]
job = Job()
ex.attach(job, pid)
job.wait()
print(json.dumps([sorted(listed), job.status.state.name, job.status.exit_code]))
"""


def _run(code: str, *args: str, home: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _files(top: Path) -> List[Path]:
    return sorted(p for p in top.rglob("*") if not p.is_dir())


def _jobs(tmp_path: Path, name: str, count: int) -> Tuple[Dict[str, List[int]], str, str]:
    home = tmp_path / f"home-{name}"
    home.mkdir()
    work = tmp_path / f"work-{name}"
    ended, running, looked, errors = json.loads(_run(RUN, str(work), str(count), LOOK,
                                                     home=home))
    assert looked, errors
    return ended, running, looked


# The registry (with SQLite's WAL files while it is in use) and the node file: nothing per job,
# per executor or per process.
ONLY_FILES = {"jobs.sqlite", "jobs.sqlite-wal", "jobs.sqlite-shm", "local/nodefile-1"}


def test_one_executor_per_job_leaves_only_the_registry_store(tmp_path: Path) -> None:
    small, _, _ = _jobs(tmp_path, "200", 200)
    big, running, looked = _jobs(tmp_path, "400", 400)
    assert len(small) == 200 and len(big) == 400
    for name in ("200", "400"):
        work = tmp_path / f"work-{name}"
        names = {str(p.relative_to(work)) for p in _files(work)}
        assert "jobs.sqlite" in names and names <= ONLY_FILES, names
        assert _files(tmp_path / f"home-{name}") == []
    assert (tmp_path / "work-400" / "jobs.sqlite").stat().st_mode & 0o777 == 0o600
    # Another process listed the running job and attached to an ended one, finding its code.
    listed, state, seen = json.loads(looked.strip().splitlines()[-1])
    assert running in listed
    code = big[sorted(big)[7]][1]
    assert (state, seen) == ("COMPLETED" if code == 0 else "FAILED", code)


def test_registry_off_many_work_directories_keep_few_journals_open_and_lose_no_line(
        tmp_path: Path, registry_off: None) -> None:
    from psij import Job, JobExecutor, JobSpec
    from psij.executors.local import LocalJobExecutorConfig

    def journal_fds() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir()
                   if _target(fd).startswith(str(tmp_path)) and _target(fd).endswith(".journal"))

    executors = [JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / f"w{i}")) for i in range(40)]
    for ex in executors + executors[:3]:  # the first ones again after their files were closed
        job = Job(JobSpec("/bin/true"))
        ex.submit(job)
        assert job.wait() is not None
    assert journal_fds() <= 32
    for i in range(40):
        assert not (tmp_path / f"w{i}" / "jobs.sqlite").exists()
        [journal] = [p for p in _files(tmp_path / f"w{i}") if p.suffix == ".journal"]
        assert journal.stat().st_mode & 0o777 == 0o600
        starts = [line for line in journal.read_text().splitlines() if line.startswith("S ")]
        assert len(starts) == (2 if i < 3 else 1), (i, starts)


def _target(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:
        return ""


def test_a_cancel_noted_in_another_journal_makes_the_end_a_cancel(tmp_path: Path) -> None:
    from psij import Job, JobState
    from psij.executors.local import LocalJobExecutor, LocalJobExecutorConfig
    from psij.executors.local._journal import scan_journals

    folder = tmp_path / "local"
    folder.mkdir(mode=0o700)
    (folder / "a.journal").write_text("S 4242 1000 job-a\nS 4343 1001 job-b\n"
                                      "E 4242 1000 143\nE 4343 1001 143\n")
    # Another process cancelled job-a (and wrote a line no reader can take, which is skipped).
    (folder / "b.journal").write_text("C 4242 1000 canceled\nC 4242\n")
    found = scan_journals(folder)
    assert (found[(4242, "1000")].canceled, found[(4343, "1001")].canceled) == (True, False)
    ex = LocalJobExecutor(config=LocalJobExecutorConfig(work_directory=tmp_path))
    a, b = Job(), Job()
    ex.attach(a, "4242")
    ex.attach(b, "4343")
    assert (a.status.state, a.status.exit_code) == (JobState.CANCELED, 143)
    assert (b.status.state, b.status.exit_code) == (JobState.FAILED, 143)


@pytest.fixture
def registry_off() -> Iterator[None]:
    import psij.registry

    psij.registry.set_recording(False)
    try:
        yield
    finally:
        psij.registry.set_recording(True)


def test_registry_off_jobs_go_to_one_journal_and_another_process_sees_them(
        tmp_path: Path) -> None:
    # The RUN script in a process where recording is off: keeper and keeper-less jobs alike.
    code = "import psij.registry; psij.registry.set_recording(False)\n" + RUN
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    ended, running, looked, errors = json.loads(_run(code, str(work), "30", LOOK, home=home))
    assert looked, errors
    # The looking process records the job it attached (its recording is on), no local run.
    with sqlite3.connect(work / "jobs.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM local_runs").fetchone() == (0,)
    journals = [p for p in _files(work) if p.suffix == ".journal"]
    assert len(journals) == 1 and journals[0].stat().st_mode & 0o777 == 0o600
    listed, state, seen = json.loads(looked.strip().splitlines()[-1])
    assert running in listed
    code_7 = ended[sorted(ended)[7]][1]
    assert (state, seen) == ("COMPLETED" if code_7 == 0 else "FAILED", code_7)


@pytest.mark.parametrize("keeper", [True, False])
def test_an_unwritable_registry_sends_the_records_to_a_journal(
        tmp_path: Path, keeper: bool, caplog: pytest.LogCaptureFixture) -> None:
    from psij import Job, JobExecutor, JobSpec, JobState
    from psij.executors.local import LocalJobExecutorConfig

    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    damaged = b"this is not a database, and it stays as it is" * 100
    (work / "jobs.sqlite").write_bytes(damaged)
    os.chmod(work / "jobs.sqlite", 0o600)
    caplog.set_level(logging.WARNING)
    config = LocalJobExecutorConfig(work_directory=work, keeper=keeper)
    ex = JobExecutor.get_instance("local", config=config)
    job = Job(JobSpec("/bin/sh", ["-c", "exit 5"]))
    ex.submit(job)
    status = job.wait()
    assert status is not None and status.exit_code == 5
    assert "jobs.sqlite" in caplog.text
    assert (work / "jobs.sqlite").read_bytes() == damaged
    [journal] = [p for p in _files(work) if p.suffix == ".journal"]
    assert journal.read_text().splitlines()[0].endswith(f" {job.id}")
    again = Job()
    JobExecutor.get_instance("local", config=config).attach(again, str(job.native_id))
    assert (again.status.state, again.status.exit_code) == (JobState.FAILED, 5)


def test_old_journals_are_read_with_the_registry_and_never_written(tmp_path: Path) -> None:
    from psij import Job, JobExecutor, JobSpec, JobState
    from psij.executors.local import LocalJobExecutorConfig

    folder = tmp_path / "local"
    folder.mkdir(mode=0o700, parents=True)
    old = folder / "host-1-2.journal"  # a job started before an upgrade, and how it ended
    old.write_text("S 4242 1000 job-old\nE 4242 1000 3\n")
    before = old.stat()
    config = LocalJobExecutorConfig(work_directory=tmp_path)
    ex = JobExecutor.get_instance("local", config=config)
    job = Job(JobSpec("/bin/sleep", ["600"]))
    ex.submit(job)
    assert job.native_id in ex.list()
    attached = Job()
    ex.attach(attached, "4242")
    assert (attached.status.state, attached.status.exit_code) == (JobState.FAILED, 3)
    # Cancelled from another executor, as another process would: the cancel is recorded too.
    other = Job()
    JobExecutor.get_instance("local", config=config).attach(other, str(job.native_id))
    other.cancel()
    status = other.wait()
    assert status is not None and status.state is JobState.CANCELED
    status = job.wait()  # its owner saw a TERM: it does not read the records
    assert status is not None and status.exit_code == 143
    later = Job()
    JobExecutor.get_instance("local", config=config).attach(later, str(job.native_id))
    assert later.status.state is JobState.CANCELED
    after = old.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert [p.name for p in folder.glob("*.journal")] == [old.name]


def test_a_registry_removed_while_a_job_runs_gets_its_end_in_a_journal(tmp_path: Path) -> None:
    # The keeper finds the registry gone when the job ends.
    from psij.executors.local._keeper_client import flush_keepers

    def removed(work: Path) -> None:
        flush_keepers()
        for name in ("jobs.sqlite", "jobs.sqlite-wal", "jobs.sqlite-shm"):
            if (work / name).exists():
                (work / name).unlink()

    _end_in_a_journal(tmp_path, True, removed)


def test_a_registry_write_failing_sends_the_end_to_a_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a keeper, this process's registry writer fails to commit the job's end.
    from psij._registry.store import RegistryError, Store
    from psij.registry import flush

    def failing(work: Path) -> None:
        flush()

        def write(self: Store, *args: object) -> None:
            raise RegistryError(f"job registry {self.path}: cannot record jobs: disk full")
        monkeypatch.setattr(Store, "write", write)

    _end_in_a_journal(tmp_path, False, failing)


def _end_in_a_journal(tmp_path: Path, keeper: bool, break_registry: Callable[[Path], None]
                      ) -> None:
    import time

    from psij import Job, JobExecutor, JobSpec, JobState
    from psij.executors.local import LocalJobExecutorConfig

    work = tmp_path / "work"
    gate = tmp_path / "gate"
    config = LocalJobExecutorConfig(work_directory=work, keeper=keeper)
    job = Job(JobSpec("/bin/sh", ["-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; exit 6"]))
    JobExecutor.get_instance("local", config=config).submit(job)
    break_registry(work)
    gate.touch()
    status = job.wait()
    assert status is not None and status.exit_code == 6
    deadline = time.monotonic() + 30
    while not list((work / "local").glob("*.journal")):  # the writer's next commit
        assert time.monotonic() < deadline, "the job's end went nowhere"
        time.sleep(0.02)
    [journal] = list((work / "local").glob("*.journal"))
    assert journal.stat().st_mode & 0o777 == 0o600
    # Another process attaches, from the journal alone or with the registry's start.
    looked = subprocess.run([sys.executable, "-c", LOOK, str(work), str(job.native_id)],
                            capture_output=True, text=True, timeout=120)
    assert looked.returncode == 0, looked.stderr
    listed, state, code = json.loads(looked.stdout.strip().splitlines()[-1])
    assert (state, code) == (JobState.FAILED.name, 6) and str(job.native_id) not in listed


def test_local_run_records_are_pruned_with_the_registry(tmp_path: Path) -> None:
    import time

    from psij._registry.store import open_store

    store = open_store(tmp_path)
    store.write([], [], [("S", 4242, "1000", "job-a"), ("E", 4242, "1000", "0"),
                         ("S", 4343, "1001", "job-b")])
    assert [r[:2] for r in store.local_runs()] == [(4242, "1000"), (4343, "1001")]
    store.prune(3600, now=time.time() + 60)
    assert len(store.local_runs()) == 2  # younger than the prune age
    store.prune(3600, now=time.time() + 7200)
    assert store.local_runs() == []
