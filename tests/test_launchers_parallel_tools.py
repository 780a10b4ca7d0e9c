"""The launchers that start a job through a parallel tool: ``mpirun``, ``srun``, ``aprun`` and
``jsrun``, run for real with bash. srun, aprun, jsrun and other MPI flavours are replaced by
small fakes on PATH that record their arguments; Open MPI's mpirun runs for real when
installed.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import psij
from psij.launchers.aprun import AprunLauncher
from psij.launchers.jsrun import JsrunLauncher
from psij.launchers.mpirun import MPILauncher
from psij.launchers.srun import SrunLauncher
from support.launchers import HOSTILE, bash_job, launched_ok, nul_joined, run, write_script

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
