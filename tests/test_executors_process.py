"""The process layer shared by the local executor and the pilot's tasks, run for real.

Grace periods and kill timers are driven by a ManualClock: a process that ignores TERM is
killed exactly when the clock passes the grace period, however long that is in real time.
"""

import os
import selectors
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, SubmitException
from psij._clock import ManualClock
from psij.executors._process import (
    SIGKILL,
    LaunchError,
    Spawner,
    StreamError,
    exit_message,
    failure_message,
    open_streams,
    reap_later,
    reap_within,
)
from psij.executors._process_watch import ProcessWatch
from psij.executors.local import LocalJobExecutorConfig
from psij.executors.pilot._task_process import HAS_PIDFD, Launch, LoopWatch, TaskProcesses
from support.process_checks import alive, live_members

HOUR = 3600.0  # a grace period no test could sit out in real time
LIMIT = 30.0  # only against a hang: no result depends on it

IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "open('ready', 'w').close(); time.sleep(300)")


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not predicate():
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.01)


# -- exit codes in words ------------------------------------------------------------------------


@pytest.mark.parametrize("code, words", [
    (0, "the job exited with code 0"),
    (3, "the job exited with code 3"),
    (126, "the job exited with code 126 (command not executable)"),
    (127, "the job exited with code 127 (command not found)"),
    (143, "the job was killed by SIGTERM (exit code 143)"),
    (137, "the job was killed by SIGKILL (exit code 137)"),
    (200, "the job exited with code 200"),  # 128 + 72 is no signal
    (None, "the job exited with code None"),
])
def test_exit_message_is_one_wording_for_every_executor(code: Optional[int], words: str) -> None:
    assert exit_message(code) == words


def test_failure_message_adds_the_end_of_stderr(tmp_path: Path) -> None:
    err = tmp_path / "err"
    err.write_bytes(b"x" * 5000 + b"\nlast words \xff\n")
    message = failure_message(3, err)
    assert message == "the job exited with code 3; last lines of the job's stderr:\n" + "x" * 4082 \
        + "\nlast words \ufffd"
    assert failure_message(3, tmp_path / "missing") == "the job exited with code 3"


def test_batch_describes_exits_with_the_shared_words() -> None:
    from psij.executors.batch._job_output import _describe_exit

    assert _describe_exit(143) == exit_message(143)
    assert _describe_exit(127) == exit_message(127)


# -- starting -----------------------------------------------------------------------------------


@pytest.mark.parametrize("posix_spawn", [True, False])
def test_spawn_errors_carry_the_shells_exit_code(tmp_path: Path, posix_spawn: bool) -> None:
    spawner = Spawner(posix_spawn=posix_spawn)
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    cwd = os.getcwd()
    env = {"PATH": str(tmp_path)}
    with pytest.raises(LaunchError) as missing:
        spawner.spawn([str(tmp_path / "absent")], cwd, env, 0, 1, 2)
    assert missing.value.exit_code == 127 and "was not found" in str(missing.value)
    with pytest.raises(LaunchError) as not_on_path:
        spawner.spawn(["psij-no-such-program"], cwd, env, 0, 1, 2)
    assert not_on_path.value.exit_code == 127
    with pytest.raises(LaunchError) as not_executable:
        spawner.spawn([str(plain)], cwd, env, 0, 1, 2)
    assert not_executable.value.exit_code == 126 and "cannot be executed" in str(
        not_executable.value)
    with pytest.raises(LaunchError) as surrogate:
        spawner.spawn(["/bin/true", "a\ud800"], cwd, env, 0, 1, 2)
    assert surrogate.value.exit_code is None and "argument 1" in str(surrogate.value)
    assert isinstance(surrogate.value.__cause__, UnicodeEncodeError)


def test_open_streams_names_the_stream_and_closes_nothing_it_did_not_open(
        tmp_path: Path) -> None:
    opened: List[int] = []
    (tmp_path / "in").write_text("input")
    fds = open_streams(str(tmp_path), "in", "out", "out", -1, opened)
    try:
        assert fds[1] == fds[2] and len(opened) == 2
        assert all(not os.get_inheritable(fd) for fd in opened)
    finally:
        for fd in opened:
            os.close(fd)
    opened = []
    with pytest.raises(StreamError) as caught:
        open_streams(str(tmp_path), "in", "no/such/dir/out", None, -1, opened)
    assert (caught.value.which, caught.value.path) == ("stdout", "no/such/dir/out")
    assert len(opened) == 1  # stdin: the caller closes it
    os.close(opened[0])
    with pytest.raises(StreamError, match="lone surrogate"):
        open_streams(str(tmp_path), None, None, "e\ud800", -1, [])


def test_local_still_refuses_an_unopenable_stream_naming_the_field(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work"))
    job = Job(JobSpec("/bin/true", stdin_path=tmp_path / "absent"))
    with pytest.raises(SubmitException, match="JobSpec.stdin_path"):
        ex.submit(job)
    assert job.status.state is JobState.NEW


# -- the local executor's grace period on a manual clock ----------------------------------------


@pytest.mark.parametrize("keeper", [True, False])
def test_local_cancel_leaves_the_kill_to_the_keeper_not_to_its_clock(tmp_path: Path,
                                                                      keeper: bool) -> None:
    clock = ManualClock()  # never moved: no KILL may wait on this process's timers
    watch = ProcessWatch(clock)
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", cancel_grace_period=1.0, keeper=keeper))
    ex._watch = watch  # type: ignore[attr-defined]
    job = Job(JobSpec(sys.executable, ["-c", IGNORE_TERM], directory=tmp_path))
    ex.submit(job)
    wait_until(lambda: (tmp_path / "ready").exists(), "start of the job")
    pid = int(job.native_id)  # type: ignore[arg-type]
    job.cancel()  # TERM, which it ignores; KILL a second later, from the keeper
    assert job.status.state is JobState.CANCELED
    assert watch._timers.next_timeout() is None
    wait_until(lambda: not alive(pid), "KILL after the grace period")


# -- the pilot's kill timers on a manual clock --------------------------------------------------


class Loop:
    """The engine's loop, driven by hand: a selector, a LoopWatch on a manual clock and the
    exits it reports."""

    def __init__(self, tmp_path: Path, grace: float = HOUR) -> None:
        self.clock = ManualClock()
        self.selector = selectors.DefaultSelector()
        self.watch = LoopWatch(self.selector, self.clock)
        self.exits: Dict[str, Optional[int]] = {}
        self.tasks = TaskProcesses(tmp_path / "tmp", self.exits.__setitem__, self.watch, grace)

    def turn(self) -> None:
        for key, mask in self.selector.select(0.01):
            key.data(mask)
        self.watch.run_due()

    def until(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + LIMIT
        while not predicate():
            assert time.monotonic() < deadline, f"no {what}"
            self.turn()

    def close(self) -> None:
        self.tasks.signal_all(0.0)  # KILL at once on the clock: nothing outlives the test
        self.clock.advance(1.0)
        self.watch.run_due()
        self.watch.close()
        self.selector.close()
        self.tasks.remove_tmp_root()


needs_pidfd = pytest.mark.skipif(not HAS_PIDFD, reason="LoopWatch needs pidfds (Linux 5.3+)")


@needs_pidfd
def test_pilot_task_is_killed_when_its_clock_passes_the_grace(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    try:
        pid = loop.tasks.start(Launch("t", [sys.executable, "-c", IGNORE_TERM], str(tmp_path)))
        wait_until(lambda: (tmp_path / "ready").exists(), "start of the task")
        assert loop.tasks.signal("t", HOUR)
        assert loop.watch.next_timeout() == HOUR
        loop.clock.advance(HOUR - 1.0)
        for _ in range(5):
            loop.turn()
        assert "t" not in loop.exits and alive(pid)
        loop.clock.advance(1.0)
        loop.until(lambda: "t" in loop.exits, "exit of the task")
        assert loop.exits["t"] == 128 + SIGKILL
        message = loop.tasks.finish("t", loop.exits["t"])
        assert message == "the job was killed by SIGKILL (exit code 137)"
    finally:
        loop.close()


@needs_pidfd
def test_what_a_leader_left_behind_is_killed_on_the_clock(tmp_path: Path) -> None:
    leader = ("import subprocess, sys, os, time\n"
              f"subprocess.Popen([sys.executable, '-c', {IGNORE_TERM!r}])\n"
              "while not os.path.exists('ready'): time.sleep(0.01)\n"
              "sys.exit(3)\n")
    loop = Loop(tmp_path)
    try:
        pid = loop.tasks.start(Launch("t", [sys.executable, "-c", leader], str(tmp_path)))
        # The leader exits; its group still has the child, which is sent TERM (ignored) and
        # KILL an hour later on the clock; the task ends only when its group is empty.
        # The group-check timer and the KILL timer.
        loop.until(lambda: len(loop.watch._timers) == 2, "the KILL timer")
        left = live_members(pid)
        assert len(left) == 1 and "t" not in loop.exits
        loop.clock.advance(HOUR - 1.0)  # the group is checked again: still not empty
        for _ in range(5):
            loop.turn()
        assert "t" not in loop.exits and live_members(pid) == left
        loop.clock.advance(1.0)
        loop.until(lambda: not live_members(pid), "the KILL")

        def checked() -> bool:
            loop.clock.advance(0.05)
            return "t" in loop.exits

        loop.until(checked, "end of the task")
        assert loop.exits["t"] == 3 and live_members(pid) == []
        loop.tasks.finish("t", 3)
    finally:
        loop.close()


def test_agent_watch_kills_on_its_clock_too(tmp_path: Path) -> None:
    clock = ManualClock()
    watch = ProcessWatch(clock)
    exits: Dict[str, Optional[int]] = {}
    tasks = TaskProcesses(tmp_path / "tmp", exits.__setitem__, watch, grace=HOUR)
    try:
        tasks.start(Launch("t", [sys.executable, "-c", IGNORE_TERM], str(tmp_path)))
        wait_until(lambda: (tmp_path / "ready").exists(), "start of the task")
        assert tasks.signal("t", HOUR)
        assert watch._timers.next_timeout() == HOUR and "t" not in exits
        clock.advance(HOUR)
        watch.wake()
        wait_until(lambda: "t" in exits, "exit of the task")
        assert exits["t"] == 128 + SIGKILL
        tasks.finish("t", exits["t"])
    finally:
        tasks.remove_tmp_root()


# -- TMPDIRs: an empty one is renamed and given to a later task -------------------------------


@needs_pidfd
def test_an_empty_tmpdir_is_renamed_for_a_later_task_instead_of_made_again(
        tmp_path: Path, monkeypatch: Any) -> None:
    calls: List[str] = []

    def recorded(real: Any) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> None:
            calls.append(real.__name__)
            real(path, *args, **kwargs)
        return call

    loop = Loop(tmp_path)
    leave = tmp_path / "leave"
    leave.write_text("")

    def wave(argvs: List[List[str]]) -> List[str]:
        loop.exits.clear()
        n = len(argvs)
        for i, argv in enumerate(argvs):
            loop.tasks.start(Launch(f"t{i}", argv, str(tmp_path)))
        tmpdirs = [loop.tasks._running[f"t{i}"].tmpdir for i in range(n)]  # type: ignore
        loop.until(lambda: len(loop.exits) == n, "exits")
        for task_id, code in loop.exits.items():
            assert loop.tasks.finish(task_id, code) is None
        # Gone at the task's end, either way; node files too.
        assert not any(os.path.exists(t) for t in tmpdirs)
        assert not list((tmp_path / "tmp").glob("*.nodes"))
        return tmpdirs

    try:
        # Each task finds its TMPDIR empty and private.
        check = ["sh", "-c", '[ -z "$(ls -A "$TMPDIR")" ] && [ "$(stat -c %a "$TMPDIR")" = 700 ]']
        first = wave([check] * 4)
        assert all(code == 0 for code in loop.exits.values())
        monkeypatch.setattr(os, "rmdir", recorded(os.rmdir))
        monkeypatch.setattr(os, "mkdir", recorded(os.mkdir))
        # The four empty ones are given out again (no mkdir); the tasks leave something in
        # them or open them to others, so they are removed, not kept.
        leaves = ["sh", "-c", 'touch "$TMPDIR/left"']
        opens = ["sh", "-c", 'chmod 755 "$TMPDIR"']
        second = wave([leaves, opens, leaves, opens])
        assert "mkdir" not in calls and calls.count("rmdir") >= 4
        assert not set(first) & set(second)
        calls.clear()
        wave([check] * 4)  # nothing spare any more: made anew
        assert calls.count("mkdir") == 4 and all(code == 0 for code in loop.exits.values())
    finally:
        loop.close()


def test_a_child_slower_than_the_wait_is_reaped_later_and_then_runs(tmp_path: Path) -> None:
    # What a pilot's worker still starting when the pilot closes gets: no zombie is left.
    import subprocess
    import threading

    slow = subprocess.Popen(["/bin/sh", "-c", "sleep 0.5"])
    quick = subprocess.Popen(["/bin/true"])
    quick_pid = quick.pid
    time.sleep(0.2)  # /bin/true has ended; the sleep has not
    late = reap_within([quick_pid, slow.pid], 0.01, 0.005)
    assert late == [slow.pid]
    with pytest.raises(ChildProcessError):
        os.waitpid(quick_pid, os.WNOHANG)  # reaped already
    done = threading.Event()
    reap_later(late, done.set)
    assert done.wait(30)
    with pytest.raises(ChildProcessError):
        os.waitpid(slow.pid, os.WNOHANG)  # reaped by the thread
    slow.returncode = 0  # for Popen's own bookkeeping: it was reaped without it
    quick.returncode = 0
    called: List[bool] = []
    reap_later([], lambda: called.append(True))  # nothing to wait for: at once
    assert called == [True]

