"""Staging end to end on PBS Pro, Torque, LSF, Cobalt and Flux, through the fake scheduler
commands of tests/support/fake_site_scheduler.py, which run each submitted script for real: each
template's script stages in, runs, stages out, and its report is read back under the native id
of that scheduler."""

from datetime import timedelta
from pathlib import Path
from typing import Tuple

from psij import Job, JobSpec, JobState
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode

WAIT = timedelta(seconds=30)


def test_staging_end_to_end(site: Tuple[str, BatchSchedulerExecutor],
                            tmp_path: Path) -> None:
    name, ex = site
    (tmp_path / "in 'x'.txt").write_text("IN")
    jd = tmp_path / "job dir"
    jd.mkdir()
    res = tmp_path / "res"
    ok = Job(JobSpec("/bin/sh", ["-c", "cat a.txt > out.txt"], directory=jd,
                     stage_in=[StageIn(tmp_path / "in 'x'.txt", "a.txt", StagingMode.LINK)],
                     stage_out=[StageOut("out.txt", res / "out.txt", StageOutFlags.IF_PRESENT),
                                StageOut("none", res / "none", StageOutFlags.IF_PRESENT)],
                     cleanup=["out.txt"]))
    bad_in = Job(JobSpec("/bin/touch", ["ran"], directory=jd,
                         stage_in=[StageIn(tmp_path / "absent", "x")]))
    bad_out = Job(JobSpec("/bin/true", directory=jd, stage_out=[StageOut("never", res / "n")]))
    for job in (ok, bad_in, bad_out):
        ex.submit(job)
    st = ok.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, (name, st)
    assert (res / "out.txt").read_text() == "IN" and not (res / "none").exists()
    assert not (jd / "out.txt").exists()
    st = bad_in.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code is None, (name, st)
    assert str(st.message).startswith("stage-in failed: ") and not (jd / "ran").exists()
    st = bad_out.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 0, (name, st)
    assert st.message == "stage-out: 'never' does not exist"
    assert not list(ex.work_directory.glob("*.staging")), name
