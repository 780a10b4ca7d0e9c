"""The two ways of writing a batch backend, side by side: a psij-python-style subclass that
overrides every hook, and a declarative one made of class attributes. Both run the same jobs
through the same in-memory scheduler. Also the base-class hooks (script on stdin, script mode,
"no jobs" exit codes) and the status poller driven by a manual clock."""

import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import IO, Collection, Dict, List, Optional, Tuple, Type

import pytest

from psij import Job, JobSpec, JobState, SubmitException
from psij._clock import ManualClock
from psij._scripts.generator import TemplatedScriptGenerator
from psij.executors.batch._poller import IDLE_LINGER
from psij.executors.batch._runner import FakeCommandRunner
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    InvalidJobStateError,
    check_status_exit_code,
)
from psij.job_executor_config import JobExecutorConfig
from psij.job_status import JobStatus

WAIT = timedelta(seconds=20)
TEMPLATE = """#!/bin/sh
{{#psij.job_name}}
#TOY --name="{{.}}"
{{/psij.job_name}}
#TOY --tasks={{psij.process_count}}
{{#psij.launch_command}}{{.}} {{/psij.launch_command}}
"""
STATES = {"Q": JobState.QUEUED, "R": JobState.ACTIVE, "C": JobState.COMPLETED,
          "F": JobState.FAILED, "X": JobState.CANCELED}


class ToyScheduler:
    """``toysub`` (script path or stdin), ``toystat ID...``, ``toydel ID``, ``toyls``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: Dict[str, str] = {}
        self.scripts: Dict[str, str] = {}
        self.calls: List[Tuple[Tuple[str, ...], Optional[str]]] = []

    def __call__(self, argv: Tuple[str, ...], stdin: Optional[str]) -> object:
        with self.lock:
            self.calls.append((argv, stdin))
            if argv[0] == "toysub":
                native_id = str(4711 + len(self.jobs))
                self.jobs[native_id] = "Q"
                self.scripts[native_id] = stdin if stdin is not None else \
                    Path(argv[-1]).read_text()
                return (0, f"toysub: job {native_id} queued\n")
            if argv[0] == "toystat":
                return (0, "".join(f"{i} {self.jobs[i]}\n" for i in argv[1:] if i in self.jobs))
            if argv[0] == "toydel":
                if self.jobs.get(argv[1]) in ("C", "F", "X"):
                    return (1, "", f"toydel: job {argv[1]} is done\n")
                self.jobs[argv[1]] = "X"
                return (0, "")
            if argv[0] == "toyls":
                if not self.jobs:
                    return (3, "", "toyls: no jobs\n")
                return (0, "\n".join(self.jobs) + "\n")
            return (127, "", f"{argv[0]}: command not found")


class OldStyleToyExecutor(BatchSchedulerExecutor):
    """Written the psij-python way: a generator made in __init__, every hook a method."""

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=config)
        assert isinstance(self.config, BatchSchedulerExecutorConfig)
        template = self.config.work_directory / "toy.mustache"
        template.write_text(TEMPLATE)
        self.generator = TemplatedScriptGenerator(self.config, template)

    def generate_submit_script(self, job: Job, context: Dict[str, object],
                               submit_file: IO[str]) -> None:
        self.generator.generate_submit_script(job, context, submit_file)

    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        return ["toysub", str(submit_file_path.absolute())]

    def job_id_from_submit_output(self, out: str) -> str:
        match = re.search(r"job (\d+) queued", out)
        if match is None:
            raise ValueError(f"no job id in {out!r}")
        return match.group(1)

    def get_cancel_command(self, native_id: str) -> List[str]:
        return ["toydel", native_id]

    def process_cancel_command_output(self, exit_code: int, out: str) -> None:
        if "is done" in out:
            raise InvalidJobStateError(out)
        raise SubmitException(f"toydel exited with {exit_code}: {out}")

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        return ["toystat", *native_ids]

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        check_status_exit_code("toystat", exit_code, out)
        found = {}
        for line in out.splitlines():
            native_id, state = line.split()
            found[native_id] = JobStatus(STATES[state], metadata={"native_state": state})
        return found

    def get_list_command(self) -> List[str]:
        return ["toyls"]

    def parse_list_output(self, out: str) -> List[str]:
        return out.split()


class DeclarativeToyExecutor(BatchSchedulerExecutor):
    """The same scheduler as declarations only."""

    TEMPLATE = "toy.mustache"  # make() gives each test its own copy, by absolute path
    SUBMIT_COMMAND = ("toysub",)
    JOB_ID_PATTERN = re.compile(r"job (\d+) queued")
    CANCEL_COMMAND = ("toydel",)
    CANCEL_GONE_PATTERN = re.compile("is done")
    STATUS_COMMAND = ("toystat",)
    STATUS_LINE_PATTERN = re.compile(r"(\d+) ([A-Z])")
    STATE_MAP = STATES
    LIST_COMMAND = ("toyls",)
    NO_JOBS_EXIT_CODES = (3,)
    NO_JOBS_PATTERN = re.compile("no jobs")


def make(cls: Type[BatchSchedulerExecutor], tmp_path: Path,
         **attributes: object) -> Tuple[BatchSchedulerExecutor, ToyScheduler]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "toy.mustache").write_text(TEMPLATE)
    body: Dict[str, object] = {"_NAME_": "toy"}
    if cls is DeclarativeToyExecutor:
        body["TEMPLATE"] = tmp_path / "toy.mustache"
    body.update(attributes)
    subclass = type(cls.__name__, (cls,), body)
    ex = subclass(config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path, queue_polling_interval=0.05, initial_queue_polling_delay=0.01))
    sched = ToyScheduler()
    ex._runner = FakeCommandRunner(sched)
    return ex, sched


@pytest.mark.parametrize("cls", [OldStyleToyExecutor, DeclarativeToyExecutor])
def test_both_styles_run_the_same_jobs(cls: Type[BatchSchedulerExecutor],
                                       tmp_path: Path) -> None:
    ex, sched = make(cls, tmp_path)
    done = Job(JobSpec("/bin/echo", ["it's"], name="first job"))
    held = Job(JobSpec("/bin/sleep", ["60"]))
    ex.submit(done)
    ex.submit(held)
    assert (done.native_id, held.native_id) == ("4711", "4712")
    script = sched.scripts["4711"]
    assert '#TOY --name="first job"' in script and "#TOY --tasks=1" in script
    assert "/bin/echo 'it'\"'\"'s'" in script
    assert sorted(ex.list()) == ["4711", "4712"]
    sched.jobs["4711"] = "C"
    st = done.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED and st.exit_code == 0
    held.cancel()
    st = held.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED
    held.cancel()  # a job that has ended: quiet
    with pytest.raises(ValueError, match="no job id"):
        ex.job_id_from_submit_output("toysub: busy\n")
    ex.close()


def test_declarative_backend_needs_no_methods() -> None:
    own = {name for name, value in vars(DeclarativeToyExecutor).items() if callable(value)
           and not isinstance(value, type) and not name.startswith("__")}
    assert own == set()


def test_a_missing_declaration_is_named(tmp_path: Path) -> None:
    ex, _ = make(DeclarativeToyExecutor, tmp_path, CANCEL_COMMAND=())
    with pytest.raises(NotImplementedError, match="CANCEL_COMMAND"):
        ex.get_cancel_command("1")


def test_script_on_stdin_hook(tmp_path: Path) -> None:
    ex, sched = make(DeclarativeToyExecutor, tmp_path, SCRIPT_ON_STDIN=True)
    job = Job(JobSpec("/bin/true", name="via stdin"))
    ex.submit(job)
    argv, stdin = sched.calls[0]
    assert argv == ("toysub",)
    assert stdin is not None and '#TOY --name="via stdin"' in stdin
    ex.close()


@pytest.mark.parametrize("mode", [0o600, 0o700])
def test_script_mode_hook(tmp_path: Path, mode: int) -> None:
    ex, sched = make(DeclarativeToyExecutor, tmp_path, SCRIPT_MODE=mode)
    ex.batch_config.keep_files = True
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    script = tmp_path / "toy" / f"{job.id}.job"
    assert script.stat().st_mode & 0o777 == mode
    assert sched.calls[0][0] == ("toysub", str(script.absolute()))
    ex.close()


def test_no_jobs_exit_codes_hook(tmp_path: Path) -> None:
    ex, _ = make(DeclarativeToyExecutor, tmp_path)
    assert ex.list() == []  # toyls exits 3, "no jobs"
    assert ex.output_means_no_jobs(3, "toyls: no jobs\n")
    assert not ex.output_means_no_jobs(3, "toyls: cannot reach the server\n")
    assert not ex.output_means_no_jobs(4, "toyls: no jobs\n")
    old, _ = make(OldStyleToyExecutor, tmp_path / "old")
    with pytest.raises(SubmitException, match="no jobs"):
        old.list()  # nothing declared: a failing command is an error


def test_poller_decides_on_its_clock(tmp_path: Path) -> None:
    ex, sched = make(DeclarativeToyExecutor, tmp_path)
    clock = ManualClock(100.0)
    ex._clock = clock
    # An hour between polls: only moving the manual clock makes the poller poll.
    ex.batch_config.queue_polling_interval = 3600.0
    ex.batch_config.initial_queue_polling_delay = 3600.0
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    sched.jobs[str(job.native_id)] = "C"
    poller = ex._status_poller()
    clock.advance(3601.0)
    poller.wake()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED
    thread = poller._thread
    assert thread is not None
    # Without jobs the thread lingers IDLE_LINGER seconds of the clock, then ends.
    while thread.is_alive():
        clock.advance(IDLE_LINGER + 1)
        poller.wake()
        thread.join(0.05)
    assert poller._thread is None
    ex.close()


class _CountingCondition(threading.Condition):
    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


def test_poller_is_woken_only_when_its_next_poll_moves(tmp_path: Path) -> None:
    ex, sched = make(DeclarativeToyExecutor, tmp_path)
    ex._clock = ManualClock(100.0)
    ex.batch_config.queue_polling_interval = 3600.0
    ex.batch_config.initial_queue_polling_delay = 3600.0
    poller = ex._status_poller()
    cond = poller._cond = _CountingCondition()
    jobs = [Job(JobSpec("/bin/true")) for _ in range(5)]
    for job in jobs:  # each is due at the same time as the first: the thread sleeps on
        ex.submit(job)
    assert cond.notified == 0 and poller._thread is not None
    # An attached job is looked up at once: the sleeping thread is woken and polls now,
    # without the clock moving.
    sched.jobs["9999"] = "R"
    attached = Job()
    ex.attach(attached, "9999")
    assert cond.notified == 1
    st = attached.wait(WAIT, target_states=[JobState.ACTIVE])
    assert st is not None and st.state is JobState.ACTIVE
    ex.close()
