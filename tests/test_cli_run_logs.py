"""``psij run`` inside makefiles, logged scripts and ``nohup``: its standard output is a file
opened for appending or already written to. On ``local`` the job writes to the command's own
descriptors (nothing is reopened or truncated); on other executors the job's output is copied
back after what is there."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")
JOB = '/bin/sh -c "echo job-out; echo job-err >&2"'


def sh(command: str, cwd: Path, **kw) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(["/bin/sh", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kw)


def batch_test_env(tmp_path: Path) -> dict:
    # batch-test keeps its spool in the executor's work directory, here under tmp_path. The
    # suite itself may run under make (make test): the inner make must not see the outer one's
    # level and flags, or it prints "Entering directory" lines into the log.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return dict(env, HOME=str(tmp_path / "home"))


@pytest.mark.parametrize("executor", ["local", "batch-test"])
def test_make_with_its_output_in_a_log(executor: str, tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text(
        "all:\n"
        "\t@echo compiling\n"
        f'\t@"{PSIJ_SCRIPT}" run --executor {executor} -- {JOB}\n'
        "\t@echo linked\n")
    done = sh("make > build.log 2>&1", tmp_path, env=batch_test_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "build.log").read_text() == "compiling\njob-out\njob-err\nlinked\n"


@pytest.mark.parametrize("executor", ["local", "batch-test", "local --launcher multiple"])
def test_a_script_logging_before_and_after(executor: str, tmp_path: Path) -> None:
    done = sh(f'(echo x; "{PSIJ_SCRIPT}" run --executor {executor} -- {JOB}; echo "rc $?") '
              "> log 2> err", tmp_path, env=batch_test_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log").read_text() == "x\njob-out\nrc 0\n"
    assert (tmp_path / "err").read_text() == "job-err\n"


@pytest.mark.parametrize("executor", ["local", "batch-test"])
def test_appending_to_a_log(executor: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("earlier\n")
    done = sh(f'"{PSIJ_SCRIPT}" run --executor {executor} -- {JOB} >> log 2>&1; echo end >> log',
              tmp_path, env=batch_test_env(tmp_path))
    assert done.returncode == 0, done.stderr
    assert log.read_text() == "earlier\njob-out\njob-err\nend\n"


def test_nohup_appends_to_nohup_out(tmp_path: Path) -> None:
    # nohup redirects only a terminal: give it one, as a user at a shell has.
    (tmp_path / "nohup.out").write_text("earlier run\n")
    leader, follower = os.openpty()
    try:
        done = subprocess.run(["nohup", PSIJ_SCRIPT, "run", "--", "/bin/sh", "-c",
                               "echo job-out; echo job-err >&2"],
                              cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=follower,
                              stderr=follower, timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 0
    assert (tmp_path / "nohup.out").read_text() == "earlier run\njob-out\njob-err\n"


def test_copies_leave_nothing_in_the_work_directory(tmp_path: Path) -> None:
    env = batch_test_env(tmp_path)
    done = sh(f'(echo x; "{PSIJ_SCRIPT}" run --executor batch-test -- /bin/echo y) > log',
              tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log").read_text() == "x\ny\n"
    work = tmp_path / "home" / ".psij" / "work"
    assert work.is_dir() and not list(work.glob("psij-run-*"))


def test_a_path_naming_our_own_descriptor_is_not_reopened(tmp_path: Path) -> None:
    from psij.executors._process import open_streams, own_descriptor

    log = tmp_path / "log"
    log.write_text("earlier\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    opened: list = []
    try:
        for path in (f"/proc/self/fd/{fd}", f"/proc/{os.getpid()}/fd/{fd}", f"/dev/fd/{fd}"):
            assert own_descriptor(path) == fd
            _, out, _ = open_streams(str(tmp_path), None, path, None, -1, opened)
            assert out != fd and os.path.samestat(os.fstat(out), os.fstat(fd))
            os.write(out, b"more\n")
    finally:
        for o in opened:
            os.close(o)
        os.close(fd)
    assert log.read_text() == "earlier\nmore\nmore\nmore\n"
    assert own_descriptor("/proc/1/fd/1") is None or os.getpid() == 1
    assert own_descriptor("/dev/fd/x") is None and own_descriptor("/dev/stdout") == 1
