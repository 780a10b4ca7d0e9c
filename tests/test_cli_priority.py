"""``psij priority [--tag TAG] ID ... PRIORITY``, run as users run it, on the registry of a
private HOME: it finds jobs as ``psij cancel`` does (re-attached to their executors, from any
process), says plainly when a job's place cannot change and why, and refuses bad usage. The
real Slurm and Grid Engine cases are in tests/real/test_batch_priority_real.py."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

import psij.registry
from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch.batch_test import BatchTestExecutorConfig

PSIJ = str(Path(sys.executable).parent / "psij")


def env(home: Path) -> Dict[str, str]:
    return dict(os.environ, HOME=str(home))


def psij_cmd(home: Path, *args: Any) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PSIJ, *args], capture_output=True, text=True, env=env(home),
                          timeout=120)


@pytest.fixture
def submitted(tmp_path: Path) -> Iterator[Tuple[Path, Job, Job]]:
    """In this process, on the registry of HOME: a batch-test job queued in its scheduler and
    a job of the same shape held back behind it (max_queued_per_shape=1)."""
    home = tmp_path / "home"
    home.mkdir()
    ex = JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
        work_directory=home / ".psij" / "work", max_queued_per_shape=1,
        queue_polling_interval=0.2, initial_queue_polling_delay=0.1))
    queued, held = (Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"batch-test.queue-delay": 120}))) for _ in range(2))
    ex.submit(queued)
    ex.submit(held)
    assert queued.native_id is not None and held.native_id is None
    psij.registry.flush()
    yield home, queued, held
    ex.close()


def test_a_job_held_in_the_submitting_process_is_said_to_be_there(
        submitted: Tuple[Path, Job, Job]) -> None:
    home, _, held = submitted
    done = psij_cmd(home, "priority", held.id, "5")
    assert done.returncode == 1, done
    assert f"job {held.id}: it is held back by the process that submitted it" in done.stderr
    assert "only that process can change its priority" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_queued_job_without_use_nice_keeps_its_place(submitted: Tuple[Path, Job, Job]
                                                       ) -> None:
    home, queued, _ = submitted
    done = psij_cmd(home, "priority", queued.id, "-3")  # a negative number is no option
    assert done.returncode == 1, done
    assert "use_nice is off" in done.stderr and queued.id in done.stderr
    assert queued.status.state is JobState.QUEUED  # the other process changed nothing


def test_jobs_whose_executor_has_no_priorities_say_so(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    job_id = psij_cmd(home, "submit", "--", "/bin/sleep", "600").stdout.strip()
    try:
        done = psij_cmd(home, "priority", job_id, "2")
        assert done.returncode == 1, done
        assert "local executor cannot change the priority" in done.stderr
    finally:
        psij_cmd(home, "cancel", job_id)


@pytest.mark.parametrize("args,text", [
    (["JOBID", "abc"], "PRIORITY: expected a finite number"),
    (["JOBID", "nan"], "PRIORITY: expected a finite number"),
    (["JOBID", "inf"], "PRIORITY: expected a finite number"),
    (["JOBID", "1e999"], "PRIORITY: expected a finite number"),
    (["5"], "name the jobs"),
    (["no-such-job", "5"], "no recorded job with id no-such-job"),
    (["--tag", "nobody", "5"], "no recorded job has tag 'nobody'"),
])
def test_bad_usage_is_a_clear_error(submitted: Tuple[Path, Job, Job], args: Any,
                                    text: str) -> None:
    home, queued, _ = submitted
    done = psij_cmd(home, "priority", *[queued.id if a == "JOBID" else a for a in args])
    assert done.returncode == 2, done
    assert text in done.stderr and "Traceback" not in done.stderr
