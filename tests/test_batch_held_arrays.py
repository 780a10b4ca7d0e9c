"""``submit_many`` under ``max_queued_per_shape``: the jobs that fit under the cap go to the
scheduler as job arrays (an array counts as its elements), and the held jobs chosen together
for freed slots go as arrays too; through the holding's hooks, end to end on the fake PBS Pro
of ``tests/support/fake_site_scheduler.py`` (counting its ``qsub`` calls), and (marked slurm)
on the real Slurm (counting ``sbatch`` calls)."""

import re
import threading
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, JobStatus
from psij._clock import MonotonicClock
from psij.executors.batch._held_jobs import HeldJobs, HoldInputs
from psij.executors.batch._runner import CommandResult, CommandRunner
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from support.batch_sites import WAIT, fake_site


class Hooks:
    """The executor's side of the holding: records what it is asked to do; ``go`` holds back
    the submissions of the worker thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: List[Tuple[str, List[str]]] = []  # ("one" or "many", job ids)
        self.marks: List[Tuple[Optional[str], List[str]]] = []
        self.go = threading.Event()
        self.go.set()
        self.count = 0

    def _give_ids(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self.count += 1
            job._native_id = str(self.count)

    def submit(self, job: Job, spec: JobSpec) -> None:
        self.go.wait()
        with self.lock:
            self.calls.append(("one", [job.id]))
            self._give_ids([job])

    def submit_many(self, pairs: List[Tuple[Job, JobSpec]]) -> List[Tuple[Job, BaseException]]:
        self.go.wait()
        with self.lock:
            self.calls.append(("many", [job.id for job, _ in pairs]))
            self._give_ids([job for job, _ in pairs])
        return []

    def mark(self, jobs: Sequence[Job], held: Optional[str], final: Any) -> None:
        with self.lock:
            self.marks.append((held, [job.id for job in jobs]))

    def inputs(self) -> HoldInputs:
        def status(job: Job, st: JobStatus) -> None:
            job._set_status(st)

        return HoldInputs(name="test", owner="the test executor", clock=MonotonicClock(),
                          memory_bucket=0, tmp_bucket=0, submit=self.submit,
                          submit_many=self.submit_many, set_status=status, restate=status,
                          cancel=lambda job: None, hurry=lambda shapes: None, mark=self.mark)


def submitted(hooks: Hooks, n: int) -> None:
    deadline = time.monotonic() + WAIT.total_seconds()
    while time.monotonic() < deadline:
        with hooks.lock:
            if sum(len(ids) for _, ids in hooks.calls) >= n:
                return
        time.sleep(0.01)
    raise AssertionError(f"not {n} jobs submitted: {hooks.calls}")


def test_submit_many_sends_what_fits_together_and_freed_slots_go_together() -> None:
    hooks = Hooks()
    holding = HeldJobs(20, hooks.inputs())
    jobs = [Job(JobSpec("/bin/true")) for _ in range(200)]
    try:
        assert holding.submit_many([(job, job.spec) for job in jobs]) == []  # type: ignore
        ids = [job.id for job in jobs]
        # One submission of the 20 that fit; the 180 others held, recorded as held at once.
        assert hooks.calls == [("many", ids[:20])]
        assert hooks.marks == [("held", ids[20:])]
        assert all(job.native_id is None and job.status.state is JobState.QUEUED
                   for job in jobs[20:])
        shape = holding.shape_key(jobs[0])
        assert holding._machine.counts(shape) == (20, 180)
        # 20 slots freed while the worker is busy with the first: the rest go as one.
        hooks.go.clear()
        for job in jobs[:20]:
            holding.left_queue(job)
        hooks.go.set()
        submitted(hooks, 40)
        later = hooks.calls[1:]
        assert len(later) <= 2, later
        assert [i for _, chunk in later for i in chunk] == ids[20:40]  # in arrival order
        assert holding._machine.counts(shape) == (20, 160)
        # Each was recorded as being submitted before, and as no longer held after.
        with hooks.lock:
            marks = hooks.marks[1:]
        assert [i for held, chunk in marks if held == "submitting" for i in chunk] == ids[20:40]
        assert [i for held, chunk in marks if held is None for i in chunk] == ids[20:40]
        assert all(job.native_id is not None for job in jobs[:40])
    finally:
        holding.close()
    assert all(job.status.state is JobState.FAILED for job in jobs[40:])
    assert hooks.marks[-1] == (None, [job.id for job in jobs[40:]])


class Scripts:
    """The executor's runner, keeping the size of each array ``qsub`` was given."""

    def __init__(self, inner: CommandRunner) -> None:
        self.inner = inner
        self.arrays: List[int] = []
        self.lock = threading.Lock()

    def run(self, argv: Sequence[str], timeout: float,
            stdin: Optional[str] = None) -> CommandResult:
        if argv[0] == "qsub":
            text = stdin if stdin is not None else Path(argv[-1]).read_text()
            found = re.search(r"^#PBS -J (\d+)-(\d+)$", text, re.MULTILINE)
            with self.lock:
                self.arrays.append(1 if found is None
                                   else int(found.group(2)) - int(found.group(1)) + 1)
        return self.inner.run(argv, timeout, stdin)


def test_fake_pbs_submit_many_under_a_cap_sends_arrays_within_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_site("pbs", tmp_path, monkeypatch).close()  # the fake commands on PATH
    ex = JobExecutor.get_instance("pbs", config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "capped", queue_polling_interval=0.2,
        initial_queue_polling_delay=0.1, max_queued_per_shape=10))
    scripts = Scripts(ex._runner)  # type: ignore[attr-defined]
    ex._runner = scripts  # type: ignore[attr-defined]
    out = tmp_path / "out"
    out.mkdir()
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"echo {i}"], stdout_path=out / str(i), name="c"))
            for i in range(40)]
    try:
        ex.submit_many(jobs)
        assert scripts.arrays[0] == 10
        for i, job in enumerate(jobs):
            st = job.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED, (i, st)
            assert (out / str(i)).read_text() == f"{i}\n"
    finally:
        ex.close()
    # Every job submitted once, never more than the cap in one array, in far fewer than 40.
    assert sum(scripts.arrays) == 40 and max(scripts.arrays) <= 10
    assert len(scripts.arrays) < 40, scripts.arrays


class SlurmScripts(Scripts):
    def run(self, argv: Sequence[str], timeout: float,
            stdin: Optional[str] = None) -> CommandResult:
        if argv[0].endswith("sbatch"):
            text = stdin if stdin is not None else Path(argv[-1]).read_text()
            found = re.search(r"^#SBATCH --array=(\d+)-(\d+)$", text, re.MULTILINE)
            with self.lock:
                self.arrays.append(1 if found is None
                                   else int(found.group(2)) - int(found.group(1)) + 1)
        return self.inner.run(argv, timeout, stdin)


@pytest.mark.slurm
def test_slurm_submit_many_under_a_cap_sends_arrays_within_it(shared_dir: Path) -> None:
    from psij.executors.batch.slurm import SlurmExecutorConfig
    from real.test_batch_real import _scheduler_problem

    problem = _scheduler_problem("slurm")
    if problem:
        pytest.fail(f"Slurm is not usable: {problem}")
    ex = JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(
        work_directory=shared_dir / "w", queue_polling_interval=1, max_queued_per_shape=10))
    scripts = SlurmScripts(ex._runner)  # type: ignore[attr-defined]
    ex._runner = scripts  # type: ignore[attr-defined]
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"echo {i}"], stdout_path=shared_dir / str(i),
                        directory=shared_dir)) for i in range(40)]
    try:
        ex.submit_many(jobs)
        assert scripts.arrays == [10]  # what fits now; the other 30 held
        for i, job in enumerate(jobs):
            st = job.wait(WAIT * 4)
            assert st is not None and st.state is JobState.COMPLETED, (i, st)
            assert (shared_dir / str(i)).read_text() == f"{i}\n"
    finally:
        ex.close()
    assert sum(scripts.arrays) == 40 and max(scripts.arrays) <= 10
    assert len(scripts.arrays) < 40, scripts.arrays
