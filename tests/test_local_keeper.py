"""The keeper of local jobs: it outlives the submitting process and records how its jobs end,
holds none of the submitter's standard streams, gives jobs default signal actions, and a
keeper that dies is reported and replaced."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, List

import pytest

import psij.registry
from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors.local._keeper_client import flush_keepers
from psij.job_executor_config import JobExecutorConfig
from support.process_checks import live_members, members_left_after

if TYPE_CHECKING:
    from psij.executors.local._keeper_client import Keeper

SUBMIT_AND_EXIT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from psij import Job, JobExecutor, JobSpec
    from psij.job_executor_config import JobExecutorConfig
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=sys.argv[1]))
    job = Job(JobSpec("/bin/sh", ["-c", sys.argv[2]]))
    ex.submit(job)
    print(job.id, flush=True)
""")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def test_the_keeper_s_copy_of_the_run_statements_is_the_registry_store_s() -> None:
    # The keeper imports nothing of psij, so it holds its own copy of the statements it uses.
    from psij._registry.store import RUN_SQL
    from psij.executors.local import _keeper

    assert _keeper._RUN_SQL == {kind: RUN_SQL[kind] for kind in _keeper._RUN_SQL}


def test_a_job_ending_after_its_submitter_exited_keeps_its_exit_code(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    gate = tmp_path / "gate"
    started = time.monotonic()
    # Run as `$(python script)` would: the submitter's output pipe must close when it exits,
    # although the keeper and the job outlive it.
    done = subprocess.run([sys.executable, "-c", SUBMIT_AND_EXIT, str(wd),
                           f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 4"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    job_id = done.stdout.strip()
    [record] = psij.registry.find(job_id, work_directory=wd)
    assert record.state is JobState.ACTIVE
    gate.touch()
    deadline = time.monotonic() + 60
    while not record.state.final:
        assert time.monotonic() < deadline, "the keeper did not record the job's end"
        time.sleep(0.05)
        [record] = psij.registry.find(job_id, work_directory=wd)
    assert (record.state, record.exit_code) == (JobState.FAILED, 4)
    assert record.message == "the job exited with code 4"
    # Re-attached later, the job reports the same.
    [job] = psij.registry.reattach(job_id, work_directory=wd)
    assert (job.status.state, job.status.exit_code) == (JobState.FAILED, 4)


def test_jobs_get_the_default_action_of_every_signal(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    out = tmp_path / "out"
    job = Job(JobSpec("/bin/sh", ["-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"],
                      stdout_path=out))
    ex.submit(job)
    status = job.wait()
    assert status is not None and status.state is JobState.COMPLETED
    masks = dict(line.split(":") for line in out.read_text().splitlines())
    # Signals 1 to 31 (glibc's posix_spawn keeps its two internal ones, 32 and 33, to itself).
    standard = (1 << 31) - 1
    assert {k: int(v.strip(), 16) & standard for k, v in masks.items()} == {"SigIgn": 0,
                                                                             "SigBlk": 0}


def test_a_killed_keeper_fails_its_jobs_saying_so_and_is_replaced(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    job = Job(JobSpec("/bin/sleep", ["600"]))
    ex.submit(job)
    assert job.native_id is not None
    pid = int(job.native_id)
    keeper = _parent(pid)
    assert keeper != os.getpid()
    try:
        os.kill(keeper, signal.SIGKILL)
        status = job.wait()
        assert status is not None and status.state is JobState.FAILED
        assert status.exit_code is None
        assert status.message == (f"the keeper process {keeper} that started the job ended "
                                  "(killed by signal 9); the job's processes were killed")
        assert members_left_after(pid, 10) == [], "the job was left running unwatched"
    finally:
        if live_members(pid):
            os.killpg(pid, signal.SIGKILL)
    again = Job(JobSpec("/bin/sleep", ["0.2"]))
    ex.submit(again)
    assert again.native_id is not None
    new_keeper = _parent(int(again.native_id))
    assert new_keeper not in (keeper, os.getpid())
    status = again.wait()
    assert status is not None and (status.state, status.exit_code) == (JobState.COMPLETED, 0)


def test_without_a_keeper_jobs_are_children_of_this_process(tmp_path: Path) -> None:
    from psij.executors.local import LocalJobExecutorConfig

    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path, keeper=False))
    job = Job(JobSpec("/bin/sh", ["-c", "sleep 0.2; exit 6"]))
    ex.submit(job)
    assert job.native_id is not None and _parent(int(job.native_id)) == os.getpid()
    status = job.wait()
    assert status is not None and (status.state, status.exit_code) == (JobState.FAILED, 6)


def test_a_keeper_setting_that_is_not_a_bool_is_refused_naming_it() -> None:
    import pytest

    from psij.executors.local import LocalJobExecutorConfig

    with pytest.raises(TypeError, match="LocalJobExecutorConfig.keeper"):
        LocalJobExecutorConfig(keeper="no")  # type: ignore[arg-type]


def _spawn(keeper: "Keeper", argv: List[str], directory: Path, job_id: str,
           journal: Path) -> int:
    """A start asked the synchronous way (one request, its answer on the socket)."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        answer = keeper._ask(("spawn", argv[0], argv, str(directory), {}, job_id, str(journal),
                              "", False), [null] * 3)
    finally:
        os.close(null)
    assert answer[0] == "ok", answer
    return int(answer[1])


def test_a_keeper_answers_garbage_requests_with_an_error_and_goes_on(tmp_path: Path) -> None:
    import struct

    from psij.executors.local._keeper_client import Keeper, _message

    journal = tmp_path / "j.journal"
    journal.touch()
    keeper = Keeper(7)
    try:
        nan, inf = float("nan"), float("inf")
        for request in [("bogus",), ("spawn", 1), ("signal", "x", 1), ("signal",),
                        ("spawn", 1, 2, 3, 4, 5, 6, 7), ("spawn", "/bin/true"),
                        ("terminate", "x", 1.0, True), ("terminate", 1, nan, True),
                        ("terminate", 1, -1.0, False), ("terminate", 1, "1", False),
                        ("terminate", 1), ("kill_later", 1, nan, False),
                        ("kill_later", -4, 1.0, False), ("kill_later", 0, 1.0, False),
                        ("kill_later", 1, -inf, False), ("kill_later", "\ud800", 1.0, False),
                        ("kill_later",)]:
            answer = keeper._ask(request, [])
            assert answer[0] == "err" and isinstance(answer[2], str), (request, answer)
        keeper._sock.sendall(struct.pack("!I", 3) + b"\xff\x00\x01")  # not marshal data
        answer = keeper._reply()
        assert b"could not read the request" in answer  # marshal bytes of the error text
        # Batches the keeper cannot read answer nothing and leave it answering.
        keeper._send(_message(("spawns", [("bad",), 3])), [])
        keeper._send(_message(("env", "x", 1)), [])
        keeper._send(_message(("spawns", "x")), [])
        assert keeper._ask(("flush",), []) == ("ok", True)
        pid = _spawn(keeper, ["/bin/sh", "-c", "exit 9"], tmp_path, "job-1", journal)
        deadline = time.monotonic() + 30
        while f"E {pid} " not in journal.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert journal.read_text().splitlines()[-1].endswith(" 9")
        assert journal.read_text().splitlines()[0].endswith(" job-1")
        # A cancel: TERM (ignored), KILL from the keeper after the grace, recorded as a cancel.
        pid = _spawn(keeper, ["/bin/sh", "-c", "trap '' TERM; sleep 60"], tmp_path, "job-2",
                     journal)
        time.sleep(0.2)  # the trap set
        assert keeper.terminate(pid, 0.3, True) is True
        while f"E {pid} " not in journal.read_text():
            assert time.monotonic() < deadline + 30
            time.sleep(0.02)
        assert journal.read_text().splitlines()[-1].endswith(" 137 canceled")
        assert keeper.terminate(pid, 0.3, True) is False  # reaped: nothing sent
        # A grace longer than select can wait leaves the keeper answering.
        assert keeper._ask(("kill_later", 99999999, 1e300, False), []) == ("ok", True)
        assert keeper._ask(("flush",), []) == ("ok", True)
    finally:
        keeper._sock.close()


def test_one_keeper_serves_every_work_directory_of_a_process(tmp_path: Path) -> None:
    parents = set()
    for i in range(5):
        wd = tmp_path / f"w{i}"
        ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=wd))
        job = Job(JobSpec("/bin/sh", ["-c", f"sleep 0.2; exit {i}"]))
        ex.submit(job)
        assert job.native_id is not None
        parents.add(_parent(int(job.native_id)))
        status = job.wait()
        assert status is not None and status.exit_code == i
        # Recorded in the work directory's registry, none in a journal file.
        flush_keepers()
        assert list((wd / "local").glob("*.journal")) == []
        with sqlite3.connect(wd / "jobs.sqlite") as conn:
            rows = conn.execute("SELECT pid, job_id, exit_code, ended, canceled "
                                "FROM local_runs").fetchall()
        assert rows == [(int(job.native_id), job.id, i, 1, 0)]
    assert len(parents) == 1 and os.getpid() not in parents


def test_the_keeper_records_a_burst_of_jobs_in_a_few_transactions(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    jobs = [Job(JobSpec("/bin/sleep", ["600"])) for _ in range(200)]
    try:
        for job in jobs:
            ex.submit(job)
        flush_keepers()
        with sqlite3.connect(tmp_path / "jobs.sqlite") as conn:
            rows = conn.execute("SELECT pid, job_id, updated FROM local_runs").fetchall()
    finally:
        for job in jobs:
            job.cancel()
    assert sorted((pid, job_id) for pid, job_id, _ in rows) == \
        sorted((int(j.native_id or 0), j.id) for j in jobs)
    # One time per transaction: the 200 starts took far fewer commits than jobs.
    commits = len({updated for _, _, updated in rows})
    print(f"200 job starts recorded in {commits} transaction(s)")
    assert commits <= 40, commits
    for job in jobs:
        status = job.wait()
        assert status is not None and status.state is JobState.CANCELED


CANCEL_AND_EXIT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from psij import Job, JobExecutor, JobSpec, JobState
    from psij.executors.local import LocalJobExecutorConfig
    wd, grace, keeper, ready = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "keeper", sys.argv[4]
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=wd, cancel_grace_period=grace, keeper=keeper))
    job = Job(JobSpec("/bin/sh", ["-c", f"trap '' TERM; touch {ready}; sleep 60"]))
    seen = []
    job.set_job_status_callback(lambda j, status: seen.append(status.state))
    ex.submit(job)
    while not Path(ready).exists():
        time.sleep(0.01)
    job.cancel()
    print(job.native_id, job.id, JobState.CANCELED in seen, flush=True)
    time.sleep(0.01)  # a launcher that exits right after cancelling its pilot job
""")


@pytest.mark.parametrize("how", ["keeper", "direct"])
def test_a_cancel_reports_at_once_and_kills_after_the_grace_when_the_caller_exits(
        tmp_path: Path, how: str) -> None:
    wd, ready = tmp_path / "work", tmp_path / "ready"
    grace = 1.5
    done = subprocess.run([sys.executable, "-c", CANCEL_AND_EXIT, str(wd), str(grace), how,
                           str(ready)], capture_output=True, text=True, timeout=60)
    ended = time.monotonic()
    assert done.returncode == 0, done.stderr
    pid, job_id, reported = done.stdout.split()
    assert reported == "True", "CANCELED was not reported before cancel() returned"
    pgid = int(pid)
    if time.monotonic() - ended < grace / 2:  # not killed before its grace (when we can see)
        assert live_members(pgid), "the job was killed at once, not after its grace"
    # The job traps TERM: only the KILL after the grace ends it, sent although the caller
    # is gone.
    assert members_left_after(pgid, grace + 30) == []
    [record] = psij.registry.find(job_id, work_directory=wd)
    assert record.state is JobState.CANCELED


def test_a_registry_flush_commits_the_keeper_s_records_so_a_killed_submitter_s_jobs_attach(
        tmp_path: Path) -> None:
    # The submitter flushes the registry and is killed at once: its jobs' records (the keeper's,
    # committed in batches) are already in the store, so another process attaches every job.
    client = textwrap.dedent(f"""
        import os, signal
        import psij, psij.registry
        from psij.job_executor_config import JobExecutorConfig
        ex = psij.JobExecutor.get_instance(
            "local", config=JobExecutorConfig(work_directory={str(tmp_path)!r}))
        jobs = [psij.Job(psij.JobSpec("/bin/sleep", ["60"])) for _ in range(8)]
        for job in jobs:
            ex.submit(job)
        psij.registry.flush()
        with __import__("sqlite3").connect({str(tmp_path / "jobs.sqlite")!r}) as conn:
            rows = conn.execute("SELECT job_id FROM local_runs").fetchall()
        print(len(rows), " ".join(job.id for job in jobs), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    out = subprocess.run([sys.executable, "-c", client], capture_output=True, text=True,
                         timeout=60).stdout.split()
    assert out[0] == "8", out  # committed by the flush itself, not some time later
    jobs = psij.registry.reattach(out[1:], work_directory=tmp_path)
    try:
        assert [job.id for job in jobs] == out[1:]
        assert all(job.status.state is JobState.ACTIVE for job in jobs)
    finally:
        for job in jobs:
            job.cancel()
