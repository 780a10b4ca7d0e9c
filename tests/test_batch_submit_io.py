"""The submit step of a batch submission (``psij.executors.batch._submit_io``): a function of
one ``SubmitInputs``, the job and the script's text, never of the executor; the inputs are made
once per executor with the backend's hooks resolved (bound where a subclass overrides them,
None for the stock behaviour), so that psij-python-style overrides are still the ones used."""

import re
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import pytest

from psij import Job, JobExecutorConfig, JobSpec
from psij.exceptions import SubmitException
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from psij.executors.batch._runner import CommandResult, FakeCommandRunner
from psij.executors.batch._submit_io import (
    SubmitInputs,
    job_id_of,
    parse_native_id,
    submit_text,
    write_script,
)
from psij.executors.batch.slurm import SlurmJobExecutor

SCRIPT = "#!/bin/sh\necho 'it''s' \"$HOME\"\n"
ID = re.compile(r"(\d+)")


class Calls:
    """A fake scheduler answering its submit command with ``answer``, recording argv and
    standard input."""

    def __init__(self, answer: Tuple[Any, ...] = (0, "4242\n")) -> None:
        self.answer = answer
        self.seen: List[Tuple[Tuple[str, ...], Optional[str]]] = []

    def __call__(self, argv: Tuple[str, ...], stdin: Optional[str]) -> Tuple[Any, ...]:
        self.seen.append((argv, stdin))
        return self.answer if argv[0] == "sub" else (0, "")


def inputs(tmp_path: Path, calls: Calls, **fields: Any) -> SubmitInputs:
    values: dict = dict(
        name="toy", owner="ToyExecutor", script_dir=tmp_path / "w" / "toy",
        work_root=tmp_path / "w", script_mode=0o600, script_on_stdin=False, in_memory=False,
        submit_command=("sub",), command_hook=None, stdin_hook=None, direct_submit=None,
        run_hook=None, job_id=job_id_of(ID, "ToyExecutor"), runner=FakeCommandRunner(calls),
        command_timeout=5.0, transient_markers=("try again",))
    values.update(fields)
    return SubmitInputs(**values)


def test_write_script_gives_exactly_its_mode_and_makes_a_vanished_folder_again(
        tmp_path: Path) -> None:
    path = tmp_path / "w" / "toy" / "j.job"
    written = write_script(path, SCRIPT, 0o700, tmp_path / "w")
    assert written == path and path.read_text() == SCRIPT
    assert path.stat().st_mode & 0o777 == 0o700
    assert path.parent.stat().st_mode & 0o777 == 0o700  # made private
    write_script(path, "x", 0o600, tmp_path / "w")  # an older file gets the new mode
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text() == "x"
    with pytest.raises(FileNotFoundError):
        write_script(tmp_path / "nowhere" / "j.job", SCRIPT, 0o600)


def test_a_script_on_standard_input_goes_from_memory_and_no_file_is_left(
        tmp_path: Path) -> None:
    calls = Calls()
    given = inputs(tmp_path, calls, script_on_stdin=True, in_memory=True)
    job = Job(JobSpec("/bin/true"))
    assert submit_text(given, job, SCRIPT) == "4242"
    assert calls.seen == [(("sub",), SCRIPT)]
    assert not (given.script_dir / f"{job.id}.job").exists()


def test_a_failed_submission_keeps_the_script_and_says_where(tmp_path: Path) -> None:
    calls = Calls((1, "", "sub: try again later\n"))
    given = inputs(tmp_path, calls, script_on_stdin=True, in_memory=True)
    given.script_dir.mkdir(parents=True)
    job = Job(JobSpec("/bin/true"))
    error = submit_text(given, job, SCRIPT)
    script = given.script_dir / f"{job.id}.job"
    assert isinstance(error, SubmitException) and error.transient
    assert str(error).startswith(f"job {job.id}: submitting failed: ")
    assert str(error).endswith(f"; the submit script is kept at {script}")
    assert script.read_text() == SCRIPT


def test_a_script_given_by_path_is_written_first_with_the_mode(tmp_path: Path) -> None:
    calls = Calls()
    given = inputs(tmp_path, calls, script_mode=0o700)
    job = Job(JobSpec("/bin/true"))
    assert submit_text(given, job, SCRIPT) == "4242"
    script = given.script_dir / f"{job.id}.job"
    assert calls.seen == [(("sub", str(script.absolute())), None)]
    assert script.read_text() == SCRIPT and script.stat().st_mode & 0o777 == 0o700


def test_the_hooks_given_are_used_instead_of_the_stock_behaviour(tmp_path: Path) -> None:
    calls = Calls()
    used: List[str] = []

    def command(job: Job, path: Path) -> List[str]:
        used.append("command")
        return ["sub", "--from-hook", path.name]

    def stdin(job: Job, path: Path) -> Optional[str]:
        used.append("stdin")
        return f"stdin of {path.name}"

    def run(argv: Sequence[str], stdin: Optional[str] = None) -> CommandResult:
        used.append("run")
        return CommandResult(tuple(argv), 0, f"queued as <{len(argv)}7>\n")

    def job_id(out: str) -> str:
        used.append("job id")
        return out.split("<")[1].split(">")[0]

    given = inputs(tmp_path, calls, command_hook=command, stdin_hook=stdin, run_hook=run,
                   job_id=job_id)
    job = Job(JobSpec("/bin/true"))
    assert submit_text(given, job, SCRIPT) == "37"
    assert used == ["command", "stdin", "run", "job id"]
    assert calls.seen == []  # the runner is the run hook's business


@pytest.mark.parametrize("result,array_of,words,transient", [
    (CommandResult(("sub",), 2, "", "sub: denied\n"), 0, "job {id}: submitting failed: ", False),
    (CommandResult(("sub",), None, failure="timed out after 5 s"), 0,
     "job {id}: submitting failed: ", True),
    (CommandResult(("sub",), 1, "", "try again\n"), 3, "submitting the array of 3 jobs failed: ",
     True),
    (CommandResult(("sub",), 0, "no number\n"), 0,
     "job {id}: the submit command seemed to succeed but its output has no job id (", False),
    (CommandResult(("sub",), 0, "  \n"), 2, "the submit command of an array of 2 jobs seemed to "
     "succeed but its output has no job id (", False),
])
def test_parse_native_id_says_why_there_is_no_id(tmp_path: Path, result: CommandResult,
                                                  array_of: int, words: str,
                                                  transient: bool) -> None:
    job = Job(JobSpec("/bin/true"))
    script = tmp_path / "s.job"
    error = parse_native_id(result, inputs(tmp_path, Calls()), job, script, array_of)
    assert isinstance(error, SubmitException)
    assert str(error).startswith(words.format(id=job.id)), str(error)
    assert f"the submit script is kept at {script}" in str(error)
    assert error.transient is transient
    if result.ok:  # the parser's own error is kept as the cause
        assert isinstance(error.__cause__, ValueError) and error.exception is error.__cause__


def test_parse_native_id_gives_the_id_stripped(tmp_path: Path) -> None:
    ok = CommandResult(("sub",), 0, "Submitted 77 \n")
    assert parse_native_id(ok, inputs(tmp_path, Calls()), Job(), tmp_path / "s") == "77"


# ------------------------------------------------------------ hooks resolved by the executor


class OwnHooks(SlurmJobExecutor):
    """A psij-python-style subclass overriding the public submit hooks and ``_run``."""

    used: List[str]

    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        self.used.append("get_submit_command")
        return ["mysub", str(submit_file_path)]

    def get_submit_stdin(self, job: Job, submit_file_path: Path) -> Optional[str]:
        self.used.append("get_submit_stdin")
        return "from the hook: " + submit_file_path.read_text()[:9]

    def job_id_from_submit_output(self, out: str) -> str:
        self.used.append("job_id_from_submit_output")
        return out.split("=")[1]

    def _run(self, argv: Sequence[str], stdin: Optional[str] = None) -> CommandResult:
        if argv[0] == "mysub":
            self.used.append(f"_run {stdin}")
            return CommandResult(tuple(argv), 0, "id=777\n")
        return super()._run(argv, stdin)


def quiet_config(tmp_path: Path) -> BatchSchedulerExecutorConfig:
    return BatchSchedulerExecutorConfig(work_directory=tmp_path, queue_polling_interval=3600,
                                        initial_queue_polling_delay=3600)


def test_a_subclass_overriding_the_hooks_has_them_used(tmp_path: Path) -> None:
    ex = OwnHooks(config=quiet_config(tmp_path))
    ex.used = []
    calls = Calls()
    ex._runner = FakeCommandRunner(calls)
    made = ex._submit_inputs()
    assert made.command_hook == ex.get_submit_command and made.run_hook == ex._run
    assert made.stdin_hook == ex.get_submit_stdin and made.job_id == ex.job_id_from_submit_output
    assert not made.in_memory  # its own stdin hook reads the file: the file is written
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    assert job.native_id == "777"
    assert ex.used == ["get_submit_command", "get_submit_stdin", "_run from the hook: #!/bin/ba",
                       "job_id_from_submit_output"]
    assert calls.seen == []  # the submit went through its own _run
    ex.close()


def test_the_stock_hooks_are_resolved_to_none_and_the_script_goes_from_memory(
        tmp_path: Path) -> None:
    ex = SlurmJobExecutor(config=quiet_config(tmp_path))
    calls = Calls()
    ex._runner = FakeCommandRunner(lambda argv, stdin: calls(("sub", *argv), stdin)
                                   if argv[0] == "sbatch" else (0, ""))
    calls.answer = (0, "5151;cluster\n")
    made = ex._submit_inputs()
    assert (made.command_hook, made.stdin_hook, made.run_hook) == (None, None, None)
    assert made.in_memory and made.direct_submit is not None  # slurm's rest_submit, off
    assert ex._submit_inputs() is made  # made once
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    assert job.native_id == "5151"
    ((argv, stdin),) = calls.seen
    assert argv == ("sub", "sbatch", "--parsable") and stdin is not None
    assert stdin.startswith("#!/bin/bash")
    assert not (ex.work_directory / f"{job.id}.job").exists()
    ex.batch_config.keep_files = True  # a setting it depends on: made again
    again = ex._submit_inputs()
    assert again is not made and not again.in_memory
    ex.close()


def test_a_hook_set_on_the_instance_is_seen(tmp_path: Path) -> None:
    ex = SlurmJobExecutor(config=JobExecutorConfig(work_directory=tmp_path))
    before = ex._submit_inputs()

    def command(job: Job, path: Path) -> List[str]:
        return ["mysbatch"]

    ex.get_submit_command = command  # type: ignore[method-assign]
    after = ex._submit_inputs()
    assert before.command_hook is None and after.command_hook is command
    ex.close()
