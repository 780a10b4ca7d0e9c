"""``JobExecutor.kill`` on the batch executors: the scheduler's command that sends KILL at once
runs before the usual cancel (a scheduler's own TERM-to-KILL wait is not added to the grace a
caller already gave), and the job still ends CANCELED; checked with a fake scheduler and on
the real Slurm and Grid Engine of this machine."""

import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, List

import pytest

from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors.batch._kill import KillFirst
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from support.process_checks import live_members
from test_batch_scheduler_executor import FakeExecutor, make, wait_state

WAIT = timedelta(seconds=240)


class KillingExecutor(FakeExecutor):
    KILL_COMMAND = ("fsig", "-KILL")


def test_kill_sends_kill_first_then_cancels(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    killing = KillingExecutor(config=ex.config)
    killing._runner = ex._runner
    calls: List[Any] = ex._runner.calls  # type: ignore[attr-defined]
    job = Job(JobSpec("/bin/true"))
    killing.submit(job)
    sched.set(str(job.native_id), "R")
    wait_state(job, JobState.ACTIVE)
    killing.kill(job)
    sent = [c for c in calls if c[0] in ("fsig", "fdel")]
    # fsig is not known to the fake scheduler: its failure does not stop the cancel.
    assert sent == [("fsig", "-KILL", job.native_id), ("fdel", job.native_id)]
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED
    killing.close()
    ex.close()


def test_without_a_kill_command_kill_is_the_cancel(tmp_path: Path) -> None:
    ex, _ = make(tmp_path)
    assert ex.KILL_COMMAND == () and isinstance(ex, KillFirst)
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    ex.kill(job)
    assert [c for c in ex._runner.calls if c[0] != "fstat"][-1] == (  # type: ignore
        "fdel", job.native_id)
    assert job.wait(WAIT).state is JobState.CANCELED  # type: ignore[union-attr]
    ex.close()


def _kill_wait() -> float:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("KillWait"):
            return float(line.split("=")[1].split()[0])
    return 30.0


@pytest.mark.parametrize("name", [pytest.param("slurm", marks=pytest.mark.slurm),
                                  pytest.param("sge", marks=pytest.mark.sge)])
def test_kill_ends_a_job_that_ignores_term_at_once(name: str, tmp_path: Path) -> None:
    if shutil.which("sbatch" if name == "slurm" else "qsub") is None:
        pytest.skip(f"{name} is not installed here: start it with tests/setup")
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "psij", queue_polling_interval=1,
        initial_queue_polling_delay=0.5))
    pidfile = tmp_path / "pid"
    job = Job(JobSpec("/bin/sh", ["-c", f"trap '' TERM; echo $$ > {pidfile}; sleep 300"],
                      directory=tmp_path))
    ex.submit(job)
    try:
        deadline = time.monotonic() + 200
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline, f"{name}: the job never started"
            time.sleep(0.2)
        pid = int(pidfile.read_text())
        pgid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
        started = time.monotonic()
        ex.kill(job)
        while live_members(pgid) and time.monotonic() - started < 60:
            time.sleep(0.05)
        waited = time.monotonic() - started
        assert not live_members(pgid)
        if name == "slurm" and _kill_wait() >= 4:
            assert waited < _kill_wait() - 1, f"killed after {waited:.1f} s, not at once"
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.CANCELED, st
    finally:
        if not job.status.final:
            job.cancel()
        ex.close()


@pytest.mark.parametrize("name", ["local", "batch-test"])
@pytest.mark.parametrize("bad", ["job-1", None, 3])
def test_kill_of_something_not_a_job_is_a_clear_error(name: str, bad: Any,
                                                      tmp_path: Path) -> None:
    from psij import JobExecutorConfig

    ex = JobExecutor.get_instance(name, config=JobExecutorConfig(work_directory=tmp_path))
    with pytest.raises(TypeError, match="expected psij.Job"):
        ex.kill(bad)
