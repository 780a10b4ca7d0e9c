"""The ``psij`` command, run as users run it: the console script and ``python -m psij``."""

import os
import pty
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import psij
from psij.cli import build_attributes, exit_status, main
from psij.job_state import JobState
from psij.job_status import JobStatus

PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")
ENTRY_POINTS = {"script": [PSIJ_SCRIPT], "module": [sys.executable, "-m", "psij"]}


@pytest.fixture(autouse=True)
def _own_work_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The local executor keeps job records under ~/.psij; keep them out of the real home.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def psij_cmd(*args: str, entry: str = "script", **kw: object) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([*ENTRY_POINTS[entry], *args], capture_output=True, text=True,
                          timeout=60, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_version(entry: str) -> None:
    proc = psij_cmd("--version", entry=entry)
    assert proc.returncode == 0
    assert proc.stdout == f"psij {psij.__version__}\n"


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_plugins_lists_builtin_executor_and_launcher(entry: str) -> None:
    proc = psij_cmd("plugins", entry=entry)
    assert proc.returncode == 0, proc.stderr
    executors, _, rest = proc.stdout.partition("Launchers:")
    launchers, _, broken = rest.partition("Broken descriptor files:")
    assert f"  local {_descriptor_version('executor', 'local')}\n" in executors
    assert "psij.executors.local.LocalJobExecutor" in executors
    assert "    status:     ok" in executors
    assert f"  single {_descriptor_version('launcher', 'single')}\n" in launchers
    assert "psij.launchers.single.SingleLauncher" in launchers
    assert "  multiple " in launchers
    assert broken.strip() == "(none)"


def _descriptor_version(kind: str, name: str) -> str:
    from psij._plugins import REGISTRY

    return str(REGISTRY.select(kind, name).desc.version)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_run_exits_with_the_jobs_exit_code(entry: str) -> None:
    proc = psij_cmd("run", "--", "/bin/sh", "-c", "exit 3", entry=entry)
    assert proc.returncode == 3
    assert proc.stdout == proc.stderr == ""


def test_job_writes_straight_to_our_streams() -> None:
    proc = psij_cmd("run", "--", "/bin/sh", "-c", "echo hello; echo oops >&2")
    assert proc.returncode == 0
    assert proc.stdout == "hello\n"
    assert proc.stderr == "oops\n"


def test_job_reads_our_stdin() -> None:
    proc = psij_cmd("run", "--", "/bin/cat", input="line one\nline two\n")
    assert proc.returncode == 0
    assert proc.stdout == "line one\nline two\n"


def test_terminal_stdin_is_not_given_to_the_job() -> None:
    # The job has its own process group; reading a terminal from there would stop it. If the
    # terminal were passed on, cat would wait for input that never comes.
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run([PSIJ_SCRIPT, "run", "--", "/bin/cat"], stdin=terminal,
                              capture_output=True, text=True, timeout=30)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 0
    assert proc.stdout == ""


def test_run_without_double_dash_keeps_job_options() -> None:
    proc = psij_cmd("run", "/bin/echo", "-n", "hello")
    assert proc.returncode == 0
    assert proc.stdout == "hello"


def test_multiple_launcher_runs_n_copies() -> None:
    proc = psij_cmd("run", "-n", "3", "--launcher", "multiple", "--",
                    "/bin/sh", "-c", 'echo "copy $_PSI_J_PROCESS_INDEX_"')
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["copy 1", "copy 2", "copy 3"]


def test_redirection_directory_environment_and_attributes(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("from a file\n")
    work = tmp_path / "work"
    work.mkdir()
    proc = psij_cmd("run", "--stdin", "in.txt", "--stdout", "out.txt", "--stderr", "err.txt",
                    "--dir", "work", "--env", "GREETING=hi there", "--env", "EMPTY=",
                    "--attr", "duration=1:30", "--attr", "queue=debug",
                    "--attr", "slurm.qos=high", "--",
                    "/bin/sh", "-c", 'cat; echo "$GREETING [$EMPTY] $(pwd)"; echo to-err >&2',
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == proc.stderr == ""
    assert (tmp_path / "out.txt").read_text() == f"from a file\nhi there [] {work}\n"
    assert (tmp_path / "err.txt").read_text() == "to-err\n"


def test_shared_output_file_keeps_every_line_in_order(tmp_path: Path) -> None:
    # `> file 2>&1`: one file for both streams and for what the shell writes afterwards.
    out = tmp_path / "all.txt"
    script = (f'"{PSIJ_SCRIPT}" run -- /bin/sh -c "echo one; echo two >&2; echo three"; '
              'echo "status $?"; echo after')
    subprocess.run(["/bin/sh", "-c", f'{{ {script}; }} > "{out}" 2>&1'], check=True,
                   timeout=60)
    assert out.read_text() == "one\ntwo\nthree\nstatus 0\nafter\n"


def test_missing_program_exits_127_with_message() -> None:
    # As a shell does: the job runs and fails with 127, naming what was not found.
    proc = psij_cmd("run", "--", "/nonexistent/prog")
    assert proc.returncode == 127
    assert proc.stderr.startswith("psij run: job failed:")
    assert "/nonexistent/prog" in proc.stderr
    assert "Traceback" not in proc.stderr


BAD_USAGE = {
    "no executable": (["run"], "no executable given"),
    "only dashes": (["run", "--"], "no executable given"),
    "unknown attribute": (["run", "--attr", "colour=blue", "--", "true"],
                          "unknown attribute 'colour'; accepted: duration, queue, account, "
                          "reservation or <executor>.<option>"),
    "attribute without value": (["run", "--attr", "queue", "--", "true"],
                                "--attr: expected KEY=VALUE, got 'queue'"),
    "bad duration": (["run", "--attr", "duration=soon", "--", "true"],
                     "--attr 'duration=soon': walltime: cannot parse 'soon'"),
    "bad environment": (["run", "--env", "=x", "--", "true"],
                        "--env: expected KEY=VALUE, got '=x'"),
    "unknown executor": (["run", "--executor", "nosuch", "--", "true"],
                         "no executor named 'nosuch'; available executors: "),
    "unknown launcher": (["run", "--launcher", "nosuch", "--", "true"],
                         "no launcher named 'nosuch'; available launchers: "),
    "zero processes": (["run", "-n", "0", "--", "true"],
                       "expected a whole number of processes of at least 1, got '0'"),
    "non-numeric processes": (["run", "-n", "two", "--", "true"],
                              "expected a whole number of processes of at least 1, got 'two'"),
    "no command": ([], "a command is required: plugins, run, script, pilot, flow, config, "
                          "submit"),
    "unknown command": (["launch"], "invalid choice: 'launch'"),
}


@pytest.mark.parametrize("case", sorted(BAD_USAGE))
def test_bad_usage_exits_2_with_a_clear_message(case: str) -> None:
    args, message = BAD_USAGE[case]
    proc = psij_cmd(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    # The message is one line (argparse adds a usage line before its own).
    assert len([line for line in proc.stderr.splitlines() if "error" in line
                or "required" in line]) == 1


def test_unknown_executor_message_lists_the_available_ones() -> None:
    proc = psij_cmd("run", "--executor", "nosuch", "--", "true")
    assert "local" in proc.stderr.split("available executors:", 1)[1]


def test_help_lists_every_command_and_each_command_its_own_options() -> None:
    # The parser is built for the command named on the line only; help must not show that.
    top = psij_cmd("--help")
    assert top.returncode == 0
    for command in ("plugins", "run", "script", "pilot"):
        assert f"    {command}" in top.stdout
    pilot = psij_cmd("pilot", "--help")
    assert pilot.returncode == 0 and "    serve" in pilot.stdout and "    run" in pilot.stdout
    run = psij_cmd("pilot", "run", "--help")
    assert run.returncode == 0 and "--cores N" in run.stdout and "--socket" not in run.stdout
    script = psij_cmd("script", "--help")
    assert script.returncode == 0 and "--executor NAME" in script.stdout
    wrong = psij_cmd("pilot", "run", "--socket", "x", "r.json")
    assert wrong.returncode == 2 and "unrecognized arguments: --socket" in wrong.stderr


PLAIN_LINES = [
    ["r.json"], ["r.json", "--cores", "2"], ["--cores=3", "r.json"], ["r.json", "--resume"],
    ["--nodes", "vn[1-2]:2", "--wd", "w d", "r.json"], ["--wd=", "r.json", "--cores", "1"],
    ["--cores", "1", "--cores", "4", "r.json"], ["--wd=-dir", "r.json"],
    ["r.json", "--check"], ["--emulate-slurm", "r.json", "--cores", "2"],
]
OTHER_LINES = [
    [], ["--help"], ["-h", "r.json"], ["r.json", "--cores", "0"], ["r.json", "--cores", "x"],
    ["r.json", "--cor", "2"], ["r.json", "--resume=yes"], ["r.json", "--wd"],
    ["r.json", "--wd", "-x"], ["a.json", "b.json"], ["--", "r.json"], ["-", "--cores", "2"],
    ["r.json", "--socket", "s"], ["--cores", "2"],
]


@pytest.mark.parametrize("line", PLAIN_LINES + OTHER_LINES, ids=" ".join)
def test_a_plain_pilot_run_line_is_read_as_argparse_reads_it(line: List[str]) -> None:
    # `psij pilot run` reads its plain lines without argparse; every other line goes to
    # argparse, which then says what is wrong with it.
    from psij.cli import _build_parser
    from psij.cli._pilot import plain_pilot_run

    argv = ["pilot", "run", *line]
    plain = plain_pilot_run(argv)
    assert (plain is not None) == (line in PLAIN_LINES)
    if plain is not None:
        assert vars(plain) == vars(_build_parser(argv).parse_args(argv))


def test_importing_the_command_loads_no_executor() -> None:
    code = ("import sys, psij.cli; "
            "print(sorted(m for m in sys.modules if m.startswith('psij.executors')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_help_documents_exit_statuses() -> None:
    proc = psij_cmd("run", "--help")
    assert proc.returncode == 0
    for fragment in ("exit status", "130", "could not be submitted", "bad usage"):
        assert fragment in proc.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("launcher", ["single", "multiple"])
def test_stop_signal_cancels_the_job(sig: signal.Signals, launcher: str) -> None:
    proc = subprocess.Popen(
        [PSIJ_SCRIPT, "run", "--launcher", launcher, "--",
         "/bin/sh", "-c", "echo $$; exec sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        job_pid = int(proc.stdout.readline())
        start = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130
    assert time.monotonic() - start < 10
    assert "canceling the job" in err
    assert not _alive(job_pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead; only its parent has not collected it yet.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_job_killed_by_a_signal_exits_like_a_shell() -> None:
    proc = psij_cmd("run", "--", "/bin/sh", "-c", "kill -KILL $$")
    assert proc.returncode == 128 + 9


# -- in-process checks of the pieces ----------------------------------------------------------


def test_main_returns_status_instead_of_exiting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"psij {psij.__version__}\n"
    assert main(["run", "-n", "x", "--", "true"]) == 2
    assert main([]) == 2


def test_attributes_map_to_job_attributes() -> None:
    attrs = build_attributes(["duration=90m", "queue=debug", "account=proj1",
                              "reservation=r7", "slurm.qos=high", "pbs.place=scatter"])
    assert attrs.duration == timedelta(minutes=90)
    assert attrs.queue_name == "debug"
    assert attrs.account == "proj1"
    assert attrs.reservation_id == "r7"
    assert attrs.custom_attributes == {"slurm.qos": "high", "pbs.place": "scatter"}
    assert build_attributes(["duration=01:02:03"]).duration == timedelta(hours=1, minutes=2,
                                                                         seconds=3)
    # A value may itself hold '='.
    assert build_attributes(["slurm.constraint=a=b"]).custom_attributes == {
        "slurm.constraint": "a=b"}


EXIT_CASES: Dict[str, Tuple[Any, int, Any]] = {
    "completed": (JobStatus(JobState.COMPLETED, exit_code=0), 0, None),
    "completed without code": (JobStatus(JobState.COMPLETED), 0, None),
    "failed with code": (JobStatus(JobState.FAILED, exit_code=42, message="x"), 42, None),
    "failed without code": (JobStatus(JobState.FAILED, message="node went away"), 1,
                            "job failed: node went away"),
    "failed with code 0": (JobStatus(JobState.FAILED, exit_code=0, message="stage-out failed"),
                           1, "job failed: stage-out failed"),
    "killed by signal": (JobStatus(JobState.FAILED, exit_code=-15), 143, None),
    "canceled": (JobStatus(JobState.CANCELED, exit_code=-15), 130, None),
    "no status": (None, 1, "the job ended without a final status"),
}


@pytest.mark.parametrize("case", sorted(EXIT_CASES))
def test_exit_status_for_final_states(case: str) -> None:
    status, code, message = EXIT_CASES[case]
    got_code, got_message = exit_status(status)
    assert got_code == code
    assert got_message == message



# -- psij script --------------------------------------------------------------------------------

# Scheduler commands the batch executors may run; each fake one records that it was called.
SCHEDULER_COMMANDS = ["sbatch", "squeue", "scancel", "sacct", "scontrol", "qsub", "qstat",
                      "qdel", "qacct", "bsub", "bjobs", "qalter", "flux"]


@pytest.fixture
def no_scheduler(tmp_path: Path) -> Tuple[Dict[str, str], Path]:
    """An environment whose PATH holds only fake scheduler commands that record their calls,
    and the file they record to (absent as long as none was called)."""
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir()
    calls = tmp_path / "scheduler-calls"
    for name in SCHEDULER_COMMANDS:
        tool = fake_bin / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\necho 4242\n')
        tool.chmod(0o755)
    env = dict(os.environ, PATH=str(fake_bin), HOME=str(tmp_path / "home"))
    return env, calls


def test_script_for_slurm_has_the_directives_and_submits_nothing(
        tmp_path: Path, no_scheduler: Tuple[Dict[str, str], Path]) -> None:
    env, calls = no_scheduler
    proc = psij_cmd("script", "--executor", "slurm", "--attr", "duration=5m",
                    "--attr", "slurm.qos=debug", "--attr", "queue=short", "-n", "2",
                    "--stdout", "out.txt", "--env", "GREETING=hi there", "--",
                    "/bin/echo", "it's", "$(touch PWNED)", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    script = proc.stdout
    assert script.startswith("#!/bin/bash\n")
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for expected in ('#SBATCH --time=00:05:00', '#SBATCH --qos="debug"',
                     '#SBATCH --partition="short"', "#SBATCH --ntasks=2"):
        assert expected in directives
    assert 'export GREETING="hi there"' in script
    assert str(tmp_path / "out.txt") in script
    # The arguments are quoted for the shell, never left to be expanded.
    assert "'it'\"'\"'s' '$(touch PWNED)'" in script
    assert not calls.exists(), calls.read_text()
    # Nothing was written where submitted scripts go, and no job exists.
    assert list((tmp_path / "home").rglob("*.job")) == []
    assert not (tmp_path / "PWNED").exists()


def test_script_for_grid_engine_has_the_directives_and_submits_nothing(
        tmp_path: Path, no_scheduler: Tuple[Dict[str, str], Path]) -> None:
    env, calls = no_scheduler
    proc = psij_cmd("script", "--executor", "gridengine", "--attr", "duration=1:30:00",
                    "--attr", "sge.l=h_vmem=1G", "--attr", "queue=all.q", "-n", "3",
                    "--", "/bin/hostname", env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    directives = [line for line in proc.stdout.splitlines() if line.startswith("#$")]
    for expected in ("#$ -l h_rt=1:30:00", "#$ -l h_vmem=1G", "#$ -q all.q", "#$ -pe smp 3"):
        assert expected in directives
    assert not calls.exists(), calls.read_text()


def test_script_matches_what_submit_writes(tmp_path: Path) -> None:
    # The printed script is the one `submit` would write: same executor method, same job.
    from psij import Job, JobExecutor
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

    out = tmp_path / "printed"
    with open(out, "w") as f:
        code = main_with_stdout(["script", "--executor", "batch-test", "--attr",
                                 "batch-test.queue-delay=3", "--", "/bin/true"], f)
    assert code == 0
    printed = out.read_text()
    executor = JobExecutor.get_instance("batch-test")
    assert isinstance(executor, BatchSchedulerExecutor)
    spec = psij.JobSpec("/bin/true", attributes=psij.JobAttributes(
        custom_attributes={"batch-test.queue-delay": "3"}))
    expected = executor.submit_script(Job(spec))
    executor.close()
    # Only the job's id (in the launcher's arguments) differs between two jobs.
    strip = [line for line in printed.splitlines() if "_launch.sh" not in line]
    assert strip == [line for line in expected.splitlines() if "_launch.sh" not in line]
    assert '#BATCH_TEST --queue-delay="3"' in printed.splitlines()


def main_with_stdout(argv: List[str], stream: Any) -> int:
    saved = sys.stdout
    sys.stdout = stream
    try:
        return main(argv)
    finally:
        sys.stdout = saved


SCRIPT_BAD_USAGE = {
    "unknown executor": (["--executor", "nosuch", "--", "true"],
                         "no executor named 'nosuch'; available executors: "),
    "executor without scripts": (["--executor", "local", "--", "true"],
                                 "executor 'local' does not submit to a batch scheduler, so it "
                                 "has no submit script; executors with one: "),
    "no executor": (["--", "true"], "the following arguments are required: --executor"),
    "no executable": (["--executor", "slurm"], "no executable given; usage: psij script"),
    "unknown launcher": (["--executor", "slurm", "--launcher", "nosuch", "--", "true"],
                         "no launcher named 'nosuch'"),
    "unknown attribute": (["--executor", "slurm", "--attr", "colour=blue", "--", "true"],
                          "unknown attribute 'colour'"),
    "bad custom attribute": (["--executor", "slurm", "--attr", "slurm.q$s=1", "--", "true"],
                             "'slurm.q$s' is not a valid slurm option name"),
    "value that cannot be a directive": (["--executor", "slurm", "--attr",
                                          "queue=a\nb", "--", "true"], "JobAttributes.queue_name"),
}


@pytest.mark.parametrize("case", sorted(SCRIPT_BAD_USAGE))
def test_script_bad_usage_exits_2(case: str, no_scheduler: Tuple[Dict[str, str], Path]) -> None:
    env, calls = no_scheduler
    args, message = SCRIPT_BAD_USAGE[case]
    proc = psij_cmd("script", *args, env=env)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert not calls.exists()


def test_script_refusing_local_names_the_batch_executors() -> None:
    proc = psij_cmd("script", "--executor", "local", "--", "true")
    names = proc.stderr.split("executors with one:", 1)[1].replace(",", " ").split()
    assert {"slurm", "sge", "gridengine", "batch-test"} <= set(names)
    assert "local" not in names
