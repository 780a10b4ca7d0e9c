"""A job over its memory on the real Slurm started by tests/setup (start-slurm.sh), where memory
is a consumable resource enforced through the cgroup memory controller (task/cgroup,
ConstrainRAMSpace): the job is killed and ends FAILED, cause ``out_of_memory``, with a message
saying so, whether its batch script or an srun step used too much; a job within its memory
completes. The status polls are 300 s apart: each end is seen from the job's files and its cause
from the status command run a second later. Without such a Slurm the tests skip, saying why.
"""

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, Optional

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1
from psij.executors.batch.slurm import SlurmExecutorConfig
from real.test_batch_real import _scheduler_problem

pytestmark = pytest.mark.slurm

WAIT = timedelta(seconds=240)
MIB = 1 << 20
# Writes every page of `size` MiB (b"x" * n fills the bytes: they are really used).
HOG = "import sys, time; data = b'x' * (int(sys.argv[1]) << 20); time.sleep(1); print(len(data))"


def _memory_problem() -> Optional[str]:
    """Why Slurm here cannot kill a job for its memory, or None when it can."""
    problem = _scheduler_problem("slurm")
    if problem is not None:
        return problem
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                            timeout=60).stdout
    settings = {}
    for line in config.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            settings[key.strip()] = value.strip()
    if "cgroup" not in settings.get("TaskPlugin", ""):
        return (f"Slurm does not enforce memory here (TaskPlugin={settings.get('TaskPlugin')}; "
                "tests/setup/start-slurm.sh sets task/cgroup where the machine has a writable "
                "cgroup memory controller)")
    if "MEMORY" not in settings.get("SelectTypeParameters", "").upper():
        return ("memory is not a consumable resource of this Slurm (SelectTypeParameters="
                f"{settings.get('SelectTypeParameters')})")
    return None


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Job]]:
    problem = _memory_problem()
    if problem is not None:
        pytest.skip(problem)
    work = tmp_path_factory.mktemp("oom")
    # Status polls 300 s apart: the ends come from the jobs' files, and their causes from the
    # status command run a second after such an end.
    config = SlurmExecutorConfig(work_directory=work / "psij", queue_polling_interval=300,
                                 initial_queue_polling_delay=300)
    ex = JobExecutor.get_instance("slurm", config=config)
    made: Dict[str, Job] = {}
    attributes = JobAttributes(duration=timedelta(minutes=5))
    # Over: 400 MiB used with 100 asked for, in the batch script itself (single launcher) or
    # in an srun step. Within: 40 MiB used with 200 asked for.
    for key, asked, used, launcher in (("over", 100, 400, "single"),
                                       ("over-srun", 100, 400, "srun"),
                                       ("within", 200, 40, "single")):
        job = Job(JobSpec(sys.executable, ["-c", HOG, str(used)], launcher=launcher,
                          stdout_path=work / f"{key}.out", stderr_path=work / f"{key}.err",
                          resources=ResourceSpecV1(memory=asked * MIB),
                          attributes=attributes))
        ex.submit(job)
        made[key] = job
    yield made
    for job in made.values():
        if not job.status.state.final:
            job.cancel()
    ex.close()


def test_a_job_over_its_memory_fails_saying_so(jobs: Dict[str, Job]) -> None:
    job = jobs["over"]
    st = job.wait(WAIT)
    assert st is not None, f"job {job.native_id} did not end"
    assert st.state is JobState.FAILED, st
    assert st.metadata is not None and st.metadata["cause"] == "out_of_memory", st
    assert "ran out of memory" in str(st.message), st
    assert "ResourceSpecV1.memory" in str(st.message), st
    # What Slurm itself says: the controller at once; the accounting (slurmdbd) a moment
    # later, for the allocation and the batch step that was killed.
    squeue = subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={job.native_id}",
                             "--format=%T|%r"], capture_output=True, text=True,
                            timeout=60).stdout.strip()
    assert squeue in ("OUT_OF_MEMORY|OutOfMemory", ""), squeue  # "": purged already
    deadline = time.monotonic() + 60
    while True:
        sacct = subprocess.run(["sacct", "--noheader", "--parsable2",
                                f"--jobs={job.native_id}", "--format=JobID,State,ExitCode"],
                               capture_output=True, text=True, timeout=60).stdout
        if sacct.count("OUT_OF_MEMORY") >= 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    print(squeue, sacct)
    assert f"{job.native_id}|OUT_OF_MEMORY|0:125\n" in sacct, sacct
    assert f"{job.native_id}.batch|OUT_OF_MEMORY|0:125\n" in sacct, sacct


def test_a_job_whose_srun_step_is_over_its_memory_fails_saying_so(jobs: Dict[str, Job]
                                                                  ) -> None:
    # Slurm marks only the step OUT_OF_MEMORY; the job reads FAILED (NonZeroExitCode) with
    # srun's exit code, and squeue's derived exit code says a step ran out of memory.
    job = jobs["over-srun"]
    st = job.wait(WAIT)
    assert st is not None, f"job {job.native_id} did not end"
    assert st.state is JobState.FAILED, st
    assert st.metadata is not None and st.metadata["cause"] == "out_of_memory", st
    assert st.metadata["native_state"] == "FAILED", st
    assert "ran out of memory" in str(st.message), st
    deadline = time.monotonic() + 60
    while True:
        sacct = subprocess.run(["sacct", "--noheader", "--parsable2",
                                f"--jobs={job.native_id}", "--format=JobID,State,ExitCode"],
                               capture_output=True, text=True, timeout=60).stdout
        if f"{job.native_id}.0|" in sacct or time.monotonic() > deadline:
            break
        time.sleep(1)
    print(sacct)
    assert f"{job.native_id}|FAILED|" in sacct, sacct
    assert f"{job.native_id}.0|OUT_OF_MEMORY|0:125\n" in sacct, sacct


def test_a_job_within_its_memory_completes(jobs: Dict[str, Job]) -> None:
    job = jobs["within"]
    st = job.wait(WAIT)
    assert st is not None, f"job {job.native_id} did not end"
    assert st.state is JobState.COMPLETED and st.exit_code == 0, st
    assert job.spec is not None and job.spec.stdout_path is not None
    assert Path(job.spec.stdout_path).read_text().strip() == str(40 * MIB)
