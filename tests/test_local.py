"""The local executor, run for real: processes, redirections, cancel, list/attach, staging."""

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import List

import pytest

import psij
from psij import InvalidJobException, Job, JobExecutor, JobSpec, JobState, JobStatus
from psij.executors.local import _WORKER, LocalJobExecutorConfig
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode
from support.process_checks import live_members, members_left_after

TIMEOUT = timedelta(seconds=30)


@pytest.fixture
def ex(tmp_path: Path) -> JobExecutor:
    cfg = LocalJobExecutorConfig(work_directory=tmp_path / "work", cancel_grace_period=1.0)
    return JobExecutor.get_instance("local", config=cfg)


def run(ex: JobExecutor, spec: JobSpec) -> JobStatus:
    job = Job(spec)
    ex.submit(job)
    st = job.wait(timeout=TIMEOUT)
    assert st is not None, "job did not finish"
    return st


def states_of(job: Job) -> List[JobState]:
    seen: List[JobState] = []
    job.set_job_status_callback(lambda j, s: seen.append(s.state))
    return seen


def test_stdout_stderr_and_exit_code(ex: JobExecutor, tmp_path: Path) -> None:
    spec = JobSpec("/bin/sh", ["-c", "echo out; echo err >&2; exit 3"],
                   stdout_path=tmp_path / "o", stderr_path=tmp_path / "e")
    st = run(ex, spec)
    assert st.state is JobState.FAILED and st.exit_code == 3
    assert (tmp_path / "o").read_text() == "out\n"
    assert (tmp_path / "e").read_text() == "err\n"
    assert st.message is not None and "code 3" in st.message and "err" in st.message


def test_completed_job_reports_only_new_queued_active_final(ex: JobExecutor) -> None:
    job = Job(JobSpec("/bin/true"))
    seen = states_of(job)
    ex_seen: List[JobState] = []
    ex.set_job_status_callback(lambda j, s: ex_seen.append(s.state))
    ex.submit(job)
    assert job.wait(timeout=TIMEOUT) is not None
    time.sleep(0.05)
    assert seen == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert ex_seen == seen
    assert job.status.exit_code == 0 and job.native_id is not None


def test_stdin_directory_and_shared_output(ex: JobExecutor, tmp_path: Path) -> None:
    (tmp_path / "in").write_text("line1\nline2\n")
    spec = JobSpec("/bin/sh", ["-c", "cat; pwd; echo e >&2"], directory=tmp_path,
                   stdin_path="in", stdout_path="both", stderr_path="both")
    assert run(ex, spec).state is JobState.COMPLETED
    text = (tmp_path / "both").read_text()
    assert text.startswith("line1\nline2\n" + str(tmp_path) + "\n") and "e\n" in text


def test_environment_inherited_or_not(ex: JobExecutor, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PSIJ_TEST_OUTER", "outer")
    out = tmp_path / "env"
    run(ex, JobSpec("/usr/bin/env", environment={"A": "1", "B": 2}, stdout_path=out))
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["A"] == "1" and env["B"] == "2" and env["PSIJ_TEST_OUTER"] == "outer"
    run(ex, JobSpec("/usr/bin/env", environment={"A": "1"}, inherit_environment=False,
                    stdout_path=out))
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert set(env) == {"A", "PSIJ_NODEFILE"}


def test_each_change_of_the_environment_reaches_the_jobs_after_it(
        ex: JobExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The inherited variables are decoded and sent to the keeper once per change of them.
    jobs = []
    for i, value in enumerate(["one", "two", "two", None, "three"]):
        if value is None:
            monkeypatch.delenv("PSIJ_TEST_CHANGING", raising=False)
        else:
            monkeypatch.setenv("PSIJ_TEST_CHANGING", value)
        job = Job(JobSpec("/bin/sh", ["-c", 'printf %s "${PSIJ_TEST_CHANGING-unset}"'],
                          stdout_path=tmp_path / f"out{i}"))
        ex.submit(job)
        jobs.append(job)
    for job in jobs:
        assert job.wait(timeout=TIMEOUT).state is JobState.COMPLETED  # type: ignore[union-attr]
    assert [(tmp_path / f"out{i}").read_text() for i in range(5)] == \
        ["one", "two", "two", "unset", "three"]


def test_nodefile_has_one_line_per_process(ex: JobExecutor, tmp_path: Path) -> None:
    out = tmp_path / "nf"
    spec = JobSpec("/bin/sh", ["-c", 'cat "$PSIJ_NODEFILE"'], stdout_path=out,
                   resources=psij.ResourceSpecV1(process_count=3))
    run(ex, spec)
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and len(set(lines)) == 1 and lines[0]


HOSTILE = ["it's", 'say "hi"', "$(touch PWNED)", "`touch PWNED`", "a\nb", "*", "?[x]",
           "ünïcødé ✓", "{{job.id}}", "; echo foo", "  spaced  ", "", "-n", "\\", "$HOME"]


def _argv_dump(tmp_path: Path) -> List[str]:
    dumper = tmp_path / "dump.py"
    dumper.write_text("import sys, os\n"
                      "sys.stdout.buffer.write(repr(sys.argv[1:]).encode())\n"
                      "sys.stdout.buffer.write(b'|' + os.environb.get(b'HOSTILE', b'')"
                      ")\n")
    return [str(dumper)]


@pytest.mark.parametrize("via_script", [False, True])
def test_hostile_strings_reach_the_job_unchanged(ex: JobExecutor, tmp_path: Path,
                                                 via_script: bool) -> None:
    odd_dir = tmp_path / "dir with 'quote' and $(x)"
    odd_dir.mkdir()
    spec = JobSpec(sys.executable, _argv_dump(tmp_path) + HOSTILE, directory=odd_dir,
                   environment={"HOSTILE": "$(touch PWNED) `x` 'q' \"d\" \n * {{a}}"},
                   stdout_path=odd_dir / "out 'x' $y")
    if via_script:
        pre = tmp_path / "pre.sh"
        pre.write_text("export FROM_PRE=1\n")
        spec.pre_launch = pre
    st = run(ex, spec)
    assert st.state is JobState.COMPLETED, st
    data = (odd_dir / "out 'x' $y").read_bytes().decode()
    args, env_value = data.split("|", 1)
    assert eval(args) == HOSTILE
    assert env_value == "$(touch PWNED) `x` 'q' \"d\" \n * {{a}}"
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def test_cancel_running_job_terms_the_whole_group(ex: JobExecutor, tmp_path: Path) -> None:
    marker = tmp_path / "child-alive"
    script = f"(sleep 30; touch '{marker}') & sleep 30"
    job = Job(JobSpec("/bin/sh", ["-c", script]))
    ex.submit(job)
    assert job.wait(timeout=TIMEOUT, target_states=[JobState.ACTIVE]) is not None
    pgid = int(job.native_id or 0)
    job.cancel()
    st = job.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.CANCELED
    assert members_left_after(pgid, 5) == []
    assert not marker.exists()


def test_cancel_kills_a_job_that_ignores_term(ex: JobExecutor) -> None:
    job = Job(JobSpec("/bin/sh", ["-c", "trap '' TERM; echo ready; sleep 60"]))
    ex.submit(job)
    job.wait(target_states=[JobState.ACTIVE])
    time.sleep(0.2)  # let the shell install its trap
    pgid = int(job.native_id or 0)
    t0 = time.monotonic()
    job.cancel()
    # CANCELED as cancel() returns, as in psij-python; the processes end after the grace.
    assert job.status.state is JobState.CANCELED
    if time.monotonic() - t0 < 0.5:
        assert live_members(pgid), "killed at once, not after the grace period"
    assert members_left_after(pgid, TIMEOUT.total_seconds()) == []
    assert time.monotonic() - t0 >= 0.8


@pytest.mark.parametrize("keeper", [True, False])
def test_kill_ends_a_job_that_ignores_term_at_once(tmp_path: Path, keeper: bool) -> None:
    # JobExecutor.kill: the cancel of a caller that gave the job its grace already (a flow's
    # shrink, a destroy); the executor's own grace period (an hour here) is not added.
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", cancel_grace_period=3600, keeper=keeper))
    job = Job(JobSpec("/bin/sh", ["-c", "trap '' TERM; sleep 60"]))
    ex.submit(job)
    job.wait(target_states=[JobState.ACTIVE])
    time.sleep(0.2)  # let the shell install its trap
    ex.kill(job)
    assert job.status.state is JobState.CANCELED
    assert members_left_after(int(job.native_id or 0), TIMEOUT.total_seconds()) == []
    ex.kill(job)  # final: nothing more happens


def test_cancel_queued_job_never_starts_it(ex: JobExecutor, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_text("x")
    gate = threading.Event()
    _WORKER.put(gate.wait)  # hold the shared worker so the job stays QUEUED
    marker = tmp_path / "ran"
    job = Job(JobSpec("/bin/touch", [str(marker)], stage_in=[StageIn(src, tmp_path / "dst")]))
    seen = states_of(job)
    ex.submit(job)
    assert job.status.state is JobState.QUEUED
    job.cancel()
    gate.set()
    st = job.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.CANCELED
    assert not marker.exists() and not (tmp_path / "dst").exists()
    assert JobState.ACTIVE not in seen


def test_cancel_of_final_job_is_a_no_op(ex: JobExecutor) -> None:
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    job.wait()
    job.cancel()
    assert job.status.state is JobState.COMPLETED


def test_wait_timeout_and_target_states(ex: JobExecutor) -> None:
    job = Job(JobSpec("/bin/sleep", ["5"]))
    ex.submit(job)
    assert job.wait(timeout=timedelta(0)) is None
    assert job.wait(timeout=timedelta(milliseconds=100)) is None
    st = job.wait(timeout=TIMEOUT, target_states=[JobState.QUEUED])
    assert st is not None and st.state is JobState.ACTIVE
    job.cancel()
    job.wait()


def test_list_and_attach_from_another_process(ex: JobExecutor, tmp_path: Path) -> None:
    running = Job(JobSpec("/bin/sleep", ["2"]))
    done = Job(JobSpec("/bin/sh", ["-c", "exit 4"]))
    ex.submit(running)
    ex.submit(done)
    done.wait()
    assert running.native_id in ex.list() and done.native_id not in ex.list()
    code = f"""
import psij, sys
from psij import Job, JobExecutor, JobExecutorConfig
cfg = JobExecutorConfig(work_directory={str(tmp_path / 'work')!r})
ex = JobExecutor.get_instance("local", config=cfg)
print(sorted(ex.list()))
for nid in {[running.native_id, done.native_id]!r}:
    j = Job()
    ex.attach(j, nid)
    first = j.status.state
    st = j.wait()
    print(nid, first, st.state, st.exit_code)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out[0] == repr([running.native_id])
    assert out[1] == f"{running.native_id} ACTIVE COMPLETED 0"
    assert out[2] == f"{done.native_id} FAILED FAILED 4"
    assert running.wait(timeout=TIMEOUT) is not None


def test_attach_unknown_id_is_refused(ex: JobExecutor) -> None:
    with pytest.raises(InvalidJobException, match="native id 999999999"):
        ex.attach(Job(), "999999999")
    with pytest.raises(ValueError, match="native_id"):
        ex.attach(Job(), "abc")


def _children() -> set:  # type: ignore[type-arg]
    kids = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                kids.update(f.read().split())
        except OSError:
            pass
    return kids


def _assert_refused(ex: JobExecutor, spec: JobSpec, exc: type, field: str) -> None:
    job = Job(spec)
    before = _children()
    with pytest.raises(exc, match=field):
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None and job.native_id is None
    assert _children() - before == set(), "a process was started for a refused job"


@pytest.mark.parametrize("make_spec, exc, field", [
    (lambda t: JobSpec("/bin/true", stdin_path=t / "missing"), psij.SubmitException,
     "JobSpec.stdin_path"),
    (lambda t: JobSpec("/bin/true", stdout_path=t / "nodir" / "o"), psij.SubmitException,
     "JobSpec.stdout_path"),
    (lambda t: JobSpec("/bin/true", stderr_path=t / "nodir" / "e"), psij.SubmitException,
     "JobSpec.stderr_path"),
    (lambda t: JobSpec("/bin/true", directory=t / "nodir"), psij.SubmitException,
     "JobSpec.directory"),
    (lambda t: JobSpec("/bin/true", launcher="nope"), InvalidJobException, "JobSpec.launcher"),
    (lambda t: JobSpec(), InvalidJobException, "JobSpec.executable"),
    (lambda t: JobSpec("no-such-exe", pre_launch=t / "missing.sh"), psij.SubmitException,
     "JobSpec"),
])
def test_bad_specs_are_refused_before_anything_runs(ex: JobExecutor, tmp_path: Path,
                                                    make_spec, exc, field) -> None:  # type: ignore[no-untyped-def]
    _assert_refused(ex, make_spec(tmp_path), exc, field)


def test_refused_job_can_be_fixed_and_resubmitted(ex: JobExecutor, tmp_path: Path) -> None:
    job = Job(JobSpec("/bin/true", stdin_path=tmp_path / "later"))
    with pytest.raises(psij.SubmitException):
        ex.submit(job)
    (tmp_path / "later").write_text("")
    ex.submit(job)
    assert job.wait(timeout=TIMEOUT).state is JobState.COMPLETED  # type: ignore[union-attr]


def test_environment_mutated_after_construction_is_checked(ex: JobExecutor) -> None:
    spec = JobSpec("/bin/true", environment={"A": "1"})
    assert spec.environment is not None
    spec.environment["B"] = 3.5  # type: ignore[assignment]
    with pytest.raises(TypeError, match="JobSpec.environment"):
        ex.submit(Job(spec))
    spec.environment["B"] = "x\0y"
    with pytest.raises(ValueError, match="NUL"):
        ex.submit(Job(spec))


def test_submit_twice_or_not_new_is_refused(ex: JobExecutor) -> None:
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    with pytest.raises(InvalidJobException):
        ex.submit(job)
    job.wait()
    with pytest.raises(InvalidJobException, match="no JobSpec"):
        ex.submit(Job())


def test_staging_copy_link_move_and_states(ex: JobExecutor, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "a.txt").write_text("A")
    (inputs / "b.txt").write_text("B")
    (inputs / "c.txt").write_text("C")
    jd = tmp_path / "jobdir"
    jd.mkdir()
    results = tmp_path / "results"
    spec = JobSpec("/bin/sh", ["-c", "cat a.txt b.txt c.txt > out.txt; mkdir tmpd; "
                                     "echo x > tmpd/f; echo s > scratch"],
                   directory=jd,
                   stage_in=[StageIn(f"file://{inputs / 'a.txt'}", "a.txt"),
                             StageIn(inputs / "b.txt", "b.txt", StagingMode.LINK),
                             StageIn(inputs / "c.txt", "c.txt", StagingMode.MOVE)],
                   stage_out=[StageOut("out.txt", results / "out.txt"),
                              StageOut("missing", results / "m", StageOutFlags.IF_PRESENT |
                                       StageOutFlags.ALWAYS),
                              StageOut("scratch", results / "only-on-error",
                                       StageOutFlags.ON_ERROR)],
                   cleanup=["tmpd", "scratch"])
    job = Job(spec)
    seen = states_of(job)
    ex.submit(job)
    st = job.wait(timeout=TIMEOUT)
    assert st is not None and st.state is JobState.COMPLETED, st
    assert (results / "out.txt").read_text() == "ABC"
    assert os.path.islink(jd / "b.txt") and not (inputs / "c.txt").exists()
    assert not (results / "m").exists() and not (results / "only-on-error").exists()
    assert not (jd / "tmpd").exists() and not (jd / "scratch").exists()
    assert seen == [JobState.QUEUED, JobState.STAGE_IN, JobState.ACTIVE, JobState.STAGE_OUT,
                    JobState.CLEANUP, JobState.COMPLETED]


def test_stage_out_on_error_and_missing_source_fails(ex: JobExecutor, tmp_path: Path) -> None:
    res = tmp_path / "res"
    st = run(ex, JobSpec("/bin/sh", ["-c", "echo bad > log; exit 2"], directory=tmp_path,
                         stage_out=[StageOut("log", res / "log", StageOutFlags.ON_ERROR),
                                    StageOut("log", res / "ok", StageOutFlags.ON_SUCCESS)]))
    assert st.state is JobState.FAILED and st.exit_code == 2
    assert (res / "log").read_text() == "bad\n" and not (res / "ok").exists()
    st = run(ex, JobSpec("/bin/true", directory=tmp_path,
                         stage_out=[StageOut("never-made", res / "x")]))
    assert st.state is JobState.FAILED and "never-made" in (st.message or "")


def test_stage_in_failure_fails_job_without_running(ex: JobExecutor, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    st = run(ex, JobSpec("/bin/touch", [str(marker)],
                         stage_in=[StageIn(tmp_path / "absent", tmp_path / "x")]))
    assert st.state is JobState.FAILED and "stage-in" in (st.message or "")
    assert not marker.exists()


def test_many_jobs_at_once_all_complete(ex: JobExecutor) -> None:
    jobs = [Job(JobSpec("/bin/sh", ["-c", f"exit {i % 3}"])) for i in range(300)]
    for j in jobs:
        ex.submit(j)
    for i, j in enumerate(jobs):
        st = j.wait(timeout=TIMEOUT)
        assert st is not None and st.exit_code == i % 3
        assert st.state is (JobState.COMPLETED if i % 3 == 0 else JobState.FAILED)


def test_slow_callback_does_not_delay_other_jobs(ex: JobExecutor) -> None:
    slow = Job(JobSpec("/bin/true"))
    release = threading.Event()
    slow.set_job_status_callback(
        lambda j, s: release.wait(10) if s.state is JobState.ACTIVE else None)
    t = threading.Thread(target=ex.submit, args=(slow,))
    t.start()
    fast = Job(JobSpec("/bin/true"))
    ex.submit(fast)
    assert fast.wait(timeout=timedelta(seconds=5)) is not None
    release.set()
    t.join()
    assert slow.wait(timeout=TIMEOUT) is not None
