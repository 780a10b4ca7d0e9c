"""``PSIJ_LOG=<level>`` sends the ``psij`` loggers' records to stderr; it is read when the first
executor is made, never at ``import psij``, and a bad value is reported and ignored."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

# Submits one job to batch-test, whose executor logs "job <id>: submitted as <native id>" at
# DEBUG level, and prints whether ``import psij`` alone had loaded logging.
JOB = r'''
import sys
from datetime import timedelta
import psij
early = "logging" in sys.modules
from psij.executors.batch.batch_test import BatchTestExecutorConfig
ex = psij.JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
    work_directory=sys.argv[1], queue_polling_interval=0.2, initial_queue_polling_delay=0.1))
job = psij.Job(psij.JobSpec("/bin/true"))
ex.submit(job)
print(job.wait(timedelta(seconds=60)).state, job.native_id, early)
ex.close()
'''


def _run(tmp_path: Path, value: Optional[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PSIJ_LOG"}
    if value is not None:
        env["PSIJ_LOG"] = value
    done = subprocess.run([sys.executable, "-c", JOB, str(tmp_path / "work")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_psij_log_debug_shows_the_executors_debug_records(tmp_path: Path) -> None:
    done = _run(tmp_path, "DEBUG")
    state, native_id, early = done.stdout.split()
    assert (state, early) == ("COMPLETED", "False")
    lines = [line for line in done.stderr.splitlines() if "submitted as" in line]
    assert len(lines) == 1, done.stderr
    assert " DEBUG psij.executors.batch.batch_scheduler_executor [MainThread]: job " in lines[0]
    assert lines[0].endswith(f": submitted as {native_id}")


def test_without_psij_log_nothing_is_printed(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert done.stdout.split()[0] == "COMPLETED"
    assert done.stderr == ""


def test_a_bad_psij_log_value_is_named_and_ignored(tmp_path: Path) -> None:
    done = _run(tmp_path, "verbose")
    assert done.stdout.split()[0] == "COMPLETED"
    assert done.stderr == ("psij: PSIJ_LOG='verbose' ignored: expected one of debug, info, "
                           "warning, error, critical\n")
