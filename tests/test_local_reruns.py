"""Requeue and retries on the ``local`` executor (``psij.requeue``, ``psij.retry``): each run
is a new process of the same Job, QUEUED again with its attempt in the status metadata; a
failure at the opt-in time limit has the cause ``time_limit``; a cancel between or during runs
leaves nothing running; a run that cannot start ends the job with the status of the run
before. Real processes and clock, sub-second to two-second payloads."""

import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, JobStatus
from psij._spawn import LaunchError
from psij.executors.local import LocalJobExecutorConfig
from psij.executors.local import _executor as local_executor
from psij.staging import StageIn
from support.process_checks import alive

WAIT = 30.0

# Counts its runs in the file "count" of its directory, notes PSIJ_ATTEMPT in "attempts" and
# its pid in "pid", then exits with argv[1] until the run argv[2] (then 0).
COUNTING = (
    "import os, pathlib, sys\n"
    "p = pathlib.Path('count'); n = int(p.read_text()) + 1 if p.exists() else 1\n"
    "p.write_text(str(n))\n"
    "with open('attempts', 'a') as f: f.write(os.environ.get('PSIJ_ATTEMPT', '-') + '\\n')\n"
    "pathlib.Path('pid').write_text(str(os.getpid()))\n"
    "sys.exit(0 if n >= int(sys.argv[2]) else int(sys.argv[1]))\n"
)
# Saves its work on SIGUSR1 and exits with 85 to be requeued; a run that finds the work saved
# completes at once.
CHECKPOINTING = (
    "import os, pathlib, signal, sys, time\n"
    "runs = pathlib.Path('runs'); runs.write_text(runs.read_text() + 'r' if runs.exists()"
    " else 'r')\n"
    "if pathlib.Path('checkpoint').exists(): sys.exit(0)\n"
    "def saved(*_):\n"
    "    pathlib.Path('checkpoint').write_text('work')\n"
    "    sys.exit(85)\n"
    "signal.signal(signal.SIGUSR1, saved)\n"
    "time.sleep(30)\n"
)


def make(tmp_path: Path, enforce: bool = False, keeper: bool = True,
         grace: float = 0.2) -> JobExecutor:
    return JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", enforce_duration=enforce, keeper=keeper,
        cancel_grace_period=grace))


def job_of(tmp_path: Path, args: List[str], duration: float = 600,
           **custom: Any) -> "tuple[Job, List[JobStatus]]":
    spec = JobSpec(sys.executable, args, directory=tmp_path,
                   attributes=JobAttributes(duration=duration, custom_attributes=custom))
    job = Job(spec)
    seen: List[JobStatus] = []
    job.set_job_status_callback(lambda j, st: seen.append(st))
    return job, seen


def final(job: Job) -> JobStatus:
    status = job.wait(timeout=WAIT)
    assert status is not None and status.state.final, status
    return status


USE = ("started_at", "ended_at", "cpu_seconds", "max_rss_bytes")  # a run's figures


def meta(status: JobStatus) -> Dict[str, Any]:
    """The status's metadata less the figures of the run (test_local_accounting's)."""
    return {k: v for k, v in (status.metadata or {}).items() if k not in USE}


def states(seen: List[JobStatus]) -> List[str]:
    return [st.state.name for st in seen]


def test_a_time_limit_failure_has_the_cause_and_keeps_its_message(tmp_path: Path) -> None:
    ex = make(tmp_path, enforce=True)
    job, _ = job_of(tmp_path, ["-c", "import time; time.sleep(30)"], duration=0.3)
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED
    assert meta(status) == {"cause": "time_limit"}
    assert "time limit" in (status.message or "")
    other, _ = job_of(tmp_path, ["-c", "raise SystemExit(3)"])
    ex.submit(other)
    status = final(other)
    assert status.state is JobState.FAILED and status.exit_code == 3
    assert "cause" not in meta(status)  # the policy's "failed"


def test_a_retry_after_the_time_limit_runs_longer_and_completes(tmp_path: Path) -> None:
    ex = make(tmp_path, enforce=True)
    job, seen = job_of(tmp_path, ["-c", "import time; time.sleep(1.5)"], duration=1,
                       **{"psij.retry": "attempts=3,on=time_limit,duration=3"})
    ex.submit(job)
    first = job.native_id
    status = final(job)
    assert status.state is JobState.COMPLETED, status
    assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    again = meta(seen[2])
    assert again["attempt"] == 2 and again["rerun"] == "retry"
    assert again["cause"] == "time_limit"
    assert again["previous"]["native_id"] == first
    assert "time limit" in again["previous"]["message"]
    assert meta(seen[3])["attempt"] == 2 and meta(status)["attempt"] == 2
    assert "attempt" not in meta(seen[1])
    assert job.spec is not None and job.spec.attributes.duration.total_seconds() == 3.0
    assert job.spec.environment == {"PSIJ_ATTEMPT": "2"}
    assert job.native_id != first and job.native_id is not None


def test_a_failing_job_is_retried_until_its_third_run_completes(tmp_path: Path) -> None:
    ex = make(tmp_path)
    job, seen = job_of(tmp_path, ["-c", COUNTING, "3", "3"], **{"psij.retry": "3"})
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.COMPLETED and meta(status)["attempt"] == 3
    assert (tmp_path / "attempts").read_text().split() == ["1", "2", "3"]
    queued = [st for st in seen if st.state is JobState.QUEUED]
    assert [meta(st).get("attempt") for st in queued] == [None, 2, 3]
    assert [meta(st).get("cause") for st in queued] == [None, "failed", "failed"]
    assert queued[1].message == "retried after failed: attempt 2 of 3, duration 600 s"


def test_psij_attempt_is_set_in_every_run_of_a_job_that_may_run_again_only(
        tmp_path: Path) -> None:
    # A job that may be run again has PSIJ_ATTEMPT from its first run on (1); a job that may
    # not (no policy, psij.requeue=0, a single attempt) has none, as with psij-python. The
    # job's own spec is not changed for its first run.
    ex = make(tmp_path)
    for i, (custom, seen_as) in enumerate([
            ({}, "-"), ({"psij.requeue": 0}, "-"), ({"psij.retry": "1"}, "-"),
            ({"psij.requeue": 1}, "1"), ({"psij.retry": "attempts=2,on=time_limit"}, "1")]):
        folder = tmp_path / str(i)
        folder.mkdir()
        job, _ = job_of(folder, ["-c", COUNTING, "0", "1"], **custom)
        ex.submit(job)
        assert final(job).state is JobState.COMPLETED
        assert (folder / "attempts").read_text().split() == [seen_as], custom
        assert job.spec is not None and job.spec.environment is None


def test_attempts_exhausted_end_the_job_failed_with_the_last_attempt(tmp_path: Path) -> None:
    ex = make(tmp_path)
    job, seen = job_of(tmp_path, ["-c", COUNTING, "4", "99"],
                       **{"psij.retry": "attempts=2,on=failed"})
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 4
    assert meta(status)["attempt"] == 2
    assert (tmp_path / "count").read_text() == "2"
    assert states(seen).count("ACTIVE") == 2


def test_causes_not_named_are_not_retried(tmp_path: Path) -> None:
    ex = make(tmp_path, enforce=True)
    job, _ = job_of(tmp_path, ["-c", COUNTING, "5", "99"],
                    **{"psij.retry": "attempts=3,on=time_limit"})
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 5
    assert "attempt" not in meta(status)
    assert (tmp_path / "count").read_text() == "1"
    timed, _ = job_of(tmp_path, ["-c", "import time; time.sleep(30)"], duration=0.3,
                      **{"psij.retry": "attempts=3,on=failed+out_of_memory"})
    ex.submit(timed)
    status = final(timed)
    assert status.state is JobState.FAILED and meta(status) == {"cause": "time_limit"}


def test_a_job_that_checkpoints_on_the_signal_before_its_end_is_requeued(
        tmp_path: Path) -> None:
    ex = make(tmp_path, enforce=True)
    # The signal 2 s after the start: Python has set its handler by then, even on a busy
    # machine (the default action of USR1 ends the process).
    job, seen = job_of(tmp_path, ["-c", CHECKPOINTING], duration=5,
                       **{"psij.requeue": 1, "psij.signal_before_end": "USR1@3"})
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.COMPLETED, status
    assert (tmp_path / "checkpoint").read_text() == "work"
    assert (tmp_path / "runs").read_text() == "rr"
    again = meta(seen[2])
    assert seen[2].state is JobState.QUEUED
    assert again["rerun"] == "requeue" and again["cause"] == "checkpoint"
    assert again["previous"]["exit_code"] == 85 and meta(status)["attempt"] == 2
    assert job.spec is not None and job.spec.attributes.duration.total_seconds() == 5  # kept


def test_requeues_stop_at_the_limit(tmp_path: Path) -> None:
    ex = make(tmp_path)
    job, seen = job_of(tmp_path, ["-c", COUNTING, "85", "99"], **{"psij.requeue": 2})
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 85
    assert meta(status)["attempt"] == 3
    assert (tmp_path / "count").read_text() == "3"
    assert [meta(st).get("rerun") for st in seen if st.state is JobState.QUEUED] == \
        [None, "requeue", "requeue"]


def test_cancel_during_a_retried_run_leaves_no_process(tmp_path: Path) -> None:
    ex = make(tmp_path)
    job, _ = job_of(tmp_path, ["-c", SLEEPS_IN_RUN_2, "3", "99"], **{"psij.retry": "3"})
    ex.submit(job)
    pid = wait_for_run_2(job, tmp_path)
    assert str(pid) == job.native_id and alive(pid)
    job.cancel()
    status = final(job)
    assert status.state is JobState.CANCELED and meta(status)["attempt"] == 2
    deadline = time.monotonic() + 5
    while alive(pid):
        assert time.monotonic() < deadline, "the second run still runs"
        time.sleep(0.02)
    assert (tmp_path / "count").read_text() == "2"


def test_cancel_while_the_next_run_starts_ends_canceled_without_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = make(tmp_path)
    job, seen = job_of(tmp_path, ["-c", COUNTING, "3", "99"], **{"psij.retry": "3"})
    prepare = ex._prepare  # type: ignore[attr-defined]

    def cancel_first(j: Job, spec: JobSpec) -> Any:
        if meta(j.status).get("attempt") == 2:
            j.cancel()  # between the runs: the first ended, the second not registered yet
        return prepare(j, spec)

    monkeypatch.setattr(ex, "_prepare", cancel_first)
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.CANCELED, status
    time.sleep(0.3)
    assert (tmp_path / "count").read_text() == "1"
    assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "CANCELED"]


def test_a_run_that_cannot_start_ends_the_job_with_the_run_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = make(tmp_path, keeper=False)
    spawner = local_executor._SPAWNER
    spawn = spawner.spawn
    calls: List[int] = []

    def failing(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        if len(calls) > 1:
            raise LaunchError("no more processes", 11)
        return spawn(*args, **kwargs)

    monkeypatch.setattr(spawner, "spawn", failing)
    job, seen = job_of(tmp_path, ["-c", COUNTING, "7", "99"], **{"psij.retry": "3"})
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.FAILED and status.exit_code == 7
    message = status.message or ""
    assert "running it again (retry after failed) failed" in message
    assert "no more processes" in message
    assert (tmp_path / "count").read_text() == "1" and len(calls) == 2
    assert meta(status).get("attempt") == 2
    assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "FAILED"]


def test_the_registry_records_each_run_of_the_job(tmp_path: Path) -> None:
    ex = make(tmp_path)
    job, _ = job_of(tmp_path, ["-c", COUNTING, "3", "2"], **{"psij.retry": "2"})
    ex.submit(job)
    first = job.native_id
    assert final(job).state is JobState.COMPLETED
    second: Optional[str] = job.native_id
    assert second != first
    import psij.registry

    psij.registry.flush()
    entries = ex._scan()  # type: ignore[attr-defined]
    runs = {str(pid): entry for (pid, _start), entry in entries.items()}
    assert first in runs and second in runs
    assert runs[first].job_id == runs[second].job_id == job.id
    assert (runs[first].ended, runs[first].code) == (True, 3)
    assert (runs[second].ended, runs[second].code) == (True, 0)


SLEEPS_IN_RUN_2 = COUNTING.replace(
    "sys.exit(0 if", "import time; time.sleep(30) if n == 2 else None\nsys.exit(0 if")


def wait_for_run_2(job: Job, folder: Path) -> int:
    """The pid of the job's second run, once it is ACTIVE and counted."""
    deadline = time.monotonic() + WAIT
    while meta(job.status).get("attempt") != 2 or job.status.state is not JobState.ACTIVE \
            or not (folder / "count").exists() or (folder / "count").read_text() != "2":
        assert time.monotonic() < deadline, job.status
        time.sleep(0.02)
    time.sleep(0.1)  # its pid file
    return int((folder / "pid").read_text())


def test_a_retried_run_goes_through_the_resource_pool_and_holds_it(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", resource_pool={"cores": 1}, cancel_grace_period=0.2))
    first, seen = job_of(tmp_path, ["-c", SLEEPS_IN_RUN_2, "3", "99"], **{"psij.retry": "2"})
    ex.submit(first)
    wait_for_run_2(first, tmp_path)
    other, _ = job_of(tmp_path, ["-c", "pass"])
    ex.submit(other)
    time.sleep(0.5)
    assert other.status.state is JobState.QUEUED  # one core, the second run holds it
    first.cancel()
    assert final(first).state is JobState.CANCELED
    assert final(other).state is JobState.COMPLETED
    assert states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "CANCELED"]


def test_a_late_queued_of_its_own_is_not_taken_for_a_requeue(tmp_path: Path) -> None:
    ex = make(tmp_path)
    job, seen = job_of(tmp_path, ["-c", "import time; time.sleep(30)"],
                       **{"psij.requeue": 3})
    ex.submit(job)
    assert job.wait(timeout=WAIT, target_states=JobState.ACTIVE) is not None
    # The keeper's ACTIVE may come before the QUEUED the submit sets: not a requeue here.
    ex._set_job_status(job, JobStatus(JobState.QUEUED))  # type: ignore[attr-defined]
    assert job.status.state is JobState.ACTIVE and "attempt" not in meta(job.status)
    job.cancel()
    assert final(job).state is JobState.CANCELED
    assert states(seen) == ["QUEUED", "ACTIVE", "CANCELED"]


def test_each_run_is_staged_in_again(tmp_path: Path) -> None:
    ex = make(tmp_path)
    (tmp_path / "input").write_text("data")
    work = tmp_path / "run"
    work.mkdir()
    script = COUNTING.replace("n = int", "assert pathlib.Path('staged').read_text() == 'data'"
                              "\npathlib.Path('staged').unlink()\nn = int")
    spec = JobSpec(sys.executable, ["-c", script, "3", "2"], directory=work,
                   stage_in=[StageIn(tmp_path / "input", "staged")],
                   attributes=JobAttributes(custom_attributes={"psij.retry": "2"}))
    job = Job(spec)
    seen: List[JobStatus] = []
    job.set_job_status_callback(lambda j, st: seen.append(st))
    ex.submit(job)
    status = final(job)
    assert status.state is JobState.COMPLETED, status
    assert (work / "count").read_text() == "2"
    assert states(seen) == ["QUEUED", "STAGE_IN", "ACTIVE", "QUEUED", "STAGE_IN", "ACTIVE",
                            "COMPLETED"]


def test_each_runs_output_is_kept_under_its_run_number(tmp_path: Path) -> None:
    ex = make(tmp_path)
    script = "import os, sys\nprint('out of', os.environ['PSIJ_ATTEMPT'])\n" \
             "print('err of', os.environ['PSIJ_ATTEMPT'], file=sys.stderr)\n" + COUNTING
    job, _ = job_of(tmp_path, ["-c", script, "3", "3"], **{"psij.retry": "3"})
    assert job.spec is not None
    job.spec.stdout_path = Path("out")  # relative to the job's directory
    job.spec.stderr_path = tmp_path / "err"
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    for name, word in (("out", "out of"), ("err", "err of")):
        assert (tmp_path / f"{name}.1").read_text() == f"{word} 1\n"
        assert (tmp_path / f"{name}.2").read_text() == f"{word} 2\n"
        assert (tmp_path / name).read_text() == f"{word} 3\n"
        assert not (tmp_path / f"{name}.3").exists()


def test_relative_outputs_of_a_job_without_a_directory_are_kept_where_it_wrote_them(
        tmp_path: Path, monkeypatch: Any) -> None:
    # Without JobSpec.directory a local job runs, and opens a relative stdout_path, in the
    # submitting process's folder (as psij-python's): its earlier runs are kept there.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    ex = make(tmp_path)
    script = "import os, sys\nprint('run', os.environ['PSIJ_ATTEMPT'])\n" \
             "sys.exit(0 if os.environ['PSIJ_ATTEMPT'] == '2' else 3)\n"
    job = Job(JobSpec(sys.executable, ["-c", script], stdout_path=Path("out"),
                      attributes=JobAttributes(custom_attributes={"psij.retry": "2"})))
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    assert (cwd / "out.1").read_text() == "run 1\n"
    assert (cwd / "out").read_text() == "run 2\n"
    assert list((tmp_path / "work").rglob("out*")) == []
