"""Executors of another host for real: a client here (root) runs jobs of the real Slurm and Grid
Engine as another local user, through the real OpenSSH of tests/setup (support.ssh_server),
with ``JobExecutor.get_instance(name, url="ssh://...")`` and ``psij --host``.

What a job does and is seen doing over ssh (its user, exit codes, cancel, status callbacks,
``list``, ``submit_many``, ``attach`` from a second connection), staging between this machine
and the job, a client killed and its job re-attached by a new process through the URL in the
local registry, and the ``psij --host`` command line. Dropped connections, restarts and hostile
remotes are in test_remote_faults_real.py, which uses the helpers of this module.

The jobs of both schedulers are submitted together the first time a test needs them (one
campaign per scheduler, support.campaigns), so that they run at the same time; each test then
checks its own. The client's batch settings (polling every second) travel to the remote
executor, so the jobs are seen ending within a second or two.
"""

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote

import pytest

import psij.registry
from psij import Job, JobExecutor, JobSpec, JobState, JobStatus
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.remote._executor import RemoteJobExecutor
from psij.staging import URI, StageIn, StageOut
from real.test_batch_real import _need, _scheduler_problem
from support.campaigns import Campaigns
from support.ssh_server import (
    SshUser,
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    sshd_reason,
)

REASON = sshd_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

WAIT = timedelta(seconds=120)
SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]


# -- helpers (test_remote_faults_real.py uses them too) -------------------------------------------

def ssh_user(prefix: str) -> Iterator[SshUser]:
    """A new user of the test sshd for a module (skips when the other side has no psij)."""
    reason = remote_psij_reason()
    if reason is not None:
        pytest.skip(reason)
    made = make_ssh_user(prefix)
    yield made
    made.remove()


def ssh_url(user: SshUser, psij: Optional[str] = None, config: Optional[Path] = None,
            with_user: bool = False) -> str:
    """``ssh://[USER@]ALIAS?ssh_config=...&psij=...`` for ``user``: its own client configuration
    (or ``config``) and this checkout's psij (or ``psij``). With ``with_user`` the ssh command
    gets ``-l USER`` too: the same login, but another connection of this process (connections
    are shared by ssh command line)."""
    login = f"{user.name}@" if with_user else ""
    query = (f"ssh_config={quote(str(config or user.config), safe='/')}"
             f"&psij={quote(psij or remote_psij_command(), safe='/')}")
    return f"ssh://{login}{user.alias}?{query}"


def fast_config(work: Path) -> BatchSchedulerExecutorConfig:
    """A batch configuration polling every second (sent to the remote executor); its work
    directory is this machine's, where the local registry records the jobs."""
    return BatchSchedulerExecutorConfig(work_directory=work, queue_polling_interval=1,
                                        initial_queue_polling_delay=0.5)


def remote_executor(name: str, user: SshUser, work: Path,
                    with_user: bool = False) -> RemoteJobExecutor:
    """Executor ``name`` of the user's side, polling every second (see ssh_url)."""
    ex = JobExecutor.get_instance(name, url=ssh_url(user, with_user=with_user),
                                  config=fast_config(work))
    assert isinstance(ex, RemoteJobExecutor), ex
    return ex


def user_file(user: SshUser, name: str, text: str, mode: int = 0o755) -> Path:
    """A file of ``user`` in its home (the other side's script or data)."""
    path = user.home / name
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, user.uid, user.gid)
    return path


def eventually(what: str, check: Callable[[], bool], seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not so after {seconds:.0f} s")
        time.sleep(0.05)


def final(job: Job) -> JobStatus:
    st = job.wait(WAIT)
    assert st is not None and st.state.final, f"job {job.id} ({job.native_id}) not final: " \
                                              f"{job.status}"
    return st


def remote_registry(user: SshUser) -> List[Dict[str, object]]:
    """The rows of the remote user's job registry (``psij list --json`` run over ssh)."""
    done = user.run(shlex.join([remote_psij_command(), "list", "--json"]))
    assert done.returncode == 0, done.stderr
    rows: List[Dict[str, object]] = json.loads(done.stdout)
    return rows


# -- the campaigns -----------------------------------------------------------------------------

class Campaign:
    """The jobs of one scheduler, submitted over ssh at the start."""

    def __init__(self, name: str, folder: Path, user: SshUser) -> None:
        self.name = name
        self.user = user
        self.local = folder / "local"  # this machine's: the work directory, staging files
        self.local.mkdir()
        self.remote = user.home / f"campaign-{name}"  # the user's: what the jobs write
        for made in (self.remote, self.remote / "stage", self.remote / "stage-missing"):
            made.mkdir()
            os.chown(made, user.uid, user.gid)
        self.ex = remote_executor(name, user, self.local / "work")
        self.seen: List[Tuple[str, str]] = []  # (job id, state) as the executor's callback saw
        self.ex.set_job_status_callback(lambda job, st: self.seen.append((job.id,
                                                                          st.state.name)))
        self.job_seen: List[str] = []  # the states the "callbacks" job's own callback saw
        self.jobs: Dict[str, Job] = {}
        self.many: List[Job] = []
        self._submit_all()

    def submit(self, key: str, spec: JobSpec,
               callback: Optional[Callable[[Job, JobStatus], None]] = None) -> Job:
        job = Job(spec)
        if callback is not None:
            job.set_job_status_callback(callback)
        self.ex.submit(job)
        self.jobs[key] = job
        return job

    def _submit_all(self) -> None:
        remote = self.remote
        self.submit("whoami", JobSpec("/bin/sh", ["-c", 'id -un > "$1"', "sh",
                                                  str(remote / "whoami")]))
        self.submit("exit3", JobSpec("/bin/sh", ["-c", "echo failing >&2; exit 3"]))
        self.submit("running", JobSpec("/bin/sleep", ["300"]))
        self.submit("callbacks", JobSpec("/bin/sleep", ["2"]),
                    callback=lambda job, st: self.job_seen.append(st.state.name))
        self.submit("attach", JobSpec("/bin/sh", ["-c", "sleep 6; exit 5"]))
        self.many = [Job(JobSpec("/bin/sh", ["-c", 'echo "$1" >> "$2"', "sh", str(i),
                                             str(remote / "many")])) for i in range(3)]
        self.ex.submit_many(self.many)
        # Staging: a file and a folder of this machine to the job, a file of the job back.
        sources = self.local / "sources"
        (sources / "folder" / "sub").mkdir(parents=True)
        (sources / "input.txt").write_text("from root's machine\n")
        (sources / "folder" / "a.txt").write_text("A\n")
        (sources / "folder" / "sub" / "b.txt").write_text("B\n")
        self.back = self.local / "back"
        self.back.mkdir()
        self.submit("stage", JobSpec(
            "/bin/sh", ["-c", "cat in.txt dir/a.txt dir/sub/b.txt > out.txt; id -un >> out.txt"],
            directory=remote / "stage",
            stage_in=[StageIn(URI(str(sources / "input.txt")), "in.txt"),
                      StageIn(URI(str(sources / "folder")), "dir")],
            stage_out=[StageOut("out.txt", URI(str(self.back / "out.txt")))]))
        self.submit("stage-missing", JobSpec(
            "/bin/true", directory=remote / "stage-missing",
            stage_out=[StageOut("missing.txt", URI(str(self.back / "missing.txt")))]))

    def close(self) -> None:
        for job in [*self.jobs.values(), *self.many]:
            if job.executor is not None and not job.status.state.final:
                try:
                    job.cancel()
                except Exception:
                    pass
        self.ex.close()


@pytest.fixture(scope="module")
def user() -> Iterator[SshUser]:
    yield from ssh_user("psijrem")


@pytest.fixture(scope="module")
def campaigns(user: SshUser, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Callable[[str], Campaign]]:
    """The campaign of a scheduler (made with the other's on first use); skips without it."""
    root = tmp_path_factory.mktemp("remote")
    made = Campaigns(lambda name, folder: Campaign(name, folder, user),
                     lambda name: _scheduler_problem(name) is None)

    def get(name: str) -> Campaign:
        _need(name)
        return made.get(name, root)

    yield get
    made.close_all(Campaign.close)


# -- jobs over ssh -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_job_runs_as_the_remote_user(name: str, campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    job = c.jobs["whoami"]
    st = final(job)
    assert (st.state, st.exit_code) == (JobState.COMPLETED, 0), st
    out = c.remote / "whoami"
    assert out.read_text() == f"{c.user.name}\n"
    assert out.stat().st_uid == c.user.uid
    assert job.native_id and job.executor is c.ex
    assert c.ex.connection.hello["user"] == c.user.name


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_failing_job_gives_its_exit_code(name: str, campaigns: Callable[[str], Campaign]) -> None:
    st = final(campaigns(name).jobs["exit3"])
    assert (st.state, st.exit_code) == (JobState.FAILED, 3), st


@pytest.mark.parametrize("name", SCHEDULERS)
def test_list_holds_a_running_job(name: str, campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    job = c.jobs["running"]
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None, job.status
    listed = c.ex.list()
    assert job.native_id in listed, listed


@pytest.mark.parametrize("name", SCHEDULERS)
def test_cancel_of_a_running_job_ends_it_canceled(name: str,
                                                  campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    job = c.jobs["running"]
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None, job.status
    job.cancel()
    st = final(job)
    # Grid Engine's qdel of a running job too: the batch layer maps it to CANCELED.
    assert st.state is JobState.CANCELED, st


@pytest.mark.parametrize("name", SCHEDULERS)
def test_status_callbacks_see_queued_active_and_the_end_in_order(
        name: str, campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    job = c.jobs["callbacks"]
    assert final(job).state is JobState.COMPLETED
    states = ["QUEUED", "ACTIVE", "COMPLETED"]
    eventually("the job's callback saw its three states", lambda: len(c.job_seen) >= 3)
    assert c.job_seen == states
    of_job = lambda: [s for i, s in c.seen if i == job.id]  # noqa: E731
    eventually("the executor's callback saw its three states", lambda: len(of_job()) >= 3)
    assert of_job() == states
    # The executor's callback sees the other jobs too, each in order.
    others = {i for i, _ in c.seen} - {job.id}
    assert {c.jobs["whoami"].id, c.jobs["exit3"].id} <= others
    for other in others:
        order = [s for i, s in c.seen if i == other]
        assert order == sorted(order, key=lambda s: JobState[s].order), order
        assert len(order) == len(set(order)), order


@pytest.mark.parametrize("name", SCHEDULERS)
def test_submit_many_runs_each_job(name: str, campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    statuses = [final(job) for job in c.many]
    assert [s.state for s in statuses] == [JobState.COMPLETED] * 3, statuses
    assert len({job.native_id for job in c.many}) == 3
    assert sorted((c.remote / "many").read_text().split()) == ["0", "1", "2"]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_second_connection_attaches_by_native_id_and_follows_to_the_end(
        name: str, campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    submitted = c.jobs["attach"]
    native_id = submitted.native_id
    assert native_id is not None
    other = remote_executor(name, c.user, c.local / "other-work", with_user=True)
    try:
        # Its own ssh and its own server, which never saw the job.
        assert other.connection is not c.ex.connection
        assert other.connection.hello["pid"] != c.ex.connection.hello["pid"]
        job = Job()
        other.attach(job, native_id)
        st = final(job)
    finally:
        other.close()
    assert job.id != submitted.id and job.native_id == native_id
    assert (st.state, st.exit_code) == (JobState.FAILED, 5), st
    assert final(submitted).state is JobState.FAILED


# -- staging over the connection ---------------------------------------------------------------

@pytest.mark.parametrize("name", SCHEDULERS)
def test_staging_takes_a_file_and_a_folder_to_the_job_and_a_file_back(
        name: str, campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    job = c.jobs["stage"]
    st = final(job)
    assert (st.state, st.exit_code) == (JobState.COMPLETED, 0), st
    back = c.back / "out.txt"
    assert back.read_text() == f"from root's machine\nA\nB\n{c.user.name}\n"
    assert back.stat().st_uid == 0  # written here by this process
    assert not list(c.back.glob(".*psij-part"))
    # The job's folder on the remote host is gone once the job is final.
    assert not (c.user.home / ".psij" / "work" / "remote" / "staging" / job.id).exists()


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_missing_stage_out_fails_the_job_naming_stage_out(
        name: str, campaigns: Callable[[str], Campaign]) -> None:
    c = campaigns(name)
    st = final(c.jobs["stage-missing"])
    assert st.state is JobState.FAILED, st
    message = (st.message or "").lower().replace("-", " ").replace("_", " ")
    assert "stage out" in message and "missing.txt" in message, st
    assert not (c.back / "missing.txt").exists()


# -- a client killed, its job re-attached by another process -----------------------------------

SUBMIT_AND_HANG = textwrap.dedent("""
    import sys, time
    import psij.registry
    from psij import Job, JobExecutor, JobSpec
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
    url, work, go, ran = sys.argv[1:]
    config = BatchSchedulerExecutorConfig(work_directory=work, queue_polling_interval=1,
                                          initial_queue_polling_delay=0.5)
    ex = JobExecutor.get_instance("slurm", url=url, config=config)
    job = Job(JobSpec("/bin/sh", ["-c", 'while [ ! -e "$1" ]; do sleep 0.1; done; '
                                        'echo ran >> "$2"', "sh", go, ran]))
    ex.submit(job)
    psij.registry.flush()
    print(job.id, job.native_id, flush=True)
    time.sleep(600)
""")

REATTACH_AND_WAIT = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import psij.registry
    work, job_id = sys.argv[1:]
    [job] = psij.registry.reattach([job_id], work_directory=work)
    print(type(job.executor).__name__, job.executor.url, job.native_id, flush=True)
    status = job.wait(timedelta(seconds=150))
    print(status.state.name, status.exit_code, flush=True)
""")


@pytest.mark.slurm
def test_a_new_process_reattaches_over_ssh_after_the_client_was_killed(
        user: SshUser, tmp_path: Path) -> None:
    _need("slurm")
    url = ssh_url(user)
    work = tmp_path / "work"
    token = secrets.token_hex(4)
    go, ran = user.home / f"go-{token}", user.home / f"ran-{token}"
    client = subprocess.Popen([sys.executable, "-c", SUBMIT_AND_HANG, url, str(work), str(go),
                               str(ran)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True)
    try:
        line = client.stdout.readline() if client.stdout else ""
    finally:
        client.send_signal(signal.SIGKILL)
        _, err = client.communicate(timeout=60)
    assert client.returncode == -signal.SIGKILL
    job_id, native_id = line.split() if len(line.split()) == 2 else ("", "")
    assert job_id, f"the client printed {line!r}; stderr: {err[-2000:]}"
    # The job waits for the go file: it still runs when the client is gone, and when the new
    # process has it again. (Its end is seen at the remote executor's next poll: 30 s later,
    # for the re-attached job is followed with the default settings, not the recorded ones.)
    [record] = psij.registry.find([job_id], work_directory=work)
    assert (record.executor, record.url, record.native_id) == ("slurm", url, native_id)
    assert not record.state.final, record
    again = subprocess.Popen([sys.executable, "-c", REATTACH_AND_WAIT, str(work), job_id],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
    try:
        attached = again.stdout.readline() if again.stdout else ""
        go.touch()
        rest, err = again.communicate(timeout=180)
    finally:
        if again.poll() is None:
            again.kill()
            again.communicate()
    assert attached.split() == ["RemoteJobExecutor", url, native_id], (attached, err[-2000:])
    assert (again.returncode, rest.split()) == (0, ["COMPLETED", "0"]), err[-2000:]
    assert ran.read_text() == "ran\n"  # once
    [record] = psij.registry.find([job_id], work_directory=work)
    assert record.state is JobState.COMPLETED


# -- psij --host -------------------------------------------------------------------------------

def psij_host(user: SshUser, *words: str, timeout: float = 120
              ) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "psij", "--host", ssh_url(user), *words],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.slurm
def test_psij_host_submits_over_ssh_and_status_shows_the_job(user: SshUser) -> None:
    _need("slurm")
    out = user.home / f"cli-{secrets.token_hex(4)}"
    submitted = psij_host(user, "submit", "--executor", "slurm", "--tag", "over-ssh", "--",
                          "/bin/sh", "-c", 'id -un > "$1"', "sh", str(out))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert len(submitted.stdout.splitlines()) == 1 and len(job_id) == 36, submitted.stdout
    shown = psij_host(user, "status", "--json", job_id)
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout)
    assert (row["id"], row["executor"], row["tag"]) == (job_id, "slurm", "over-ssh")
    assert row["native_id"] and row["state"] in ("QUEUED", "ACTIVE", "COMPLETED"), row
    waited = psij_host(user, "wait", "--no-progress", "--json", job_id)
    assert waited.returncode == 0, waited.stderr
    [row] = json.loads(waited.stdout)
    assert (row["state"], row["exit_code"]) == ("COMPLETED", 0), row
    assert out.read_text() == f"{user.name}\n"
    table = psij_host(user, "status", job_id)
    assert table.returncode == 0, table.stderr
    head, line = table.stdout.splitlines()
    assert head.split()[:5] == ["ID", "EXECUTOR", "NATIVE_ID", "TAG", "STATE"]
    assert line.split()[:5] == [job_id, "slurm", row["native_id"], "over-ssh", "COMPLETED"]


def test_psij_host_passes_on_the_remote_commands_error_and_status(user: SshUser) -> None:
    done = psij_host(user, "status", "no-such-job")
    assert (done.returncode, done.stdout) == (2, ""), done
    assert "no recorded job with id no-such-job" in done.stderr
