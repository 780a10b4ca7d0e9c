"""Submit commands started ahead of need (``spare_submit_commands``, ``_spares``).

A fake submit command notes in a log when it starts (its pid, working directory, umask and one
environment value), reads its script from standard input, notes it, and prints its pid as the
job id; so each test can tell which process answered, what it was started with, and whether a
process that was killed had been given anything.
"""

import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch._runner import SubprocessRunner
from psij.executors.batch._spares import SpareCommands
from psij.executors.batch.slurm import SlurmExecutorConfig
from support.process_checks import alive

LIMIT = 20.0
SCRIPT = "#!/bin/bash\n#FAKE --opt\necho job\n"

FAKE = r"""#!/bin/bash
echo "start $$ $(pwd -P) $(umask) ${SPARE_MARK-none}" >> "$SPARE_LOG"
script=$(cat)
if [ -z "$script" ]; then echo "empty script" >&2; echo "empty $$" >> "$SPARE_LOG"; exit 1; fi
echo "got $$ ${#script}" >> "$SPARE_LOG"
if [ -n "${SPARE_SLEEP-}" ]; then sleep "$SPARE_SLEEP"; fi
echo "$$"
"""


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> List[List[str]]:
        if not self.path.exists():
            return []
        return [line.split() for line in self.path.read_text().splitlines()]

    def starts(self) -> Dict[int, List[str]]:
        return {int(f[1]): f[2:] for f in self.lines() if f[0] == "start"}

    def got(self) -> List[int]:
        return [int(f[1]) for f in self.lines() if f[0] == "got"]

    def empty(self) -> List[int]:
        return [int(f[1]) for f in self.lines() if f[0] == "empty"]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tuple[Tuple[str, ...], Log]]:
    command = tmp_path / "fake-submit"
    command.write_text(FAKE)
    command.chmod(0o755)
    log = tmp_path / "log"
    monkeypatch.setenv("SPARE_LOG", str(log))
    monkeypatch.setenv("SPARE_MARK", "a")
    monkeypatch.delenv("SPARE_SLEEP", raising=False)
    yield (str(command),), Log(log)


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {LIMIT} s"
        time.sleep(0.01)


def ready_spare(spares: SpareCommands, log: Log) -> int:
    """The pid of the spare waiting now, once it has started (noted its start)."""
    wait_until(lambda: bool(spares.spare_pids()) and spares.spare_pids()[0] in log.starts(),
               "spare started")
    return spares.spare_pids()[0]


def start(spares: SpareCommands, argv: Tuple[str, ...], runner: SubprocessRunner) -> None:
    """Two submissions: spares are started from the second on."""
    run(spares, argv, runner)
    run(spares, argv, runner)


def run(spares: SpareCommands, argv: Tuple[str, ...], runner: SubprocessRunner) -> int:
    result = spares.run(argv, 10, SCRIPT)
    if result is None:
        result = runner.run(argv, 10, SCRIPT)
    assert result.ok, result.describe()
    return int(result.stdout)


def test_spares_start_with_the_second_submission_and_answer_the_next(
        fake: Tuple[Tuple[str, ...], Log]) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    try:
        first = runner.run_spared(argv, 10, SCRIPT, 1)
        assert first.ok, first.describe()
        spares = runner._spares
        assert spares is not None
        # One submission starts nothing: a program that submits one job needs no spare.
        assert spares.spare_pids() == [] and spares._thread is None
        second = runner.run_spared(argv, 10, SCRIPT, 1)
        assert second.ok, second.describe()
        spare = ready_spare(spares, log)
        assert spare not in (int(first.stdout), int(second.stdout))
        third = runner.run_spared(argv, 10, SCRIPT, 1)
        assert third.ok and int(third.stdout) == spare
        assert log.got().count(spare) == 1
        assert sorted(log.got()) == sorted([int(first.stdout), int(second.stdout), spare])
    finally:
        runner.close()


@pytest.mark.parametrize("change", ["environment", "putenv", "directory", "umask"])
def test_a_spare_started_before_a_change_is_killed_unused(
        change: str, fake: Tuple[Tuple[str, ...], Log], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    spares = SpareCommands(1)
    old_umask = os.umask(0o022)
    try:
        start(spares, argv, runner)
        spare = ready_spare(spares, log)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        if change == "environment":
            monkeypatch.setenv("SPARE_MARK", "b")
        elif change == "putenv":  # below os.environ: a command started now still gets it
            monkeypatch.setenv("SPARE_MARK", "a")  # restored (putenv included) afterwards
            os.putenv("SPARE_MARK", "b")
        elif change == "directory":
            monkeypatch.chdir(elsewhere)
        else:
            os.umask(0o077)
        answered = run(spares, argv, runner)
        assert answered != spare
        wait_until(lambda: not alive(spare), "end of the unfit spare")
        assert spare not in log.got() and spare not in log.empty()  # given nothing
        pwd, umask, mark = log.starts()[answered]
        expected = {"environment": (str(Path.cwd().resolve()), "0022", "b"),
                    "putenv": (str(Path.cwd().resolve()), "0022", "b"),
                    "directory": (str(elsewhere.resolve()), "0022", "a"),
                    "umask": (str(Path.cwd().resolve()), "0077", "a")}[change]
        assert (pwd, umask, mark) == expected
        # The next spare is started with the new settings and used.
        spare2 = ready_spare(spares, log)
        assert log.starts()[spare2] == list(expected)
        assert run(spares, argv, runner) == spare2
    finally:
        os.umask(old_umask)
        spares.close()


def test_a_spare_that_died_is_replaced_by_a_fresh_command(
        fake: Tuple[Tuple[str, ...], Log]) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    spares = SpareCommands(1)
    try:
        start(spares, argv, runner)
        spare = ready_spare(spares, log)
        os.kill(spare, signal.SIGKILL)
        wait_until(lambda: not alive(spare), "end of the killed spare")
        answered = run(spares, argv, runner)
        assert answered != spare and answered in log.got()
    finally:
        spares.close()


def test_close_kills_the_spares_which_submit_nothing(fake: Tuple[Tuple[str, ...], Log]) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    spares = SpareCommands(3)
    start(spares, argv, runner)
    wait_until(lambda: len(spares.spare_pids()) == 3
               and all(p in log.starts() for p in spares.spare_pids()), "three spares")
    pids = spares.spare_pids()
    spares.close()
    assert not any(alive(p) for p in pids)
    assert not set(pids) & set(log.got() + log.empty())
    assert spares.run(argv, 10, SCRIPT) is None  # closed: the caller starts its own


def test_spares_are_killed_after_a_while_without_submissions(
        fake: Tuple[Tuple[str, ...], Log]) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    spares = SpareCommands(1, idle=0.3)
    try:
        start(spares, argv, runner)
        spare = ready_spare(spares, log)
        wait_until(lambda: not alive(spare), "end of the idle spare")
        assert spares.spare_pids() == [] and spare not in log.got() + log.empty()
        # Submitting again starts spares again.
        run(spares, argv, runner)
        assert ready_spare(spares, log) != spare
    finally:
        spares.close()


def test_another_command_line_is_not_answered_by_a_spare_of_the_first(
        fake: Tuple[Tuple[str, ...], Log]) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    spares = SpareCommands(1)
    try:
        start(spares, argv, runner)
        spare = ready_spare(spares, log)
        other = (*argv, "--other")
        assert spares.run(other, 10, SCRIPT) is None
        wait_until(lambda: not alive(spare), "end of the spare of the other command line")
        assert spare not in log.got()
    finally:
        spares.close()


def test_parallel_submissions_each_get_their_own_process(
        fake: Tuple[Tuple[str, ...], Log]) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    answers: List[int] = []
    lock = threading.Lock()

    def submit() -> None:
        for _ in range(8):
            result = runner.run_spared(argv, 20, SCRIPT, 2)
            assert result.ok, result.describe()
            with lock:
                answers.append(int(result.stdout))

    threads = [threading.Thread(target=submit) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        runner.close()
    assert len(answers) == 48 and len(set(answers)) == 48
    assert sorted(log.got()) == sorted(answers)  # each got exactly its one script
    assert log.empty() == []


def test_a_timed_out_spare_is_killed_with_its_group(
        fake: Tuple[Tuple[str, ...], Log], monkeypatch: pytest.MonkeyPatch) -> None:
    argv, log = fake
    monkeypatch.setenv("SPARE_SLEEP", "30")
    runner = SubprocessRunner()
    spares = SpareCommands(1)
    try:
        for _ in range(2):  # from the second submission on, a spare is started
            assert spares.run(argv, 0.5, SCRIPT) is None  # the caller would start its own
        spare = ready_spare(spares, log)
        result = spares.run(argv, 0.5, SCRIPT)
        assert result is not None and result.exit_code is None
        assert result.failure is not None and "did not finish within 0.5 s" in result.failure
        assert not alive(spare) and spare in log.got()
    finally:
        spares.close()
        runner.close()


def test_a_forked_child_neither_uses_nor_holds_the_parents_spares(
        fake: Tuple[Tuple[str, ...], Log]) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    spares = SpareCommands(1)
    try:
        start(spares, argv, runner)
        spare = ready_spare(spares, log)
        release_r, release_w = os.pipe()
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own submission, then it waits while the parent submits
            code = 1
            try:
                os.close(release_w)
                result = spares.run(argv, 10, SCRIPT)
                os.write(report_w, b"none" if result is None else b"used")
                os.read(release_r, 1)
                code = 0
            finally:
                os._exit(code)
        os.close(report_w)
        os.close(release_r)
        try:
            assert os.read(report_r, 10) == b"none"
            # The child still runs; the parent's spare sees the end of its script anyway.
            assert run(spares, argv, runner) == spare
        finally:
            os.write(release_w, b"x")
            os.close(release_w)
            os.close(report_r)
            _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        spares.close()


def test_spares_found_unfit_three_times_in_a_row_rest(
        fake: Tuple[Tuple[str, ...], Log], monkeypatch: pytest.MonkeyPatch) -> None:
    argv, log = fake
    runner = SubprocessRunner()
    spares = SpareCommands(1)
    try:
        start(spares, argv, runner)
        for mark in "bcd":
            spare = ready_spare(spares, log)
            monkeypatch.setenv("SPARE_MARK", mark)
            assert run(spares, argv, runner) != spare
        assert spares._rest_until > time.monotonic()
        starts = len(log.starts())
        assert spares.run(argv, 10, SCRIPT) is None  # resting: no spare is waiting
        assert spares.spare_pids() == [] and len(log.starts()) == starts
    finally:
        spares.close()


@pytest.mark.parametrize("value", [-1, 17, 1.5, float("nan"), float("inf"), True, "2", None,
                                   10 ** 30])
def test_spare_submit_commands_refuses_what_is_not_a_count(value: object) -> None:
    with pytest.raises(ValueError, match=r"SlurmExecutorConfig\.spare_submit_commands: "
                                         r"expected a whole number from 0 \(none\) to 16"):
        SlurmExecutorConfig(spare_submit_commands=value)  # type: ignore[arg-type]



def _slurm_problem() -> str:
    if shutil.which("sbatch") is None:
        return "Slurm is not installed (tests/setup/start-slurm.sh)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    return "" if "UP" in ping.stdout else f"Slurm is not running: {ping.stdout.strip()!r}"


@pytest.mark.slurm
def test_on_slurm_each_job_has_the_environment_and_directory_of_its_own_submission(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _slurm_problem()
    if problem:
        pytest.skip(problem)
    tag = "spare" + uuid.uuid4().hex[:8]
    ex = JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(
        work_directory=tmp_path / "w", queue_polling_interval=0.5,
        initial_queue_polling_delay=0.2, rest_submit=False))  # sbatch for every job
    assert ex.batch_config.spare_submit_commands == 1  # on by default
    places = {name: tmp_path / name for name in "ab"}
    for place in places.values():
        place.mkdir()
    plan = [("one", "a"), ("one", "a"), ("one", "a"), ("two", "a"), ("two", "b")]
    jobs: List[Job] = []
    try:
        for i, (mark, place) in enumerate(plan):
            if i >= 2:  # spares are started from the second submission on
                spares = ex._runner._spares  # type: ignore[attr-defined]
                wait_until(lambda s=spares: bool(s.spare_pids()), "spare sbatch")
                spare = spares.spare_pids()[0]
                assert Path(f"/proc/{spare}/cmdline").read_bytes().split(b"\0")[0] \
                    .endswith(b"sbatch")
            monkeypatch.setenv("PSIJ_SPARE_MARK", mark)
            monkeypatch.chdir(places[place])
            job = Job(JobSpec("/bin/sh", ["-c", 'echo "$PSIJ_SPARE_MARK $SLURM_SUBMIT_DIR"'],
                              name=tag, directory=tmp_path, stdout_path=tmp_path / f"{i}.out",
                              attributes=JobAttributes(duration=timedelta(minutes=2))))
            ex.submit(job)
            jobs.append(job)
            if i >= 2:
                wait_until(lambda p=spare: not alive(p), "end of the spare (used or unfit)")
        for job in jobs:
            status = job.wait(timedelta(seconds=240))
            assert status is not None and status.state == JobState.COMPLETED, status
        said = [(tmp_path / f"{i}.out").read_text().split() for i in range(len(plan))]
        assert said == [[mark, str(places[place].resolve())] for mark, place in plan]
        # Only the five jobs were submitted: the spares killed for the changes submitted none.
        def listed() -> List[str]:  # the accounting database is written a moment later
            return subprocess.run(
                ["sacct", "--noheader", "--allocations", "--parsable2", "--name", tag,
                 "--starttime", "now-1hour", "--format=JobID"],
                capture_output=True, text=True, timeout=60).stdout.split()

        wait_until(lambda: len(listed()) >= len(jobs), "accounting records")
        assert sorted(listed()) == sorted(str(job.native_id) for job in jobs)
    finally:
        ex.close()
