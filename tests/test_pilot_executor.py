"""The ``pilot`` executor: PSI/J jobs on an in-process pilot and on a pilot served by
``psij pilot serve`` (socket rights, one server per socket, clean stop, crash and resume)."""

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
    SubmitException,
)
from psij.executors.pilot.executor import PilotJobExecutor, PilotJobExecutorConfig
from psij.executors.pilot.journal import read_journal, task_runs
from psij.executors.pilot.service import JOURNAL_NAME, PilotClient, answering

WAIT = timedelta(seconds=30)


def attrs(**custom: object) -> JobAttributes:
    return JobAttributes(custom_attributes={f"pilot.{k}": v for k, v in custom.items()})


def final(job: Job) -> JobStatus:
    status = job.wait(WAIT)
    assert status is not None, f"job {job.native_id} did not end in time"
    return status


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[PilotJobExecutor]:
    ex = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(cores=2))
    assert isinstance(ex, PilotJobExecutor)
    yield ex
    ex.close()


# -- in-process pilot -------------------------------------------------------------------------


def test_jobs_complete_fail_and_report_their_states(executor: PilotJobExecutor,
                                                    tmp_path: Path) -> None:
    seen: List[Tuple[str, JobState]] = []
    executor.set_job_status_callback(lambda job, st: seen.append((job.id, st.state)))
    ok = Job(JobSpec("/bin/sh", ["-c", 'echo "$SLURM_NTASKS $QCG_PM_NPROCS $(wc -l < '
                                       '"$PSIJ_NODEFILE")"'],
                     stdout_path=Path("out.txt"), directory=tmp_path,
                     resources=ResourceSpecV1(process_count=2)))
    bad = Job(JobSpec("/bin/sh", ["-c", "echo broken >&2; exit 4"],
                      stderr_path=tmp_path / "bad.err"))
    executor.submit(ok)
    executor.submit(bad)
    assert ok.native_id == ok.id and ok.status.state in (JobState.QUEUED, JobState.ACTIVE,
                                                         JobState.COMPLETED)
    assert final(ok).state is JobState.COMPLETED and ok.status.exit_code == 0
    assert (tmp_path / "out.txt").read_text().split() == ["2", "2", "2"]
    status = final(bad)
    assert status.state is JobState.FAILED and status.exit_code == 4
    assert "broken" in (status.message or "")
    assert [s for j, s in seen if j == ok.id] == [JobState.QUEUED, JobState.ACTIVE,
                                                  JobState.COMPLETED]


def test_tasks_inherit_the_environment_the_pilot_started_with(
        executor: PilotJobExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSIJ_T_BEFORE", "before")
    show = 'echo "${PSIJ_T_BEFORE-unset} ${PSIJ_T_AFTER-unset}"'
    first = Job(JobSpec("/bin/sh", ["-c", show], stdout_path=tmp_path / "1"))
    executor.submit(first)  # starts the pilot
    assert final(first).state is JobState.COMPLETED
    monkeypatch.setenv("PSIJ_T_AFTER", "after")
    later = Job(JobSpec("/bin/sh", ["-c", show], stdout_path=tmp_path / "2"))
    given = Job(JobSpec("/bin/sh", ["-c", show], stdout_path=tmp_path / "3",
                        environment={"PSIJ_T_AFTER": "given"}))
    bare = Job(JobSpec("/bin/sh", ["-c", show], stdout_path=tmp_path / "4",
                       inherit_environment=False))
    for job in (later, given, bare):
        executor.submit(job)
    for job in (later, given, bare):
        assert final(job).state is JobState.COMPLETED
    assert [(tmp_path / n).read_text() for n in "1234"] == [
        "before unset\n", "before unset\n", "before given\n", "unset unset\n"]


def test_cancel_list_and_attach_in_process(executor: PilotJobExecutor) -> None:
    sleeper = Job(JobSpec("/bin/sleep", ["60"]))
    executor.submit(sleeper)
    assert sleeper.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    assert sleeper.native_id in executor.list()
    follower = Job()
    executor.attach(follower, sleeper.native_id or "")
    assert follower.status.state is JobState.ACTIVE
    sleeper.cancel()
    assert final(sleeper).state is JobState.CANCELED
    assert final(follower).state is JobState.CANCELED
    assert sleeper.native_id not in executor.list()
    with pytest.raises(InvalidJobException, match="'nope' is not a task of this pilot"):
        executor.attach(Job(), "nope")


def test_dependencies_by_name_and_a_failed_dependency(executor: PilotJobExecutor,
                                                      tmp_path: Path) -> None:
    first = Job(JobSpec("/bin/sh", ["-c", f"sleep 0.2; echo first >> {tmp_path}/log"],
                        name="first"))
    second = Job(JobSpec("/bin/sh", ["-c", f"echo second >> {tmp_path}/log"],
                         attributes=attrs(after="first")))
    broken = Job(JobSpec("/bin/false", name="broken"))
    skipped = Job(JobSpec("/bin/true", attributes=attrs(after=f"broken, {first.id}")))
    for job in (first, second, broken, skipped):
        executor.submit(job)
    assert final(second).state is JobState.COMPLETED
    assert (tmp_path / "log").read_text() == "first\nsecond\n"
    status = final(skipped)
    assert status.state is JobState.FAILED
    assert "depends on did not complete" in (status.message or "")
    assert f"dependency '{broken.id}' ended FAILED" in (status.message or "")


def test_priorities_are_honoured(tmp_path: Path) -> None:
    ex = PilotJobExecutor(config=PilotJobExecutorConfig(cores=1))
    try:
        gate = tmp_path / "gate"
        blocker = Job(JobSpec("/bin/sh", ["-c", f"while [ ! -e {gate} ]; do sleep 0.02; done"]))
        ex.submit(blocker)
        # The others must queue behind it: a job of higher priority submitted before the
        # blocker is placed would rightly start first.
        started = blocker.wait(timedelta(seconds=20), target_states=JobState.ACTIVE)
        assert started is not None and started.state is JobState.ACTIVE
        # pilot.priority and psij.priority (the one every executor takes) mix
        jobs = [Job(JobSpec("/bin/sh", ["-c", f"echo {p} >> {tmp_path}/order"],
                            attributes=attrs(priority=p) if p != 2 else JobAttributes(
                                custom_attributes={"psij.priority": 2.0})))
                for p in (1, 3, 2)]
        for job in jobs:
            ex.submit(job)
        gate.touch()
        for job in jobs:
            final(job)
        assert (tmp_path / "order").read_text().split() == ["3", "2", "1"]
    finally:
        ex.close()


def test_jobs_the_pilot_cannot_run_are_refused_at_submission(
        executor: PilotJobExecutor) -> None:
    with pytest.raises(InvalidJobException, match="JobSpec.launcher: 'mpirun' is not supported"):
        executor.submit(Job(JobSpec("/bin/true", launcher="mpirun")))
    with pytest.raises(InvalidJobException, match="pilot.priority: expected a number"):
        executor.submit(Job(JobSpec("/bin/true", attributes=attrs(priority="high"))))
    for bad, text in ((float("nan"), "expected a finite number"), (2.5, "whole numbers")):
        with pytest.raises(InvalidJobException, match=f"psij.priority.*{text}"):
            executor.submit(Job(JobSpec("/bin/true", attributes=JobAttributes(
                custom_attributes={"psij.priority": bad}))))
    with pytest.raises(SubmitException, match="'ghost' is neither a task nor"):
        executor.submit(Job(JobSpec("/bin/true", attributes=attrs(after="ghost"))))
    job = Job(JobSpec("/bin/true", attributes=attrs(after="ghost")))
    with pytest.raises(SubmitException):
        executor.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None and job.native_id is None
    huge = Job(JobSpec("/bin/true", resources=ResourceSpecV1(process_count=64)))
    executor.submit(huge)
    status = final(huge)
    assert status.state is JobState.FAILED and "can never fit" in (status.message or "")


# -- served pilot -----------------------------------------------------------------------------


class Served:
    """A ``psij pilot serve`` process on a short socket path."""

    def __init__(self, folder: Path, wd: Path, *extra: str) -> None:
        self.socket = str(folder / "pilot.sock")
        self.wd = wd
        self.log = folder / f"serve-{time.monotonic_ns()}.log"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.extra = extra

    def start(self, *more: str) -> "Served":
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "psij", "pilot", "serve", "--socket", self.socket,
                 "--cores", "2", "--wd", str(self.wd), *self.extra, *more],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not answering(self.socket, timeout=1):
            assert self.proc.poll() is None, f"serve exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, "the pilot did not start"
            time.sleep(0.02)
        return self

    def stop(self, signum: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        return self.proc.wait(30)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are limited to about 100 bytes: pytest's tmp_path is often longer.
    folder = Path(tempfile.mkdtemp(prefix="pj"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def served(short_dir: Path, tmp_path: Path) -> Iterator[Served]:
    pilot = Served(short_dir, tmp_path / "wd").start()
    yield pilot
    pilot.stop(signal.SIGTERM)


def test_served_pilot_runs_200_jobs_from_another_process(served: Served,
                                                         tmp_path: Path) -> None:
    assert stat.S_IMODE(os.stat(served.socket).st_mode) == 0o600
    ex = JobExecutor.get_instance("pilot", url=f"unix://{served.socket}")
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"echo {i} > {tmp_path}/out.{i}"]))
            for i in range(200)]
    for job in jobs:
        ex.submit(job)
    states = [final(job).state for job in jobs]
    assert states == [JobState.COMPLETED] * 200
    assert all((tmp_path / f"out.{i}").read_text() == f"{i}\n" for i in range(200))
    # Each final status has the figures of its run, as the served pilot's journal has them.
    rows = {row["id"]: row for row in task_runs(read_journal(served.wd / JOURNAL_NAME))}
    for job in jobs:
        meta = job.status.metadata or {}
        assert meta["queued_at"] <= meta["started_at"] <= meta["ended_at"]
        assert meta["cores"] == 1 and meta["max_rss_bytes"] > 0 and meta["run"] == 1
        row = rows[job.native_id or ""]
        assert set(meta) - set(row) == {"pilot_state"}
        assert {k: row[k] for k in meta if k in row} == {k: meta[k] for k in meta if k in row}
    assert ex.list() == []
    # A second executor (as another process would) follows a task by its native id.
    other = PilotJobExecutor(url=served.socket)
    late = Job()
    other.attach(late, jobs[7].native_id or "")
    assert late.status.state is JobState.COMPLETED and late.status.exit_code == 0


def test_cancel_and_list_through_the_socket(served: Served) -> None:
    ex = PilotJobExecutor(url=f"unix://{served.socket}")
    job = Job(JobSpec("/bin/sleep", ["60"]))
    ex.submit(job)
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    assert ex.list() == [job.native_id]
    job.cancel()
    assert final(job).state is JobState.CANCELED


def test_a_second_server_is_refused_and_a_stale_socket_is_replaced(served: Served,
                                                                   short_dir: Path) -> None:
    again = subprocess.run([sys.executable, "-m", "psij", "pilot", "serve", "--socket",
                            served.socket], capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "already running" in again.stderr
    assert served.proc is not None and served.proc.poll() is None
    served.stop(signal.SIGKILL)
    assert os.path.exists(served.socket)  # a killed server leaves its socket behind
    restarted = Served(short_dir, served.wd).start()
    try:
        assert answering(restarted.socket)
    finally:
        assert restarted.stop() == 0


def test_sigterm_cancels_running_tasks_and_stops_cleanly(served: Served) -> None:
    ex = PilotJobExecutor(url=served.socket)
    job = Job(JobSpec("/bin/sleep", ["60"]))
    ex.submit(job)
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    assert served.stop(signal.SIGTERM) == 0
    assert final(job).state is JobState.CANCELED
    assert not os.path.exists(served.socket)
    assert (served.wd / JOURNAL_NAME).is_file()


def test_protocol_errors_are_answered_not_fatal(served: Served) -> None:
    client = PilotClient(served.socket)
    try:
        with pytest.raises(ValueError, match="'dance' is not an operation"):
            client.request("dance")
        with pytest.raises(ValueError, match=r"tasks\[0\]: task: the field 'executable'"):
            client.request("submit", tasks=[{"name": "x"}])
        assert client.request("ping")["pid"] == served.proc.pid  # type: ignore[union-attr]
        usage = client.request("usage")["usage"]
        assert usage["total_cores"] == 2
    finally:
        client.close()


def test_crash_and_resume_does_not_rerun_succeeded_tasks(served: Served,
                                                         tmp_path: Path) -> None:
    counts = tmp_path / "counts"
    counts.mkdir()
    ex = PilotJobExecutor(url=served.socket)
    jobs = [Job(JobSpec("/bin/sh", ["-c", 'echo run >> "$0"; sleep 0.15', str(counts / str(i))]))
            for i in range(16)]
    released = tmp_path / "released"
    hanging = Job(JobSpec("/bin/sh", ["-c", f'echo $$ >> {tmp_path}/pids; [ -e {released} ] '
                                            '|| exec sleep 60']))
    ex.submit(hanging)
    for job in jobs:
        ex.submit(job)
    deadline = time.monotonic() + 30
    while sum(j.status.state is JobState.COMPLETED for j in jobs) < 4:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    served.stop(signal.SIGKILL)
    done_before = [j.native_id for j in jobs if j.status.state is JobState.COMPLETED]
    assert len(done_before) >= 4
    for job in jobs:
        final(job)  # the lost connection ends the others FAILED
    orphan = int((tmp_path / "pids").read_text().split()[0])
    deadline = time.monotonic() + 10
    while _alive(orphan):  # the crashed pilot's workers take its tasks along
        assert time.monotonic() < deadline, "the crashed run's task outlived it"
        time.sleep(0.02)
    released.touch()
    resumed = Served(Path(served.socket).parent, served.wd).start("--resume")
    try:
        again = PilotJobExecutor(url=resumed.socket)
        followers = []
        for job in jobs:
            follower = Job()
            again.attach(follower, job.native_id or "")
            followers.append(follower)
        assert [final(f).state for f in followers] == [JobState.COMPLETED] * 16
        rerun = Job()
        again.attach(rerun, hanging.native_id or "")
        assert final(rerun).state is JobState.COMPLETED
        for i, job in enumerate(jobs):
            runs = (counts / str(i)).read_text().count("run")
            if job.native_id in done_before:
                assert runs == 1, f"task {i} succeeded before the crash but ran {runs} times"
            else:
                assert runs >= 1
        # The journal of both runs of the pilot: the task that ran when it crashed started
        # twice, and its second run is the one that ended.
        rows = [r for r in task_runs(read_journal(served.wd / JOURNAL_NAME))
                if r["id"] == hanging.native_id]
        assert [(r["run"], r.get("state")) for r in rows] == [(1, None), (2, "SUCCEEDED")]
    finally:
        assert resumed.stop() == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of the crashed pilot is a zombie until init reaps it.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
