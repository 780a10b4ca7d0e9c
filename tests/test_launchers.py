"""The script-based launchers, run for real with bash.

Each test builds the launch command with a launcher class, runs it in a job directory and checks
what the job saw (arguments, environment, streams) and what the launcher reported (exit status,
completion marker, failure message, log). srun, aprun, jsrun and other MPI flavours are replaced by
small fakes on PATH that record their arguments; Open MPI's mpirun runs for real when installed.
"""

import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

import psij
from psij import _data
from psij.exceptions import InvalidJobException
from psij.launchers import script_based_launcher
from psij.launchers.aprun import AprunLauncher
from psij.launchers.jsrun import JsrunLauncher
from psij.launchers.mpirun import MPILauncher
from psij.launchers.multiple import MultipleLauncher
from psij.launchers.script_based_launcher import (
    LAUNCHER_DONE_MARKER,
    ScriptBasedLauncher,
    deploy_files,
)
from psij.launchers.single import SingleLauncher
from psij.launchers.srun import SrunLauncher

MARKER = LAUNCHER_DONE_MARKER

# Strings a shell would mangle or execute if anything on the way were unquoted or evaluated.
HOSTILE = [
    "plain",
    "two words",
    "  leading and trailing  ",
    "",
    "'single quoted'",
    '"double quoted"',
    "$(touch pwned_subst)",
    "`touch pwned_backtick`",
    "$HOME ${HOME} $1 $@",
    "line one\nline two\n",
    "tab\there",
    "* ? [a-z] ~ **/*",
    "{{mustache}} {a,b}",
    "; touch pwned_semicolon && echo x | cat > pwned_pipe",
    "back\\slash \\n",
    "%s %n %%",
    "-n",
    "--",
    "!bang !!",
    "unicode: h\u00e9llo \u2713 \u65e5\u672c",
    "$'\\x41' <(echo) >(cat)",
]

# Prints its arguments and the variables named in ECHO_ENV, each NUL-terminated.
# One write() per run, so copies sharing an output file never interleave inside a record.
ARGV_DUMP = """\
import os, sys
parts = [os.fsencode(word) + b"\\0" for word in sys.argv[1:]]
for name in os.environ.get("ECHO_ENV", "").split(","):
    if name:
        parts.append(b"ENV " + os.fsencode(name) + b"=" + os.environb[os.fsencode(name)] + b"\\0")
os.write(1, b"".join(parts))
"""


def nul_joined(words: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(w) + b"\0" for w in words)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "job dir $(x) 'q'"
    d.mkdir()
    return d


@pytest.fixture
def config(tmp_path: Path) -> psij.JobExecutorConfig:
    return psij.JobExecutorConfig(work_directory=tmp_path / "work")


@pytest.fixture
def argv_dump(tmp_path: Path) -> Path:
    path = tmp_path / "argv_dump.py"
    path.write_text(ARGV_DUMP)
    return path


def write_script(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    path.chmod(0o755)
    return path


def run(argv: List[str], cwd: Path, env: Optional[Dict[str, str]] = None,
        timeout: float = 60) -> "subprocess.CompletedProcess[str]":
    """Runs a launch command the way executors do: launcher stdout and stderr in one capture."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def bash_job(script: str, **spec_fields: object) -> psij.Job:
    return psij.Job(psij.JobSpec(executable="bash", arguments=["-c", script],
                                 **spec_fields))  # type: ignore[arg-type]


def launched_ok(launcher: ScriptBasedLauncher, output: str) -> bool:
    lines = output.splitlines()
    return (not launcher.is_launcher_failure(output)) and bool(lines) and lines[-1] == MARKER


# --- the launch command --------------------------------------------------------------------

def test_launch_command_layout(config: psij.JobExecutorConfig) -> None:
    job = psij.Job(psij.JobSpec(executable="prog", arguments=["a", "b c"], stdin_path="in.txt",
                                stdout_path="rel/out.txt", stderr_path="/abs/err.txt",
                                pre_launch="pre.sh", post_launch="/x/post.sh"))
    argv = SingleLauncher(config=config).get_launch_command(job)
    script = Path(argv[1])
    assert argv[0] == "bash"
    assert script.is_absolute() and script.name == "single_launch.sh"
    assert script.parent.parent == config.work_directory / "launchers"
    assert argv[2:] == [job.id, "", "pre.sh", "/x/post.sh", "in.txt", "rel/out.txt",
                        "/abs/err.txt", "prog", "a", "b c"]


def test_launch_command_defaults_and_log_file(config: psij.JobExecutorConfig,
                                              tmp_path: Path) -> None:
    job = psij.Job(psij.JobSpec(executable="prog"))
    argv = MultipleLauncher(config=config).get_launch_command(job, log_file="rel.log")
    assert argv[3] == str(Path.cwd() / "rel.log")
    assert argv[4:] == ["", "", "/dev/null", "/dev/null", "/dev/null", "1", "prog"]
    logged = psij.JobExecutorConfig(work_directory=tmp_path / "w2",
                                    launcher_log_file=tmp_path / "l.log")
    assert SingleLauncher(config=logged).get_launch_command(job)[3] == str(tmp_path / "l.log")


def test_launch_command_refuses_incomplete_jobs(config: psij.JobExecutorConfig) -> None:
    launcher = SingleLauncher(config=config)
    with pytest.raises(InvalidJobException, match="no JobSpec"):
        launcher.get_launch_command(psij.Job())
    with pytest.raises(InvalidJobException, match="executable"):
        launcher.get_launch_command(psij.Job(psij.JobSpec()))


def test_process_count_argument(config: psij.JobExecutorConfig) -> None:
    launcher = MultipleLauncher(config=config)

    def count(resources: Optional[psij.ResourceSpecV1]) -> List[str]:
        return launcher.get_additional_args(psij.Job(psij.JobSpec("x", resources=resources)))

    assert count(None) == ["1"]
    assert count(psij.ResourceSpecV1(process_count=5)) == ["5"]
    assert count(psij.ResourceSpecV1(node_count=2, processes_per_node=3)) == ["6"]


def test_get_instance_through_descriptors(config: psij.JobExecutorConfig) -> None:
    from packaging.version import Version

    expected = {"single": SingleLauncher, "multiple": MultipleLauncher, "mpirun": MPILauncher,
                "srun": SrunLauncher, "aprun": AprunLauncher, "jsrun": JsrunLauncher}
    assert set(expected) <= psij.Launcher.get_launcher_names()
    for name, cls in expected.items():
        launcher = psij.Launcher.get_instance(name, config=config)
        assert type(launcher) is cls
        assert launcher.name == name
        assert launcher.version == Version("0.1.0")
        assert launcher.config is config
    assert type(psij.Launcher.get_instance("multiple", ">= 0.1")) is MultipleLauncher


# --- failure detection ---------------------------------------------------------------------

@pytest.mark.parametrize(("output", "failed"), [
    (f"{MARKER}\n", False),
    (f"noise from pre-launch\n{MARKER}\n", False),
    (f"{MARKER}\n\n  \n", False),
    (MARKER, False),
    ("", True),
    ("bash: something broke\n", True),
    (f"{MARKER}\nan error after the marker\n", True),
    (f"not the {MARKER}\n", True),
])
def test_is_launcher_failure(config: psij.JobExecutorConfig, output: str, failed: bool) -> None:
    assert SingleLauncher(config=config).is_launcher_failure(output) is failed


def test_failure_message(config: psij.JobExecutorConfig) -> None:
    launcher = SingleLauncher(config=config)
    assert launcher.get_launcher_failure_message(f"\n  broke here  \n{MARKER}\n") == "broke here"
    long_output = "".join(f"line {i}\n" for i in range(2000))
    message = launcher.get_launcher_failure_message(long_output)
    assert len(message) <= 2003
    assert message.endswith("line 1999")
    assert "line 5\n" not in message
    assert "without any output" in launcher.get_launcher_failure_message("")


# --- running the single launcher -----------------------------------------------------------

@pytest.fixture(params=["exec", "child"])
def post_launch(request: pytest.FixtureRequest, tmp_path: Path) -> Optional[Path]:
    """Without a post-launch script `single` replaces itself by the job; with one it waits."""
    if request.param == "exec":
        return None
    return write_script(tmp_path / "noop_post.sh", "true\n")


def test_single_streams_and_exit_code(config: psij.JobExecutorConfig, job_dir: Path,
                                      post_launch: Optional[Path]) -> None:
    (job_dir / "in.txt").write_bytes(b"first\nsecond\xff\n")
    job = bash_job("cat; echo out; echo err >&2; exit 3", stdin_path="in.txt",
                   stdout_path="out.txt", stderr_path="err.txt", post_launch=post_launch)
    launcher = SingleLauncher(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert result.returncode == 3
    assert launched_ok(launcher, result.stdout), result.stdout
    assert (job_dir / "out.txt").read_bytes() == b"first\nsecond\xff\nout\n"
    assert (job_dir / "err.txt").read_bytes() == b"err\n"


def test_single_truncates_existing_output(config: psij.JobExecutorConfig, job_dir: Path,
                                          post_launch: Optional[Path]) -> None:
    (job_dir / "out.txt").write_text("old content that is longer\n")
    job = bash_job("echo new", stdout_path="out.txt", post_launch=post_launch)
    result = run(SingleLauncher(config=config).get_launch_command(job), job_dir)
    assert result.returncode == 0
    assert (job_dir / "out.txt").read_text() == "new\n"


def test_shared_stdout_and_stderr_keep_every_line(config: psij.JobExecutorConfig, job_dir: Path,
                                                  post_launch: Optional[Path]) -> None:
    job = bash_job("echo o1; echo e1 >&2; echo o2; echo e2 >&2", stdout_path="both.txt",
                   stderr_path=job_dir / "both.txt", post_launch=post_launch)
    result = run(SingleLauncher(config=config).get_launch_command(job), job_dir)
    assert result.returncode == 0
    assert (job_dir / "both.txt").read_text() == "o1\ne1\no2\ne2\n"


def test_hostile_strings_reach_the_job_unchanged(config: psij.JobExecutorConfig, job_dir: Path,
                                                 argv_dump: Path,
                                                 post_launch: Optional[Path]) -> None:
    hostile_dir = job_dir / "out $(touch pwned_dir) `x` * ? [a] {{y}} \u00e9"
    hostile_dir.mkdir()
    stdout = hostile_dir / "stdout 'q' \"d\" $HOME ; |.txt"
    env = {f"HOSTILE_{i}": value for i, value in enumerate(HOSTILE) if value}
    job = psij.Job(psij.JobSpec(executable=sys.executable, arguments=[str(argv_dump), *HOSTILE],
                                stdout_path=stdout, post_launch=post_launch))
    result = run(SingleLauncher(config=config).get_launch_command(job), job_dir,
                 env={**env, "ECHO_ENV": ",".join(env)})
    assert result.returncode == 0, result.stdout
    expected = nul_joined(HOSTILE) + b"".join(
        b"ENV " + os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items())
    assert stdout.read_bytes() == expected
    assert not list(job_dir.rglob("pwned*"))


def test_executable_not_found_is_a_job_failure(config: psij.JobExecutorConfig, job_dir: Path,
                                               post_launch: Optional[Path]) -> None:
    job = psij.Job(psij.JobSpec(executable="no-such-program-psij", stderr_path="err.txt",
                                post_launch=post_launch))
    launcher = SingleLauncher(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert result.returncode == 127
    assert launched_ok(launcher, result.stdout)
    assert "no-such-program-psij" in (job_dir / "err.txt").read_text()


def test_executable_named_like_a_library_function_runs_the_program(
        config: psij.JobExecutorConfig, job_dir: Path, tmp_path: Path,
        post_launch: Optional[Path]) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("log", "pre_launch", "echo"):
        write_script(bin_dir / name, f"#!/bin/sh\nprintf 'program {name}: %s\\n' \"$*\"\n")
    launcher = SingleLauncher(config=config)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for name in ("log", "pre_launch", "echo"):
        job = psij.Job(psij.JobSpec(executable=name, arguments=["x"], stdout_path="out.txt",
                                    post_launch=post_launch))
        result = run(launcher.get_launch_command(job), job_dir, env=env)
        assert result.returncode == 0
        assert (job_dir / "out.txt").read_text() == f"program {name}: x\n"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd (Linux)")
def test_job_inherits_only_its_three_streams(config: psij.JobExecutorConfig, job_dir: Path,
                                             post_launch: Optional[Path]) -> None:
    code = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    job = psij.Job(psij.JobSpec(executable=sys.executable, arguments=["-c", code],
                                stdout_path="fds.txt", post_launch=post_launch))
    result = run(SingleLauncher(config=config).get_launch_command(job), job_dir)
    assert result.returncode == 0
    # 0-2 are the job's streams; the one more is the directory listdir has open.
    assert (job_dir / "fds.txt").read_text() == "[0, 1, 2, 3]\n"


# --- pre- and post-launch ------------------------------------------------------------------

def test_pre_launch_exports_reach_the_job_and_post_launch_runs_after(
        config: psij.JobExecutorConfig, job_dir: Path) -> None:
    write_script(job_dir / "pre.sh", """\
        export PRE_VALUE='from pre $(not run) "q"'
        greet() { echo "hello from $1"; }
        export -f greet
        """)
    write_script(job_dir / "post.sh", """\
        # Runs after the job: its output is complete and its status known.
        { cat out.txt; echo "status=$_PSI_J_EC"; } > post_saw.txt
        """)
    job = bash_job('echo "$PRE_VALUE"; greet job; exit 4', stdout_path="out.txt",
                   pre_launch="pre.sh", post_launch="post.sh")
    launcher = SingleLauncher(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert result.returncode == 4
    assert launched_ok(launcher, result.stdout)
    job_output = 'from pre $(not run) "q"\nhello from job\n'
    assert (job_dir / "out.txt").read_text() == job_output
    assert (job_dir / "post_saw.txt").read_text() == job_output + "status=4\n"


def test_relative_pre_launch_is_not_looked_up_on_path(config: psij.JobExecutorConfig,
                                                      job_dir: Path, tmp_path: Path) -> None:
    decoy_dir = tmp_path / "decoy"
    decoy_dir.mkdir()
    write_script(decoy_dir / "setup.sh", "export PICKED=decoy\n")
    write_script(job_dir / "setup.sh", "export PICKED=job-dir\n")
    job = bash_job('echo "$PICKED"', stdout_path="out.txt", pre_launch="setup.sh")
    env = {"PATH": f"{decoy_dir}{os.pathsep}{os.environ['PATH']}"}
    result = run(SingleLauncher(config=config).get_launch_command(job), job_dir, env=env)
    assert result.returncode == 0
    assert (job_dir / "out.txt").read_text() == "job-dir\n"


@pytest.mark.parametrize("launcher_cls", [SingleLauncher, MultipleLauncher])
def test_missing_pre_launch_is_a_launcher_failure(config: psij.JobExecutorConfig,
                                                  job_dir: Path,
                                                  launcher_cls: type) -> None:
    job = bash_job("touch job_ran", pre_launch="missing pre.sh")
    launcher = launcher_cls(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert result.returncode != 0
    assert launcher.is_launcher_failure(result.stdout)
    message = launcher.get_launcher_failure_message(result.stdout)
    assert "pre-launch script not found: missing pre.sh" in message
    assert not (job_dir / "job_ran").exists()


def test_failing_pre_launch_stops_the_launch(config: psij.JobExecutorConfig,
                                             job_dir: Path) -> None:
    write_script(job_dir / "pre.sh", "echo 'module not available' >&2\nfalse\n")
    job = bash_job("touch job_ran", pre_launch="pre.sh")
    launcher = SingleLauncher(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert launcher.is_launcher_failure(result.stdout)
    message = launcher.get_launcher_failure_message(result.stdout)
    assert "module not available" in message
    assert "pre-launch script pre.sh failed with exit status 1" in message
    assert not (job_dir / "job_ran").exists()


def test_failing_post_launch_is_a_launcher_failure(config: psij.JobExecutorConfig,
                                                   job_dir: Path) -> None:
    write_script(job_dir / "post.sh", "exit_status_of_post() { return 6; }\nexit_status_of_post\n")
    job = bash_job("touch job_ran", post_launch="post.sh")
    launcher = SingleLauncher(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert (job_dir / "job_ran").exists()
    assert launcher.is_launcher_failure(result.stdout)
    assert "post-launch script post.sh failed with exit status 6" in \
        launcher.get_launcher_failure_message(result.stdout)


@pytest.mark.parametrize("launcher_cls", [SingleLauncher, MultipleLauncher])
def test_unopenable_output_is_a_launcher_failure(config: psij.JobExecutorConfig, job_dir: Path,
                                                 launcher_cls: type,
                                                 post_launch: Optional[Path]) -> None:
    job = bash_job("touch job_ran", stdout_path="no such dir/out.txt", post_launch=post_launch)
    launcher = launcher_cls(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert result.returncode != 0
    assert launcher.is_launcher_failure(result.stdout)
    message = launcher.get_launcher_failure_message(result.stdout)
    assert "cannot open the job's streams" in message
    assert "no such dir/out.txt" in message
    assert not (job_dir / "job_ran").exists()


def test_too_few_arguments_is_a_launcher_failure(config: psij.JobExecutorConfig,
                                                 job_dir: Path) -> None:
    launcher = SingleLauncher(config=config)
    script = launcher.get_launch_command(psij.Job(psij.JobSpec("true")))[1]
    result = run(["bash", script, "id", "", "", ""], job_dir)
    assert result.returncode != 0
    assert launcher.is_launcher_failure(result.stdout)
    assert "expected at least 8 arguments" in result.stdout


def test_bad_process_count_is_a_launcher_failure(config: psij.JobExecutorConfig,
                                                 job_dir: Path) -> None:
    launcher = MultipleLauncher(config=config)
    argv = launcher.get_launch_command(bash_job("touch job_ran"))
    argv[9] = "0; touch pwned"
    result = run(argv, job_dir)
    assert launcher.is_launcher_failure(result.stdout)
    assert "process count must be a positive integer, got '0; touch pwned'" in result.stdout
    assert list(job_dir.iterdir()) == []


# --- logging -------------------------------------------------------------------------------

def test_log_file_gets_timestamped_lines(config: psij.JobExecutorConfig, job_dir: Path,
                                         tmp_path: Path, post_launch: Optional[Path]) -> None:
    log = tmp_path / "launcher.log"
    job = bash_job("exit 2", post_launch=post_launch)
    result = run(SingleLauncher(config=config).get_launch_command(job, log_file=str(log)),
                 job_dir)
    assert result.returncode == 2
    lines = log.read_text().splitlines()
    assert len(lines) >= 3
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} " + re.escape(job.id) + " ")
    assert all(stamp.match(line) for line in lines), lines
    assert any("command: bash -c exit\\ 2" in line for line in lines), lines
    if post_launch is not None:
        assert any("job exited with status 2" in line for line in lines), lines


def test_no_log_file_writes_nothing(config: psij.JobExecutorConfig, job_dir: Path) -> None:
    result = run(SingleLauncher(config=config).get_launch_command(bash_job("true")), job_dir)
    assert result.returncode == 0
    assert list(job_dir.iterdir()) == []


# --- multiple ------------------------------------------------------------------------------

def test_multiple_starts_indexed_copies(config: psij.JobExecutorConfig, job_dir: Path) -> None:
    (job_dir / "in.txt").write_text("shared input\n")
    job = bash_job('read -r line; echo "$_PSI_J_PROCESS_INDEX_/$_PSI_J_PROCESS_COUNT $line"; '
                   'echo "err $_PSI_J_PROCESS_INDEX_" >&2',
                   stdin_path="in.txt", stdout_path="out.txt", stderr_path="err.txt",
                   resources=psij.ResourceSpecV1(process_count=3))
    launcher = MultipleLauncher(config=config)
    result = run(launcher.get_launch_command(job), job_dir)
    assert result.returncode == 0
    assert launched_ok(launcher, result.stdout)
    assert sorted((job_dir / "out.txt").read_text().splitlines()) == [
        "1/3 shared input", "2/3 shared input", "3/3 shared input"]
    assert sorted((job_dir / "err.txt").read_text().splitlines()) == ["err 1", "err 2", "err 3"]


def test_multiple_exit_status_is_first_failure_by_index(config: psij.JobExecutorConfig,
                                                        job_dir: Path) -> None:
    # Copy 3 fails first in time, copy 2 first in index order.
    job = bash_job('case $_PSI_J_PROCESS_INDEX_ in 2) sleep 0.3; exit 4;; 3) exit 5;; esac',
                   resources=psij.ResourceSpecV1(process_count=3))
    result = run(MultipleLauncher(config=config).get_launch_command(job), job_dir)
    assert result.returncode == 4
    assert result.stdout.splitlines()[-1] == MARKER


def test_multiple_without_resources_runs_one_copy(config: psij.JobExecutorConfig,
                                                  job_dir: Path) -> None:
    job = bash_job('echo "$_PSI_J_PROCESS_INDEX_"', stdout_path="out.txt")
    result = run(MultipleLauncher(config=config).get_launch_command(job), job_dir)
    assert result.returncode == 0
    assert (job_dir / "out.txt").read_text() == "1\n"


def test_multiple_hostile_strings_and_shared_output(config: psij.JobExecutorConfig,
                                                    job_dir: Path, argv_dump: Path) -> None:
    job = psij.Job(psij.JobSpec(executable=sys.executable, arguments=[str(argv_dump), *HOSTILE],
                                stdout_path="o $(x).txt", stderr_path="o $(x).txt",
                                resources=psij.ResourceSpecV1(process_count=2)))
    result = run(MultipleLauncher(config=config).get_launch_command(job), job_dir)
    assert result.returncode == 0
    assert (job_dir / "o $(x).txt").read_bytes() == nul_joined(HOSTILE) * 2
    assert not list(job_dir.rglob("pwned*"))


def test_multiple_passes_termination_to_its_copies(config: psij.JobExecutorConfig,
                                                   job_dir: Path) -> None:
    job = bash_job('echo $$ > "pid.$_PSI_J_PROCESS_INDEX_"; exec sleep 30',
                   resources=psij.ResourceSpecV1(process_count=2))
    full_env = dict(os.environ)
    proc = subprocess.Popen(MultipleLauncher(config=config).get_launch_command(job),
                            cwd=job_dir, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        pid_files = [job_dir / "pid.1", job_dir / "pid.2"]
        while not all(p.exists() and p.read_text().strip() for p in pid_files):
            assert time.monotonic() < deadline, "copies did not start"
            time.sleep(0.02)
        copy_pids = [int(p.read_text()) for p in pid_files]
        proc.send_signal(signal.SIGTERM)  # the launcher only, not its process group
        output, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM
    assert output.splitlines()[-1] == MARKER
    for pid in copy_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# --- mpirun --------------------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None,
                    reason="mpirun not installed (tests/setup/system-deps.sh installs Open MPI)")
def test_mpirun_runs_two_ranks(config: psij.JobExecutorConfig, job_dir: Path,
                               tmp_path: Path) -> None:
    node_file = tmp_path / "nodes"
    node_file.write_text("localhost\nlocalhost\n")
    log = tmp_path / "mpi.log"
    job = bash_job('echo "rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-?}} $1"; exit 3',
                   stdout_path="out.txt", stderr_path="err.txt",
                   resources=psij.ResourceSpecV1(process_count=2))
    assert job.spec is not None and job.spec.arguments is not None
    job.spec.arguments = [*job.spec.arguments, "argv0", "two words $(x)"]
    launcher = MPILauncher(config=config)
    result = run(launcher.get_launch_command(job, log_file=log), job_dir,
                 env={"PSIJ_NODEFILE": str(node_file)})
    assert launched_ok(launcher, result.stdout), result.stdout
    assert result.returncode == 3
    lines = sorted((job_dir / "out.txt").read_text().splitlines())
    assert lines == ["rank=0 two words $(x)", "rank=1 two words $(x)"]
    commands = [line for line in log.read_text().splitlines() if "command:" in line]
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version:
        assert "--hostfile" in commands[-1]
        if os.geteuid() == 0:
            assert "--allow-run-as-root" in commands[-1]


# --- tools replaced by fakes on PATH -------------------------------------------------------

FAKE_TOOL = """\
#!/bin/bash
# Records its arguments, then runs what follows its options.
printf '%s\\0' "$@" > "$FAKE_ARGV_FILE"
if [[ $1 == --version ]]; then
    printf '%s\\n' "$FAKE_VERSION"
    exit 0
fi
while [[ $1 == -* ]]; do
    case $1 in
        --oversubscribe|--allow-run-as-root) shift ;;
        *) shift 2 ;;
    esac
done
exec "$@"
"""


@pytest.fixture
def fake_tools(tmp_path: Path) -> Dict[str, str]:
    bin_dir = tmp_path / "fake bin"
    bin_dir.mkdir()
    for tool in ("srun", "aprun", "jsrun", "mpirun"):
        write_script(bin_dir / tool, FAKE_TOOL)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_ARGV_FILE": str(tmp_path / "argv")}


def recorded_argv(env: Dict[str, str]) -> List[str]:
    return Path(env["FAKE_ARGV_FILE"]).read_bytes().decode().split("\0")[:-1]


@pytest.mark.parametrize(("launcher_cls", "resources", "flags"), [
    (SrunLauncher, None, ["-n", "1"]),
    (SrunLauncher, psij.ResourceSpecV1(process_count=5), ["-n", "5"]),
    (SrunLauncher, psij.ResourceSpecV1(node_count=2, processes_per_node=2,
                                       cpu_cores_per_process=3),
     ["-n", "4", "-N", "2", "--ntasks-per-node", "2", "--cpus-per-task", "3"]),
    (SrunLauncher, psij.ResourceSpecV1(node_count=3),
     ["-n", "3", "-N", "3", "--ntasks-per-node", "1"]),
    (AprunLauncher, None, ["-n", "1"]),
    (AprunLauncher, psij.ResourceSpecV1(node_count=2, process_count=4, cpu_cores_per_process=2),
     ["-n", "4", "-N", "2", "-d", "2"]),
    (JsrunLauncher, None, ["-n", "1", "-a", "1"]),
    (JsrunLauncher, psij.ResourceSpecV1(process_count=3, cpu_cores_per_process=2,
                                        gpu_cores_per_process=1),
     ["-n", "3", "-a", "1", "-c", "2", "-g", "1"]),
])
def test_scheduler_launcher_flags(config: psij.JobExecutorConfig, job_dir: Path,
                                  fake_tools: Dict[str, str], argv_dump: Path,
                                  launcher_cls: type, resources: Optional[psij.ResourceSpecV1],
                                  flags: List[str]) -> None:
    (job_dir / "in.txt").write_text("to stdin\n")
    job = psij.Job(psij.JobSpec(executable=sys.executable, arguments=[str(argv_dump), *HOSTILE],
                                stdout_path="out.txt", resources=resources))
    launcher = launcher_cls(config=config)
    result = run(launcher.get_launch_command(job), job_dir, env=fake_tools)
    assert result.returncode == 0, result.stdout
    assert launched_ok(launcher, result.stdout)
    assert recorded_argv(fake_tools) == [*flags, sys.executable, str(argv_dump), *HOSTILE]
    assert (job_dir / "out.txt").read_bytes() == nul_joined(HOSTILE)


@pytest.mark.parametrize(("version", "euid_flags", "hostfile_flag", "oversubscribe"), [
    ("mpirun (Open MPI) 4.1.4", True, "--hostfile", ["--oversubscribe"]),
    ("mpirun (Open MPI) 5.0.3", True, "--hostfile", ["--map-by", ":OVERSUBSCRIBE"]),
    ("HYDRA build details:\n    Version: 4.1.2", False, "-f", []),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.9", False, "-f", []),
    ("some other mpirun 1.0", False, None, []),
])
def test_mpirun_flavours(config: psij.JobExecutorConfig, job_dir: Path, tmp_path: Path,
                         fake_tools: Dict[str, str], version: str, euid_flags: bool,
                         hostfile_flag: Optional[str], oversubscribe: List[str]) -> None:
    node_file = tmp_path / "node file $(x)"
    node_file.write_text("localhost\nlocalhost\n")
    job = bash_job("echo ran", stdout_path="out.txt",
                   resources=psij.ResourceSpecV1(process_count=2))
    env = {**fake_tools, "FAKE_VERSION": version, "PSIJ_NODEFILE": str(node_file)}
    result = run(MPILauncher(config=config).get_launch_command(job), job_dir, env=env)
    assert result.returncode == 0, result.stdout
    expected = list(oversubscribe)
    if euid_flags and os.geteuid() == 0:
        expected.append("--allow-run-as-root")
    if hostfile_flag is not None:
        expected += [hostfile_flag, str(node_file)]
    expected += ["-n", "2", "bash", "-c", "echo ran"]
    assert recorded_argv(fake_tools) == expected
    assert (job_dir / "out.txt").read_text() == "ran\n"


def test_mpirun_ignores_a_missing_node_file(config: psij.JobExecutorConfig, job_dir: Path,
                                            tmp_path: Path, fake_tools: Dict[str, str]) -> None:
    env = {**fake_tools, "FAKE_VERSION": "HYDRA", "PSIJ_NODEFILE": str(tmp_path / "absent")}
    job = bash_job("true", resources=psij.ResourceSpecV1(process_count=2))
    result = run(MPILauncher(config=config).get_launch_command(job), job_dir, env=env)
    assert result.returncode == 0
    assert recorded_argv(fake_tools) == ["-n", "2", "bash", "-c", "true"]


def test_mpirun_found_through_pre_launch(config: psij.JobExecutorConfig, job_dir: Path,
                                         fake_tools: Dict[str, str]) -> None:
    fake_dir = fake_tools["PATH"].split(os.pathsep)[0]
    pre = job_dir / "modules.sh"
    pre.write_text(f"export PATH={_sh_quote(fake_dir)}:/usr/bin:/bin\n")
    job = bash_job("echo ran", stdout_path="out.txt", pre_launch=pre,
                   resources=psij.ResourceSpecV1(process_count=2))
    env = {"PATH": "/usr/bin:/bin", "FAKE_ARGV_FILE": fake_tools["FAKE_ARGV_FILE"],
           "FAKE_VERSION": "HYDRA"}
    result = run(MPILauncher(config=config).get_launch_command(job), job_dir, env=env)
    assert result.returncode == 0, result.stdout
    assert recorded_argv(fake_tools)[:2] == ["-n", "2"]


def test_missing_mpirun_is_a_launcher_failure(config: psij.JobExecutorConfig, job_dir: Path,
                                              tmp_path: Path) -> None:
    empty = tmp_path / "empty bin"
    empty.mkdir()
    (empty / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
    launcher = MPILauncher(config=config)
    argv = launcher.get_launch_command(bash_job("true"))
    result = run([str(empty / "bash"), *argv[1:]], job_dir, env={"PATH": str(empty)})
    assert launcher.is_launcher_failure(result.stdout)
    assert "mpirun not found" in launcher.get_launcher_failure_message(result.stdout)


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# --- deployment ----------------------------------------------------------------------------

def deployed_folders(work: Path) -> List[str]:
    return sorted(p.name for p in (work / "launchers").iterdir())


def test_deploy_is_idempotent(config: psij.JobExecutorConfig) -> None:
    job = psij.Job(psij.JobSpec("true"))
    first = SingleLauncher(config=config).get_launch_command(job)[1]
    second = SingleLauncher(config=config).get_launch_command(job)[1]
    assert first == second
    folder = Path(first).parent
    assert deployed_folders(config.work_directory) == [folder.name]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    lib = _data.data_dir("launchers") / "launcher_lib.sh"
    assert (folder / "launcher_lib.sh").read_bytes() == lib.read_bytes()
    assert stat.S_IMODE((folder / "single_launch.sh").stat().st_mode) & 0o077 == 0
    MultipleLauncher(config=config).get_launch_command(job)
    assert len(deployed_folders(config.work_directory)) == 2


def test_deployed_folder_is_named_by_the_sha256_of_names_and_contents(
        config: psij.JobExecutorConfig) -> None:
    launcher = SingleLauncher(config=config)
    folder = Path(launcher.get_launch_command(psij.Job(psij.JobSpec("true")))[1]).parent
    digest = hashlib.sha256()
    for path in launcher._files_to_deploy():
        for part in (path.name.encode(), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "big") + part)
    assert folder.name == digest.hexdigest()[:32]


def test_changed_script_gets_a_new_folder(tmp_path: Path) -> None:
    script = tmp_path / "custom_launch.sh"
    script.write_text('source "$(dirname "$0")/launcher_lib.sh"\necho v1\n')
    config = psij.JobExecutorConfig(work_directory=tmp_path / "work")
    job = psij.Job(psij.JobSpec("true"))
    old = ScriptBasedLauncher(script, config).get_launch_command(job)[1]
    script.write_text('source "$(dirname "$0")/launcher_lib.sh"\necho v2\n')
    new = ScriptBasedLauncher(script, config).get_launch_command(job)[1]
    assert old != new
    assert Path(old).read_text().endswith("v1\n") and Path(new).read_text().endswith("v2\n")


def test_edited_deployment_is_replaced(config: psij.JobExecutorConfig,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    job = psij.Job(psij.JobSpec("true"))
    script = Path(SingleLauncher(config=config).get_launch_command(job)[1])
    original = script.read_bytes()
    script.write_text("broken\n")
    monkeypatch.setattr(script_based_launcher, "_deployed", {})  # as in a fresh process
    again = Path(SingleLauncher(config=config).get_launch_command(job)[1])
    assert again == script
    assert script.read_bytes() == original
    assert deployed_folders(config.work_directory) == [script.parent.name]


def test_deploy_refuses_two_files_with_one_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.sh").write_text("1")
    (tmp_path / "b" / "x.sh").write_text("2")
    with pytest.raises(ValueError, match=r"x\.sh"):
        deploy_files(tmp_path / "work", [tmp_path / "a" / "x.sh", tmp_path / "b" / "x.sh"])


def test_missing_script_is_reported(config: psij.JobExecutorConfig, tmp_path: Path) -> None:
    launcher = ScriptBasedLauncher(tmp_path / "nope.sh", config)
    with pytest.raises(FileNotFoundError, match=r"nope\.sh"):
        launcher.get_launch_command(psij.Job(psij.JobSpec("true")))


def test_concurrent_deploys_end_in_one_folder(tmp_path: Path) -> None:
    work = tmp_path / "shared work"
    start_at = time.time() + 1.0
    code = textwrap.dedent(f"""\
        import time, psij
        from psij.launchers.single import SingleLauncher
        from psij.launchers.script_based_launcher import deploy_files
        launcher = SingleLauncher(psij.JobExecutorConfig(work_directory={str(work)!r}))
        files = launcher._files_to_deploy()
        time.sleep(max(0.0, {start_at!r} - time.time()))
        print(deploy_files(launcher.config.work_directory, files))
        """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outputs)) == 1
    folder = Path(outputs[0])
    assert deployed_folders(work) == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == ["launcher_lib.sh", "single_launch.sh"]


# --- data folders --------------------------------------------------------------------------

def test_data_dir_finds_the_source_tree() -> None:
    folder = _data.data_dir("launchers")
    assert (folder / "launcher_lib.sh").is_file()
    assert _data.data_dir("templates").is_dir()
    with pytest.raises(ValueError, match="'scripts'"):
        _data.data_dir("scripts")


def test_data_dir_prefers_the_installed_copy(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "src" / "psij"
    package.mkdir(parents=True)
    monkeypatch.setattr(_data, "__file__", str(package / "_data.py"))
    _data.data_dir.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="launchers"):
            _data.data_dir("launchers")
        (tmp_path / "launchers").mkdir()
        assert _data.data_dir("launchers") == tmp_path / "launchers"
        _data.data_dir.cache_clear()
        (package / "_data" / "launchers").mkdir(parents=True)
        assert _data.data_dir("launchers") == package / "_data" / "launchers"
    finally:
        _data.data_dir.cache_clear()
