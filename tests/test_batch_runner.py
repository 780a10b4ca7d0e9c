"""The command runner: exit code, stdout and stderr together; timeouts kill the whole group;
submit commands are stopped for good by ``stop_submits``."""

import os
import threading
import time
from pathlib import Path
from typing import List

import pytest

from psij.executors.batch._runner import (
    MAY_HAVE_BEEN_SUBMITTED,
    SUBMITS_STOPPED,
    CommandResult,
    FakeCommandRunner,
    SubprocessRunner,
    outcome_unknown,
)


def test_captures_exit_code_stdout_and_stderr() -> None:
    r = SubprocessRunner().run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (r.exit_code, r.stdout, r.stderr, r.failure) == (3, "out\n", "err\n", None)
    assert not r.ok
    assert "`sh -c echo out; echo err >&2; exit 3` exited with 3" in r.describe()
    assert "out" in r.describe() and "err" in r.describe()


def test_passes_stdin_and_never_uses_a_shell() -> None:
    r = SubprocessRunner().run(["cat"], timeout=10, stdin="$(echo no) ; x")
    assert r.ok and r.stdout == "$(echo no) ; x"
    r = SubprocessRunner().run(["echo", "$HOME", "*"], timeout=10)
    assert r.stdout == "$HOME *\n"


def test_missing_program_is_a_result_not_an_exception() -> None:
    r = SubprocessRunner().run(["/nonexistent/squeue"], timeout=10)
    assert r.exit_code is None and r.failure is not None and "could not be started" in r.failure
    assert not r.ok


def test_timeout_kills_the_command_and_what_it_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    start = time.monotonic()
    r = SubprocessRunner().run(
        ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo started; wait"], timeout=0.5)
    assert time.monotonic() - start < 10
    assert r.exit_code is None and r.failure is not None and "0.5 s" in r.failure
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the command's child survived the timeout")


def test_undecodable_output_is_kept_as_text() -> None:
    r = SubprocessRunner().run(["printf", "\\377ok"], timeout=10)
    assert r.ok and r.stdout.endswith("ok")


def test_fake_runner_records_calls_and_answers() -> None:
    fake = FakeCommandRunner(lambda argv, stdin: (0, "1\n") if argv[0] == "sbatch"
                             else CommandResult(argv, 1, "", "nope"))
    assert fake.run(["sbatch", "x"], timeout=1).stdout == "1\n"
    assert fake.run(["squeue"], timeout=1).stderr == "nope"
    assert fake.calls == [("sbatch", "x"), ("squeue",)]
    assert fake.calls_to("squeue") == [("squeue",)]
    with pytest.raises(TypeError, match="responder"):
        FakeCommandRunner(lambda a, s: "bad").run(["x"], timeout=1)


def test_a_command_that_closes_its_streams_still_times_out() -> None:
    # Its output ends at once; the wait for its exit keeps the timeout.
    start = time.monotonic()
    r = SubprocessRunner().run(["sh", "-c", "exec >&- 2>&-; sleep 30"], timeout=0.5)
    assert r.exit_code is None and "did not finish within 0.5 s" in str(r.failure)
    assert time.monotonic() - start < 10


def test_exit_codes_come_back_after_the_output_ended() -> None:
    r = SubprocessRunner().run(["sh", "-c", "echo out; echo err >&2; exec >&- 2>&-; exit 7"],
                               timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")


def test_too_large_an_environment_is_explained() -> None:
    r = SubprocessRunner(env={"BIG": "x" * 200_000}).run(["true"], timeout=10)
    assert r.exit_code is None and r.failure is not None
    assert r.failure.startswith("could not be started: Argument list too long")
    assert "128 KiB for each variable or argument" in r.failure
    assert str(os.sysconf("SC_ARG_MAX")) in r.failure
    # Other start failures keep the system's words alone.
    r = SubprocessRunner().run(["/nonexistent/squeue"], timeout=10)
    assert r.failure == "could not be started: No such file or directory"


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_stop_submits_kills_the_running_submit_commands_and_refuses_later_ones(
        tmp_path: Path) -> None:
    runner = SubprocessRunner()
    pidfile, started = tmp_path / "child", tmp_path / "started"
    results: List[CommandResult] = []
    submit = threading.Thread(target=lambda: results.append(runner.run(
        ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; touch {started}; wait"], timeout=60,
        submit=True)))
    submit.start()
    deadline = time.monotonic() + 10
    while not started.exists():
        assert time.monotonic() < deadline, "the submit command never started"
        time.sleep(0.02)
    other = runner.run(["true"], timeout=10)  # not a submit command: not followed
    assert other.ok
    begun = time.monotonic()
    assert runner.stop_submits() == 1
    submit.join(10)
    assert time.monotonic() - begun < 5
    result = results[0]
    assert result.exit_code is None and result.failure is not None
    assert "stopped before it finished" in result.failure
    assert MAY_HAVE_BEEN_SUBMITTED in result.failure and outcome_unknown(result.describe())
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child):  # what the command started went with it
        assert time.monotonic() < deadline, "the submit command's child survived"
        time.sleep(0.02)
    # From now on a submit command is not even started; other commands run as before.
    marker = tmp_path / "ran"
    refused = runner.run(["touch", str(marker)], timeout=10, submit=True)
    assert refused.failure == SUBMITS_STOPPED and not outcome_unknown(refused.describe())
    assert runner.run_spared(["touch", str(marker)], 10, "", 1).failure == SUBMITS_STOPPED
    assert not marker.exists()
    assert runner.run(["true"], timeout=10).ok
    assert runner.stop_submits() == 0


def test_a_timed_out_submit_may_have_submitted_its_job() -> None:
    from psij.supervise._machine import outcome_unknown as supervisor_reads

    timed_out = SubprocessRunner().run(["sleep", "5"], timeout=0.2, submit=True).describe()
    missing = SubprocessRunner().run(["/nonexistent"], timeout=1).describe()
    assert outcome_unknown(timed_out) and supervisor_reads(timed_out)
    assert not outcome_unknown(missing) and not supervisor_reads(missing)
