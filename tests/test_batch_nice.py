"""``use_nice``: the documented mapping of priorities to each scheduler's option (monotonic,
clamped to the range a user may set), as written into real submit scripts; off by default."""

import math
from pathlib import Path

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobExecutor, JobSpec
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from psij.executors.batch._nice import LSF_NICE, PBS_NICE, SGE_NICE, SLURM_NICE, NiceMapping

PRIORITIES = [-1e300, -5000, -3.5, -1, 0, 0.5, 1, 2, 99.9, 5000, 1e300]


@pytest.mark.parametrize("mapping,first_is_low", [
    (SLURM_NICE, True), (SGE_NICE, False), (PBS_NICE, False), (LSF_NICE, False)])
def test_mapping_is_monotonic_and_stays_in_range(mapping: NiceMapping,
                                                 first_is_low: bool) -> None:
    values = [mapping.value(p) for p in PRIORITIES]
    assert all(mapping.low <= v <= mapping.high for v in values)
    # Slurm: a lower nice goes first; the others: a higher value goes first
    ordered = values == sorted(values, reverse=True) if first_is_low \
        else values == sorted(values)
    assert ordered, values
    assert len(set(values)) >= 6  # distinct priorities stay distinct inside the range


def test_documented_values() -> None:
    assert (SLURM_NICE.value(0), SLURM_NICE.value(30), SLURM_NICE.value(-2.5)) == \
        (10000, 9970, 10003)
    assert SLURM_NICE.value(1e9) == 0
    assert (SGE_NICE.value(0), SGE_NICE.value(600), SGE_NICE.value(-600)) == (-512, 0, -1023)
    assert (PBS_NICE.value(7), PBS_NICE.value(-5000)) == (7, -1024)
    assert (LSF_NICE.value(0), LSF_NICE.value(49), LSF_NICE.value(-100)) == (50, 99, 1)


def job(priority: object) -> Job:
    return Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"psij.priority": priority})))


@pytest.mark.parametrize("name,line", [
    ("slurm", "#SBATCH --nice=9995"), ("sge", "#$ -p -507"), ("pbs", "#PBS -p 5"),
    ("pbs_classic", "#PBS -p 5"), ("lsf", "#BSUB -sp 55")])
def test_scripts_carry_the_priority_only_with_use_nice(tmp_path: Path, name: str,
                                                       line: str) -> None:
    on = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path, use_nice=True))
    off = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path))
    assert line in on.submit_script(job(5)).splitlines()  # type: ignore[attr-defined]
    assert line.split()[1] not in off.submit_script(job(5))  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "high", "1", True])
def test_hostile_priorities_are_refused_by_name(tmp_path: Path, bad: object) -> None:
    ex = JobExecutor.get_instance("slurm", config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path, use_nice=True))
    with pytest.raises(InvalidJobException, match="custom attribute psij.priority: expected"):
        ex.submit_script(job(bad))  # type: ignore[attr-defined]


def test_use_nice_on_a_scheduler_without_priority_option_is_an_error(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("cobalt", config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path, use_nice=True))
    with pytest.raises(InvalidJobException, match="use_nice: the cobalt executor has no way"):
        ex.submit_script(job(1))  # type: ignore[attr-defined]


def test_tmp_is_asked_exactly_on_slurm(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("slurm", config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path, tmp_bucket=1 << 30))
    script = ex.submit_script(Job(JobSpec("/bin/true", attributes=JobAttributes(  # type: ignore
        custom_attributes={"psij.tmp": 1500 * 1024 + 1}))))
    assert "#SBATCH --tmp=1501K" in script.splitlines()
