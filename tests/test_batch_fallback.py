"""``fallback="local"``: with the Slurm commands removed from PATH (or a controller that does
not answer), the slurm executor warns once and runs jobs on this machine through a resource
pool; without ``fallback`` the submit error says what is missing. Plus the pool's pure rules."""

import os
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import List, Optional

import pytest

from psij import (
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    ResourceSpecV1,
    SubmitException,
)
from psij.executors.batch._fallback import SchedulerFallbackWarning
from psij.executors.batch.slurm import SlurmExecutorConfig
from psij.executors.local._pool_machine import (
    Amounts,
    Arrived,
    Cancel,
    Dropped,
    Ended,
    IllegalEvent,
    LocalPool,
    Start,
    Wait,
)

WAIT = timedelta(seconds=60)
SLURM = {"sbatch", "squeue", "scancel", "sacct", "scontrol", "sinfo", "srun", "salloc",
         "sacctmgr", "sstat", "sprio", "sshare", "sreport", "strigger", "sattach", "sbcast"}


@pytest.fixture
def no_slurm_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with everything of the current one but Slurm's commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = bin_dir / name
            if name not in SLURM and not target.exists() and not target.is_symlink():
                target.symlink_to(os.path.join(folder, name))
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def slurm(tmp_path: Path, **kw: object) -> JobExecutor:
    return JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(
        work_directory=tmp_path / "w", **kw))  # type: ignore[arg-type]


def sh(script: str, **kw: object) -> Job:
    return Job(JobSpec("/bin/sh", ["-c", script], **kw))  # type: ignore[arg-type]


def refused_submit_text(tmp_path: Path) -> str:
    """The error of a slurm submit that is refused; the job is left NEW and unbound."""
    ex = slurm(tmp_path)
    job = sh("exit 0")
    with pytest.raises(SubmitException) as info:
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None
    ex.close()
    return str(info.value)


def test_missing_commands_warn_once_and_jobs_run_locally(tmp_path: Path,
                                                         no_slurm_path: Path) -> None:
    with pytest.warns(SchedulerFallbackWarning) as seen:
        ex = slurm(tmp_path, fallback="local")
        jobs = [sh("exit 0"), sh("exit 3")]
        for job in jobs:
            ex.submit(job)
        finals = [job.wait(WAIT) for job in jobs]
    assert len(seen) == 1
    assert "cannot use its scheduler (the command 'squeue' is not on PATH)" in \
        str(seen[0].message)
    assert "run on this machine" in str(seen[0].message)
    assert [(f.state, f.exit_code) for f in finals] == [  # type: ignore[union-attr]
        (JobState.COMPLETED, 0), (JobState.FAILED, 3)]
    for f in finals:
        assert f.metadata["backend"] == "local"  # type: ignore[union-attr,index]
    with pytest.raises(SubmitException, match="cannot attach '1234': the slurm executor "
                       "cannot use its scheduler .*'squeue' is not on PATH"):
        ex.attach(Job(), "1234")
    ex.close()


def test_without_fallback_the_error_names_the_missing_command(tmp_path: Path,
                                                              no_slurm_path: Path) -> None:
    text = refused_submit_text(tmp_path)
    assert "`sbatch --parsable" in text and "could not be started" in text
    assert "not installed here or not on PATH" in text and "fallback='local'" in text


def test_a_controller_that_does_not_answer_is_a_reason_to_fall_back(
        tmp_path: Path, no_slurm_path: Path) -> None:
    for name, body in (("squeue", "echo 'slurm_load_jobs error: Unable to contact slurm "
                                  "controller (connect failure)' >&2; exit 1"),
                       ("sbatch", "exit 1")):
        path = no_slurm_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(stat.S_IRWXU)
    with pytest.warns(SchedulerFallbackWarning, match="does not answer.*Unable to contact"):
        ex = slurm(tmp_path, fallback="local")
    job = sh("exit 0")
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED
    ex.close()


def test_big_job_runs_alone_and_waiting_jobs_go_by_priority(tmp_path: Path,
                                                            no_slurm_path: Path) -> None:
    log = tmp_path / "log"
    gate = tmp_path / "gate"

    def job(name: str, cores: int, priority: int, wait_gate: bool = False) -> Job:
        hold = f"while [ ! -e {gate} ]; do sleep 0.05; done; " if wait_gate else ""
        return sh(f"echo start {name} >> {log}; {hold}sleep 0.3; echo end {name} >> {log}",
                  resources=ResourceSpecV1(cpu_cores_per_process=cores),
                  attributes=JobAttributes(custom_attributes={"psij.priority": priority}))

    with pytest.warns(SchedulerFallbackWarning):
        ex = slurm(tmp_path, fallback="local")
    first = job("first", 100000, 0, wait_gate=True)  # takes the whole machine
    ex.submit(first)
    big = job("big", 100000, 1)  # more cores than any machine: runs alone
    low = job("low", 1, 1)
    high = job("high", 1, 7)
    for j in (big, low, high):
        ex.submit(j)
    for j in (big, low, high):
        st = j.status
        assert st.state is JobState.QUEUED
        assert st.metadata["waiting_for"] == "local resources"  # type: ignore[index]
    low.cancel()
    assert low.status.state is JobState.CANCELED
    time.sleep(0.3)
    assert log.read_text().split("\n")[:1] == ["start first"]  # the others wait for it
    gate.touch()
    for j in (first, big, high):
        st = j.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED
    lines = log.read_text().split()
    events: List[str] = [" ".join(lines[i:i + 2]) for i in range(0, len(lines), 2)]
    # high priority first; the big job alone after everything before it ended
    assert events == ["start first", "end first", "start high", "end high", "start big",
                      "end big"]
    ex.close()


def test_pool_rules() -> None:
    pool = LocalPool(Amounts(4, 1000, None))
    assert pool.step(Arrived("a", Amounts(2, 500, 10), 0)) == [Start("a")]
    assert pool.step(Arrived("wide", Amounts(99, None, None), 0)) == [Wait("wide", 1)]
    # the barrier: a narrow job behind the waiting wide one waits too
    assert pool.step(Arrived("b", Amounts(1, 1, None), 0)) == [Wait("b", 2)]
    assert pool.step(Arrived("urgent", Amounts(1, 100, None), 5)) == [Start("urgent")]
    assert pool.step(Cancel("b")) == [Dropped("b")]
    assert pool.step(Ended("a")) == []
    assert pool.step(Ended("urgent")) == [Start("wide")]  # clamped to 4 cores: alone
    assert pool.step(Arrived("c", Amounts(1, 1, 1), 0)) == [Wait("c", 1)]
    assert pool.step(Ended("wide")) == [Start("c")]
    for event, text in ((Ended("zz"), "not running"), (Cancel("c"), "not waiting"),
                        (Arrived("c", Amounts(1, 1, 1), 0), "already known")):
        with pytest.raises(IllegalEvent, match=text):
            pool.step(event)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["cores", "memory", "tmp", "gpus"])
def test_a_job_larger_than_the_pool_in_any_resource_runs_alone(field: str) -> None:
    """Whatever it asks too much of, it waits for every running job to end (even those that
    ask for none of that resource), and nothing starts beside it until it ends."""
    pool = LocalPool(Amounts(4, 1000, 1000, 2))
    small = Amounts(1, None, None, None)
    huge = Amounts(**{**Amounts(1, None, None, None).as_dict(), field: 1 << 50})
    assert pool.step(Arrived("running", small, 0)) == [Start("running")]
    assert pool.step(Arrived("huge", huge, 0)) == [Wait("huge", 1)]
    assert pool.step(Arrived("after", small, 0)) == [Wait("after", 2)]  # the barrier
    # Higher priority goes first, but not beside the job running alone.
    assert pool.step(Arrived("urgent", small, 9)) == [Start("urgent")]
    assert pool.step(Ended("running")) == []
    started = pool.step(Ended("urgent"))
    assert [a.key for a in started] == ["huge"]
    if field == "gpus":  # clamped to the pool: every GPU
        assert started == [Start("huge", ("0", "1"))]
    assert pool.step(Arrived("late", small, 99)) == [Wait("late", 2)]
    assert pool.step(Ended("huge")) == [Start("late"), Start("after")]


def test_gpu_jobs_get_distinct_ids_lowest_first_and_give_them_back() -> None:
    pool = LocalPool(Amounts(8, None, None, 3), gpu_ids=("3", "5", "7"))
    assert pool.step(Arrived("a", Amounts(1, None, None, 1), 0)) == [Start("a", ("3",))]
    assert pool.step(Arrived("b", Amounts(1, None, None, 2), 0)) == [Start("b", ("5", "7"))]
    assert pool.step(Arrived("cpu", Amounts(1, None, None, None), 0)) == [Start("cpu")]
    assert pool.step(Arrived("c", Amounts(1, None, None, 2), 0)) == [Wait("c", 1)]
    assert pool.step(Ended("a")) == []  # one GPU free, c needs two
    assert pool.step(Ended("b")) == [Start("c", ("3", "5"))]
    assert pool.step(Arrived("d", Amounts(1, None, None, 1), 0)) == [Start("d", ("7",))]
    with pytest.raises(ValueError, match="2 GPU ids for 3 GPUs"):
        LocalPool(Amounts(1, None, None, 3), gpu_ids=("0", "1"))


def test_a_gpu_job_on_a_machine_without_gpus_runs_alone_in_the_fallback_pool(
        tmp_path: Path, no_slurm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU here, whatever the machine has
    log = tmp_path / "log"
    gate = tmp_path / "gate"

    def job(name: str, gpus: Optional[int] = None, wait_gate: bool = False) -> Job:
        hold = f"while [ ! -e {gate} ]; do sleep 0.05; done; " if wait_gate else ""
        return sh(f"echo start {name} >> {log}; {hold}sleep 0.3; echo end {name} >> {log}",
                  resources=ResourceSpecV1(gpu_cores_per_process=gpus))

    with pytest.warns(SchedulerFallbackWarning):
        ex = slurm(tmp_path, fallback="local")
    first, gpu, after = job("first", wait_gate=True), job("gpu", gpus=1), job("after")
    for j in (first, gpu, after):
        ex.submit(j)
    assert gpu.status.state is JobState.QUEUED and after.status.state is JobState.QUEUED
    time.sleep(0.3)
    gate.touch()
    for j in (first, gpu, after):
        st = j.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
    assert log.read_text().split("\n")[:-1] == ["start first", "end first", "start gpu",
                                                 "end gpu", "start after", "end after"]
    ex.close()


def test_a_submit_command_that_is_there_gets_no_not_installed_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 17\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PSIJ_TEST_TOO_BIG", "x" * 200_000)
    text = refused_submit_text(tmp_path)
    assert "could not be started: Argument list too long" in text and "128 KiB" in text
    assert "not installed" not in text and "fallback" not in text


def test_importing_a_batch_executor_loads_the_local_executor_only_for_a_fallback() -> None:
    # The fallback's local executor is made when a fallback is: importing the Slurm executor
    # (and through it the fallback module) loads no module holding the local executor.
    code = ("import sys, psij.executors.batch.slurm\n"
            "print(sorted(name for name, m in list(sys.modules.items())\n"
            "             if name.startswith('psij') and 'LocalJobExecutor' in vars(m)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
