"""``FunctionExecutor(..., url="ssh://...")``: function calls on another host that shares no
file system with this one. The client is this process (root), whose work directory is closed
to everyone else; the other side is a real second user of the test sshd (support.ssh_server)
running this checkout's psij. The calls file and the job's key go over the connection as the
job's stage-in and the results come back as its stage-out: values, raised exceptions, packs of
calls, a call that cannot be cancelled once running, and nothing left behind on either side.

The functions are builtins (importable there by name) or made in the test (sent by value)."""

import math
import operator
import os
import secrets
import shutil
import stat
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, Iterator, Tuple

import pytest

from psij import JobExecutorConfig, JobState
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.futures import FunctionExecutor, FunctionJobError, reattach
from psij.remote import _connection
from psij.remote._executor import RemoteJobExecutor
from psij.remote._protocol import PROTOCOL
from psij.version import __version__
from real.test_batch_real import _need
from support.ssh_server import (
    SshUser,
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    sshd_reason,
)

pytestmark = pytest.mark.skipif(sshd_reason() is not None, reason=str(sshd_reason()))
WAIT = 120


@pytest.fixture(scope="module")
def user() -> Iterator[SshUser]:
    reason = remote_psij_reason()
    if reason is not None:
        pytest.skip(reason)
    made = make_ssh_user("psijfun")
    try:
        yield made
    finally:
        made.remove()


def url_of(user: SshUser) -> str:
    return f"ssh://{user.alias}?ssh_config={user.config}&psij={remote_psij_command()}"


@pytest.fixture
def fx(user: SshUser, tmp_path: Path) -> Iterator[FunctionExecutor]:
    with FunctionExecutor("local", url=url_of(user),
                          config=JobExecutorConfig(work_directory=tmp_path / "work")) as ex:
        yield ex


def eventually(what: str, check: Callable[[], bool], seconds: float = WAIT) -> None:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not so after {seconds:.0f} s")
        time.sleep(0.05)


def remote_staging(fx: FunctionExecutor) -> Path:
    executor = fx.executor
    assert isinstance(executor, RemoteJobExecutor)
    folder = executor.remote_job_folder("x")
    assert folder is not None
    return Path(folder).parent


def test_calls_run_there_as_its_user_and_their_results_come_back(
        fx: FunctionExecutor, user: SshUser) -> None:
    # Nothing of this machine's work directory can be reached from the other side.
    closed = user.run(f"ls {fx.work_directory}")
    assert closed.returncode != 0 and "Permission denied" in closed.stderr, closed
    assert fx.submit(os.getuid).result(WAIT) == user.uid != os.getuid()
    assert fx.submit(os.path.expanduser, "~").result(WAIT) == str(user.home)
    offset = secrets.randbelow(1000)
    assert fx.submit(lambda x: x + offset, 1).result(WAIT) == offset + 1  # sent by value
    with pytest.raises(ValueError, match="math domain error"):
        fx.submit(math.sqrt, -1).result(WAIT)
    big = bytes(range(256)) * 20000  # 5 MB each way: several pieces over the connection
    assert fx.submit(operator.concat, big, b"!").result(WAIT) == big + b"!"


def test_map_packs_calls_into_jobs_and_leaves_nothing_on_either_side(
        user: SshUser, tmp_path: Path) -> None:
    with FunctionExecutor("local", url=url_of(user),
                          config=JobExecutorConfig(work_directory=tmp_path / "work")) as fx:
        values = list(range(40))
        assert list(fx.map(pow, values, [3] * len(values), chunksize=8, timeout=WAIT)) == [
            v ** 3 for v in values]
        assert list(fx.map(divmod, [7, 9], [2, 4])) == [(3, 1), (2, 1)]
        there = remote_staging(fx)
        jobs = {f.job.id for f in [fx.submit(abs, -1), fx.submit(abs, -2)] if f.result(WAIT)}
    # A call's future is settled once its job is final: its files here and its folder there
    # are gone by then, so nothing is left once shutdown (the with block) has returned.
    assert jobs and not [p for p in fx.work_directory.iterdir() if p.is_dir()]
    assert not there.exists() or not list(there.iterdir())


def test_a_job_that_fails_there_fails_its_calls_with_its_stderr(
        user: SshUser, tmp_path: Path) -> None:
    with FunctionExecutor("local", url=url_of(user), python="/bin/sh", pack=1,
                          config=JobExecutorConfig(work_directory=tmp_path / "w")) as ex:
        future = ex.submit(os.getuid)
        with pytest.raises(FunctionJobError) as raised:
            future.result(WAIT)
    text = str(raised.value)
    # The job's stderr there came back with the job's end: /bin/sh's complaint.
    assert "ended FAILED" in text and "stderr ends with" in text, text
    assert "/bin/sh" in text and "psij.futures._run" in text, text


def test_a_running_call_cannot_be_cancelled_and_its_result_still_comes(
        fx: FunctionExecutor, user: SshUser) -> None:
    # A gate the other side can see (this machine's /tmp, for the test only).
    gates = Path("/tmp") / f"psij-gate-{secrets.token_hex(4)}"
    gates.mkdir(mode=0o755)
    try:
        gate = gates / "open"

        def wait_for(path: str) -> int:
            while not os.path.exists(path):
                time.sleep(0.05)
            return os.getuid()

        future = fx.submit(wait_for, str(gate))
        job = future.job
        job.wait(timedelta(seconds=WAIT), target_states=[JobState.ACTIVE])
        assert job.status.state is JobState.ACTIVE
        assert future.cancel() is False and not future.cancelled()
        gate.touch()
        assert future.result(WAIT) == user.uid
    finally:
        shutil.rmtree(gates)


def test_the_files_sent_there_are_private_and_signed_by_a_key_of_the_job(
        fx: FunctionExecutor, user: SshUser) -> None:
    def look() -> Tuple[str, int, Dict[str, Tuple[int, int]], bytes]:
        call_directory = sys.argv[-1]  # the runner's argument, on the other side
        top = os.path.dirname(os.path.dirname(call_directory))  # the job's folder there
        found = {}
        for folder, names, files in os.walk(top):
            for name in names + files:
                st = os.lstat(os.path.join(folder, name))
                found[os.path.relpath(os.path.join(folder, name), top)] = (
                    stat.S_IMODE(st.st_mode), st.st_uid)
        with open(os.path.join(os.path.dirname(call_directory), "key"), "rb") as f:
            key = f.read()
        return top, stat.S_IMODE(os.lstat(top).st_mode), found, key

    top, mode, found, key = fx.submit(look).result(WAIT)
    assert top.startswith(str(user.home) + "/") and mode == 0o700, (top, mode)
    files = {name: entry for name, entry in found.items()
             if name.endswith(("key", "calls.in", "stdout", "stderr"))}
    name = os.path.basename(os.path.dirname(next(n for n in files if n.endswith("calls.in"))))
    assert sorted(files) == sorted(["functions/key", f"functions/{name}/calls.in", "stderr",
                                    "stdout"]), found  # moved into place, no copy left
    assert all(entry == (0o600, user.uid) for entry in files.values()), files
    assert len(key) == 32 and key != (fx.work_directory / "key").read_bytes()
    eventually("the job's folder there removed", lambda: not Path(top).exists())


def test_reattach_refuses_a_function_job_of_another_host(
        fx: FunctionExecutor, tmp_path: Path) -> None:
    future = fx.submit(abs, -3)
    assert future.result(WAIT) == 3
    with pytest.raises(ValueError, match=r"ran its calls on ssh://.*submitted them"):
        reattach([future.job_id], work_directory=str(tmp_path / "work"))


@pytest.mark.slurm
def test_calls_run_on_the_slurm_of_the_other_host(user: SshUser, tmp_path: Path) -> None:
    # The job's script stages the files in and out there (no executor of this process does).
    _need("slurm")
    config = BatchSchedulerExecutorConfig(work_directory=tmp_path / "work",
                                          queue_polling_interval=1,
                                          initial_queue_polling_delay=0.5)
    with FunctionExecutor("slurm", url=url_of(user), config=config) as ex:
        assert [f.result(WAIT) for f in (ex.submit(os.getuid), ex.submit(pow, 2, 10))] == [
            user.uid, 1024]
        assert list(ex.map(abs, [-1, -2, -3], timeout=WAIT)) == [1, 2, 3]
        with pytest.raises(ZeroDivisionError):
            ex.submit(divmod, 1, 0).result(WAIT)


def test_a_remote_psij_that_does_not_say_where_its_files_go_is_refused_clearly(
        user: SshUser, tmp_path: Path) -> None:
    # A server of this protocol whose "open" answer lacks its Python and staging folder.
    script = user.home / f"psij-silent-{secrets.token_hex(3)}"
    script.write_text(
        "#!/bin/sh\n"
        f"echo '{{\"psij_remote\": {PROTOCOL}, \"version\": \"{__version__}\"}}'\n"
        "read -r line\n"
        "echo '{\"re\": 1, \"ok\": true, \"value\": {\"name\": \"local\", \"version\": \"1\"}}'\n"
        "cat >/dev/null\n")
    script.chmod(0o755)
    os.chown(script, user.uid, user.gid)
    url = f"ssh://{user.alias}?ssh_config={user.config}&psij={script}"
    with pytest.raises(ValueError, match="does not say which Python it runs on"):
        FunctionExecutor("local", url=url,
                         config=JobExecutorConfig(work_directory=tmp_path / "work"))
    assert not [c for c in _connection._POOL.values() if c.target.psij == str(script)]
