"""File staging: the flag rules, and the same staging scenarios run on every executor that
stages (local in its own process; batch-test and the in-process pilot in the job's script),
with real files, real processes and, for batch-test, the fake scheduler's real cancel."""

import os
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Iterator, List

import pytest

from psij import InvalidJobException, Job, JobExecutor, JobSpec, JobState, JobStatus
from psij.executors._staging import read_report, staged_status
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.executors.local import LocalJobExecutorConfig
from psij.executors.pilot.executor import PilotJobExecutorConfig
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode, normalize_flags

F = StageOutFlags
WAIT = timedelta(seconds=60)
EXECUTORS = ["local", "batch-test", "pilot"]


# -- the flag rules (pure) ----------------------------------------------------------------------

@pytest.mark.parametrize(("given", "meant"), [
    (F.NONE, F.ALWAYS),
    (F.IF_PRESENT, F.IF_PRESENT | F.ALWAYS),
    (F.ON_SUCCESS, F.ON_SUCCESS),
    (F.IF_PRESENT | F.ON_ERROR, F.IF_PRESENT | F.ON_ERROR),
    (F.ON_CANCEL | F.ON_ERROR, F.ON_CANCEL | F.ON_ERROR),
    (F.ALWAYS, F.ALWAYS),
    (F.IF_PRESENT | F.ALWAYS, F.IF_PRESENT | F.ALWAYS),
])
def test_flag_rules(given: StageOutFlags, meant: StageOutFlags) -> None:
    assert normalize_flags(given) == meant
    assert StageOut("a", "b", given).flags == meant
    out = StageOut("a", "b")
    out.flags = given
    assert out.flags == meant


def test_none_and_if_present_alone_apply_to_every_outcome() -> None:
    for outcome in (F.ON_SUCCESS, F.ON_ERROR, F.ON_CANCEL):
        assert StageOut("a", "b", F.NONE).flags & outcome
        assert StageOut("a", "b", F.IF_PRESENT).flags & outcome
        assert normalize_flags(F.NONE) & outcome
    assert not StageOut("a", "b", F.ON_ERROR).flags & F.ON_SUCCESS


# -- the report a job script leaves (pure) ------------------------------------------------------

def test_report_rules(tmp_path: Path) -> None:
    report = tmp_path / "r"
    report.write_text("job-exit 0\nstage-out-failed stage-out: 'a' does not exist\n"
                      "stage-out-failed stage-out: 'b' does not exist\n"
                      "cleanup-failed cleanup of /x failed: busy\n")
    done = JobStatus(JobState.COMPLETED, exit_code=0)
    st = staged_status(done, read_report(report))
    assert st.state is JobState.FAILED and st.exit_code == 0
    assert st.message == "stage-out: 'a' does not exist"
    canceled = JobStatus(JobState.CANCELED, exit_code=143)
    assert staged_status(canceled, read_report(report)) is canceled
    report.write_text("stage-in-failed stage-in failed: No such file or directory: '/in'\n")
    st = staged_status(JobStatus(JobState.FAILED, exit_code=1, message="exit 1"),
                       read_report(report))
    assert st.state is JobState.FAILED and st.exit_code is None
    assert st.message == "stage-in failed: No such file or directory: '/in'"
    assert read_report(tmp_path / "absent") is None
    report.write_text("garbage\x00 line\njob-exit x\n")
    failed = JobStatus(JobState.FAILED, exit_code=3)
    assert staged_status(failed, read_report(report)) is failed


# -- scenarios on every executor ----------------------------------------------------------------

@pytest.fixture(params=EXECUTORS)
def ex(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobExecutor]:
    name = request.param
    work = tmp_path / "work"
    if name == "local":
        executor = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
            work_directory=work, cancel_grace_period=5.0))
    elif name == "batch-test":
        executor = JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
            work_directory=work, queue_polling_interval=0.2, initial_queue_polling_delay=0.1,
            keep_finished=1))
    else:
        executor = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(
            work_directory=work, cores=2))
    yield executor
    close = getattr(executor, "close", None)
    if close is not None:
        close()


def run(ex: JobExecutor, spec: JobSpec) -> JobStatus:
    job = Job(spec)
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None, f"job {job.native_id} did not finish"
    return st


def folders(tmp_path: Path) -> List[Path]:
    made = [tmp_path / n for n in ("inputs", "job dir 'q' $(x)", "results")]
    for d in made:
        d.mkdir()
    return made


def test_stage_in_files_the_job_reads_and_stage_out_every_mode(ex: JobExecutor,
                                                               tmp_path: Path) -> None:
    inputs, jd, results = folders(tmp_path)
    (inputs / "a.txt").write_text("A")
    (inputs / "b b.txt").write_text("B")
    (inputs / "c'.txt").write_text("C")
    (inputs / "tree").mkdir()
    (inputs / "tree" / "leaf").write_text("L")
    spec = JobSpec(
        "/bin/sh", ["-c", "cat a.txt sub/b.txt c.txt tree/leaf > out.txt; cp out.txt moved; "
                          "cp out.txt linked; mkdir tmpd; echo x > tmpd/f; echo s > scratch"],
        directory=jd,
        stage_in=[StageIn(f"file://{inputs / 'a.txt'}", "a.txt"),
                  StageIn(inputs / "b b.txt", "sub/b.txt", StagingMode.LINK),
                  StageIn(inputs / "c'.txt", "c.txt", StagingMode.MOVE),
                  StageIn(inputs / "tree", "tree")],
        stage_out=[StageOut("out.txt", results / "copied" / "out.txt"),
                   StageOut("moved", results / "moved", mode=StagingMode.MOVE),
                   StageOut("linked", results / "linked", mode=StagingMode.LINK),
                   StageOut("out.txt", results / "if-present", F.IF_PRESENT),
                   StageOut("absent", results / "absent", F.IF_PRESENT),
                   StageOut("absent", results / "absent2", F.IF_PRESENT | F.ON_SUCCESS),
                   StageOut("out.txt", results / "on-error", F.ON_ERROR),
                   StageOut("out.txt", results / "on-cancel", F.ON_CANCEL),
                   StageOut("tree", results / "tree")],
        cleanup=["tmpd", "scratch"])
    st = run(ex, spec)
    assert st.state is JobState.COMPLETED and st.exit_code == 0, st
    assert (results / "copied" / "out.txt").read_text() == "ABCL"
    assert (results / "moved").read_text() == "ABCL" and not (jd / "moved").exists()
    assert os.readlink(results / "linked") == str(jd / "linked")
    assert os.readlink(jd / "sub" / "b.txt") == str(inputs / "b b.txt")
    assert not (inputs / "c'.txt").exists() and (jd / "c.txt").read_text() == "C"
    assert (results / "if-present").read_text() == "ABCL"
    assert (results / "tree" / "leaf").read_text() == "L"
    for absent in ("absent", "absent2", "on-error", "on-cancel"):
        assert not (results / absent).exists(), absent
    assert not (jd / "tmpd").exists() and not (jd / "scratch").exists()


def test_staged_file_as_stdin(ex: JobExecutor, tmp_path: Path) -> None:
    inputs, jd, results = folders(tmp_path)
    (inputs / "in.txt").write_text("IN")
    st = run(ex, JobSpec("/bin/cat", directory=jd, stdin_path="in.txt", stdout_path="out.txt",
                         stage_in=[StageIn(inputs / "in.txt", "in.txt")],
                         stage_out=[StageOut("out.txt", results / "out.txt")]))
    assert st.state is JobState.COMPLETED, st
    assert (results / "out.txt").read_text() == "IN"


def test_failed_job_stages_on_error_entries_and_keeps_its_failure(ex: JobExecutor,
                                                                  tmp_path: Path) -> None:
    _, jd, results = folders(tmp_path)
    spec = JobSpec("/bin/sh", ["-c", "echo bad > log; echo t > tmp; exit 2"], directory=jd,
                   stage_out=[StageOut("log", results / "err-log", F.ON_ERROR),
                              StageOut("log", results / "ok-log", F.ON_SUCCESS),
                              StageOut("never-made", results / "x", F.ON_ERROR | F.IF_PRESENT),
                              StageOut("log", results / "always", F.NONE)],
                   cleanup=["tmp"], cleanup_flags=F.ON_SUCCESS)
    st = run(ex, spec)
    assert st.state is JobState.FAILED and st.exit_code == 2, st
    assert "code 2" in str(st.message)
    assert (results / "err-log").read_text() == "bad\n"
    assert (results / "always").read_text() == "bad\n"
    assert not (results / "ok-log").exists() and not (results / "x").exists()
    assert (jd / "tmp").exists()  # cleanup only on success
    # NONE means ALWAYS for cleanup too.
    st = run(ex, JobSpec("/bin/sh", ["-c", "echo t > tmp2; exit 1"], directory=jd,
                         cleanup=["tmp2"], cleanup_flags=F.NONE))
    assert st.state is JobState.FAILED and not (jd / "tmp2").exists()


def test_if_present_alone_stages_a_present_file(ex: JobExecutor, tmp_path: Path) -> None:
    _, jd, results = folders(tmp_path)
    st = run(ex, JobSpec("/bin/sh", ["-c", "echo hi > out.txt"], directory=jd,
                         stage_out=[StageOut("out.txt", results / "out.txt", F.IF_PRESENT),
                                    StageOut("nope", results / "nope", F.IF_PRESENT)]))
    assert st.state is JobState.COMPLETED, st
    assert (results / "out.txt").read_text() == "hi\n"
    assert not (results / "nope").exists()


def test_missing_stage_out_source_fails_a_successful_job(ex: JobExecutor,
                                                         tmp_path: Path) -> None:
    _, jd, results = folders(tmp_path)
    st = run(ex, JobSpec("/bin/sh", ["-c", "echo x > made"], directory=jd,
                         stage_out=[StageOut("never-made", results / "x"),
                                    StageOut("made", results / "made")]))
    assert st.state is JobState.FAILED and st.exit_code == 0, st
    assert st.message == "stage-out: 'never-made' does not exist"
    assert (results / "made").read_text() == "x\n"  # the other entries still run


def test_stage_in_failure_fails_without_running(ex: JobExecutor, tmp_path: Path) -> None:
    inputs, jd, results = folders(tmp_path)
    (inputs / "ok").write_text("ok")
    missing = inputs / "absent file"
    st = run(ex, JobSpec("/bin/touch", ["ran"], directory=jd,
                         stage_in=[StageIn(inputs / "ok", "ok"), StageIn(missing, "x"),
                                   StageIn(inputs / "ok", "ok2")],
                         stage_out=[StageOut("ok", results / "ok")], cleanup=["ok"]))
    assert st.state is JobState.FAILED and st.exit_code is None, st
    message = str(st.message)
    assert message.startswith("stage-in failed: ") and str(missing) in message
    assert "No such file or directory" in message
    assert not (jd / "ran").exists() and not (jd / "ok2").exists()
    # As on local: no stage-out or cleanup for a job that did not run.
    assert (jd / "ok").exists() and not (results / "ok").exists()


@pytest.mark.parametrize("mode", list(StagingMode))
def test_stage_in_of_a_missing_source_fails_in_every_mode(ex: JobExecutor, tmp_path: Path,
                                                          mode: StagingMode) -> None:
    _, jd, _ = folders(tmp_path)
    st = run(ex, JobSpec("/bin/true", directory=jd,
                         stage_in=[StageIn(tmp_path / "absent", "x", mode)]))
    assert st.state is JobState.FAILED and "No such file or directory" in str(st.message), st
    assert not os.path.lexists(jd / "x")


def test_stage_in_failure_names_the_cause(ex: JobExecutor, tmp_path: Path) -> None:
    inputs, jd, _ = folders(tmp_path)
    (inputs / "f").write_text("f")
    (jd / "blocker").write_text("a file where a folder is needed")
    st = run(ex, JobSpec("/bin/true", directory=jd,
                         stage_in=[StageIn(inputs / "f", "blocker/f")]))
    assert st.state is JobState.FAILED and str(st.message).startswith("stage-in failed: ")
    assert "blocker" in str(st.message), st


def test_cancel_stages_out_on_cancel_entries(ex: JobExecutor, tmp_path: Path) -> None:
    _, jd, results = folders(tmp_path)
    started = jd / "started"
    spec = JobSpec("/bin/sh", ["-c", "echo partial > part; touch started; sleep 120"],
                   directory=jd,
                   stage_out=[StageOut("part", results / "on-cancel", F.ON_CANCEL),
                              StageOut("part", results / "on-error", F.ON_ERROR),
                              StageOut("part", results / "on-success", F.ON_SUCCESS)],
                   cleanup=["part"], cleanup_flags=F.ON_CANCEL)
    job = Job(spec)
    ex.submit(job)
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    for _ in range(600):
        if started.exists():
            break
        job.wait(timedelta(seconds=0.1), target_states=[JobState.COMPLETED])
    assert started.exists()
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    assert (results / "on-cancel").read_text() == "partial\n"
    assert not (results / "on-error").exists() and not (results / "on-success").exists()
    assert not (jd / "part").exists()


# -- refused before anything is submitted (script executors) ------------------------------------

@pytest.mark.parametrize("bad", [
    {"stage_in": [StageIn("http://example.org/x", "x")]},
    {"stage_out": [StageOut("x", "sftp://host/x")]},
    {"stage_in": [StageIn("file://otherhost/x", "x")]},
    {"stage_in": [StageIn("/in\nput", "x")]},
    {"stage_out": [StageOut("out\ud800", "/tmp/x")]},
    {"cleanup": ["a\nb"]},
    {"stage_out": [StageOut("x", "file://localhost")]},
])
def test_unwritable_or_remote_paths_are_refused_at_submit(bad: dict, tmp_path: Path,
                                                          request: pytest.FixtureRequest
                                                          ) -> None:
    for name in ("batch-test", "pilot"):
        work = tmp_path / name
        if name == "batch-test":
            ex = JobExecutor.get_instance(name, config=BatchTestExecutorConfig(
                work_directory=work))
        else:
            ex = JobExecutor.get_instance(name, config=PilotJobExecutorConfig(
                work_directory=work, cores=1))
        job = Job(JobSpec("/bin/true", **bad))
        field = next(iter(bad))
        with pytest.raises(InvalidJobException, match=rf"JobSpec\.{field}\[0\]"):
            ex.submit(job)
        assert job.status.state is JobState.NEW and job.executor is None
        assert not list(work.rglob("*.job")) and not list(work.rglob("*.staging"))
        if name == "batch-test":
            spool = work / "batch-test-spool" / "jobs"
            assert not spool.exists() or not list(spool.iterdir())
        ex.close()


# -- a served pilot: the task script is written by the submitting process -------------------

def test_served_pilot_stages_in_the_task(tmp_path: Path) -> None:
    from test_pilot_executor import Served

    short = Path(tempfile.mkdtemp(prefix="pj"))
    served = Served(short, tmp_path / "wd").start()
    try:
        inputs, jd, results = folders(tmp_path)
        (inputs / "in.txt").write_text("IN")
        ex = JobExecutor.get_instance("pilot", url=f"unix://{served.socket}",
                                      config=PilotJobExecutorConfig(work_directory=tmp_path))
        st = run(ex, JobSpec("/bin/cat", directory=jd, stdin_path="in.txt",
                             stdout_path="out.txt",
                             stage_in=[StageIn(inputs / "in.txt", "in.txt")],
                             stage_out=[StageOut("out.txt", results / "out.txt")]))
        assert st.state is JobState.COMPLETED, st
        assert (results / "out.txt").read_text() == "IN"  # stdin opened once staged in
        st = run(ex, JobSpec("/bin/true", directory=jd,
                             stage_out=[StageOut("never", results / "never")]))
        assert st.state is JobState.FAILED and st.exit_code == 0
        assert st.message == "stage-out: 'never' does not exist"
        assert not list((tmp_path / "pilot").iterdir())  # scripts and reports removed
        ex.close()  # type: ignore[attr-defined]
    finally:
        served.stop()
        shutil.rmtree(short, ignore_errors=True)
