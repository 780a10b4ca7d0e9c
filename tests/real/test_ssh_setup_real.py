"""The ssh tests' setup for real (tests/setup/start-sshd.sh and support.ssh_server): a new local
user logs in to the test sshd with its key, runs this checkout's psij, submits to the real
Slurm and Grid Engine (run under the schedulers' lock); an unknown host key and a key the user
did not authorize are refused; removing the user leaves nothing of it."""

import grp
import pwd
import secrets
import shlex
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

import psij
from real.test_batch_real import _need, _scheduler_problem
from support.ssh_server import (
    SshUser,
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    remote_python,
    restart_sshd,
    sshd_reason,
    user_pids,
)

REASON = sshd_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def user() -> Iterator[SshUser]:
    made = make_ssh_user("psijssh")
    yield made
    made.remove()


def _appears(path: Path, seconds: float = 180.0) -> str:
    """The text of ``path`` once it is there and not empty (AssertionError after ``seconds``)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.is_file() and path.stat().st_size > 0:
            return path.read_text()
        time.sleep(0.25)
    raise AssertionError(f"{path} did not appear in {seconds:.0f}s")


def test_the_user_logs_in_with_its_key(user: SshUser) -> None:
    done = user.run("id -un")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{user.name}\n", "")
    assert pwd.getpwnam(user.name).pw_dir == str(user.home)


def test_the_checkouts_psij_over_ssh_is_the_local_one(user: SshUser) -> None:
    reason = remote_psij_reason()
    if reason is not None:
        pytest.skip(reason)
    psij_command = remote_psij_command()
    done = user.run(shlex.join([psij_command, "--version"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["psij", psij.__version__]
    where = user.run(shlex.join([remote_python(), "-c", "import psij; print(psij.__file__)"]))
    assert where.stdout.strip() == psij.__file__, where.stderr


@pytest.mark.slurm
def test_an_sbatch_job_of_the_user_writes_in_its_home(user: SshUser) -> None:
    _need("slurm")
    out = user.home / f"slurm-{secrets.token_hex(4)}.txt"
    done = user.run(shlex.join(["sbatch", "--output=/dev/null", "--wrap", f"id -un > {out}"]))
    assert done.returncode == 0 and done.stdout.startswith("Submitted batch job"), done
    assert _appears(out) == f"{user.name}\n"
    assert out.stat().st_uid == user.uid


@pytest.mark.sge
def test_a_qsub_job_of_the_user_writes_in_its_home(user: SshUser) -> None:
    _need("sge")
    out = user.home / f"sge-{secrets.token_hex(4)}.txt"
    script = user.home / f"{out.stem}.sh"
    done = user.run(f"echo 'id -un > {out}' > {script} && "
                    f"qsub -b y -o /dev/null -e /dev/null /bin/sh {script}")
    assert done.returncode == 0 and "has been submitted" in done.stdout, done
    assert _appears(out) == f"{user.name}\n"
    assert out.stat().st_uid == user.uid


def test_an_unknown_host_key_is_refused(user: SshUser) -> None:
    done = user.run("id -un", config=user.unknown_host_config())
    assert done.returncode == 255 and done.stdout == ""
    assert "Host key verification failed" in done.stderr


def test_a_key_the_user_did_not_authorize_is_refused(user: SshUser) -> None:
    done = user.run("id -un", config=user.wrong_key_config())
    assert done.returncode == 255 and done.stdout == ""
    assert "Permission denied" in done.stderr


def test_a_restart_keeps_open_sessions_and_accepts_new_ones(user: SshUser) -> None:
    session = subprocess.Popen(user.ssh_argv("sleep 2; echo still here"), text=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        time.sleep(1)
        restart_sshd()
        out, err = session.communicate(timeout=60)
    finally:
        session.kill()
        session.wait()
    assert (session.returncode, out) == (0, "still here\n"), err
    assert user.run("id -un").stdout == f"{user.name}\n"


def test_removing_the_user_leaves_no_user_home_process_or_job() -> None:
    gone = make_ssh_user("psijgone")
    try:
        background = gone.run("nohup sleep 600 >/dev/null 2>&1 </dev/null & echo $!")
        assert background.returncode == 0, background.stderr
        assert user_pids(gone.uid)
        held = ""
        if _scheduler_problem("slurm") is None:
            submitted = gone.run("sbatch --parsable --hold --output=/dev/null --wrap true")
            held = submitted.stdout.strip().split(";")[0]
            assert held.isdigit(), submitted
    finally:
        gone.remove()
    with pytest.raises(KeyError):
        pwd.getpwnam(gone.name)
    with pytest.raises(KeyError):
        grp.getgrnam(gone.name)
    assert not gone.home.exists() and not gone.private_dir.exists()
    assert user_pids(gone.uid) == []
    if held:
        state = subprocess.run(["squeue", "-h", "-j", held, "-o", "%T"], capture_output=True,
                               text=True).stdout.strip()
        assert state not in ("PENDING", "RUNNING"), state
