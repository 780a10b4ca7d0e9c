"""``psij supervise`` on the real Grid Engine (run under the schedulers' lock): the example
study to the end, nothing left in the queue."""

import subprocess
import time
from pathlib import Path

import pytest

from real.test_batch_real import _need
from support.supervise_study import Study

pytestmark = pytest.mark.sge


def test_example_study_runs_to_completion_on_grid_engine(tmp_path: Path) -> None:
    _need("sge")
    study = Study(tmp_path / "r", executor="sge", clients=10, wave=5, timer_delay=1.0).start()
    assert study.wait(180) == 0, study.errors()
    study.check_finished()
    # The jobs' ends come from their own files, a moment before Grid Engine's execution
    # daemon reports them (it may still show them starting, "t"): they leave the queue by
    # themselves soon after, while a job left running would stay.
    deadline = time.monotonic() + 60
    while True:
        queue = subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True).stdout
        left = [nid for nid in study.native_ids() if f" {nid} " in f" {queue} "]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert left == [], queue
