"""psij.remote._executor: what a remote executor does on its own side (the executor made
with get_instance, submit_many in one request, checks before anything is sent, the shared
connection, native ids told later), against a real ``psij remote serve`` reached through the
test sshd as a real second user, running the remote user's local executor."""

import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from psij import InvalidJobException, Job, JobExecutor, JobExecutorConfig, JobSpec, JobState
from psij.exceptions import SubmitManyException
from psij.remote._connection import Connection
from psij.remote._executor import SUBMIT_CHUNK, RemoteJobExecutor
from psij.staging import StageIn, StageOut
from support.ssh_server import (
    SshUser,
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    sshd_reason,
)

pytestmark = pytest.mark.skipif(sshd_reason() is not None, reason=str(sshd_reason()))


@pytest.fixture(scope="module")
def user() -> Iterator[SshUser]:
    reason = remote_psij_reason()
    if reason is not None:
        pytest.skip(reason)
    made = make_ssh_user("psijrex")
    try:
        yield made
    finally:
        made.remove()


def url_of(user: SshUser, with_user: bool = False) -> str:
    host = f"{user.name}@{user.alias}" if with_user else user.alias
    return f"ssh://{host}?ssh_config={user.config}&psij={remote_psij_command()}"


@pytest.fixture
def local(user: SshUser, tmp_path: Path) -> Iterator[RemoteJobExecutor]:
    ex = JobExecutor.get_instance("local", url=url_of(user),
                                  config=JobExecutorConfig(work_directory=tmp_path / "work"))
    assert isinstance(ex, RemoteJobExecutor)
    yield ex
    ex.close()


def counting(conn: Connection) -> List[str]:
    """The ops of the requests sent from now on (the connection's call, wrapped)."""
    ops: List[str] = []
    call = conn.call

    def counted(op: str, fields: Dict[str, Any], timeout: Any = None) -> Any:
        ops.append(op)
        return call(op, fields, timeout)

    conn.call = counted  # type: ignore[method-assign]
    return ops


def test_the_remote_executor_is_made_and_checked_by_get_instance(user: SshUser,
                                                                 tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", url=url_of(user))
    try:
        assert ex.name == "local" and str(ex.version) == str(
            JobExecutor.get_instance("local").version)
        assert ex.url == url_of(user)
    finally:
        ex.close()
    with pytest.raises(ValueError, match="no-such-executor"):
        JobExecutor.get_instance("no-such-executor", url=url_of(user))
    config = JobExecutorConfig(work_directory=tmp_path)
    config.__dict__["no_such_setting"] = 5
    with pytest.raises(ValueError, match="takes no 'no_such_setting'"):
        JobExecutor.get_instance("local", url=url_of(user), config=config)


def test_submit_many_sends_one_request_per_chunk_and_a_bad_job_fails_alone(
        local: RemoteJobExecutor, user: SshUser, tmp_path: Path) -> None:
    ops = counting(local.connection)
    jobs = [Job(JobSpec("/bin/true")) for _ in range(SUBMIT_CHUNK + 20)]
    bad = Job(JobSpec("/bin/true", stage_in=[StageIn(tmp_path / "absent", "x")]))
    jobs.insert(7, bad)
    with pytest.raises(SubmitManyException) as info:
        local.submit_many(jobs)
    assert [job for job, _ in info.value.failures] == [bad]
    assert isinstance(info.value.failures[0][1], InvalidJobException)
    assert bad.executor is None and bad.status.state is JobState.NEW
    assert ops.count("submit") == 2
    for job in jobs:
        if job is not bad:
            st = job.wait(120)
            assert st is not None and st.state is JobState.COMPLETED, st


def test_a_stage_out_target_elsewhere_is_refused_before_anything_is_sent(
        local: RemoteJobExecutor) -> None:
    ops = counting(local.connection)
    job = Job(JobSpec("/bin/true", stage_out=[StageOut("r", "gsiftp://elsewhere/r")]))
    with pytest.raises(InvalidJobException, match=r"stage_out\[0\] target"):
        local.submit(job)
    assert ops == [] and job.executor is None


def test_executors_of_one_target_share_one_connection_until_the_last_closes(
        user: SshUser) -> None:
    a = JobExecutor.get_instance("local", url=url_of(user, with_user=True))
    b = JobExecutor.get_instance("local", url=url_of(user, with_user=True))
    assert isinstance(a, RemoteJobExecutor) and isinstance(b, RemoteJobExecutor)
    conn = a.connection
    assert b.connection is conn and conn.users == 2 and conn.connects == 1
    a.close()
    job = Job(JobSpec("/bin/true"))
    b.submit(job)
    assert job.wait(60) is not None and job.status.state is JobState.COMPLETED
    proc = conn._proc
    assert proc is not None and proc.poll() is None
    b.close()
    assert conn.closed and proc.poll() is not None
    with pytest.raises(Exception, match="closed"):
        b.submit(Job(JobSpec("/bin/true")))


def test_job_native_id_waits_for_the_id_the_remote_side_tells_later(
        local: RemoteJobExecutor, user: SshUser) -> None:
    job = Job(JobSpec("/bin/sleep", ["2"]))
    local.submit(job)
    native = job.native_id  # the local executor there gives it once the process started
    assert native is not None and native.isdigit()
    # It is the pid of a process of the remote user.
    assert os.stat(f"/proc/{native}").st_uid == user.uid
    deadline = time.monotonic() + 60
    while not job.status.state.final and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job.status.state is JobState.COMPLETED
