"""A pilot inside a real Slurm allocation (the Slurm started by tests/setup): the pilot is
submitted as a Slurm job through the ``slurm`` executor, and 200 jobs are sent into it through
the ``pilot`` executor's URL. Each task sees the SLURM_*/QCG_PM_* variables of its own share,
not those of the pilot's allocation. Without a running Slurm the test skips, saying why."""

import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Optional

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, ResourceSpecV1
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.pilot.service import PilotClient, answering

WAIT = timedelta(seconds=120)


def _slurm_problem() -> Optional[str]:
    setup = "tests/setup/start-slurm.sh starts one as root with apt-get"
    if shutil.which("sbatch") is None:
        return f"Slurm is not installed ({setup})"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "UP" not in ping.stdout:
        return f"Slurm is not running: scontrol ping says {ping.stdout.strip()!r} ({setup})"
    return None


@pytest.mark.slurm
def test_a_pilot_submitted_to_slurm_runs_200_jobs_with_their_own_share(
        shared_dir: Path) -> None:
    problem = _slurm_problem()
    if problem is not None:
        pytest.skip(problem)
    socket_path = shared_dir / "pilot.sock"
    slurm = JobExecutor.get_instance("slurm", config=BatchSchedulerExecutorConfig(
        work_directory=shared_dir / "psij", queue_polling_interval=1,
        initial_queue_polling_delay=0.5))
    pilot_job = Job(JobSpec(
        sys.executable, ["-m", "psij", "pilot", "serve", "--socket", str(socket_path),
                         "--wd", str(shared_dir / "wd")],
        stdout_path=shared_dir / "pilot.out", stderr_path=shared_dir / "pilot.err",
        resources=ResourceSpecV1(process_count=2)))
    slurm.submit(pilot_job)
    try:
        deadline = time.monotonic() + WAIT.total_seconds()
        while not answering(str(socket_path), timeout=1):
            assert not pilot_job.status.final, \
                f"the pilot job ended: {pilot_job.status}; {_read(shared_dir / 'pilot.err')}"
            assert time.monotonic() < deadline, "the pilot did not start within the wait"
            time.sleep(0.2)

        pilot = JobExecutor.get_instance("pilot", url=f"unix://{socket_path}")
        show = ('echo "$SLURM_JOB_NODELIST $SLURM_NTASKS $SLURM_NNODES $SLURM_TASKS_PER_NODE '
                '$QCG_PM_NPROCS $QCG_PM_NODELIST $QCG_PM_STEP_ID $(wc -l < $PSIJ_NODEFILE) '
                '${SLURM_JOB_ID:+has-job-id}"')
        out = shared_dir / "out"
        out.mkdir()
        jobs = [Job(JobSpec("/bin/sh", ["-c", show], stdout_path=out / str(i)))
                for i in range(199)]
        jobs.append(Job(JobSpec("/bin/sh", ["-c", show], stdout_path=out / "wide",
                                resources=ResourceSpecV1(process_count=2))))
        for job in jobs:
            pilot.submit(job)
        assert [j.wait(WAIT).state for j in jobs] == [JobState.COMPLETED] * 200  # type: ignore
        node = _read(out / "0").split()[0]
        for i, job in enumerate(jobs[:-1]):
            assert _read(out / str(i)).split() == [node, "1", "1", "1", "1", node,
                                                  job.native_id, "1", "has-job-id"]
        assert _read(out / "wide").split() == [node, "2", "1", "2", "2", node,
                                               jobs[-1].native_id, "2", "has-job-id"]

        client = PilotClient(str(socket_path))
        try:
            assert client.request("usage")["usage"]["total_cores"] == 2  # the Slurm share
            client.request("shutdown")
        finally:
            client.close()
        final = pilot_job.wait(WAIT)
        assert final is not None and final.state is JobState.COMPLETED, \
            f"{final}; {_read(shared_dir / 'pilot.err')}"
    finally:
        if not pilot_job.status.final:
            pilot_job.cancel()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
