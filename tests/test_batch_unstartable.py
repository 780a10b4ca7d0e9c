"""Queued jobs the scheduler will never start (``fail_unstartable``): Slurm's reasons read from
canned squeue output, the tracker's rules fed event by event, the executor against a fake
runner (reported queued with the reason, or failed and cancelled), and the option's checks."""

import math
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from psij import Job, JobSpec, JobState, ResourceSpecV1, SubmitException
from psij._clock import ManualClock
from psij.executors.batch._final_state import Seen, final_status, needs_accounting
from psij.executors.batch._runner import FakeCommandRunner
from psij.executors.batch._tracking import (
    CancelAsked,
    Finish,
    JobAdded,
    JobTracker,
    Observation,
    PollSucceeded,
    Restate,
    RunStatusCommand,
    Settings,
    Tick,
    Withdraw,
)
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.batch.sge import SgeExecutorConfig
from psij.executors.batch.slurm import SlurmExecutorConfig, SlurmJobExecutor

WAIT = timedelta(seconds=20)

# Slurm 22.05's reasons of a pending job that never goes away by itself.
NEVER = ["PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints",
         "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
         "DependencyNeverSatisfied", "QOSMaxCpuPerJobLimit", "QOSMaxNodePerJobLimit",
         "QOSMaxWallDurationPerJobLimit", "QOSMaxMemoryPerJob", "QOSMaxGRESPerNode",
         "AssocMaxCpuPerJobLimit", "AssocMaxNodePerJobLimit", "AssocMaxMemPerNode",
         "AssocMaxWallDurationPerJobLimit", "QOSMinCpuNotSatisfied", "QOSMinMemory"]
# Reasons that go away: resources in use, priority, dependencies, begin times, holds, limits
# on running or submitted jobs, nodes that are down for now.
PASSING = ["Resources", "Priority", "Dependency", "BeginTime", "JobHeldUser", "JobHeldAdmin",
           "ReqNodeNotAvail, UnavailableNodes:n3", "ReqNodeNotAvail", "NodeDown",
           "PartitionDown", "PartitionInactive", "AssocGrpCpuLimit", "AssocMaxJobsLimit",
           "QOSMaxJobsPerUserLimit", "QOSMaxSubmitJobPerUserLimit", "QOSMaxNodePerUserLimit",
           "MaxCpuPerAccount", "QOSGrpNodeLimit", "Licenses", "Reservation", "None", ""]


@pytest.fixture
def slurm_ex(tmp_path: Path) -> SlurmJobExecutor:
    return SlurmJobExecutor(config=SlurmExecutorConfig(work_directory=tmp_path))


# ----------------------------------------------------------------------- Slurm's reasons


def test_slurm_reasons_that_never_go_away_say_so(slurm_ex: SlurmJobExecutor) -> None:
    out = "".join(f"{100 + i}|PENDING|{reason}\n" for i, reason in enumerate(NEVER))
    parsed = slurm_ex.parse_status_output(0, out)
    for i, reason in enumerate(NEVER):
        st = parsed[str(100 + i)]
        assert st.state is JobState.QUEUED, reason
        assert st.metadata is not None and st.metadata["unstartable"] == reason, reason
        assert st.metadata["reason"] == reason
        assert f"never start this job as submitted (reason {reason})" in str(st.message)


@pytest.mark.parametrize("reason", PASSING)
def test_slurm_reasons_that_go_away_are_not_unstartable(slurm_ex: SlurmJobExecutor,
                                                        reason: str) -> None:
    st = slurm_ex.parse_status_output(0, f"7|PENDING|{reason}\n")["7"]
    assert st.state is JobState.QUEUED
    assert "unstartable" not in (st.metadata or {}), reason
    assert "never start" not in str(st.message)


def test_only_a_pending_job_is_unstartable(slurm_ex: SlurmJobExecutor) -> None:
    # A running or ended job with such a reason left over is what its state says.
    parsed = slurm_ex.parse_status_output(
        0, "1|RUNNING|PartitionNodeLimit\n2|CANCELLED|PartitionNodeLimit\n"
           "3|PENDING|PartitionNodeLimit\n4_[1-2]|PENDING|PartitionTimeLimit\n")
    assert "unstartable" not in parsed["1"].metadata  # type: ignore[operator]
    assert parsed["2"].state is JobState.CANCELED
    assert "unstartable" not in parsed["2"].metadata  # type: ignore[operator]
    for nid in ("3", "4_1", "4_2"):
        assert parsed[nid].metadata["unstartable"]  # type: ignore[index]


def test_the_message_says_what_to_change(slurm_ex: SlurmJobExecutor) -> None:
    parsed = slurm_ex.parse_status_output(
        0, "1|PENDING|PartitionNodeLimit\n2|PENDING|PartitionTimeLimit\n"
           "3|PENDING|InvalidAccount\n")
    assert "node_count" in str(parsed["1"].message)
    assert "JobAttributes.duration" in str(parsed["2"].message)
    assert "JobAttributes.account" in str(parsed["3"].message)


# ----------------------------------------------------------------------- the tracker

def _tracker(fail: bool) -> Tuple[JobTracker, ManualClock]:
    clock = ManualClock(1000.0)
    return JobTracker(Settings(interval=10, initial_delay=2, fail_unstartable=fail), clock), clock


def _poll(t: JobTracker, clock: ManualClock, seen: Dict[str, Observation]) -> List[Any]:
    clock.advance(60)
    actions = t.feed(Tick())
    assert len(actions) == 1 and isinstance(actions[0], RunStatusCommand), actions
    return t.feed(PollSucceeded(seen))


NEVER_OBS = Observation(JobState.QUEUED, "Slurm will never start this job (PartitionNodeLimit)",
                        metadata={"native_state": "PENDING", "reason": "PartitionNodeLimit",
                                  "unstartable": "PartitionNodeLimit"})
WAITING_OBS = Observation(JobState.QUEUED, metadata={"native_state": "PENDING",
                                                     "reason": "Resources"})


def test_without_the_option_the_reason_is_restated_once_and_when_it_goes() -> None:
    t, clock = _tracker(False)
    t.feed(JobAdded("1"))
    assert _poll(t, clock, {"1": WAITING_OBS}) == []
    actions = _poll(t, clock, {"1": NEVER_OBS})
    assert actions == [Restate("1", NEVER_OBS)]
    assert _poll(t, clock, {"1": NEVER_OBS}) == []  # said once
    other = Observation(JobState.QUEUED, "another", metadata={"unstartable": "InvalidQOS"})
    assert _poll(t, clock, {"1": other}) == [Restate("1", other)]  # another reason
    assert _poll(t, clock, {"1": WAITING_OBS}) == [Restate("1", WAITING_OBS)]  # it went away
    assert t.is_tracked("1")


def test_with_the_option_the_job_is_withdrawn_then_failed() -> None:
    t, clock = _tracker(True)
    t.feed(JobAdded("1"))
    t.feed(JobAdded("2"))
    actions = _poll(t, clock, {"1": NEVER_OBS, "2": WAITING_OBS})
    assert [type(a) for a in actions] == [Withdraw, Finish]
    assert actions[0] == Withdraw("1")
    finish = actions[1]
    assert finish.native_id == "1" and not finish.cancel_requested
    assert finish.observation.state is JobState.FAILED
    assert finish.observation.metadata["cause"] == "unstartable"
    assert finish.observation.metadata["reason"] == "PartitionNodeLimit"
    assert "PartitionNodeLimit" in str(finish.observation.message)
    assert "cancelled in the scheduler" in str(finish.observation.message)
    assert not t.is_tracked("1") and t.is_tracked("2")


def test_with_the_option_a_job_being_cancelled_is_left_to_its_cancel() -> None:
    t, clock = _tracker(True)
    t.feed(JobAdded("1"))
    t.feed(CancelAsked("1"))
    assert _poll(t, clock, {"1": NEVER_OBS}) == [Restate("1", NEVER_OBS)]
    assert t.is_tracked("1")


def test_an_attached_job_reports_the_reason_with_its_first_state() -> None:
    t, clock = _tracker(False)
    t.feed(JobAdded("1", JobState.NEW, poll_soon=True))
    actions = _poll(t, clock, {"1": NEVER_OBS})
    assert len(actions) == 1 and actions[0].observation == NEVER_OBS
    assert type(actions[0]).__name__ == "ReportState"


# ----------------------------------------------------------------------- final status

def test_a_failed_unstartable_job_quotes_no_files_and_asks_no_accounting() -> None:
    obs = Observation(JobState.FAILED, "never starts (reason PartitionNodeLimit); cancelled",
                      metadata={"cause": "unstartable", "reason": "PartitionNodeLimit"})
    assert not needs_accounting(obs, None)
    st = final_status(Seen("9", obs, False, exit_code=None, stderr_tail="old output\n",
                           launcher_failure="old launcher text"))
    assert st.state is JobState.FAILED and st.exit_code is None
    assert st.message == "never starts (reason PartitionNodeLimit); cancelled"
    assert st.metadata is not None and st.metadata["native_id"] == "9"


# ----------------------------------------------------------------------- the executor


class _Slurm:
    """Answers sbatch, squeue, scancel and sacct for one pending job (4242)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.state = "PENDING"

    def __call__(self, argv: Tuple[str, ...], stdin: Optional[str]) -> object:
        if argv[0] == "sbatch":
            return 0, "4242\n"
        if argv[0] == "squeue":
            return 0, f"4242|{self.state}|{self.reason}\n"
        if argv[0] == "scancel":
            self.state, self.reason = "CANCELLED", "None"
            return 0, ""
        if argv[0] == "sacct":
            return 0, "4242|CANCELLED by 0|0:0|None\n"
        return 1, "", f"unexpected command {argv}"


def _executor(tmp_path: Path, slurm: _Slurm, **kw: Any
              ) -> Tuple[SlurmJobExecutor, FakeCommandRunner]:
    ex = SlurmJobExecutor(config=SlurmExecutorConfig(
        work_directory=tmp_path / "work", queue_polling_interval=0.05,
        initial_queue_polling_delay=0.01, rest_submit=False, spare_submit_commands=0, **kw))
    runner = FakeCommandRunner(slurm)
    ex._runner = runner
    return ex, runner


def _wait_for_message(job: Job, text: str) -> None:
    deadline = time.monotonic() + WAIT.total_seconds()
    while text not in str(job.status.message) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert text in str(job.status.message), job.status


def test_without_the_option_the_job_stays_queued_saying_why(tmp_path: Path) -> None:
    ex, runner = _executor(tmp_path, _Slurm("PartitionNodeLimit"))
    seen: List[JobState] = []
    job = Job(JobSpec("/bin/true", resources=ResourceSpecV1(node_count=5)))
    job.set_job_status_callback(lambda j, st: seen.append(st.state))
    try:
        ex.submit(job)
        _wait_for_message(job, "reason PartitionNodeLimit")
        polls = len(runner.calls_to("squeue"))
        deadline = time.monotonic() + 5
        while len(runner.calls_to("squeue")) < polls + 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert job.status.state is JobState.QUEUED
        assert job.status.metadata["unstartable"] == "PartitionNodeLimit"  # type: ignore[index]
        assert runner.calls_to("scancel") == []
        assert seen == [JobState.QUEUED]  # the restatement is no second QUEUED callback
    finally:
        job.cancel()
        ex.close()


def test_with_the_option_the_job_fails_and_is_cancelled(tmp_path: Path) -> None:
    ex, runner = _executor(tmp_path, _Slurm("PartitionNodeLimit"), fail_unstartable=True)
    job = Job(JobSpec("/bin/true", resources=ResourceSpecV1(node_count=5)))
    try:
        ex.submit(job)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.FAILED, st
        assert "reason PartitionNodeLimit" in str(st.message)
        assert "cancelled in the scheduler" in str(st.message)
        assert st.exit_code is None
        assert st.metadata is not None and st.metadata["cause"] == "unstartable"
        assert runner.calls_to("scancel") == [("scancel", "4242")]
        assert runner.calls_to("sacct") == []
    finally:
        ex.close()


def test_with_the_option_a_passing_reason_leaves_the_job_queued(tmp_path: Path) -> None:
    slurm = _Slurm("Resources")
    ex, runner = _executor(tmp_path, slurm, fail_unstartable=True)
    job = Job(JobSpec("/bin/true"))
    try:
        ex.submit(job)
        deadline = time.monotonic() + 5
        while len(runner.calls_to("squeue")) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(runner.calls_to("squeue")) >= 4
        assert job.status.state is JobState.QUEUED and job.status.message is None
        assert runner.calls_to("scancel") == []
        job.cancel()
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.CANCELED
    finally:
        ex.close()


def test_a_withdraw_that_fails_is_logged_and_the_job_still_fails(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    slurm = _Slurm("InvalidQOS")

    def refuse_cancel(argv: Tuple[str, ...], stdin: Optional[str]) -> object:
        if argv[0] == "scancel":
            return 1, "", "scancel: error: Unable to contact slurm controller"
        return slurm(argv, stdin)

    ex, runner = _executor(tmp_path, slurm, fail_unstartable=True)
    runner._respond = refuse_cancel
    job = Job(JobSpec("/bin/true"))
    try:
        with caplog.at_level("WARNING", logger="psij.executors.batch._kill"):
            ex.submit(job)
            st = job.wait(WAIT)
    finally:
        ex.close()
    assert st is not None and st.state is JobState.FAILED and "InvalidQOS" in str(st.message)
    assert any("Unable to contact slurm controller" in r.getMessage() for r in caplog.records)


def test_a_refused_submit_names_slurms_reason(tmp_path: Path) -> None:
    def refuse(argv: Tuple[str, ...], stdin: Optional[str]) -> object:
        return (1, "", "sbatch: error: Batch job submission failed: Invalid account or "
                       "account/partition combination specified\n")

    ex = SlurmJobExecutor(config=SlurmExecutorConfig(
        work_directory=tmp_path, rest_submit=False, spare_submit_commands=0))
    ex._runner = FakeCommandRunner(refuse)
    job = Job(JobSpec("/bin/true"))
    with pytest.raises(SubmitException, match="Invalid account"):
        ex.submit(job)
    assert job.status.state is JobState.NEW
    ex.close()


# ----------------------------------------------------------------------- Grid Engine


@pytest.mark.parametrize("fail", [False, True])
def test_sge_scripts_ask_qsub_to_verify_only_with_the_option(tmp_path: Path, fail: bool) -> None:
    from psij.executors.batch.sge import SgeJobExecutor

    ex = SgeJobExecutor(config=SgeExecutorConfig(work_directory=tmp_path,
                                                 fail_unstartable=fail))
    script = ex.submit_script(Job(JobSpec("/bin/true", resources=ResourceSpecV1(
        process_count=500))))
    assert ("#$ -w e\n" in script) is fail, script
    assert "#$ -pe smp 500\n" in script


# ----------------------------------------------------------------------- the option


@pytest.mark.parametrize("value", ["yes", "True", None, 1, 0, math.nan, 1.0, [True]])
@pytest.mark.parametrize("cls", [BatchSchedulerExecutorConfig, SlurmExecutorConfig,
                                 SgeExecutorConfig])
def test_bad_values_are_refused_naming_the_field(cls: Any, value: Any) -> None:
    with pytest.raises(TypeError) as e:
        cls(fail_unstartable=value)
    text = str(e.value)
    assert f"{cls.__name__}.fail_unstartable" in text and "expected bool" in text, text
    assert repr(value) in text


def test_default_off_and_carried_into_settings_and_other_configs(tmp_path: Path) -> None:
    assert BatchSchedulerExecutorConfig().fail_unstartable is False
    assert BatchSchedulerExecutorConfig()._settings().fail_unstartable is False
    on = BatchSchedulerExecutorConfig(work_directory=tmp_path, fail_unstartable=True)
    assert on._settings().fail_unstartable is True
    assert SlurmExecutorConfig._from_config(on).fail_unstartable is True
    with pytest.raises(TypeError, match="Settings.fail_unstartable"):
        Settings(fail_unstartable="no")  # type: ignore[arg-type]
