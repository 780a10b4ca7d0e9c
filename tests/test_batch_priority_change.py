"""``set_priority`` of a job a batch executor has taken: a queued job gets the scheduler's
value with ``use_nice`` through the scheduler's own command (each backend's, run through a fake
runner), nothing otherwise; hostile values and jobs in the wrong place are refused by name
before anything changes. The held-job order is in tests/test_batch_held_jobs.py, the real Slurm
and Grid Engine in tests/real/test_batch_priority_real.py."""

import math
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobExecutorConfig,
    JobSpec,
    JobState,
    JobStatus,
    SubmitException,
)
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from psij.executors.batch._runner import FakeCommandRunner

# name -> (what its submit command prints, the native id, the command that changes the nice
# of that job for priority 7)
BACKENDS = {
    "slurm": ("123\n", "123", ["scontrol", "update", "JobId=123", "Nice=9993"]),
    "sge": ("123\n", "123", ["qalter", "-p", "-505", "123"]),
    "pbs": ("123.pbs1\n", "123.pbs1", ["qalter", "-p", "7", "123.pbs1"]),
    "pbs_classic": ("123.host\n", "123.host", ["qalter", "-p", "7", "123.host"]),
    "lsf": ("Job <123> is submitted to queue <normal>.\n", "123", ["bmod", "-sp", "57", "123"]),
}


def submitted(name: str, tmp_path: Path, use_nice: bool = True,
              answer: Tuple[Any, ...] = (0, "")) -> Tuple[Any, Job, FakeCommandRunner]:
    """An executor (no poll comes during a test) and a job it submitted; other commands get
    ``answer``."""
    out = BACKENDS[name][0]
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path, use_nice=use_nice, queue_polling_interval=300,
        initial_queue_polling_delay=300))

    def respond(argv: Tuple[str, ...], stdin: Optional[str]) -> Any:
        return (0, out) if argv[0] in ("sbatch", "qsub", "bsub") else answer

    runner = FakeCommandRunner(respond)
    ex._runner = runner
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"psij.priority": 1})))
    ex.submit(job)
    assert job.native_id == BACKENDS[name][1]
    return ex, job, runner


def changes(runner: FakeCommandRunner) -> List[List[str]]:
    return [list(c) for c in runner.calls if c[0] in ("scontrol", "qalter", "bmod")]


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_use_nice_gives_a_queued_job_its_new_value(name: str, tmp_path: Path) -> None:
    ex, job, runner = submitted(name, tmp_path)
    try:
        assert ex.set_priority(job, 7) is True
        assert changes(runner) == [BACKENDS[name][2]]
        # What a later script or submission of this job would say is the new priority.
        assert job.spec.attributes.custom_attributes["psij.priority"] == 7  # type: ignore
    finally:
        ex.close()


def test_without_use_nice_the_scheduler_keeps_its_order(tmp_path: Path) -> None:
    ex, job, runner = submitted("slurm", tmp_path, use_nice=False)
    try:
        assert ex.set_priority(job, 7) is False
        assert changes(runner) == []
    finally:
        ex.close()


def test_a_refused_change_says_what_the_scheduler_said(tmp_path: Path) -> None:
    ex, job, _ = submitted("slurm", tmp_path, answer=(
        1, "", "scontrol: error: Access/permission denied for job 123\n"))
    try:
        with pytest.raises(SubmitException, match=f"job {job.id}: the scheduler did not take "
                                                  "its new priority.*permission denied"):
            ex.set_priority(job, 7)
    finally:
        ex.close()


@pytest.mark.parametrize("bad,error", [
    ("high", TypeError), (True, TypeError), (None, TypeError), ([1], TypeError),
    (math.nan, ValueError), (math.inf, ValueError), (-math.inf, ValueError)])
def test_hostile_priorities_are_refused_by_name(tmp_path: Path, bad: Any,
                                               error: type) -> None:
    ex, job, runner = submitted("slurm", tmp_path)
    try:
        with pytest.raises(error, match="set_priority priority"):
            ex.set_priority(job, bad)
        assert changes(runner) == []
        assert job.spec.attributes.custom_attributes["psij.priority"] == 1  # type: ignore
    finally:
        ex.close()


def test_jobs_in_the_wrong_place_are_refused(tmp_path: Path) -> None:
    ex, job, runner = submitted("slurm", tmp_path)
    other = JobExecutor.get_instance("slurm", config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "other"))
    try:
        with pytest.raises(InvalidJobException, match="was not submitted to"):
            other.set_priority(job, 3)
        with pytest.raises(InvalidJobException, match="was not submitted to"):
            ex.set_priority(Job(JobSpec("/bin/true")), 3)
        with pytest.raises(TypeError, match="set_priority job"):
            ex.set_priority("123", 3)  # type: ignore[arg-type]
        job._set_status(JobStatus(JobState.ACTIVE))
        assert ex.set_priority(job, 3) is False  # it runs: nothing orders it any more
        job._set_status(JobStatus(JobState.COMPLETED, exit_code=0))
        with pytest.raises(InvalidJobException, match="COMPLETED.*no longer matters"):
            ex.set_priority(job, 3)
        assert changes(runner) == []
    finally:
        ex.close()
        other.close()


def test_executors_without_priorities_say_so(tmp_path: Path) -> None:
    local = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    job = Job(JobSpec("/bin/sleep", ["5"]))
    local.submit(job)
    try:
        with pytest.raises(SubmitException, match="local executor cannot change the priority"):
            local.set_priority(job, 3)
    finally:
        job.cancel()
        job.wait()
