"""A failed job's message quotes the end of its stderr in the same words, and to the same extent,
on the local executor and on the batch executors."""

from datetime import timedelta
from pathlib import Path

import psij
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.executors.local import LocalJobExecutorConfig

# 15 lines on stderr, then exit 3: the excerpt is the last 10 lines.
SCRIPT = "for i in $(seq 1 15); do echo \"complaint $i\" >&2; done; exit 3"
EXPECTED = ("the job exited with code 3; last lines of the job's stderr:\n"
            + "\n".join(f"complaint {i}" for i in range(6, 16)))


def _failed_message(executor: psij.JobExecutor, directory: Path) -> str:
    directory.mkdir()
    job = psij.Job(psij.JobSpec("/bin/sh", ["-c", SCRIPT], directory=directory,
                                stderr_path=Path("err.txt")))
    executor.submit(job)
    status = job.wait(timedelta(seconds=60))
    assert status is not None and status.state is psij.JobState.FAILED, status
    assert status.exit_code == 3
    assert status.message is not None
    return status.message


def test_local_and_batch_quote_stderr_alike(tmp_path: Path) -> None:
    local = psij.JobExecutor.get_instance(
        "local", config=LocalJobExecutorConfig(work_directory=tmp_path / "local-work"))
    batch = psij.JobExecutor.get_instance(
        "batch-test", config=BatchTestExecutorConfig(work_directory=tmp_path / "batch-work",
                                                     queue_polling_interval=0.2,
                                                     initial_queue_polling_delay=0.1))
    try:
        local_message = _failed_message(local, tmp_path / "local-job")
        batch_message = _failed_message(batch, tmp_path / "batch-job")
    finally:
        batch.close()
    assert local_message == EXPECTED
    assert batch_message == EXPECTED
