"""The batch executor's machinery against an in-memory scheduler behind the fake command runner:
submit errors, refused values, polling faults, jobs leaving the queue, cancel, attach, threads."""

import gc
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import IO, Collection, Dict, List, Optional, Sequence, Tuple

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobSpec, JobState, SubmitException
from psij.executors.batch._runner import CommandResult, FakeCommandRunner
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    InvalidJobStateError,
    check_status_exit_code,
)
from psij.job_status import JobStatus

WAIT = timedelta(seconds=20)


class MemoryScheduler:
    """Jobs in a dict; answers the commands of FakeExecutor."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: Dict[str, str] = {}
        self.accounting: Dict[str, Tuple[str, int]] = {}
        self.next_id = 100
        self.fail_status = 0  # how many status calls still fail
        self.fail_submit: Optional[CommandResult] = None
        self.status_calls: List[Tuple[str, ...]] = []

    def __call__(self, argv: Tuple[str, ...], stdin: Optional[str]) -> object:
        with self.lock:
            cmd = argv[0]
            if cmd == "fsub":
                if self.fail_submit is not None:
                    return self.fail_submit
                self.next_id += 1
                self.jobs[str(self.next_id)] = "Q"
                return (0, f"{self.next_id}\n")
            if cmd == "fstat":
                self.status_calls.append(argv[1:])
                if self.fail_status > 0:
                    self.fail_status -= 1
                    return (1, "", "fstat: cannot reach the scheduler")
                return (0, "".join(f"{i} {self.jobs[i]}\n" for i in argv[1:] if i in self.jobs))
            if cmd == "fdel":
                if argv[1] not in self.jobs:
                    return (1, "", "fdel: no such job")
                self.jobs[argv[1]] = "X"
                return (0, "")
            if cmd == "facct":
                return (0, "".join(f"{i} {s} {c}\n" for i, (s, c) in self.accounting.items()
                                   if i in argv[1:]))
            if cmd == "flist":
                return (0, "\n".join(self.jobs))
            return (127, "", f"{cmd}: command not found")

    def set(self, native_id: str, state: str) -> None:
        with self.lock:
            self.jobs[native_id] = state

    def purge(self, native_id: str, accounting: Optional[Tuple[str, int]] = None) -> None:
        with self.lock:
            del self.jobs[native_id]
            if accounting is not None:
                self.accounting[native_id] = accounting


STATES = {"Q": JobState.QUEUED, "R": JobState.ACTIVE, "C": JobState.COMPLETED,
          "F": JobState.FAILED, "X": JobState.CANCELED}


class FakeExecutor(BatchSchedulerExecutor):
    _NAME_ = "fake"
    CUSTOM_ATTRIBUTE_PREFIXES = ("fake",)
    TRANSIENT_SUBMIT_ERRORS = ("busy, try later",)

    def generate_submit_script(self, job: Job, context: Dict[str, object],
                               submit_file: IO[str]) -> None:
        submit_file.write("#!/bin/sh\n# fake script\n")

    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        return ["fsub", str(submit_file_path)]

    def job_id_from_submit_output(self, out: str) -> str:
        return out.strip()

    def get_cancel_command(self, native_id: str) -> List[str]:
        return ["fdel", native_id]

    def process_cancel_command_output(self, exit_code: int, out: str) -> None:
        if "no such job" in out:
            raise InvalidJobStateError(out)
        raise SubmitException(out)

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        return ["fstat", *native_ids]

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        check_status_exit_code("fstat", exit_code, out)
        found = {}
        for line in out.splitlines():
            nid, code = line.split()
            found[nid] = JobStatus(STATES[code], metadata={"native_state": code})
        return found

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        return [["facct", *native_ids]]

    def parse_accounting_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        found = {}
        for line in out.splitlines():
            nid, code, ec = line.split()
            found[nid] = JobStatus(STATES[code], exit_code=int(ec))
        return found

    def get_list_command(self) -> List[str]:
        return ["flist"]


def make(tmp_path: Path, **kw: object) -> Tuple[FakeExecutor, MemoryScheduler]:
    options = dict(queue_polling_interval=0.05, initial_queue_polling_delay=0.01)
    options.update(kw)
    ex = FakeExecutor(config=BatchSchedulerExecutorConfig(work_directory=tmp_path,
                                                          **options))  # type: ignore[arg-type]
    sched = MemoryScheduler()
    ex._runner = FakeCommandRunner(sched)
    return ex, sched


def spec(**kw: object) -> JobSpec:
    return JobSpec("/bin/true", **kw)  # type: ignore[arg-type]


def wait_state(job: Job, state: JobState) -> None:
    st = job.wait(WAIT, target_states=[state])
    assert st is not None and st.state is state, st


def test_submit_renders_script_and_tracks_to_completion(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    job = Job(spec())
    ex.submit(job)
    assert job.native_id == "101" and job.status.state is JobState.QUEUED
    script = tmp_path / "fake" / f"{job.id}.job"
    assert script.read_text().startswith("#!/bin/sh")
    assert oct(script.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "fake").stat().st_mode & 0o777) == "0o700"
    sched.set("101", "R")
    wait_state(job, JobState.ACTIVE)
    assert job.status.metadata == {"native_state": "R", "native_id": "101"}
    sched.set("101", "C")
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED and st.exit_code == 0
    assert not script.exists()
    ex.close()


def test_submit_failure_keeps_script_and_leaves_job_new(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    sched.fail_submit = CommandResult(("fsub",), 1, "", "fsub: error: invalid account 'x'")
    job = Job(spec())
    with pytest.raises(SubmitException) as info:
        ex.submit(job)
    assert "invalid account 'x'" in str(info.value) and not info.value.transient
    script = tmp_path / "fake" / f"{job.id}.job"
    assert str(script) in str(info.value) and script.exists()
    assert job.status.state is JobState.NEW and job.executor is None and job.native_id is None
    sched.fail_submit = CommandResult(("fsub",), 1, "", "busy, try later")
    with pytest.raises(SubmitException) as info:
        ex.submit(job)
    assert info.value.transient
    sched.fail_submit = CommandResult(("fsub",), None, failure="did not finish within 60 s")
    with pytest.raises(SubmitException) as info:
        ex.submit(job)
    assert info.value.transient
    sched.fail_submit = None
    ex.submit(job)  # the same job can still be submitted
    assert job.native_id is not None
    ex.close()


@pytest.mark.parametrize("bad_spec,field", [
    (dict(attributes=JobAttributes(queue_name="debug\n#FAKE --evil")), "queue_name"),
    (dict(attributes=JobAttributes(account="a\rb")), "account"),
    (dict(name="two\nlines"), "JobSpec.name"),
    (dict(environment={"BAD-NAME": "x"}), "environment"),
    (dict(environment={"X; rm -rf ~": "x"}), "environment"),
    (dict(attributes=JobAttributes(custom_attributes={"fake.x.y": "1"})), "fake.x.y"),
    (dict(attributes=JobAttributes(custom_attributes={"fake.qos": "a\nb"})), "fake.qos"),
])
def test_values_a_script_cannot_hold_are_refused_before_anything_runs(
        tmp_path: Path, bad_spec: Dict[str, object], field: str) -> None:
    ex, _sched = make(tmp_path)
    job = Job(spec(**bad_spec))
    with pytest.raises(InvalidJobException, match=field.replace(".", r"\.")):
        ex.submit(job)
    assert ex._runner.calls == []  # type: ignore[attr-defined]
    assert not (tmp_path / "fake" / f"{job.id}.job").exists()
    assert job.executor is None and job.status.state is JobState.NEW


def test_other_executors_custom_attributes_are_ignored(tmp_path: Path) -> None:
    ex, _ = make(tmp_path)
    job = Job(spec(attributes=JobAttributes(custom_attributes={
        "slurm.weird.name": "a\nb", "fake.flag": True, "fake.off": False, "fake.qos": "hi"})))
    ctx = ex._create_script_context(job)
    assert ctx["custom_attributes"] == {"fake": [{"key": "flag", "value": None},
                                                 {"key": "qos", "value": "hi"}]}


def test_failing_status_command_never_changes_state(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    ex, sched = make(tmp_path, queue_polling_error_threshold=1000)
    try:
        job = Job(spec())
        ex.submit(job)
        sched.set("101", "R")
        sched.fail_status = 1000
        with caplog.at_level("WARNING", logger="psij.executors.batch._poller"):
            deadline = time.monotonic() + 20
            while sched.fail_status > 997 and time.monotonic() < deadline:  # 3 failed polls
                time.sleep(0.02)
            assert sched.fail_status <= 997
            assert job.status.state is JobState.QUEUED
            sched.fail_status = 0
            wait_state(job, JobState.ACTIVE)
    finally:
        ex.close()
    # Said once when polling starts failing, once when it works again; not at every retry.
    said = [r.getMessage() for r in caplog.records if r.name == "psij.executors.batch._poller"]
    assert len(said) == 2, said
    assert "status poll failed" in said[0] and "fstat: cannot reach the scheduler" in said[0]
    assert "queue_polling_outage_tolerance" in said[0]
    assert said[1].endswith("status polling works again")


def test_long_outage_fails_jobs_quoting_the_error(tmp_path: Path) -> None:
    ex, sched = make(tmp_path, queue_polling_error_threshold=2,
                     queue_polling_outage_tolerance=0.3)
    sched.fail_status = 10**6
    job = Job(spec())
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED
    assert "fstat: cannot reach the scheduler" in str(st.message)
    ex.close()


def test_job_leaving_queue_is_resolved_from_exit_code_file(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    ok, bad = Job(spec()), Job(spec(stderr_path=tmp_path / "err.txt"))
    ex.submit(ok)
    ex.submit(bad)
    (tmp_path / "err.txt").write_text("".join(f"line {i}\n" for i in range(30)))
    (tmp_path / "fake" / f"{ok.native_id}.ec").write_text("0\n")
    (tmp_path / "fake" / f"{bad.native_id}.ec").write_text("3\n")
    sched.purge(str(ok.native_id))
    sched.purge(str(bad.native_id))
    s1, s2 = ok.wait(WAIT), bad.wait(WAIT)
    assert s1 is not None and s1.state is JobState.COMPLETED and s1.exit_code == 0
    assert s2 is not None and s2.state is JobState.FAILED and s2.exit_code == 3
    assert "exited with code 3" in str(s2.message)
    assert "line 29" in str(s2.message) and "line 19" not in str(s2.message)
    assert not (tmp_path / "fake" / f"{ok.native_id}.ec").exists()
    ex.close()


def test_job_leaving_queue_is_resolved_from_accounting(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    job = Job(spec())
    ex.submit(job)
    sched.purge(str(job.native_id), accounting=("F", 9))
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 9
    assert st.metadata is not None and st.metadata["source"] == "accounting"
    ex.close()


def test_job_leaving_queue_without_trace_is_failed_never_completed(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    job = Job(spec())
    ex.submit(job)
    sched.purge(str(job.native_id))
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED
    assert "without an exit code" in str(st.message)
    ex.close()


def test_cancel_pending_and_cancel_after_finish(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    pending, done = Job(spec()), Job(spec())
    ex.submit(pending)
    ex.submit(done)
    pending.cancel()
    st = pending.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED
    assert st.message is None  # asked through this executor: nothing to explain
    (tmp_path / "fake" / f"{done.native_id}.ec").write_text("0\n")
    sched.purge(str(done.native_id))
    done.cancel()  # the scheduler says "no such job": it finished meanwhile
    st = done.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED
    ex.close()


def test_cancelled_by_someone_else_is_explained(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    job = Job(spec())
    ex.submit(job)
    sched.set(str(job.native_id), "X")
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED
    assert "outside this executor" in str(st.message)
    ex.close()


def test_attach_learns_state_at_once_and_shares_updates(tmp_path: Path) -> None:
    ex, sched = make(tmp_path, initial_queue_polling_delay=5, queue_polling_interval=0.1)
    sched.jobs["555"] = "R"
    first, second = Job(), Job()
    ex.attach(first, "555")
    wait_state(first, JobState.ACTIVE)
    ex.attach(second, "555")
    assert second.status.state is JobState.ACTIVE  # brought up to date at once
    sched.set("555", "C")
    for j in (first, second):
        st = j.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED
    with pytest.raises(InvalidJobException):
        ex.attach(first, "556")
    ex.close()


def test_list(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)
    sched.jobs.update({"7": "R", "8": "Q"})
    assert ex.list() == ["7", "8"]


def test_one_status_command_per_interval_for_all_jobs(tmp_path: Path) -> None:
    ex, sched = make(tmp_path, queue_polling_interval=0.2, initial_queue_polling_delay=0.05)
    jobs = [Job(spec()) for _ in range(1000)]
    for j in jobs:
        ex.submit(j)
    time.sleep(0.3)
    before = len(sched.status_calls)
    time.sleep(1.0)
    calls = sched.status_calls[before:]
    assert 3 <= len(calls) <= 6, len(calls)
    assert all(len(c) == 1000 for c in calls)
    ex.close()


def _poll_threads() -> List[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "psij-fake-status"]


def test_dropped_executors_leave_no_polling_thread(tmp_path: Path) -> None:
    for i in range(100):
        ex, sched = make(tmp_path / str(i))
        if i % 10 == 0:  # some of them are used: their thread starts, then must end
            job = Job(spec())
            ex.submit(job)
            sched.set(str(job.native_id), "C")
            assert job.wait(WAIT) is not None
            del job
        del ex, sched
    gc.collect()
    deadline = time.monotonic() + 10
    while _poll_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    assert _poll_threads() == []


def test_close_stops_the_thread_and_refuses_new_jobs(tmp_path: Path) -> None:
    ex, _sched = make(tmp_path)
    job = Job(spec())
    ex.submit(job)
    assert len(_poll_threads()) == 1
    ex.close()
    assert _poll_threads() == []
    with pytest.raises(SubmitException, match="closed"):
        ex.submit(Job(spec()))


def test_callbacks_that_raise_do_not_stop_polling(tmp_path: Path) -> None:
    ex, sched = make(tmp_path)

    def boom(job: Job, status: JobStatus) -> None:
        raise RuntimeError("callback bug")

    ex.set_job_status_callback(boom)
    job = Job(spec())
    ex.submit(job)
    sched.set(str(job.native_id), "R")
    wait_state(job, JobState.ACTIVE)
    sched.set(str(job.native_id), "C")
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED
    ex.close()


def test_config_checks_and_conversion(tmp_path: Path) -> None:
    from psij import JobExecutorConfig

    with pytest.raises(ValueError, match="queue_polling_interval"):
        BatchSchedulerExecutorConfig(queue_polling_interval=0)
    with pytest.raises(TypeError, match="keep_files"):
        BatchSchedulerExecutorConfig(keep_files="yes")  # type: ignore[arg-type]
    ex = FakeExecutor(config=JobExecutorConfig(work_directory=tmp_path))
    assert isinstance(ex.config, BatchSchedulerExecutorConfig)
    assert ex.work_directory == tmp_path / "fake"
