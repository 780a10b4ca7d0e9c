"""The PBS Pro, Torque, LSF, Cobalt and Flux executors end to end through fake scheduler
commands (``tests/support/fake_site_scheduler.py``) that run the submitted scripts for real: submit,
wait, cancel, attach and submit errors, for every executor.
"""

import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Optional, Sequence, Tuple

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1, SubmitException
from psij.executors.batch._runner import CommandResult
from psij.executors.batch._tracking import PollSucceeded
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    InvalidJobStateError,
)
from support.batch_sites import WAIT, fake_site

SUBMIT_ERRORS = {"pbs": "qsub: Unknown queue", "pbs_classic": "Unknown queue MSG=cannot locate",
                 "lsf": "No such queue. Job not submitted",
                 "cobalt": "'nosuchqueue' is not a valid queue name",
                 "flux": "Invalid queue 'nosuchqueue' specified",
                 "nqsv": "Queue nosuchqueue does not exist"}


def test_lsf_script_goes_to_bsub_on_stdin(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("lsf", tmp_path, monkeypatch)
    calls = []
    real = ex._runner

    class Recording:
        def run(self, argv: Sequence[str], timeout: float,
                stdin: Optional[str] = None) -> CommandResult:
            calls.append((tuple(argv), stdin))
            return real.run(argv, timeout, stdin)

    ex._runner = Recording()
    job = Job(JobSpec("/bin/true", name="on stdin"))
    ex.submit(job)
    argv, stdin = calls[0]
    assert argv == ("bsub",)  # no shell, no path: the fake bsub reads the script on stdin
    assert stdin is not None and "#BSUB -J \"on_stdin\"" in stdin
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    ex.close()


def test_lsf_bjobs_exit_255_means_no_jobs(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LSB_BJOBS_CONSISTENT_EXIT_CODE", "Y")
    ex = fake_site("lsf", tmp_path, monkeypatch)
    result = ex._run(ex.get_list_command())
    assert result.exit_code == 255 and "No job found" in result.stderr
    assert ex.list() == []
    event = ex._poll_status(["404"])
    assert isinstance(event, PollSucceeded) and event.observations == {}
    job = Job(JobSpec("/bin/sleep", ["30"]))
    ex.submit(job)
    assert ex.list() == [job.native_id]
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    ex.close()


def test_cobalt_script_is_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site("cobalt", tmp_path, monkeypatch)
    ex.batch_config.keep_files = True
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)  # the fake qsub refuses scripts that are not executable
    script = ex.work_directory / f"{job.id}.job"
    assert script.stat().st_mode & 0o777 == 0o700
    assert type(ex).SCRIPT_MODE == 0o700
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    ex.close()


def test_end_to_end(site: Tuple[str, BatchSchedulerExecutor], tmp_path: Path) -> None:
    name, ex = site
    out = tmp_path / "out put's.txt"
    err = tmp_path / "err.txt"
    hello = Job(JobSpec("/bin/echo", ["hello", "it's", "$(id)", "é ✓"], stdout_path=out))
    failing = Job(JobSpec("/bin/sh", ["-c", "echo 'disk full' >&2; exit 3"],
                          stderr_path=err))
    sleeper = Job(JobSpec("/bin/sleep", ["30"]))
    for job in (hello, failing, sleeper):
        ex.submit(job)
        assert job.native_id and job.status.state is JobState.QUEUED
    assert sleeper.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    assert set(ex.list()) >= {sleeper.native_id}
    sleeper.cancel()

    st = hello.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED and st.exit_code == 0, st
    assert out.read_text() == "hello it's $(id) é ✓\n"
    st = failing.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 3, st
    assert "code 3" in str(st.message) and "disk full" in str(st.message)
    st = sleeper.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    # The files of finished jobs are gone (keep_files is off).
    assert not list(ex.work_directory.glob("*.job")), name


def test_exit_code_file_is_named_after_the_native_id(
        site: Tuple[str, BatchSchedulerExecutor]) -> None:
    _, ex = site
    ex.batch_config.keep_files = True
    job = Job(JobSpec("/bin/sh", ["-c", "exit 5"]))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 5, st
    assert (ex.work_directory / f"{job.native_id}.ec").read_text().split()[0] == "5"
    assert (ex.work_directory / f"{job.id}.job").is_file()


def test_cancel_while_pending(site: Tuple[str, BatchSchedulerExecutor]) -> None:
    _, ex = site
    # The fake scheduler keeps jobs of the queue "held" waiting until they are cancelled.
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(queue_name="held")))
    ex.submit(job)
    assert job.wait(timedelta(seconds=0.6)) is None and job.status.state is JobState.QUEUED
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st


def test_two_processes_see_their_nodefile(site: Tuple[str, BatchSchedulerExecutor],
                                          tmp_path: Path) -> None:
    _, ex = site
    out = tmp_path / "lines.txt"
    job = Job(JobSpec("/bin/sh", ["-c", 'wc -l < "$PSIJ_NODEFILE"'], stdout_path=out,
                      launcher="multiple",
                      resources=ResourceSpecV1(process_count=2, cpu_cores_per_process=2)))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    assert out.read_text().split() == ["2", "2"]


def test_submit_errors_carry_the_scheduler_message(site: Tuple[str, BatchSchedulerExecutor]
                                                   ) -> None:
    name, ex = site
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(queue_name="nosuchqueue")))
    with pytest.raises(SubmitException) as raised:
        ex.submit(job)
    message = str(raised.value)
    assert SUBMIT_ERRORS[name] in message and "submit script is kept at" in message
    kept = Path(message.rsplit("kept at ", 1)[1].split()[0])
    assert kept.is_file() and "nosuchqueue" in kept.read_text()
    assert job.executor is None and job.status.state is JobState.NEW


def test_cancel_of_a_finished_job_is_quiet(site: Tuple[str, BatchSchedulerExecutor]) -> None:
    _, ex = site
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED
    assert job.native_id is not None
    result = ex._run(ex.get_cancel_command(job.native_id))
    if not result.ok:
        with pytest.raises(InvalidJobStateError):
            ex.process_cancel_command_output(result.exit_code or 1, result.output)


def test_attach_from_another_executor(site: Tuple[str, BatchSchedulerExecutor],
                                      tmp_path: Path) -> None:
    name, ex = site
    job = Job(JobSpec("/bin/sh", ["-c", "sleep 0.5; exit 4"]))
    ex.submit(job)
    assert job.native_id is not None
    ex.close()  # from here on only the other executor follows the job (and reads its files)
    config = BatchSchedulerExecutorConfig(work_directory=tmp_path / "work",
                                          queue_polling_interval=0.2,
                                          initial_queue_polling_delay=0.1)
    other = JobExecutor.get_instance(name, config=config)
    assert isinstance(other, BatchSchedulerExecutor)
    try:
        twin = Job()
        native = job.native_id
        if name == "flux":
            native = subprocess.run(["flux", "jobs", "-n", "-o", "{id.f58}", native],
                                    capture_output=True, text=True).stdout.strip()
            assert native.startswith("\u0192")
        other.attach(twin, native)
        st = twin.wait(WAIT)
        assert st is not None and st.state is JobState.FAILED and st.exit_code == 4, st
        assert twin.native_id == job.native_id
    finally:
        other.close()


def test_jobs_are_found_and_cancelled_by_their_name(
        site: Tuple[str, BatchSchedulerExecutor]) -> None:
    """What ``psij supervise`` does with a submission whose outcome it does not know."""
    name, ex = site
    if name in ("cobalt", "nqsv"):  # qstat cannot select by name: the supervisor says so
        with pytest.raises(NotImplementedError):
            ex.jobs_named("study.u3.ab12")
        return
    jobs = [Job(JobSpec("/bin/true", name=label, attributes=JobAttributes(queue_name="held")))
            for label in ("study.u3.ab12", "study.u4.ab12")]
    for job in jobs:
        ex.submit(job)
    assert ex.jobs_named("study.u3.ab12") == [jobs[0].native_id]
    assert ex.jobs_named("study.u9.ab12") == []
    assert ex.cancel_jobs_named("study.u3.ab12") == [jobs[0].native_id]
    st = jobs[0].wait(WAIT)  # cancelled behind its executor's back: Torque says FAILED
    assert st is not None and st.state in (JobState.CANCELED, JobState.FAILED), st
    assert ex.jobs_named("study.u3.ab12") == []  # an ended job is not in the queue any more
    assert jobs[1].status.state is JobState.QUEUED
    jobs[1].cancel()
