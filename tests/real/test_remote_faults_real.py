"""Remote executors for real when things go wrong: the ssh connection killed while jobs run or
while jobs are being submitted, the test sshd restarted, a remote host without psij or with a
psij of another protocol, an unknown host key, a key the user did not authorize, and hostile
remote commands that answer garbage, an endless line or messages of the wrong shape.

The client is this process (root), the other side a real user of the test sshd
(support.ssh_server) running this checkout's psij, or a script of the user's standing in for
it. After each hostile remote the process must be unharmed: a local job still runs, and a good
remote executor of the same process still submits. Tests that expect no answer lower the
connection's ``call_timeout`` so that nothing waits its 300 s.
"""

import collections
import re
import secrets
import threading
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from psij import Job, JobExecutor, JobExecutorConfig, JobSpec, JobState
from psij.exceptions import SubmitException
from psij.remote import (
    RemoteConnectError,
    RemoteError,
    RemoteProtocolError,
    RemoteVersionError,
    _connection,
)
from psij.remote._executor import RemoteJobExecutor
from psij.remote._protocol import PROTOCOL
from psij.version import __version__
from real.test_batch_real import _need, _scheduler_problem
from real.test_remote_ssh_real import (
    WAIT,
    eventually,
    final,
    remote_executor,
    remote_registry,
    ssh_url,
    ssh_user,
    user_file,
)
from support.ssh_server import SshUser, remote_python, restart_sshd, sshd_reason

REASON = sshd_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

HELLO = f'{{"psij_remote": {PROTOCOL}, "version": "{__version__}"}}'


@pytest.fixture(scope="module")
def user() -> Iterator[SshUser]:
    yield from ssh_user("psijflt")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote-faults")


@pytest.fixture(scope="module")
def slurm(user: SshUser, work: Path) -> Iterator[RemoteJobExecutor]:
    """The remote Slurm executor the faults are done to (a connection of its own)."""
    _need("slurm")
    ex = remote_executor("slurm", user, work / "slurm", with_user=True)
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def good(user: SshUser, work: Path) -> Iterator[Optional[RemoteJobExecutor]]:
    """A remote executor that nothing is done to (None without a scheduler to submit to)."""
    usable = [name for name in ("slurm", "sge") if _scheduler_problem(name) is None]
    if not usable:
        yield None
        return
    ex = remote_executor(usable[0], user, work / "good")
    yield ex
    ex.close()


def unharmed(good: Optional[RemoteJobExecutor], work: Path) -> None:
    """This process still runs jobs: a local one, and one over the good connection."""
    local = JobExecutor.get_instance("local", config=JobExecutorConfig(
        work_directory=work / f"local-{secrets.token_hex(3)}"))
    try:
        job = Job(JobSpec("/bin/true"))
        local.submit(job)
        assert final(job).state is JobState.COMPLETED
    finally:
        local.close()
    if good is not None:
        job = Job(JobSpec("/bin/true"))
        good.submit(job)
        assert final(job).state is JobState.COMPLETED
        assert good.connection.connects == 1, "the good connection was never dropped"


def counted_lines(path: Path) -> "collections.Counter[str]":
    return collections.Counter(path.read_text().split()) if path.exists() else \
        collections.Counter()


# -- dropped connections ---------------------------------------------------------------------

@pytest.mark.slurm
def test_jobs_reach_their_final_states_when_the_connection_is_killed(
        slurm: RemoteJobExecutor) -> None:
    conn = slurm.connection
    before = conn.connects
    seen: List[str] = []
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"sleep 3; exit {i}"])) for i in range(3)]
    jobs[0].set_job_status_callback(lambda job, st: seen.append(st.state.name))
    for job in jobs:
        slurm.submit(job)
    assert jobs[0].wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    old_pid = conn.hello["pid"]
    conn.kill()
    assert [(s.state, s.exit_code) for s in map(final, jobs)] == [
        (JobState.COMPLETED, 0), (JobState.FAILED, 1), (JobState.FAILED, 2)]
    assert conn.connects == before + 1 and conn.hello["pid"] != old_pid
    eventually("the callback saw the end", lambda: "COMPLETED" in seen)
    assert seen == ["QUEUED", "ACTIVE", "COMPLETED"]  # each once, in order


@pytest.mark.slurm
def test_a_restarted_sshd_and_then_a_killed_connection_reconnect(
        slurm: RemoteJobExecutor) -> None:
    conn = slurm.connection
    before = conn.connects
    jobs = [Job(JobSpec("/bin/sleep", ["3"])) for _ in range(2)]
    for job in jobs:
        slurm.submit(job)
    restart_sshd()  # the open connection lives on, through the old listener's session
    assert slurm.list()
    conn.kill()  # and the next one goes to the new listener
    assert [final(job).state for job in jobs] == [JobState.COMPLETED] * 2
    assert conn.connects == before + 1
    job = Job(JobSpec("/bin/true"))
    slurm.submit(job)
    assert final(job).state is JobState.COMPLETED


@pytest.mark.slurm
def test_a_connection_killed_during_many_submissions_runs_each_job_once(
        slurm: RemoteJobExecutor, user: SshUser, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = slurm.connection
    monkeypatch.setattr(conn, "call_timeout", 60.0)
    before = conn.connects
    runs = user.home / f"runs-{secrets.token_hex(4)}"
    jobs = [Job(JobSpec("/bin/sh", ["-c", 'echo "$1" >> "$2"', "sh", str(i), str(runs)]))
            for i in range(50)]
    submitted = 0
    kills = (5, 20, 35)  # after that many submissions, while the next one is on its way
    done = threading.Event()

    def killer() -> None:
        for at in kills:
            while submitted < at and not done.is_set():
                done.wait(0.001)
            conn.kill()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    retried = 0
    try:
        for job in jobs:
            for _ in range(5):
                try:
                    slurm.submit(job)
                    break
                except SubmitException as ex:  # safe to submit the same Job again
                    assert ex.transient, ex
                    retried += 1
            else:
                raise AssertionError(f"job {job.id} could not be submitted in 5 tries")
            submitted += 1
    finally:
        done.set()
        thread.join(30)
    states = collections.Counter(final(job).state.name for job in jobs)
    assert states == {"COMPLETED": 50}, (states, retried)
    assert conn.connects == before + len(kills)
    assert len({job.native_id for job in jobs}) == 50
    assert counted_lines(runs) == {str(i): 1 for i in range(50)}
    # The remote registry holds each job once, under the id it was given here.
    rows = collections.Counter(row["id"] for row in remote_registry(user))
    assert [rows[job.id] for job in jobs] == [1] * 50


@pytest.mark.slurm
def test_the_same_job_submitted_again_after_a_submit_exception_runs_once(
        slurm: RemoteJobExecutor, user: SshUser, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = slurm.connection
    runs = user.home / f"once-{secrets.token_hex(4)}"
    job = Job(JobSpec("/bin/sh", ["-c", 'echo ran >> "$1"', "sh", str(runs)]))
    monkeypatch.setattr(conn, "call_timeout", 0.001)  # no answer can come that soon
    with pytest.raises(SubmitException) as raised:
        slurm.submit(job)
    assert raised.value.transient and isinstance(raised.value.exception, RemoteError)
    assert "submitting this same Job again is safe" in str(raised.value)
    assert job.executor is None and job.status.state is JobState.NEW
    # The resubmission goes to a new server: the job's id is found in the registry there
    # (under the per-user lock) if the first server submitted it.
    conn.kill()
    monkeypatch.setattr(conn, "call_timeout", 60.0)
    slurm.submit(job)
    assert final(job).state is JobState.COMPLETED
    assert counted_lines(runs) == {"ran": 1}
    assert collections.Counter(row["id"] for row in remote_registry(user))[job.id] == 1


# -- connections refused -----------------------------------------------------------------------

def test_a_missing_remote_psij_is_named_at_get_instance(user: SshUser) -> None:
    with pytest.raises(RemoteConnectError, match=r"remote psij command '/nonexistent/psij' "
                                                 r"was not found there"):
        JobExecutor.get_instance("slurm", url=ssh_url(user, psij="/nonexistent/psij"))


def test_a_remote_psij_of_another_protocol_names_both_versions(user: SshUser) -> None:
    script = user_file(user, "psij-protocol-99", (
        "#!/bin/sh\n"
        f"exec {remote_python()} -c 'import psij.remote._protocol as p; p.PROTOCOL = 99; "
        "from psij.remote._server import serve; raise SystemExit(serve())'\n"))
    with pytest.raises(RemoteVersionError) as raised:
        JobExecutor.get_instance("slurm", url=ssh_url(user, psij=str(script)))
    text = str(raised.value)
    assert "remote protocol 99" in text and f"remote protocol {PROTOCOL}" in text, text


def test_an_unknown_host_key_is_refused_saying_so(user: SshUser) -> None:
    with pytest.raises(RemoteConnectError, match=r"the host key is not one .* accepts") as raised:
        JobExecutor.get_instance("slurm", url=ssh_url(user, config=user.unknown_host_config()))
    assert "Host key verification failed" in str(raised.value)


def test_a_key_the_user_did_not_authorize_is_refused_saying_so(user: SshUser) -> None:
    with pytest.raises(RemoteConnectError, match=r"the login was refused") as raised:
        JobExecutor.get_instance("slurm", url=ssh_url(user, config=user.wrong_key_config()))
    assert "Permission denied (publickey)" in str(raised.value)


# -- hostile remotes -------------------------------------------------------------------------

FIRST_LINES = {
    "random bytes": "printf '\\377\\376 not json {{\\n'; head -c 300 /dev/urandom\n",
    "an endless first line": "yes xxxxxxxxxxxxxxxx | tr -d '\\n'\n",
    "nothing at all": "exec sleep 30\n",
}


@pytest.mark.parametrize("what", sorted(FIRST_LINES))
def test_a_remote_that_does_not_say_hello_is_refused(
        what: str, user: SshUser, good: Optional[RemoteJobExecutor], work: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_connection, "HELLO_TIMEOUT", 3.0)
    script = user_file(user, f"hostile-{secrets.token_hex(3)}", "#!/bin/sh\n" +
                       FIRST_LINES[what])
    with pytest.raises(RemoteError) as raised:
        JobExecutor.get_instance("slurm", url=ssh_url(user, psij=str(script)))
    text = str(raised.value)
    if what == "nothing at all":
        assert isinstance(raised.value, RemoteConnectError), repr(raised.value)
        assert "no answer from the remote psij in 3 s" in text
    else:
        assert isinstance(raised.value, RemoteProtocolError), repr(raised.value)
        assert f"the remote command '{script}' did not start a psij server" in text
    unharmed(good, work)


def hostile(user: SshUser, body: str) -> RemoteJobExecutor:
    """A remote executor of a script of the user's that says hello and then ``body``."""
    script = user_file(user, f"hostile-{secrets.token_hex(3)}",
                       f"#!/bin/sh\necho '{HELLO}'\n{body}")
    ex = JobExecutor.get_instance("slurm", url=ssh_url(user, psij=str(script)))
    assert isinstance(ex, RemoteJobExecutor)
    ex.connection.call_timeout = 10
    return ex


def test_garbage_after_the_hello_fails_the_requests_clearly(
        user: SshUser, good: Optional[RemoteJobExecutor], work: Path) -> None:
    # The first request (get_instance asks the remote side to make the executor) is answered
    # with garbage: refused there, and the connection let go.
    with pytest.raises(RemoteProtocolError) as raised:
        hostile(user, "while read -r line; do echo 'not the protocol {'; done\n")
    assert "sent a line that is not the remote protocol" in str(raised.value)
    assert "'not the protocol {'" in str(raised.value)
    assert not [c for c in _connection._POOL.values() if c.users == 0]
    # A server that makes the executor and then answers garbage fails the submission clearly.
    ex = hostile(user, "read -r line\n"
                 "echo '{\"re\": 1, \"ok\": true, \"value\": {\"version\": \"1\"}}'\n"
                 "while read -r line; do echo 'not the protocol {'; done\n")
    try:
        job = Job(JobSpec("/bin/true"))
        with pytest.raises(SubmitException) as failed:
            ex.submit(job)
        cause = failed.value.exception
        assert isinstance(cause, RemoteProtocolError), repr(cause)
        assert "sent a line that is not the remote protocol" in str(cause)
        assert job.executor is None and job.status.state is JobState.NEW
    finally:
        ex.close()
    unharmed(good, work)


def _memory_kib(field: str) -> int:
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    assert found, field
    return int(found.group(1))


def test_an_endless_line_is_cut_at_the_limit(
        user: SshUser, good: Optional[RemoteJobExecutor], work: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 1 << 20  # the real one is 64 MiB
    monkeypatch.setattr(_connection, "MAX_LINE", limit)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak memory starts again from here
        peak_known = True
    except OSError:
        peak_known = False
    before = _memory_kib("VmRSS")
    with pytest.raises(RemoteProtocolError) as raised:
        hostile(user, "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | tr -d '\\n'\n")
    assert f"sent a line longer than {limit} bytes" in str(raised.value)
    # What the remote sent had no end; what this process held of it, a few times the limit
    # (about 3 MiB here; without the limit, all that came in 10 s).
    grown = _memory_kib("VmHWM" if peak_known else "VmRSS") - before
    assert grown < 16 * limit // 1024, f"{grown} KiB more"
    unharmed(good, work)


# A server of the user's that answers each request with a message of the wrong shape, chosen by
# the job's executable (and 42 for everything else).
SHAPES = """
import json, sys, time

def send(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()

send({"psij_remote": PROTOCOL, "version": VERSION})
for line in sys.stdin:
    request = json.loads(line)
    value = 42
    if request["op"] == "submit":
        job = request["jobs"][0]["id"]
        if "bad-status" in line:
            value = [{"id": job, "native_id": 7,
                      "status": {"state": "NOT_A_STATE", "time": "yesterday"}}]
        elif "bad-event" in line:
            queued = {"ev": "status", "job": job, "native_id": "n-1", "state": "QUEUED",
                      "time": time.time(), "exit_code": None, "message": None, "metadata": None}
            value = [{"id": job, "native_id": "n-1", "status": queued}]
            send({"re": request["id"], "ok": True, "value": value})
            send({"ev": "status", "job": job, "state": "NOPE", "time": "then"})
            send({"ev": "status", "job": job, "native_id": "n-1", "state": "ACTIVE"})
            send(dict(queued, state="COMPLETED", exit_code=0, time=time.time()))
            continue
    send({"re": request["id"], "ok": True, "value": value})
"""


@pytest.fixture
def shapes(user: SshUser) -> Iterator[RemoteJobExecutor]:
    script = user_file(user, f"shapes-{secrets.token_hex(3)}", f"#!{remote_python()}\n" +
                       SHAPES.replace("PROTOCOL", str(PROTOCOL))
                       .replace("VERSION", repr(__version__)))
    ex = JobExecutor.get_instance("slurm", url=ssh_url(user, psij=str(script)))
    assert isinstance(ex, RemoteJobExecutor)
    ex.connection.call_timeout = 10
    yield ex
    ex.close()


def test_answers_of_the_wrong_shape_are_refused_clearly(
        shapes: RemoteJobExecutor, good: Optional[RemoteJobExecutor], work: Path) -> None:
    job = Job(JobSpec("/shape/value-42"))
    with pytest.raises(SubmitException) as raised:
        shapes.submit(job)
    cause = raised.value.exception
    assert isinstance(cause, RemoteError), repr(cause)
    assert "answered a submission of 1 jobs with '42'" in str(cause)
    assert isinstance(cause, RemoteProtocolError)
    assert job.executor is None and job.status.state is JobState.NEW
    with pytest.raises(RemoteError, match="answered a list with '42'"):
        shapes.list()
    # Events of the wrong shape are dropped; the good ones around them still count.
    job = Job(JobSpec("/shape/bad-event"))
    shapes.submit(job)
    st = final(job)
    assert (st.state, st.exit_code, job.native_id) == (JobState.COMPLETED, 0, "n-1")
    assert shapes.connection.connects == 1  # a bad event is no reason to drop the connection
    unharmed(good, work)


def test_a_submission_answered_with_a_bad_status_is_refused_clearly(
        shapes: RemoteJobExecutor) -> None:
    job = Job(JobSpec("/shape/bad-status"))
    with pytest.raises((RemoteError, SubmitException)):
        shapes.submit(job)
    assert job.executor is None and job.status.state is JobState.NEW


def test_an_attach_answered_with_the_wrong_shape_is_refused_clearly(
        shapes: RemoteJobExecutor) -> None:
    with pytest.raises(RemoteError):
        shapes.attach(Job(), "123")
