"""Job arrays on the real Slurm and Grid Engine started by tests/setup: 500 jobs given to
``submit_many`` go as one array submission, and each keeps its own native id, state, exit code,
output file and cancel.

Both schedulers' arrays are submitted together by a module fixture, so that they run at the
same time. Every job runs ``/bin/sh`` printing its own environment value and argument; every
fifth one exits with a code of its own; element 100 sleeps until it is cancelled while running
(once it has printed that it started), and the last element is cancelled while it waits in the
queue. Without a running scheduler the tests skip, saying why.
"""

import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from real.test_batch_real import _scheduler_problem
from test_batch_arrays import Recording

N_JOBS = 500
RUNNING_CANCEL = 100
PENDING_CANCEL = N_JOBS - 1
# Grid Engine here dispatches at most 8 tasks per scheduling cycle (1 s, plus 1 s after ends):
# 500 tasks take about 100 s when it is otherwise idle.
DEADLINE_S = 420.0
SUBMIT_PROGRAMS = {"slurm": "sbatch", "sge": "qsub"}


def exit_code_of(i: int) -> int:
    """Every fifth job fails, with codes 1..98 (Grid Engine requeues a job that exits with 99
    and puts one that exits with 100 in its error state)."""
    return 0 if i % 5 != 4 else 1 + (i // 5) % 98


class ArrayRun:
    """The 500 jobs given to one scheduler's ``submit_many``."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.out = work / "out"
        self.out.mkdir(parents=True)
        config = BatchSchedulerExecutorConfig(work_directory=work / "psij",
                                              queue_polling_interval=1,
                                              initial_queue_polling_delay=0.5)
        executor = JobExecutor.get_instance(name, config=config)
        assert isinstance(executor, BatchSchedulerExecutor)
        self.ex = executor
        self.runner = Recording(executor._runner)
        executor._runner = self.runner
        self.jobs: List[Job] = []
        for i in range(N_JOBS):
            if i == RUNNING_CANCEL:
                spec = JobSpec("/bin/sh", ["-c", "echo started; exec sleep 300"],
                               stdout_path=self.out / str(i), name="psij-array-test")
            else:
                spec = JobSpec("/bin/sh", ["-c", 'printf "%s %s\\n" "$ELEMENT" "$1"; exit "$2"',
                                           "sh", f"argument {i}", str(exit_code_of(i))],
                               environment={"ELEMENT": f"element {i}"},
                               stdout_path=self.out / str(i), name="psij-array-test")
            self.jobs.append(Job(spec))
        self.started = time.monotonic()
        executor.submit_many(self.jobs)
        # Right away: the last element waits behind 499 others.
        self.jobs[PENDING_CANCEL].cancel()


_runs: Dict[str, ArrayRun] = {}
_lock = threading.Lock()


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("arrays")
    for run in _runs.values():
        if not all(job.status.state.final for job in run.jobs):
            # The whole array at once rather than 500 cancel commands.
            array_id = str(run.jobs[0].native_id).split("_")[0].split(".")[0]
            subprocess.run(["scancel" if run.name == "slurm" else "qdel", array_id],
                           capture_output=True, timeout=60)
        run.ex.close()
    _runs.clear()


def array_run(name: str, root: Path) -> ArrayRun:
    problem = _scheduler_problem(name)
    if problem is not None:
        pytest.skip(problem)
    with _lock:
        if name not in _runs:
            for other in ("slurm", "sge"):
                if other not in _runs and _scheduler_problem(other) is None:
                    _runs[other] = ArrayRun(other, root / other)
        return _runs[name]


SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_500_jobs_go_as_one_array_with_their_own_ids(name: str, runs_root: Path) -> None:
    run = array_run(name, runs_root)
    assert len(run.runner.to(SUBMIT_PROGRAMS[name])) == 1
    ids = [job.native_id for job in run.jobs]
    assert len(set(ids)) == N_JOBS
    array_id = str(ids[0]).split("_" if name == "slurm" else ".")[0]
    expected = ([f"{array_id}_{i}" for i in range(N_JOBS)] if name == "slurm"
                else [f"{array_id}.{i + 1}" for i in range(N_JOBS)])
    assert ids == expected


@pytest.mark.parametrize("name", SCHEDULERS)
def test_500_array_jobs_end_with_their_own_states_codes_and_outputs(
        name: str, runs_root: Path) -> None:
    run = array_run(name, runs_root)
    running = run.jobs[RUNNING_CANCEL]
    deadline = run.started + DEADLINE_S
    assert running.wait(timedelta(seconds=DEADLINE_S), target_states=[JobState.ACTIVE]) \
        is not None
    # Cancelled once it runs the job itself: a Grid Engine job killed while its login shell
    # starts may leave that shell's start-up files half done (a stale lock of pyenv here).
    started = run.out / str(RUNNING_CANCEL)
    while time.monotonic() < deadline and not (started.exists() and started.read_text()):
        time.sleep(0.2)
    running.cancel()
    wrong = []
    for i, job in enumerate(run.jobs):
        st = job.wait(timedelta(seconds=max(1.0, deadline - time.monotonic())))
        assert st is not None, f"{name} job {i} ({job.native_id}) not done"
        if i in (RUNNING_CANCEL, PENDING_CANCEL):
            if st.state is not JobState.CANCELED:
                wrong.append((i, st))
            continue
        code = exit_code_of(i)
        path = run.out / str(i)
        output = path.read_text() if path.exists() else None
        state = JobState.COMPLETED if code == 0 else JobState.FAILED
        if st.state is not state or st.exit_code != code \
                or output != f"element {i} argument {i}\n":
            wrong.append((i, st, output))
    assert not wrong, wrong[:5]
    # The element cancelled in the queue never ran.
    assert not (run.out / str(PENDING_CANCEL)).exists()
    # Each poll was one status command naming the array once (qstat -xml names no job).
    array_id = str(run.jobs[0].native_id).split("_")[0].split(".")[0]
    polls = [c for c in run.runner.calls if c[0] == ("squeue" if name == "slurm" else "qstat")]
    assert polls
    for argv in polls:
        assert (f"--jobs={array_id}" in argv) if name == "slurm" else argv == ("qstat", "-xml")
