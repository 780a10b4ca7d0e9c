"""Jobs that can never start, on the real four-node Slurm started by tests/setup
(start-slurm.sh: partition ``debug`` of nodes n1..n4, 4096 MiB each, EnforcePartLimits off).

A job asking for five nodes is accepted and stays pending with the reason
``PartitionNodeLimit`` (``PartitionConfig`` for its first second): without ``fail_unstartable``
it stays QUEUED and its status says why; with it, it ends FAILED with that reason and is
cancelled in Slurm. A job asking for more memory than any node has is refused by sbatch, which
``submit`` raises with Slurm's words, whatever the option. Without such a Slurm the tests skip,
saying why.

On the real Grid Engine (one host, queue all.q of 8 slots), a job asking for 500 slots waits in
``qw`` without the option and is refused by qsub (``-w e``) with it.
"""

import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from psij import (
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    ResourceSpecV1,
    SubmitException,
)
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
from psij.executors.batch.slurm import SlurmExecutorConfig
from real.test_batch_real import _scheduler_problem

WAIT = timedelta(seconds=120)
GIB = 1 << 30


def _nodes_problem() -> Optional[str]:
    problem = _scheduler_problem("slurm")
    if problem is not None:
        return problem
    out = subprocess.run(["sinfo", "--noheader", "--partition=debug", "--format=%D %m"],
                         capture_output=True, text=True, timeout=60).stdout.split()
    if len(out) != 2 or out[0] != "4":
        return (f"the partition debug does not have 4 nodes here (sinfo: {' '.join(out)!r}; "
                "tests/setup/start-slurm.sh makes n1..n4)")
    if not out[1].rstrip("+").isdigit() or int(out[1].rstrip("+")) >= 8192:
        return f"the nodes of partition debug have {out[1]} MiB, not less than 8 GiB"
    return None


class Executors:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.made: List[BatchSchedulerExecutor] = []
        self.jobs: List[Job] = []

    def get(self, fail: bool) -> BatchSchedulerExecutor:
        config = SlurmExecutorConfig(work_directory=self.work / f"psij-{fail}",
                                     queue_polling_interval=1, initial_queue_polling_delay=0.5,
                                     fail_unstartable=fail)
        ex = JobExecutor.get_instance("slurm", config=config)
        assert isinstance(ex, BatchSchedulerExecutor)
        self.made.append(ex)
        return ex

    def job(self, **resources: int) -> Job:
        job = Job(JobSpec("/bin/true", resources=ResourceSpecV1(**resources),
                          attributes=JobAttributes(duration=timedelta(minutes=1))))
        self.jobs.append(job)
        return job


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[Executors]:
    problem = _nodes_problem()
    if problem is not None:
        pytest.skip(problem)
    made = Executors(tmp_path)
    yield made
    for job in made.jobs:
        if job.native_id is not None and not job.status.state.final:
            try:
                job.cancel()
            except Exception:
                pass
    for ex in made.made:
        ex.close()


def _squeue_state(native_id: str) -> str:
    return subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={native_id}",
                           "--format=%T|%r"], capture_output=True, text=True,
                          timeout=60).stdout.strip()


@pytest.mark.slurm
def test_five_nodes_stay_queued_saying_why(slurm: Executors) -> None:
    job = slurm.job(node_count=5)
    slurm.get(False).submit(job)
    deadline = time.monotonic() + WAIT.total_seconds()
    while "PartitionNodeLimit" not in str(job.status.message) and time.monotonic() < deadline:
        time.sleep(0.2)
    st = job.status
    print(st, _squeue_state(str(job.native_id)))
    assert st.state is JobState.QUEUED, st
    assert "never start this job" in str(st.message) and "PartitionNodeLimit" in str(st.message)
    assert st.metadata is not None and st.metadata["unstartable"] == "PartitionNodeLimit"
    assert _squeue_state(str(job.native_id)) == "PENDING|PartitionNodeLimit"
    job.cancel()
    end = job.wait(WAIT)
    assert end is not None and end.state is JobState.CANCELED, end


@pytest.mark.slurm
def test_five_nodes_fail_and_are_cancelled_with_the_option(slurm: Executors) -> None:
    job = slurm.job(node_count=5)
    slurm.get(True).submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED, st
    # Slurm 22.05 says PartitionConfig at the submission's scheduling attempt, then
    # PartitionNodeLimit: the first poll may see either.
    assert st.metadata is not None and st.metadata["cause"] == "unstartable"
    reason = st.metadata["reason"]
    assert reason in ("PartitionConfig", "PartitionNodeLimit"), st
    assert f"reason {reason}" in str(st.message) and "cancelled" in str(st.message), st
    assert st.exit_code is None
    left = _squeue_state(str(job.native_id))
    print(st, left)
    assert left == "" or left.startswith("CANCELLED"), left  # nothing pending stays behind


@pytest.mark.slurm
@pytest.mark.parametrize("fail", [False, True])
def test_more_memory_than_any_node_is_refused_at_submit(slurm: Executors, fail: bool) -> None:
    job = slurm.job(memory=8 * GIB)
    with pytest.raises(SubmitException) as e:
        slurm.get(fail).submit(job)
    print(e.value)
    assert "Requested node configuration is not available" in str(e.value)
    assert job.status.state is JobState.NEW and job.native_id is None


@pytest.mark.slurm
def test_a_job_within_the_partition_still_runs_with_the_option(slurm: Executors) -> None:
    job = slurm.job(node_count=4)
    slurm.get(True).submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st


@pytest.mark.slurm
@pytest.mark.parametrize("fail", [False, True])
def test_an_unknown_account_is_refused_or_runs_as_the_site_enforces(slurm: Executors,
                                                                    fail: bool) -> None:
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                            timeout=60).stdout
    enforce = next((line.partition("=")[2].strip() for line in config.splitlines()
                    if line.startswith("AccountingStorageEnforce")), "")
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        account="psij-no-such-account", duration=timedelta(minutes=1))))
    slurm.jobs.append(job)
    ex = slurm.get(fail)
    if "associations" in enforce:
        with pytest.raises(SubmitException, match="Invalid account"):
            ex.submit(job)
        return
    # Not enforced (the test cluster: "none"): Slurm runs it under the default account.
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, (enforce, st)


@pytest.mark.sge
@pytest.mark.parametrize("fail", [False, True])
def test_sge_slots_no_queue_offers(tmp_path: Path, fail: bool) -> None:
    from psij.executors.batch.sge import SgeExecutorConfig

    problem = _scheduler_problem("sge")
    if problem is not None:
        pytest.skip(problem)
    config = SgeExecutorConfig(work_directory=tmp_path / "psij", queue_polling_interval=1,
                               initial_queue_polling_delay=0.5, fail_unstartable=fail)
    ex = JobExecutor.get_instance("sge", config=config)
    job = Job(JobSpec("/bin/true", resources=ResourceSpecV1(process_count=500)))
    try:
        if fail:
            with pytest.raises(SubmitException, match="no suitable queues"):
                ex.submit(job)
            assert job.status.state is JobState.NEW and job.native_id is None
            return
        ex.submit(job)
        time.sleep(3)
        assert job.status.state is JobState.QUEUED, job.status
        job.cancel()
        end = job.wait(WAIT)
        assert end is not None and end.state is JobState.CANCELED, end
    finally:
        if job.native_id is not None and not job.status.state.final:
            job.cancel()
        ex.close()
