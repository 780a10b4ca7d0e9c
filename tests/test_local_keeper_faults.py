"""Several keepers under faults: a keeper killed fails its own running jobs, naming it, and kills
their processes, while the other keepers' jobs go on and the next jobs go to a live keeper; the
submitter killed leaves every keeper recording its jobs' exit codes; a burst of jobs spread over
keepers all complete with distinct pids; a job cancelled before its pid is known is killed once
started."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator, List

import pytest

import psij
import psij.registry
from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors._process_watch import ProcessWatch
from psij.job_executor_config import JobExecutorConfig
from support.process_checks import live_members, members_left_after

TIMEOUT = 60.0


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


@pytest.fixture
def three(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JobExecutor]:
    """An executor whose jobs are spread over three keepers of its own (its own watch: the
    keepers of the other tests are not these)."""
    monkeypatch.setenv("PSIJ_LOCAL_KEEPERS", "3")
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    ex._watch = ProcessWatch()  # type: ignore[attr-defined]
    yield ex


def _pids(jobs: List[Job]) -> List[int]:
    pids = []
    for job in jobs:
        assert job.native_id is not None  # waits for the keeper's answer
        pids.append(int(job.native_id))
    return pids


def test_a_keeper_killed_fails_its_jobs_naming_it_and_kills_them(three: JobExecutor,
                                                                  tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
            for _ in range(6)]
    for job in jobs:
        three.submit(job)
    pids = _pids(jobs)
    keepers = [_parent(pid) for pid in pids]
    assert len(set(keepers)) == 3 and os.getpid() not in keepers
    victim = keepers[0]
    try:
        os.kill(victim, signal.SIGKILL)
        for job, keeper, pid in zip(jobs, keepers, pids):
            if keeper != victim:
                continue
            status = job.wait(timeout=TIMEOUT)
            assert status is not None and status.state is JobState.FAILED
            assert status.message == (f"the keeper process {victim} that started the job "
                                      "ended (killed by signal 9); the job's processes were "
                                      "killed")
            assert members_left_after(pid, 10) == [], "left running with nobody watching"
        others = [j for j, k in zip(jobs, keepers) if k != victim]
        assert others and all(not j.status.state.final for j in others)
        # The next jobs go to live keepers (a new one replaces the dead).
        later = [Job(JobSpec("/bin/sh", ["-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
                 for _ in range(3)]
        for job in later:
            three.submit(job)
        later_pids = _pids(later)
        pids += later_pids
        assert victim not in {_parent(pid) for pid in later_pids}
        gate.touch()
        for job in others + later:
            status = job.wait(timeout=TIMEOUT)
            assert status is not None and (status.state, status.exit_code) == \
                (JobState.COMPLETED, 0)
    finally:
        gate.touch()
        for pid in pids:
            if live_members(pid):
                os.killpg(pid, signal.SIGKILL)


def test_a_burst_spread_over_keepers_all_completes_with_distinct_pids(
        three: JobExecutor) -> None:
    jobs = [Job(JobSpec("/bin/true")) for _ in range(2000)]
    for job in jobs:
        three.submit(job)
    for job in jobs:
        status = job.wait(timeout=TIMEOUT)
        assert status is not None and (status.state, status.exit_code) == \
            (JobState.COMPLETED, 0), status
    assert len({job.native_id for job in jobs}) == 2000


def test_a_job_cancelled_before_its_pid_is_known_is_killed_once_started(
        three: JobExecutor) -> None:
    ahead = [Job(JobSpec("/bin/true")) for _ in range(300)]
    for job in ahead:
        three.submit(job)
    job = Job(JobSpec("/bin/sleep", ["60"]))
    three.submit(job)
    job.cancel()
    status = job.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.CANCELED
    assert job.native_id is not None
    assert members_left_after(int(job.native_id), 10) == []
    for other in ahead:
        assert other.wait(timeout=TIMEOUT) is not None


SUBMIT_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    from psij import Job, JobExecutor, JobSpec
    from psij.job_executor_config import JobExecutorConfig
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=sys.argv[1]))
    jobs = [Job(JobSpec("/bin/sh", ["-c", sys.argv[2] + f"; exit {i + 3}"])) for i in range(4)]
    for job in jobs:
        ex.submit(job)
    for job in jobs:
        assert job.native_id is not None
        job.wait(target_states=[job.status.state.ACTIVE])
    import psij._registry.recorder
    psij._registry.recorder.flush()  # the jobs' rows (a kill -9 loses the last 50 ms of them)
    print(" ".join(f"{job.id}:{job.native_id}" for job in jobs), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_the_submitter_killed_leaves_every_keeper_recording_its_jobs(tmp_path: Path) -> None:
    wd, gate = tmp_path / "work", tmp_path / "gate"
    env = {**os.environ, "PSIJ_LOCAL_KEEPERS": "2"}
    done = subprocess.run([sys.executable, "-c", SUBMIT_AND_DIE, str(wd),
                           f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pairs = [item.split(":") for item in done.stdout.split()]
    assert len(pairs) == 4
    try:
        assert len({_parent(int(pid)) for _, pid in pairs}) == 2  # both keepers outlived it
        gate.touch()
        for i, (job_id, _) in enumerate(pairs):
            deadline = time.monotonic() + TIMEOUT
            while True:
                [record] = psij.registry.find(job_id, work_directory=wd)
                if record.state.final:
                    break
                assert time.monotonic() < deadline, "the keeper did not record the job's end"
                time.sleep(0.05)
            assert (record.state, record.exit_code) == (JobState.FAILED, i + 3)
    finally:
        gate.touch()


def test_a_callback_reading_the_native_id_on_queued_gets_the_pid(three: JobExecutor) -> None:
    seen: List[str] = []

    def note(job: Job, status: psij.JobStatus) -> None:
        if status.state is JobState.QUEUED:
            seen.append(str(job.native_id))  # waits for the keeper's answer

    job = Job(JobSpec("/bin/true"))
    job.set_job_status_callback(note)
    three.submit(job)
    status = job.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.COMPLETED
    assert seen == [job.native_id] and seen[0].isdigit()


def test_jobs_sent_to_a_keeper_that_died_unanswered_fail_and_later_ones_go_to_another(
        tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    ex._watch = ProcessWatch()  # type: ignore[attr-defined]
    first = Job(JobSpec("/bin/true"))
    ex.submit(first)
    assert first.wait(timeout=TIMEOUT) is not None
    from psij.executors.local._keeper_client import _KEEPERS, _PID

    [k] = _KEEPERS[(_PID[0], id(ex._watch))]  # type: ignore[attr-defined]
    os.kill(k.pid, signal.SIGSTOP)  # it reads nothing more: what is sent stays unanswered
    try:
        sent = [Job(JobSpec("/bin/true")) for _ in range(3)]
        for job in sent:
            ex.submit(job)  # each on its socket before submit returns
    finally:
        os.kill(k.pid, signal.SIGKILL)
    for job in sent:
        status = job.wait(timeout=TIMEOUT)
        assert status is not None and status.state is JobState.FAILED
        assert status.message == (f"could not start '/bin/true': the keeper process {k.pid} "
                                  "ended (killed by signal 9) before it answered")
    # Whether this process saw that keeper's end yet or not (a send to it then fails), the
    # next jobs go to another keeper, or are started here.
    later = [Job(JobSpec("/bin/true")) for _ in range(3)]
    for job in later:
        ex.submit(job)
    for job in later:
        status = job.wait(timeout=TIMEOUT)
        assert status is not None and (status.state, status.exit_code) == \
            (JobState.COMPLETED, 0)
        assert job.native_id is not None


def test_jobs_queued_for_a_keeper_that_died_before_they_were_sent_go_to_another(
        tmp_path: Path) -> None:
    from psij.executors.local import _handover
    from psij.executors.local._keeper_client import _KEEPERS, _PID

    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    ex._watch = ProcessWatch()  # type: ignore[attr-defined]
    first = Job(JobSpec("/bin/true"))
    ex.submit(first)
    assert first.wait(timeout=TIMEOUT) is not None
    [k] = _KEEPERS[(_PID[0], id(ex._watch))]  # type: ignore[attr-defined]
    queued = [Job(JobSpec("/bin/true")) for _ in range(3)]
    with _handover.batched(ex):  # as submit_many: queued, sent as the batch ends
        for job in queued:
            ex.submit(job)
        os.kill(k.pid, signal.SIGKILL)
        try:
            os.waitpid(k.pid, 0)  # gone for sure: the sends fail
        except ChildProcessError:  # the watch reaped it first
            pass
    for job in queued:
        status = job.wait(timeout=TIMEOUT)
        assert status is not None and (status.state, status.exit_code) == \
            (JobState.COMPLETED, 0), status
        assert job.native_id is not None


def test_a_bad_keeper_count_is_said_once_and_the_cores_decide(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from psij.executors.local import _keeper_client

    monkeypatch.setattr(_keeper_client, "_WARNED", set())
    monkeypatch.delenv("PSIJ_LOCAL_KEEPERS", raising=False)
    by_cores = _keeper_client.keeper_count()
    assert by_cores[1] is False
    for bad in ("0", "-2", "many", "1.5", "nan", "1025", "9" * 400, "\u0663", "2 3"):
        monkeypatch.setenv("PSIJ_LOCAL_KEEPERS", bad)
        caplog.clear()
        assert _keeper_client.keeper_count() == by_cores
        assert _keeper_client.keeper_count() == by_cores
        said = [r.getMessage() for r in caplog.records if "PSIJ_LOCAL_KEEPERS" in r.getMessage()]
        assert len(said) == 1 and "from 1 to 1024" in said[0], (bad, said)
    monkeypatch.setenv("PSIJ_LOCAL_KEEPERS", " 7 ")
    assert _keeper_client.keeper_count() == (7, True)
