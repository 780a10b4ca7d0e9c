"""``set_priority`` and ``psij priority`` on the real Slurm and Grid Engine of this machine
(run under ``flock -s /tmp/psij-test-schedulers.lock``): with ``use_nice`` a queued job's
nice (``squeue %y``) or priority (``qstat -j``) follows the new priority, from this process and
from another one through the registry; the jobs held back by ``max_queued_per_shape`` go to
the scheduler in their new order."""

import os
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, List

import pytest

import psij.registry
from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig

WAIT = timedelta(seconds=180)
SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]
ON_HOLD = {"slurm": {"slurm.hold": True}, "sge": {"sge.h": True}}
RELEASE = {"slurm": ["scontrol", "release"], "sge": ["qrls"]}
PSIJ = str(Path(sys.executable).parent / "psij")


def scheduler_value(name: str, native_id: str) -> int:
    """The job's nice (Slurm) or priority (Grid Engine) as the scheduler shows it."""
    if name == "slurm":
        out = subprocess.run(["squeue", "-h", "-j", native_id, "-o", "%y"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
        return int(out.strip())
    out = subprocess.run(["qstat", "-j", native_id], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    match = re.search(r"^priority:\s+(-?\d+)", out, re.MULTILINE)
    assert match is not None, out
    return int(match.group(1))


# priority -> the scheduler's value (tests/test_batch_nice.py checks the mapping itself)
VALUES = {"slurm": {1: 9999, 40: 9960, 7: 9993}, "sge": {1: -511, 40: -472, 7: -505}}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_queued_job_gets_its_new_priority_here_and_from_another_process(
        name: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=home / ".psij" / "work", use_nice=True, queue_polling_interval=1,
        initial_queue_polling_delay=0.2))
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        duration=timedelta(minutes=2), custom_attributes={"psij.priority": 1, **ON_HOLD[name]})))
    try:
        ex.submit(job)
        native_id = str(job.native_id)
        assert scheduler_value(name, native_id) == VALUES[name][1]
        assert ex.set_priority(job, 40) is True
        assert scheduler_value(name, native_id) == VALUES[name][40]
        psij.registry.flush()
        # Another process finds the job in the registry, as `psij cancel` does.
        done = subprocess.run([PSIJ, "priority", job.id, "7"], capture_output=True, text=True,
                              env=dict(os.environ, HOME=str(home)), timeout=120)
        assert done.returncode == 0, done
        assert done.stdout == f"{job.id}: priority 7\n"
        assert scheduler_value(name, native_id) == VALUES[name][7]
    finally:
        job.cancel()
        job.wait(WAIT)
        ex.close()


@pytest.mark.parametrize("name", SCHEDULERS)
def test_held_back_jobs_go_to_the_scheduler_in_their_new_order(name: str,
                                                               tmp_path: Path) -> None:
    # Every job is submitted on hold, and released by this test as soon as it is queued in
    # the scheduler: the slot of the one shape (cap 1) is free again once it starts, so the
    # jobs are given to the scheduler one by one, and their ids tell in which order.
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "w", max_queued_per_shape=1, queue_polling_interval=30,
        initial_queue_polling_delay=0.3))

    def make(priority: int) -> Job:
        return Job(JobSpec("/bin/true", attributes=JobAttributes(
            duration=timedelta(minutes=2),
            custom_attributes={"psij.priority": priority, **ON_HOLD[name]})))

    first = make(100)
    jobs: Dict[str, Job] = {"a": make(1), "b": make(2), "c": make(3)}
    released: List[str] = []
    try:
        ex.submit(first)
        for job in jobs.values():
            ex.submit(job)
            assert job.native_id is None  # held back behind the first
        assert ex.set_priority(jobs["a"], 10) is True
        assert ex.set_priority(jobs["c"], 5) is True
        deadline = time.monotonic() + 150
        while len(released) < 4:
            assert time.monotonic() < deadline, f"released only {released}"
            for job in (first, *jobs.values()):
                if job.native_id is not None and job.native_id not in released:
                    subprocess.run([*RELEASE[name], job.native_id], capture_output=True,
                                   check=True, timeout=30)
                    released.append(job.native_id)
            time.sleep(0.1)
        for job in (first, *jobs.values()):
            st = job.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED, st
    finally:
        for job in (first, *jobs.values()):
            if not job.status.final:
                job.cancel()
        ex.close()
    order = sorted(jobs, key=lambda k: int(str(jobs[k].native_id).split(".")[0]))
    assert order == ["a", "c", "b"]
