"""psij.executors.batch._reruns and the batch executors' part of running a job again
(psij.requeue, psij.retry): the directives each scheduler gets, a run submitted again (the
fake batch-test scheduler and a scripted Slurm), the old scheduler job followed no more, a
cancel between two runs, a resubmission that fails, and a job that the scheduler requeued
itself seen QUEUED again."""

import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
)
from psij._clock import ManualClock
from psij.executors.batch._runner import FakeCommandRunner
from psij.executors.batch._tracking import (
    Finish,
    Forget,
    JobAdded,
    JobTracker,
    Observation,
    PollSucceeded,
    ReportState,
    RunStatusCommand,
    Settings,
    Tick,
)
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.executors.batch.batch_test_tool import main as batch_test_tool
from psij.executors.batch.sge import sge_status
from psij.executors.batch.slurm import SlurmExecutorConfig, SlurmJobExecutor
from support.batch_sites import fake_site

WAIT = timedelta(seconds=60)
MIB = 1 << 20


def _spec(script: str, custom: Dict[str, Any], **kw: Any) -> JobSpec:
    return JobSpec("/bin/bash", ["-c", script],
                   attributes=JobAttributes(duration=kw.pop("duration", timedelta(minutes=5)),
                                            custom_attributes=custom), **kw)


def _watched(job: Job) -> List[JobStatus]:
    seen: List[JobStatus] = []
    job.set_job_status_callback(lambda j, st: seen.append(st))
    return seen


def _states(seen: List[JobStatus]) -> List[str]:
    return [st.state.name for st in seen]


# ------------------------------------------------------------------------ directives


@pytest.mark.parametrize("name,directive", [
    ("slurm", "#SBATCH --requeue"), ("sge", "#$ -r y"), ("pbs", "#PBS -r y"),
    ("pbs_classic", "#PBS -r y"), ("lsf", "#BSUB -r"), ("batch-test", "#BATCH_TEST --requeue"),
])
def test_each_scheduler_is_asked_to_requeue_only_jobs_that_ask(tmp_path: Path, name: str,
                                                               directive: str) -> None:
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path))
    try:
        asking = ex.submit_script(Job(_spec("true", {"psij.requeue": 2})))  # type: ignore
        assert directive in asking.splitlines()
        # Every start counts itself: PSIJ_ATTEMPT is the run submitted plus the restarts.
        assert 'export PSIJ_ATTEMPT="1"' in asking.splitlines()
        assert "export PSIJ_ATTEMPT=$((1 + _psij_starts))" in asking
        # A job that may be run again has PSIJ_ATTEMPT in its first run; the others have none.
        for custom, attempt in (({}, False), ({"psij.requeue": 0}, False),
                                ({"psij.retry": "attempts=1"}, False),
                                ({"psij.retry": "attempts=3"}, True)):
            other = ex.submit_script(Job(_spec("true", custom)))  # type: ignore
            assert directive not in other.splitlines()
            assert "$((1 + _psij_starts))" not in other
            assert ('export PSIJ_ATTEMPT="1"' in other.splitlines()) is attempt, custom
            assert other.count("PSIJ_ATTEMPT") == int(attempt), custom
    finally:
        ex.close()


@pytest.mark.parametrize("value", ["lots", -1, 1001, 2.5, "1; touch PWNED", "nan"])
def test_a_bad_requeue_count_is_refused_naming_the_attribute(tmp_path: Path,
                                                             value: object) -> None:
    ex = JobExecutor.get_instance("slurm", config=SlurmExecutorConfig(
        work_directory=tmp_path, rest_submit=False))
    ex._runner = FakeCommandRunner(lambda argv, stdin: (1, "", "no scheduler in unit tests"))
    try:
        with pytest.raises(InvalidJobException, match="psij.requeue"):
            ex.submit_script(Job(_spec("true", {"psij.requeue": value})))  # type: ignore
        job = Job(_spec("true", {"psij.requeue": value}))
        with pytest.raises(InvalidJobException, match="psij.requeue"):
            ex.submit(job)
        assert job.status.state is JobState.NEW and job.executor is None
    finally:
        ex.close()


# ------------------------------------------------------------------------ batch-test


@pytest.fixture
def bt(tmp_path: Path) -> Any:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=0.5)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    yield ex
    ex.close()


def test_a_job_exiting_85_is_submitted_again_as_the_same_job(bt: Any, tmp_path: Path) -> None:
    out = tmp_path / "attempt"
    # PSIJ_ATTEMPT is there in the first run too.
    script = f'sleep 1; [ "$PSIJ_ATTEMPT" = 1 ] && exit 85; echo "$PSIJ_ATTEMPT" > {out}'
    job = Job(_spec(script, {"psij.requeue": 1}))
    seen = _watched(job)
    told: List[JobStatus] = []  # restatements too
    job._add_watcher(lambda j, st: told.append(st))
    bt.submit(job)
    first = job.native_id
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    assert _states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    again = seen[2].metadata or {}
    assert again["attempt"] == 2 and again["rerun"] == "requeue"
    assert again["cause"] == "checkpoint"  # FAILED, exit 85, no cause of the scheduler's
    assert again["previous"]["native_id"] == first and again["previous"]["exit_code"] == 85
    assert job.native_id != first
    # Once submitted, the QUEUED status of run 2 is restated with its native id.
    restated = [x.metadata for x in told if x.state is JobState.QUEUED and x.metadata
                and x.metadata.get("native_id") == job.native_id]
    assert restated and restated[0]["attempt"] == 2 and restated[0]["cause"] == "checkpoint"
    assert (seen[3].metadata or {})["attempt"] == 2 and (st.metadata or {})["attempt"] == 2
    assert out.read_text().strip() == "2"
    work = bt.work_directory
    assert not list(work.glob(f"{first}.*")), "the first run's files were not removed"
    poller = bt._poller
    assert first not in poller._jobs and not poller._tracker.is_tracked(first)


def test_a_time_limit_is_retried_with_a_longer_duration(bt: Any, tmp_path: Path) -> None:
    job = Job(_spec('[ "$PSIJ_ATTEMPT" = 1 ] && sleep 30; exit 0',
                    {"psij.retry": "attempts=2,on=time_limit,duration=3"},
                    duration=timedelta(seconds=2)))
    seen = _watched(job)
    bt.submit(job)
    first = job.native_id
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, (st, seen)
    again = seen[2].metadata or {}
    assert again["rerun"] == "retry" and again["cause"] == "time_limit"
    assert job.spec is not None and job.spec.attributes.duration == timedelta(seconds=6)
    spool = tmp_path / "work" / "batch-test-spool"
    shown: List[str] = []

    class _Out:
        def write(self, text: str) -> None:
            shown.append(text)

    saved, sys.stdout = sys.stdout, _Out()  # type: ignore[assignment]
    try:
        batch_test_tool(["--spool", str(spool), "show", str(job.native_id)])
        batch_test_tool(["--spool", str(spool), "show", str(first)])
    finally:
        sys.stdout = saved
    shown = [x for x in shown if x.strip()]
    assert '"time": "0:00:06"' in shown[0] and '"time": "0:00:02"' in shown[1], shown


def test_without_a_policy_a_job_exiting_85_just_fails(bt: Any) -> None:
    job = Job(_spec("sleep 1; exit 85", {}))
    seen = _watched(job)
    bt.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 85
    assert _states(seen) == ["QUEUED", "ACTIVE", "FAILED"]


@pytest.mark.parametrize("name", ["pbs", "lsf"])
def test_an_array_element_runs_again_alone(name: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ex = fake_site(name, tmp_path, monkeypatch)
    submit = "qsub" if name == "pbs" else "bsub"
    scripts: List[str] = []
    inner = ex._runner

    class Recording:
        def run(self, argv: Any, timeout: float, stdin: Optional[str] = None) -> Any:
            if argv[0] == submit:
                path = Path(argv[-1])
                scripts.append(stdin if stdin else path.read_text() if path.exists() else "")
            return inner.run(argv, timeout, stdin)

    ex._runner = Recording()  # type: ignore[assignment]
    out = tmp_path / "runs"
    jobs = [Job(_spec(f'sleep 1; echo "${{PSIJ_ATTEMPT:-none}}" >> {out}{i}; '
                      f'[ {i} = 1 ] && [ "$PSIJ_ATTEMPT" = 1 ] && exit 85; '
                      "exit 0", {"psij.requeue": 1})) for i in range(3)]
    try:
        ex.submit_many(jobs)
        first = [job.native_id for job in jobs]
        assert all("[" in str(nid) for nid in first), first  # elements of one array
        for job in jobs:
            st = job.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED, (job.native_id, st)
        assert len(scripts) == 2, "the rerun did not go by itself"
        directive = "#PBS -r y" if name == "pbs" else "#BSUB -r"
        assert all(directive in text.splitlines() for text in scripts)
        assert "[" not in str(jobs[1].native_id) and jobs[1].native_id != first[1]
        assert [job.native_id for job in (jobs[0], jobs[2])] == [first[0], first[2]]
        assert (Path(f"{out}1")).read_text().split() == ["1", "2"]
        assert [(Path(f"{out}{i}")).read_text().split() for i in (0, 2)] == [["1"], ["1"]]
    finally:
        ex.close()


def test_a_rerun_of_a_job_held_by_the_client_goes_at_once(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=0.5,
                                  max_queued_per_shape=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    # One shape (custom attributes are part of it): the first runs alone, the other waits.
    again = Job(_spec('sleep 1; [ "${PSIJ_ATTEMPT:-1}" = 1 ] && [ -z "$OTHER" ] && exit 85; '
                      "exit 0", {"psij.requeue": 1}))
    other = Job(_spec('sleep 1; [ "${PSIJ_ATTEMPT:-1}" = 1 ] && [ -z "$OTHER" ] && exit 85; '
                      "exit 0", {"psij.requeue": 1}, environment={"OTHER": "1"}))
    seen_other = _watched(other)
    seen = _watched(again)
    try:
        ex.submit(again)
        ex.submit(other)  # held until the first starts
        assert (other.status.metadata or {}).get("held_by") == "client"
        for job in (again, other):
            st = job.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED, st
        assert _states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
        assert _states(seen_other) == ["QUEUED", "ACTIVE", "COMPLETED"]
    finally:
        ex.close()


# ------------------------------------------------------------------------ a scripted Slurm


class _Slurm:
    """sbatch, squeue, scancel and sacct of a scripted Slurm: each job answers squeue with the
    next line of its script (the last one repeats; None: gone from the queue)."""

    def __init__(self, *scripts: List[Optional[str]]) -> None:
        self.scripts = [list(s) for s in scripts]
        self.lock = threading.Lock()
        self.jobs: Dict[str, List[Optional[str]]] = {}
        self.submitted: List[str] = []
        self.cancelled: List[str] = []
        self.gate: Optional[threading.Event] = None  # the second sbatch waits for it
        self.in_sbatch = threading.Event()
        self.refuse_second = False

    def __call__(self, argv: Tuple[str, ...], stdin: Optional[str]) -> object:
        if argv[0] == "sbatch":
            with self.lock:
                n = len(self.submitted)
            if n == 1:
                self.in_sbatch.set()
                if self.gate is not None:
                    self.gate.wait(30)
                if self.refuse_second:
                    return 1, "", "sbatch: error: Batch job submission failed: Invalid account"
            with self.lock:
                native_id = str(100 + len(self.submitted))
                self.submitted.append(native_id)
                self.jobs[native_id] = self.scripts[len(self.submitted) - 1]
            return 0, f"{native_id}\n"
        if argv[0] == "squeue":
            wanted = next(a for a in argv if a.startswith("--jobs="))[7:].split(",")
            lines = []
            with self.lock:
                for nid in wanted:
                    script = self.jobs.get(nid)
                    if not script:
                        continue
                    line = script.pop(0) if len(script) > 1 else script[0]
                    if line is not None:
                        lines.append(f"{nid}|{line}")
            return 0, "".join(x + "\n" for x in lines)
        if argv[0] == "scancel":
            with self.lock:
                self.cancelled.append(argv[-1])
                self.jobs[argv[-1]] = ["CANCELLED|None|0|0"]
            return 0, ""
        if argv[0] == "sacct":
            return 0, ""
        return 1, "", f"unexpected command {argv}"


def _slurm(tmp_path: Path, fake: _Slurm) -> Tuple[SlurmJobExecutor, FakeCommandRunner]:
    ex = SlurmJobExecutor(config=SlurmExecutorConfig(
        work_directory=tmp_path / "work", queue_polling_interval=0.05,
        initial_queue_polling_delay=0.01, rest_submit=False, spare_submit_commands=0))
    runner = FakeCommandRunner(fake)
    ex._runner = runner
    return ex, runner


RUN = "RUNNING|None|0|0"
OOM = "OUT_OF_MEMORY|OutOfMemory|0|0"
DONE = "COMPLETED|None|0|0"
# The text form: custom attributes hold plain values only.
OOM_RETRY = {"psij.retry": "attempts=2,on=out_of_memory,memory=4"}


def _oom_job() -> Job:
    return Job(_spec("true", OOM_RETRY, resources=ResourceSpecV1(memory=100 * MIB)))


def test_out_of_memory_is_retried_with_more_memory_and_the_old_job_is_not_polled(
        tmp_path: Path) -> None:
    fake = _Slurm([RUN, RUN, OOM], [RUN, RUN, DONE])
    ex, runner = _slurm(tmp_path, fake)
    job = _oom_job()
    seen = _watched(job)
    try:
        ex.submit(job)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, (st, seen)
        assert _states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
        assert (seen[2].metadata or {})["cause"] == "out_of_memory"
        assert job.native_id == "101" and fake.submitted == ["100", "101"]
        assert job.spec is not None and job.spec.resources.memory == 400 * MIB  # type: ignore
        scripts = [c for c in runner.calls if c[0] == "sbatch"]
        assert len(scripts) == 2
        # Once the second run was submitted, squeue was never asked about the first.
        calls = runner.calls
        second = [i for i, c in enumerate(calls) if c[0] == "sbatch"][1]
        assert not any(c[0] == "squeue" and "--jobs=100" in c for c in calls[second:])
        assert not ex._poller._tracker.is_tracked("100")  # type: ignore[union-attr]
    finally:
        ex.close()


def test_the_second_run_gets_the_memory_in_its_script(tmp_path: Path) -> None:
    fake = _Slurm([OOM], [DONE])
    scripts: List[str] = []
    ex, _ = _slurm(tmp_path, fake)

    def record(argv: Tuple[str, ...], stdin: Optional[str]) -> object:
        if argv[0] == "sbatch" and stdin:
            scripts.append(stdin)
        return fake(argv, stdin)

    ex._runner = FakeCommandRunner(record)
    job = _oom_job()
    try:
        ex.submit(job)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
        assert "#SBATCH --mem=102400K" in scripts[0]
        assert 'export PSIJ_ATTEMPT="1"' in scripts[0].splitlines()
        assert "#SBATCH --mem=409600K" in scripts[1]
        assert 'export PSIJ_ATTEMPT="2"' in scripts[1].splitlines()
        assert all(s.count("PSIJ_ATTEMPT") == 1 for s in scripts)
    finally:
        ex.close()


def test_a_failed_resubmission_fails_the_job_saying_why(tmp_path: Path) -> None:
    fake = _Slurm([RUN, OOM], [DONE])
    fake.refuse_second = True
    ex, _ = _slurm(tmp_path, fake)
    job = _oom_job()
    seen = _watched(job)
    try:
        ex.submit(job)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.FAILED, st
        assert _states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "FAILED"]
        assert "running it again (retry after out_of_memory) failed" in str(st.message)
        assert "Invalid account" in str(st.message)
        assert (st.metadata or {}).get("cause") == "out_of_memory"
    finally:
        ex.close()


def test_a_cancel_while_the_next_run_is_submitted_cancels_that_run(tmp_path: Path) -> None:
    fake = _Slurm([RUN, OOM], [RUN])
    fake.gate = threading.Event()
    ex, _ = _slurm(tmp_path, fake)
    job = _oom_job()
    try:
        ex.submit(job)
        assert fake.in_sbatch.wait(30)
        assert job.status.state is JobState.QUEUED
        job.cancel()  # the old job is gone, the new one has no id yet
        fake.gate.set()
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.CANCELED, st
        assert fake.cancelled == ["101"], "the new run was left going"
    finally:
        ex.close()


def test_a_cancel_before_the_next_run_is_submitted_submits_nothing(tmp_path: Path) -> None:
    fake = _Slurm([RUN, OOM], [RUN])
    ex, _ = _slurm(tmp_path, fake)
    reached, go = threading.Event(), threading.Event()
    checked = ex._check_script_values

    def held_back(job: Job, spec: JobSpec, inputs: Any = None) -> None:
        if job.status.state is JobState.QUEUED and job.native_id == "100":
            reached.set()
            go.wait(30)
        checked(job, spec, inputs)

    job = _oom_job()
    ex.submit(job)
    ex._check_script_values = held_back  # type: ignore[method-assign]
    try:
        assert reached.wait(30)
        job.cancel()
        go.set()
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.CANCELED, st
        assert "cancelled before its run 2 was submitted" in str(st.message)
        assert fake.submitted == ["100"] and fake.cancelled == []
    finally:
        ex.close()


def test_a_job_slurm_requeued_is_queued_again_with_the_same_id(tmp_path: Path) -> None:
    fake = _Slurm([RUN, RUN, "COMPLETING|None|0|1", "PENDING|BeginTime|0|1", RUN[:-1] + "1",
                   None])
    ex, _ = _slurm(tmp_path, fake)
    job = Job(_spec("true", {"psij.requeue": 1}))
    seen = _watched(job)
    try:
        ex.submit(job)
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        (ex.work_directory / "100.ec").write_text("0\n")
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, (st, seen)
        assert _states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
        again = seen[2].metadata or {}
        assert again["attempt"] == 2 and again["rerun"] == "requeue"
        assert again["cause"] == "requeued" and again["previous"]["native_id"] == "100"
        assert job.native_id == "100" and fake.submitted == ["100"]
    finally:
        ex.close()


def test_a_requeue_between_two_polls_is_seen_from_the_restart_count(tmp_path: Path) -> None:
    fake = _Slurm([RUN, RUN, RUN[:-1] + "1", DONE])
    ex, _ = _slurm(tmp_path, fake)
    job = Job(_spec("true", {"psij.requeue": 3}))
    seen = _watched(job)
    try:
        ex.submit(job)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, (st, seen)
        assert _states(seen) == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
        assert (st.metadata or {})["attempt"] == 2
    finally:
        ex.close()


def test_a_job_without_a_policy_seen_pending_again_stays_active(tmp_path: Path) -> None:
    fake = _Slurm([RUN, RUN, "PENDING|BeginTime|0|1", RUN[:-1] + "1", DONE])
    ex, _ = _slurm(tmp_path, fake)
    job = Job(_spec("true", {}))
    seen = _watched(job)
    try:
        ex.submit(job)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED
        assert _states(seen) == ["QUEUED", "ACTIVE", "COMPLETED"]
    finally:
        ex.close()


# ------------------------------------------------------------------------ the tracker


def _tracker() -> Tuple[JobTracker, ManualClock]:
    clock = ManualClock()
    return JobTracker(Settings(interval=1.0, initial_delay=0.0), clock), clock


def _poll(t: JobTracker, clock: ManualClock, seen: Dict[str, Observation]) -> List[Any]:
    clock.advance(1.0)
    (action,) = t.feed(Tick())
    assert isinstance(action, RunStatusCommand)
    return t.feed(PollSucceeded({k: v for k, v in seen.items() if k in action.native_ids}))


ACTIVE = Observation(JobState.ACTIVE, metadata={"restarts": 0})
QUEUED = Observation(JobState.QUEUED, metadata={"restarts": 1})


def test_the_tracker_reports_a_rerunnable_job_queued_after_it_ran() -> None:
    t, clock = _tracker()
    t.feed(JobAdded("1", rerunnable=True))
    t.feed(JobAdded("2"))
    assert len(_poll(t, clock, {"1": ACTIVE, "2": ACTIVE})) == 2
    actions = _poll(t, clock, {"1": QUEUED, "2": QUEUED})
    assert actions == [ReportState("1", QUEUED)]  # job 2 keeps moving forward only
    assert _poll(t, clock, {"1": QUEUED, "2": QUEUED}) == []
    later = Observation(JobState.ACTIVE, metadata={"restarts": 1})
    assert _poll(t, clock, {"1": later, "2": later}) == [ReportState("1", later)]


def test_the_tracker_reports_a_restart_it_saw_only_in_the_count() -> None:
    t, clock = _tracker()
    t.feed(JobAdded("1", rerunnable=True))
    _poll(t, clock, {"1": ACTIVE})
    again = Observation(JobState.ACTIVE, metadata={"restarts": 1})
    actions = _poll(t, clock, {"1": again})
    assert [a.observation.state for a in actions] == [JobState.QUEUED, JobState.ACTIVE]
    assert _poll(t, clock, {"1": again}) == []


def test_the_tracker_reports_a_run_it_never_saw_when_the_count_grew() -> None:
    t, clock = _tracker()
    t.feed(JobAdded("1", rerunnable=True))
    again = Observation(JobState.QUEUED, metadata={"restarts": 1})  # Grid Engine's Rq
    actions = _poll(t, clock, {"1": again})
    assert [a.observation.state for a in actions] == [JobState.ACTIVE, JobState.QUEUED]
    assert _poll(t, clock, {"1": again}) == []
    running = Observation(JobState.ACTIVE, metadata={"restarts": 1})
    assert _poll(t, clock, {"1": running}) == [ReportState("1", running)]


def test_a_forgotten_job_is_polled_no_more_even_mid_poll() -> None:
    t, clock = _tracker()
    t.feed(JobAdded("1"))
    t.feed(JobAdded("2"))
    clock.advance(1.0)
    (polling,) = t.feed(Tick())
    assert polling == RunStatusCommand(("1", "2"))
    t.feed(Forget("1"))
    done = Observation(JobState.COMPLETED, exit_code=0)
    actions = t.feed(PollSucceeded({"1": done, "2": ACTIVE}))
    assert not any(isinstance(a, Finish) and a.native_id == "1" for a in actions)
    assert not t.is_tracked("1") and t.is_tracked("2")
    assert t.feed(Forget("nobody")) == []


def test_restart_counts_are_read_from_squeue_and_qstat() -> None:
    parsed = SlurmJobExecutor.parse_status_output(
        None, 0, "7|PENDING|BeginTime|0|2\n8|COMPLETING|None|0|1\n9|RUNNING|None\n")  # type: ignore
    assert (parsed["7"].metadata or {})["restarts"] == 2
    assert "restarts" not in (parsed["8"].metadata or {})  # a requeue passes through it
    assert "restarts" not in (parsed["9"].metadata or {})
    assert (sge_status("Rq").metadata or {})["restarts"] == 1
    assert sge_status("Rq").state is JobState.QUEUED and sge_status("Rr").state is JobState.ACTIVE
    assert "restarts" not in (sge_status("r").metadata or {})
