"""Faults of the local executor, run for real: programs that cannot run, values no process can
take, timers out of range, children that ignore TERM, and journals holding garbage."""

import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import List

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, SubmitException
from psij.executors._process_watch import WATCH
from psij.executors.local import LocalJobExecutorConfig
from support.process_checks import members_left_after

TIMEOUT = timedelta(seconds=30)


@pytest.fixture
def ex(tmp_path: Path) -> JobExecutor:
    cfg = LocalJobExecutorConfig(work_directory=tmp_path / "work", cancel_grace_period=1.0)
    return JobExecutor.get_instance("local", config=cfg)


def _final(job: Job) -> "object":
    st = job.wait(timeout=TIMEOUT)
    assert st is not None, "the job did not end"
    return st


# -- item: a program that cannot run fails its job, it does not make submit raise ------------


@pytest.mark.parametrize("via_script", [False, True])
@pytest.mark.parametrize("kind", ["absent", "not-on-path", "not-executable", "directory"])
def test_a_program_that_cannot_run_fails_its_job_with_126_or_127(
        ex: JobExecutor, tmp_path: Path, kind: str, via_script: bool) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("not a program\n")
    exe, code = {"absent": (str(tmp_path / "no" / "such-program"), 127),
                 "not-on-path": ("psij-no-such-program-on-path", 127),
                 "not-executable": (str(plain), 126),
                 "directory": (str(tmp_path), 126)}[kind]
    spec = JobSpec(exe, ["x"])
    if via_script:
        pre = tmp_path / "pre.sh"
        pre.write_text("true\n")
        spec.pre_launch = pre
    job = Job(spec)
    ex.submit(job)  # does not raise: the job fails as it would on a batch system
    st = job.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.FAILED
    assert st.exit_code == code
    assert exe in (st.message or "") and "JobSpec.executable" in (st.message or "")
    # The executor goes on as before.
    ok = Job(JobSpec("/bin/true"))
    ex.submit(ok)
    assert ok.wait(timeout=TIMEOUT).state is JobState.COMPLETED  # type: ignore[union-attr]


# -- item: a bad value never stops the executor ----------------------------------------------


@pytest.mark.parametrize("field, make", [
    ("JobSpec.arguments[1]", lambda t: JobSpec("/bin/echo", ["ok", "\ud800"])),
    ("JobSpec.environment['BAD']", lambda t: JobSpec("/bin/true", environment={"BAD": "x\ud800"})),
    ("JobSpec.stdout_path", lambda t: JobSpec("/bin/true", stdout_path=t / "o\ud800")),
    ("JobSpec.stderr_path", lambda t: JobSpec("/bin/true", stderr_path=t / "e\ud800",
                                               pre_launch=t / "pre.sh")),
    ("JobSpec.executable", lambda t: JobSpec("/bin/\ud800")),
    ("JobSpec.pre_launch", lambda t: JobSpec("/bin/true", pre_launch=t / "p\ud800.sh")),
])
def test_a_lone_surrogate_is_refused_naming_the_field(ex: JobExecutor, tmp_path: Path,
                                                     field: str, make) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "pre.sh").write_text("true\n")
    job = Job(make(tmp_path))
    with pytest.raises(SubmitException, match=field.replace("[", r"\[").replace("]", r"\]")
                       + ".*lone surrogate"):
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None
    ok = Job(JobSpec("/bin/true"))
    ex.submit(ok)
    assert ok.wait(timeout=TIMEOUT).state is JobState.COMPLETED  # type: ignore[union-attr]


@pytest.mark.parametrize("keeper", [True, False])
@pytest.mark.parametrize("via_script", [False, True])
def test_an_environment_too_large_to_start_is_refused_saying_why(
        tmp_path: Path, keeper: bool, via_script: bool) -> None:
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", keeper=keeper))
    spec = JobSpec("/bin/true", environment={"BIG": "x" * 200_000})
    if via_script:
        (tmp_path / "pre.sh").write_text("true\n")
        spec.pre_launch = tmp_path / "pre.sh"
    job = Job(spec)
    with pytest.raises(SubmitException) as info:
        ex.submit(job)
    text = str(info.value)
    assert "Argument list too long" in text and "128 KiB for each variable" in text
    assert job.status.state is JobState.NEW and job.executor is None
    ok = Job(JobSpec("/bin/true"))
    ex.submit(ok)
    assert ok.wait(timeout=TIMEOUT).state is JobState.COMPLETED  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 2.0 ** 31, 1e300])
def test_cancel_grace_period_out_of_range_is_refused(tmp_path: Path, value: float) -> None:
    with pytest.raises(ValueError, match="LocalJobExecutorConfig.cancel_grace_period"):
        LocalJobExecutorConfig(work_directory=tmp_path, cancel_grace_period=value)
    # Also when the attribute is changed after the config was made.
    cfg = LocalJobExecutorConfig(work_directory=tmp_path)
    cfg.cancel_grace_period = value
    with pytest.raises(ValueError, match="LocalJobExecutorConfig.cancel_grace_period"):
        JobExecutor.get_instance("local", config=cfg)


def test_the_process_watch_survives_timers_out_of_range(ex: JobExecutor) -> None:
    # A timer of NaN, infinity or more than 2**31 ms used to end the one thread that reaps
    # every local job of the process; now each is made safe and later jobs still end.
    fired: List[str] = []
    for delay in (float("inf"), 2.0 ** 31, 1e300):
        WATCH.call_later(delay, lambda: fired.append("far"))
    WATCH.call_later(float("nan"), lambda: fired.append("nan"))
    WATCH.call_later(-5.0, lambda: fired.append("negative"))
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    assert job.wait(timeout=TIMEOUT).state is JobState.COMPLETED  # type: ignore[union-attr]
    deadline = time.monotonic() + 10
    while len(fired) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(fired) == ["nan", "negative"]


def test_the_process_watch_survives_an_exit_handler_that_raises(ex: JobExecutor) -> None:
    import subprocess

    proc = subprocess.Popen(["/bin/true"])
    proc.returncode = 0  # reaped by the watch, not by Popen

    def boom(pid: int, status: object) -> None:
        raise RuntimeError("boom")

    WATCH.watch(proc.pid, boom)
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    assert job.wait(timeout=TIMEOUT).state is JobState.COMPLETED  # type: ignore[union-attr]


# -- item: cancel kills the whole job ----------------------------------------------------------


# The leader exits on TERM (bash's wait is interrupted); its child ignores TERM.
STUBBORN_CHILD = ('(trap "" TERM; echo $BASHPID > child.pid; exec sleep 1000) & '
                  'while [ ! -s child.pid ]; do sleep 0.01; done; echo ready > ready; wait')


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + 20
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.parametrize("via_script", [False, True])
def test_cancel_kills_a_child_that_ignores_term_after_the_leader_exits(
        ex: JobExecutor, tmp_path: Path, via_script: bool) -> None:
    spec = JobSpec("/bin/bash", ["-c", STUBBORN_CHILD], directory=tmp_path)
    if via_script:
        pre = tmp_path / "pre.sh"
        pre.write_text("true\n")
        spec.pre_launch = pre
    job = Job(spec)
    ex.submit(job)
    wait_for_file(tmp_path / "ready")
    child = int((tmp_path / "child.pid").read_text())
    pgid = os.getpgid(child)
    job.cancel()
    st = job.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.CANCELED
    assert members_left_after(pgid, 15) == [], "a child that ignores TERM outlived the cancel"


# -- item: journals with garbage lines -------------------------------------------------------


def test_garbage_journal_lines_are_skipped_with_a_warning(
        ex: JobExecutor, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    job = Job(JobSpec("/bin/sh", ["-c", "exit 3"]))
    ex.submit(job)
    assert job.wait(timeout=TIMEOUT) is not None
    pid = job.native_id
    folder = tmp_path / "work" / "local"
    (folder / "garbage.journal").write_bytes(
        "S \u00b2 1 j1\n"           # a superscript two is a digit to str.isdigit, not to int
        "S 4242 \u00b2 j2\n"        # a start time int() cannot read
        "S 4242 5 j3\n"
        "S 99999999999999999999999 5 j4\n"
        "E \u00b2 1 0\n"
        "S 4343 7 j5\nE 4343 7 \u00b2\n"  # an exit code int() cannot read
        "\x00\xff\xfe binary\n"
        "X 1 2 3\n"
        "S\n".encode("utf-8", "surrogateescape"))
    caplog.set_level(logging.WARNING)
    listed = ex.list()  # used to raise ValueError in every process
    assert pid not in listed
    assert "skipped" in caplog.text
    # Each executor, in any process, still attaches to real jobs, and to the odd ones.
    again = Job()
    JobExecutor.get_instance("local", config=ex.config).attach(again, str(pid))
    st = again.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 3
    odd = Job()
    ex.attach(odd, "4343")
    st = odd.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code is None
    ex.attach(Job(), "4242")
    with pytest.raises(ValueError, match="native_id"):
        ex.attach(Job(), "\u00b2")


def test_a_python_child_that_ignores_term_is_killed(ex: JobExecutor, tmp_path: Path) -> None:
    code = ("import os, signal, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); open(\"ready\", \"w\").write(\"1\"); "
            "time.sleep(1000)'])\n"
            "open('child.pid', 'w').write(str(child.pid))\n"
            "time.sleep(1000)\n")
    job = Job(JobSpec(sys.executable, ["-c", code], directory=tmp_path))
    ex.submit(job)
    wait_for_file(tmp_path / "ready")
    wait_for_file(tmp_path / "child.pid")
    pgid = int(job.native_id or 0)
    job.cancel()
    st = job.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.CANCELED
    assert members_left_after(pgid, 15) == [], "a child ignoring TERM outlived the cancel"
