"""psij.signal_before_end on the batch executors (psij.executors.batch._signals): Slurm and
LSF ask the scheduler in directives, the others' scripts send it from their own timer, run here
as the scheduler would run them; the job gets the signal once, and a lead that does not fit is
refused before anything is written."""

import signal
from datetime import timedelta
from pathlib import Path

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobExecutor, JobSpec
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from test_batch_signals import NATIVE_ID, run_script, trapping_payload

ATTR = "psij.signal_before_end"


def script(name: str, tmp_path: Path, value: str, duration: timedelta) -> str:
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work"))
    spec = JobSpec("/bin/true", attributes=JobAttributes(
        duration=duration, custom_attributes={ATTR: value}))
    return ex.submit_script(Job(spec))  # type: ignore[attr-defined]


def test_slurm_asks_for_the_signal_to_its_script(tmp_path: Path) -> None:
    text = script("slurm", tmp_path, "SIGUSR1@60", timedelta(minutes=10))
    assert "#SBATCH --signal=B:USR1@60\n" in text
    assert "_psij_before_end" not in text  # no timer of its own


@pytest.mark.parametrize("lead,minutes", [("USR2@60", "1"), ("USR2@90", "2"),
                                          ("USR2@3600", "1:00"), ("USR2@3661", "1:02")])
def test_lsf_asks_for_a_warning_action_in_whole_minutes(lead: str, minutes: str,
                                                        tmp_path: Path) -> None:
    text = script("lsf", tmp_path, lead, timedelta(hours=5))
    assert f"#BSUB -wa USR2\n#BSUB -wt {minutes}\n" in text
    assert "_psij_before_end" not in text


@pytest.mark.parametrize("name", ["sge", "pbs", "pbs_classic", "cobalt", "flux", "nqsv",
                                  "batch-test"])
def test_the_other_scripts_time_it_themselves(name: str, tmp_path: Path) -> None:
    text = script(name, tmp_path, "TERM@60", timedelta(minutes=10))
    assert "sleep 540 &" in text and "trap _psij_before_end ALRM" in text
    assert "kill -TERM 0" in text
    assert 'kill "$_psij_timer"' in text  # stopped once the job has ended
    assert "--signal=" not in text and "s_rt" not in text


def test_without_the_attribute_nothing_is_added(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("sge", config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work"))
    text = ex.submit_script(Job(JobSpec("/bin/true")))  # type: ignore[attr-defined]
    assert "_psij_timer" not in text and "ALRM" not in text


@pytest.mark.parametrize("name", ["slurm", "sge", "pbs", "lsf"])
@pytest.mark.parametrize("value,words", [
    ("USR1@600", "not within the job's time limit (JobAttributes.duration = 600 s)"),
    ("KILL@60", "'KILL' is not a signal"),
    ("USR1@nan", "expected SIGNAL@SECONDS"),
    (float("nan"), "expected SIGNAL@SECONDS")])
def test_values_that_cannot_be_sent_are_refused_before_anything_is_written(
        name: str, value: object, words: str, tmp_path: Path) -> None:
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work"))
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        duration=timedelta(minutes=10), custom_attributes={ATTR: value})))
    with pytest.raises(InvalidJobException, match=f"custom attribute {ATTR}: .*") as info:
        ex.submit(job)
    assert words in str(info.value)
    assert job.native_id is None
    assert not list((tmp_path / "work").rglob("*.job"))


@pytest.mark.parametrize("name", ["sge", "pbs", "batch-test"])
@pytest.mark.parametrize("signame", ["USR1", "USR2", "TERM"])
def test_the_scripts_timer_signals_the_job_once(name: str, signame: str,
                                                tmp_path: Path) -> None:
    # Two seconds after the start (a limit of 4 s, the signal 2 s before it); the job leaves
    # by itself 0.6 s after the signal. On Grid Engine the job starts with USR1 and USR2
    # ignored, except the one it asked for, which it could not trap otherwise.
    spec = JobSpec("/bin/bash", trapping_payload(tmp_path, signame), directory=tmp_path,
                   stderr_path=tmp_path / "err", attributes=JobAttributes(
                       duration=timedelta(seconds=4),
                       custom_attributes={ATTR: f"{signame}@2"}))
    rc, elapsed, work = run_script(name, tmp_path, spec, lambda pid, work: None)
    assert rc == 0, (tmp_path / "err").read_text()
    assert (tmp_path / "count").read_text() == "1\n"
    assert (work / f"{NATIVE_ID}.ec").read_text().split()[0] == "0"
    assert 1.5 <= elapsed < 10


def test_grid_engine_still_ignores_the_warning_not_asked_for(tmp_path: Path) -> None:
    spec = JobSpec("/bin/bash", ["-c", f"grep SigIgn /proc/$$/status > {tmp_path}/ign; "
                                       f"echo ready > {tmp_path}/ready"], directory=tmp_path,
                   attributes=JobAttributes(duration=timedelta(minutes=10),
                                            custom_attributes={ATTR: "USR1@60"}))
    rc, _, _ = run_script("sge", tmp_path, spec, lambda pid, work: None)
    mask = int((tmp_path / "ign").read_text().split()[1], 16)
    assert rc == 0 and not mask & (1 << (signal.SIGUSR1 - 1))
    assert mask & (1 << (signal.SIGUSR2 - 1))


def test_a_job_ending_first_stops_the_timer(tmp_path: Path) -> None:
    spec = JobSpec("/bin/bash", ["-c", f"echo ready > {tmp_path}/ready"], directory=tmp_path,
                   attributes=JobAttributes(duration=timedelta(minutes=10),
                                            custom_attributes={ATTR: "USR1@60"}))
    rc, elapsed, _ = run_script("pbs", tmp_path, spec, lambda pid, work: None)
    assert rc == 0 and elapsed < 5  # its timer, sleeping for 540 s, did not hold it
