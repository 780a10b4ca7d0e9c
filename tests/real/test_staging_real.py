"""Staging on the real Slurm and Grid Engine started by tests/setup (make schedulers): the job's
script stages in, runs, stages out and cleans up; failures come back as the local executor
reports them; a cancelled job stages out its ON_CANCEL entries (Slurm signals the script alone,
Grid Engine sends USR2 before its kill thanks to -notify).

The jobs of both schedulers are submitted together by a module fixture; without a running
scheduler the tests skip, saying why.
"""

import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, JobStatus, ResourceSpecV1
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode
from real.test_batch_real import _need, _scheduler_problem

F = StageOutFlags
WAIT = timedelta(seconds=240)


class Jobs:
    def __init__(self, name: str, root: Path) -> None:
        self.root = root
        self.inputs, self.jd, self.results = (root / n for n in ("in", "job dir 'q'", "res"))
        for d in (self.inputs, self.jd, self.results):
            d.mkdir(parents=True)
        self.ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
            work_directory=root / "psij", queue_polling_interval=1,
            initial_queue_polling_delay=0.5))
        self.jobs: Dict[str, Job] = {}

    def submit(self, key: str, spec: JobSpec) -> None:
        spec.directory = self.jd / key
        spec.directory.mkdir()
        self.jobs[key] = Job(spec)
        self.ex.submit(self.jobs[key])

    def final(self, key: str) -> JobStatus:
        st = self.jobs[key].wait(WAIT)
        assert st is not None, f"job {key} ({self.jobs[key].native_id}) did not finish"
        return st


def _start(name: str, root: Path) -> Jobs:
    j = Jobs(name, root)
    (j.inputs / "a b.txt").write_text("A")
    (j.inputs / "c.txt").write_text("C")
    res = j.results
    j.submit("ok", JobSpec(
        "/bin/sh", ["-c", "cat in/a.txt linked > out.txt; echo t > tmp; cp out.txt mv"],
        stage_in=[StageIn(j.inputs / "a b.txt", "in/a.txt"),
                  StageIn(f"file://{j.inputs / 'c.txt'}", "linked", StagingMode.LINK)],
        stage_out=[StageOut("out.txt", res / "ok" / "out.txt"),
                   StageOut("mv", res / "ok" / "mv", mode=StagingMode.MOVE),
                   StageOut("out.txt", res / "ok" / "if-present", F.IF_PRESENT),
                   StageOut("absent", res / "ok" / "absent", F.IF_PRESENT),
                   StageOut("out.txt", res / "ok" / "on-error", F.ON_ERROR)],
        cleanup=["tmp"]))
    j.submit("exit3", JobSpec(
        "/bin/sh", ["-c", "echo bad > log; exit 3"],
        stage_out=[StageOut("log", res / "exit3" / "log", F.ON_ERROR),
                   StageOut("log", res / "exit3" / "ok", F.ON_SUCCESS)]))
    j.submit("stage-in", JobSpec("/bin/touch", ["ran"],
                                 stage_in=[StageIn(j.inputs / "absent", "x")]))
    j.submit("stage-out", JobSpec("/bin/true", stage_out=[StageOut("never", res / "never")]))
    j.submit("cancel", JobSpec(
        "/bin/sh", ["-c", "echo p > part; touch started; sleep 600"],
        stage_out=[StageOut("part", res / "cancel" / "part", F.ON_CANCEL),
                   StageOut("part", res / "cancel" / "error", F.ON_ERROR)],
        cleanup=["part"], cleanup_flags=F.ON_CANCEL))
    if name == "slurm":
        j.submit("srun", JobSpec(
            "/bin/sh", ["-c", "cat in.txt > out.$SLURM_PROCID"], launcher="srun",
            resources=ResourceSpecV1(process_count=2),
            stage_in=[StageIn(j.inputs / "c.txt", "in.txt")],
            stage_out=[StageOut("out.0", res / "srun" / "out.0"),
                       StageOut("out.1", res / "srun" / "out.1")]))
    return j


_all: Dict[str, Jobs] = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("staging-real")
    for jobs in _all.values():
        for job in jobs.jobs.values():
            if not job.status.state.final:
                try:
                    job.cancel()
                except Exception:
                    pass
        jobs.ex.close()  # type: ignore[attr-defined]
    _all.clear()


def jobs_of(name: str, root: Path) -> Jobs:
    _need(name)
    if name not in _all:
        for other in ("slurm", "sge"):
            if other not in _all and _scheduler_problem(other) is None:
                _all[other] = _start(other, root / other)
    return _all[name]


SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_staged_job_reads_inputs_and_stages_out(name: str, root: Path) -> None:
    j = jobs_of(name, root)
    st = j.final("ok")
    assert st.state is JobState.COMPLETED and st.exit_code == 0, st
    ok = j.results / "ok"
    assert (ok / "out.txt").read_text() == "AC"
    assert (ok / "mv").read_text() == "AC" and not (j.jd / "ok" / "mv").exists()
    assert (ok / "if-present").read_text() == "AC"
    assert not (ok / "absent").exists() and not (ok / "on-error").exists()
    assert (j.jd / "ok" / "linked").is_symlink() and not (j.jd / "ok" / "tmp").exists()


@pytest.mark.parametrize("name", SCHEDULERS)
def test_failed_job_stages_on_error(name: str, root: Path) -> None:
    j = jobs_of(name, root)
    st = j.final("exit3")
    assert st.state is JobState.FAILED and st.exit_code == 3, st
    assert (j.results / "exit3" / "log").read_text() == "bad\n"
    assert not (j.results / "exit3" / "ok").exists()


@pytest.mark.parametrize("name", SCHEDULERS)
def test_stage_in_and_stage_out_failures(name: str, root: Path) -> None:
    j = jobs_of(name, root)
    st = j.final("stage-in")
    assert st.state is JobState.FAILED and st.exit_code is None, st
    assert str(st.message).startswith("stage-in failed: ")
    assert str(j.inputs / "absent") in str(st.message)
    assert not (j.jd / "stage-in" / "ran").exists()
    st = j.final("stage-out")
    assert st.state is JobState.FAILED and st.exit_code == 0, st
    assert st.message == "stage-out: 'never' does not exist"


@pytest.mark.parametrize("name", SCHEDULERS)
def test_cancel_stages_out_on_cancel(name: str, root: Path) -> None:
    j = jobs_of(name, root)
    started = j.jd / "cancel" / "started"
    deadline = time.monotonic() + WAIT.total_seconds()
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert started.exists(), "the job did not start"
    j.jobs["cancel"].cancel()
    st = j.final("cancel")
    assert st.state is JobState.CANCELED, st
    assert (j.results / "cancel" / "part").read_text() == "p\n"
    assert not (j.results / "cancel" / "error").exists()
    assert not (j.jd / "cancel" / "part").exists()


@pytest.mark.slurm
def test_staged_srun_job(root: Path) -> None:
    j = jobs_of("slurm", root)
    st = j.final("srun")
    assert st.state is JobState.COMPLETED, st
    assert [(j.results / "srun" / f"out.{i}").read_text() for i in (0, 1)] == ["C", "C"]
