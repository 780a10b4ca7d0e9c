"""Strings no process can receive (a lone surrogate with no byte form, ``"\\ud800"``) are refused
by every batch executor at ``submit`` and ``submit_script``, naming the field, before anything
is held, written or submitted; a surrogate that stands for an undecodable byte (``"\\udcff"``,
as ``os.fsdecode`` makes) is accepted and reaches the job as that byte."""

from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from psij.executors.batch._runner import FakeCommandRunner
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.staging import StageIn, StageOut

BAD = "x\ud800y"
EXECUTORS = ["slurm", "sge", "pbs", "pbs_classic", "lsf", "cobalt", "flux", "nqsv", "batch-test"]
PREFIX = {"pbs_classic": "pbs", "sge": "sge"}

# field named in the error -> a spec holding a bad string there
CASES: Dict[str, Callable[[str, Path], JobSpec]] = {
    "JobSpec.name": lambda e, t: JobSpec("/bin/true", name=BAD),
    "JobSpec.executable": lambda e, t: JobSpec("/bin/" + BAD),
    "JobSpec.arguments[1]": lambda e, t: JobSpec("/bin/echo", ["ok", BAD]),
    "JobSpec.environment['V']": lambda e, t: JobSpec("/bin/true", environment={"V": BAD}),
    "JobSpec.directory": lambda e, t: JobSpec("/bin/true", directory=t / BAD),
    "JobSpec.stdin_path": lambda e, t: JobSpec("/bin/true", stdin_path=t / BAD),
    "JobSpec.stdout_path": lambda e, t: JobSpec("/bin/true", stdout_path=t / BAD),
    "JobSpec.stderr_path": lambda e, t: JobSpec("/bin/true", stderr_path=t / BAD),
    "JobSpec.pre_launch": lambda e, t: JobSpec("/bin/true", pre_launch=t / BAD),
    "JobSpec.post_launch": lambda e, t: JobSpec("/bin/true", post_launch=t / BAD),
    "JobAttributes.account": lambda e, t: JobSpec("/bin/true", attributes=JobAttributes(
        account=BAD)),
    "custom_attributes": lambda e, t: JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={f"{PREFIX.get(e, e)}.comment": BAD})),
    "JobSpec.stage_in[0].source": lambda e, t: JobSpec("/bin/true", stage_in=[
        StageIn(str(t / BAD), "in.txt")]),
    "JobSpec.stage_out[0].source": lambda e, t: JobSpec("/bin/true", stage_out=[
        StageOut(BAD, str(t / "out.txt"))]),
}


def executor(name: str, tmp_path: Path, **options: Any) -> Tuple[Any, FakeCommandRunner]:
    """``name`` with a runner that records every command (and answers none usefully)."""
    work = tmp_path / "work"
    config = (BatchTestExecutorConfig if name == "batch-test" else
              BatchSchedulerExecutorConfig)(work_directory=work, **options)
    ex = JobExecutor.get_instance(name, config=config)
    runner = FakeCommandRunner(lambda argv, stdin: (1, "", "must not be called"))
    ex._runner = runner
    return ex, runner


def check_refused(ex: Any, runner: FakeCommandRunner, job: Job, field: str,
                  call: Optional[Callable[[Job], Any]] = None) -> None:
    with pytest.raises(InvalidJobException, match="lone surrogate") as refused:
        (call or ex.submit)(job)
    assert field.replace("[", "").split("'")[0] in str(refused.value).replace("[", "")
    assert job.status.state is JobState.NEW and job.executor is None and job.native_id is None
    assert runner.calls == []  # nothing submitted
    assert not list(ex.work_directory.glob("*.job"))  # nothing written


@pytest.mark.parametrize("name", EXECUTORS)
@pytest.mark.parametrize("field", sorted(CASES))
def test_refused_at_submit_naming_the_field(name: str, field: str, tmp_path: Path) -> None:
    ex, runner = executor(name, tmp_path)
    try:
        check_refused(ex, runner, Job(CASES[field](name, tmp_path)), field)
        check_refused(ex, runner, Job(CASES[field](name, tmp_path)), field, ex.submit_script)
    finally:
        ex.close()


@pytest.mark.parametrize("name", ["slurm", "sge", "batch-test"])
def test_refused_before_being_held(name: str, tmp_path: Path) -> None:
    # With a cap reached, a job would be held: it is refused first, not held and failed later.
    ex, _ = executor(name, tmp_path, max_queued_per_shape=1)
    ex._runner = FakeCommandRunner(lambda argv, stdin: (0, "101\n"))
    try:
        ex.submit(Job(JobSpec("/bin/true")))  # takes the one slot of its shape
        for field in ("JobSpec.arguments[1]", "JobSpec.environment['V']", "JobSpec.name"):
            job = Job(CASES[field](name, tmp_path))
            with pytest.raises(InvalidJobException, match="lone surrogate"):
                ex.submit(job)
            assert job.status.state is JobState.NEW and job.executor is None
        assert ex._held._machine.held() == 0
    finally:
        ex.close()


def test_an_undecodable_byte_reaches_the_job_as_that_byte(tmp_path: Path) -> None:
    # "\udcff" is the byte 0xff read through os.fsdecode: legal in names and arguments.
    ex = JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
        work_directory=tmp_path / "w", queue_polling_interval=0.1,
        initial_queue_polling_delay=0.05))
    out = tmp_path / "out\udcff.txt"
    job = Job(JobSpec("/bin/echo", ["a\udcffb"], stdout_path=out, environment={"V": "\udcfe"}))
    try:
        assert "a\udcffb" in ex.submit_script(job)
        ex.submit(job)
        st = job.wait()
        assert st is not None and st.state is JobState.COMPLETED, st
    finally:
        ex.close()
    with open(bytes(tmp_path) + b"/out\xff.txt", "rb") as written:  # the name's byte too
        assert written.read() == b"a\xffb\n"


@pytest.mark.parametrize("name", ["slurm", "lsf"])
def test_a_script_on_standard_input_carries_the_byte(name: str, tmp_path: Path) -> None:
    seen: Dict[str, bytes] = {}

    def respond(argv: Tuple[str, ...], stdin: Optional[str]) -> Any:
        if stdin is not None:
            seen["script"] = stdin.encode("utf-8", "surrogateescape")
        return (0, "Job <7> is submitted to queue <q>.\n" if name == "lsf" else "7\n")

    ex, _ = executor(name, tmp_path, queue_polling_interval=300,
                     initial_queue_polling_delay=300)
    ex._runner = FakeCommandRunner(respond)
    try:
        ex.submit(Job(JobSpec("/bin/echo", ["a\udcffb"])))
        assert b"a\xffb" in seen["script"]
    finally:
        ex.close()
