"""The script-based launchers ``single`` and ``multiple``, run for real with bash.

Each test builds the launch command with a launcher class, runs it in a job directory and checks
what the job saw (arguments, environment, streams) and what the launcher reported (exit status,
completion marker, failure message, log). The launchers that wrap a scheduler's or an MPI
tool are in tests/test_launchers_parallel_tools.py, the deployment of the launcher scripts in
tests/test_launchers_script_based_launcher.py.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

import psij
from psij.exceptions import InvalidJobException
from psij.launchers.aprun import AprunLauncher
from psij.launchers.jsrun import JsrunLauncher
from psij.launchers.mpirun import MPILauncher
from psij.launchers.multiple import MultipleLauncher
from psij.launchers.single import SingleLauncher
from psij.launchers.srun import SrunLauncher
from support.launchers import HOSTILE, MARKER, bash_job, launched_ok, nul_joined, run, write_script

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
