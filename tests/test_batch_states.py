"""Canned scheduler outputs, one for every state code of every state map, parsed for real."""

import pytest

from psij import JobState
from psij.executors.batch import batch_test, sge, slurm
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.batch.batch_test import BatchTestJobExecutor
from psij.executors.batch.sge import SgeJobExecutor
from psij.executors.batch.slurm import SlurmJobExecutor

# The state each code must map to, written out again (not derived from the maps under test).
SLURM_EXPECTED = {
    "PENDING": JobState.QUEUED, "CONFIGURING": JobState.QUEUED, "REQUEUED": JobState.QUEUED,
    "REQUEUE_FED": JobState.QUEUED, "REQUEUE_HOLD": JobState.QUEUED,
    "RESV_DEL_HOLD": JobState.QUEUED, "RUNNING": JobState.ACTIVE,
    "COMPLETING": JobState.ACTIVE, "SUSPENDED": JobState.ACTIVE, "STOPPED": JobState.ACTIVE,
    "SIGNALING": JobState.ACTIVE, "STAGE_OUT": JobState.ACTIVE, "RESIZING": JobState.ACTIVE,
    "COMPLETED": JobState.COMPLETED, "CANCELLED": JobState.CANCELED, "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED, "OUT_OF_MEMORY": JobState.FAILED, "NODE_FAIL": JobState.FAILED,
    "PREEMPTED": JobState.FAILED, "BOOT_FAIL": JobState.FAILED, "DEADLINE": JobState.FAILED,
    "REVOKED": JobState.FAILED, "SPECIAL_EXIT": JobState.FAILED,
}
SLURM_CAUSES = {"TIMEOUT": "time_limit", "OUT_OF_MEMORY": "out_of_memory",
                "NODE_FAIL": "node_failure", "PREEMPTED": "preempted",
                "BOOT_FAIL": "boot_failure", "DEADLINE": "deadline"}
# States that mean Slurm holds the job until it is released, whatever the reason.
SLURM_HELD = {"REQUEUE_HOLD", "RESV_DEL_HOLD"}


@pytest.fixture
def slurm_ex(tmp_path):  # type: ignore[no-untyped-def]
    return SlurmJobExecutor(config=BatchSchedulerExecutorConfig(work_directory=tmp_path))


@pytest.fixture
def sge_ex(tmp_path):  # type: ignore[no-untyped-def]
    return SgeJobExecutor(config=BatchSchedulerExecutorConfig(work_directory=tmp_path))


def test_slurm_map_is_fully_covered() -> None:
    assert set(slurm.STATE_MAP) == set(SLURM_EXPECTED)


def test_slurm_squeue_every_state(slurm_ex: SlurmJobExecutor) -> None:
    lines = [f"{100 + i}|{code}|Reason{i}" for i, code in enumerate(SLURM_EXPECTED)]
    out = "\n".join(lines) + "\n"
    parsed = slurm_ex.parse_status_output(0, out)
    for i, (code, state) in enumerate(SLURM_EXPECTED.items()):
        st = parsed[str(100 + i)]
        assert st.state is state, code
        assert st.metadata is not None
        assert st.metadata["native_state"] == code and st.metadata["reason"] == f"Reason{i}"
        assert st.metadata.get("cause") == SLURM_CAUSES.get(code)
        assert (st.metadata.get("held_by") == "scheduler") == (code in SLURM_HELD), code


def test_slurm_held_reasons_say_held(slurm_ex: SlurmJobExecutor) -> None:
    # As squeue shows `sbatch --hold` (JobHeldUser) and `scontrol hold` by root (JobHeldAdmin).
    out = ("1|PENDING|JobHeldUser", "2|PENDING|JobHeldAdmin", "3|PENDING|Resources",
           "4|PENDING|Priority", "5|RUNNING|None", "6_[1-2]|PENDING|JobHeldUser")
    parsed = slurm_ex.parse_status_output(0, "\n".join(out) + "\n")
    for nid in ("1", "2", "6_1", "6_2"):
        st = parsed[nid]
        assert st.state is JobState.QUEUED, nid
        assert st.metadata["held_by"] == "scheduler", nid  # type: ignore[index]
        assert "held by the scheduler" in str(st.message) and "JobHeld" in str(st.message)
    for nid in ("3", "4", "5"):
        assert "held_by" not in parsed[nid].metadata, nid  # type: ignore[operator]
        assert parsed[nid].message is None

def test_slurm_failed_reasons_give_causes(slurm_ex: SlurmJobExecutor) -> None:
    parsed = slurm_ex.parse_status_output(
        0, "1|FAILED|JobLaunchFailure\n2|FAILED|NonZeroExitCode\n3|PENDING|None\n")
    assert parsed["1"].metadata["cause"] == "launch_failure"  # type: ignore[index]
    assert "cause" not in parsed["2"].metadata  # type: ignore[operator]
    assert parsed["3"].metadata["reason"] is None  # type: ignore[index]


def test_slurm_squeue_purged_single_job_is_no_rows(slurm_ex: SlurmJobExecutor) -> None:
    assert slurm_ex.output_means_no_jobs(
        1, "slurm_load_jobs error: Invalid job id specified\n")
    assert not slurm_ex.output_means_no_jobs(
        1, "squeue: error: Unable to contact slurm controller (connect failure)\n")


@pytest.mark.parametrize("exit_code,out", [
    (1, "squeue: error: Unable to contact slurm controller (connect failure)\n"),
    (0, "1|RUNNING|None\n<html>garbage</html>\n"),
    (0, "1|NOT_A_STATE|None\n"),
    (0, "1 RUNNING None\n"),
])
def test_slurm_squeue_errors_and_garbage_raise(slurm_ex: SlurmJobExecutor, exit_code: int,
                                               out: str) -> None:
    with pytest.raises((ValueError, RuntimeError)):
        slurm_ex.parse_status_output(exit_code, out)


def test_slurm_sacct_records(slurm_ex: SlurmJobExecutor) -> None:
    out = ("11|COMPLETED|0:0|None\n12|FAILED|3:0|NonZeroExitCode\n"
           "13|CANCELLED by 0|0:15|None\n14|TIMEOUT|0:15|TimeLimit\n"
           "15|OUT_OF_MEMORY|0:125|OutOfMemory\n16|RUNNING|0:0|None\n")
    parsed = slurm_ex.parse_accounting_output(0, out)
    assert parsed["11"].state is JobState.COMPLETED and parsed["11"].exit_code == 0
    assert parsed["12"].state is JobState.FAILED and parsed["12"].exit_code == 3
    assert parsed["13"].state is JobState.CANCELED and parsed["13"].exit_code == 143
    assert parsed["14"].metadata["cause"] == "time_limit"  # type: ignore[index]
    assert parsed["15"].metadata["cause"] == "out_of_memory"  # type: ignore[index]
    assert parsed["16"].state is JobState.ACTIVE
    with pytest.raises(RuntimeError, match="accounting storage is disabled"):
        slurm_ex.parse_accounting_output(
            1, "sacct: error: Slurm accounting storage is disabled\n")


def test_slurm_submit_output(slurm_ex: SlurmJobExecutor) -> None:
    assert slurm_ex.job_id_from_submit_output("4242\n") == "4242"
    assert slurm_ex.job_id_from_submit_output("4242;cluster\n") == "4242"
    assert slurm_ex.job_id_from_submit_output("Submitted batch job 77\n") == "77"
    with pytest.raises(ValueError):
        slurm_ex.job_id_from_submit_output("sbatch: error: oops\n")


# sacct without --allocations, as a real Slurm 22.05 prints a job stopped at its time limit
# (1), one cancelled while running (2), one that exited 5 (3), one that completed with an srun
# step (4) and one cancelled while pending (5, no steps).
SACCT_WITH_STEPS = """1|TIMEOUT|0:0|None
1.batch|CANCELLED|0:15|
1.extern|COMPLETED|0:0|
2|CANCELLED by 0|0:0|None
2.batch|CANCELLED|0:15|
3|FAILED|5:0|None
3.batch|FAILED|5:0|
4|COMPLETED|0:0|None
4.batch|COMPLETED|0:0|
4.0|COMPLETED|0:0|
5|CANCELLED by 1001|0:0|None
"""


def test_slurm_sacct_takes_the_batch_steps_signal(slurm_ex: SlurmJobExecutor) -> None:
    argv = slurm_ex.get_accounting_commands(["1", "2"])[0]
    assert "--allocations" not in argv  # the batch step's line is needed
    parsed = slurm_ex.parse_accounting_output(0, SACCT_WITH_STEPS)
    assert sorted(parsed) == ["1", "2", "3", "4", "5"]  # steps are not jobs
    timeout = parsed["1"]
    assert timeout.state is JobState.FAILED and timeout.exit_code == 128 + 15
    assert timeout.metadata["cause"] == "time_limit"  # type: ignore[index]
    assert (parsed["2"].state, parsed["2"].exit_code) == (JobState.CANCELED, 143)
    assert (parsed["3"].state, parsed["3"].exit_code) == (JobState.FAILED, 5)
    assert (parsed["4"].state, parsed["4"].exit_code) == (JobState.COMPLETED, 0)
    # Nothing tells the exit code of a job cancelled before it ran: unknown, not 0.
    assert (parsed["5"].state, parsed["5"].exit_code) == (JobState.CANCELED, None)
    # A TIMEOUT without any step line (records purged) has no known code either.
    alone = slurm_ex.parse_accounting_output(0, "9|TIMEOUT|0:0|None\n")["9"]
    assert alone.state is JobState.FAILED and alone.exit_code is None


def test_slurm_failed_reasons_give_messages(slurm_ex: SlurmJobExecutor) -> None:
    parsed = slurm_ex.parse_status_output(
        0, "1|FAILED|NonZeroExitCode\n2|FAILED|RaisedSignal:9(Killed)\n3|FAILED|None\n"
           "4|FAILED|TimeLimit\n")
    assert "non-zero" in str(parsed["1"].message)
    assert "NonZeroExitCode" in str(parsed["1"].message)
    assert "signal" in str(parsed["2"].message) and "RaisedSignal:9(Killed)" in str(
        parsed["2"].message)
    assert parsed["3"].message is None
    assert parsed["4"].message is None  # its cause says it (time_limit)


def _slurm_with_answers(tmp_path, squeue: "tuple[int, str]", sacct: "tuple[int, str]"
                        ):  # type: ignore[no-untyped-def]
    from psij.executors.batch._runner import FakeCommandRunner

    def respond(argv, stdin):  # type: ignore[no-untyped-def]
        if argv[0] == "sbatch":
            return 0, "4242\n"
        if argv[0] == "squeue":
            return squeue
        if argv[0] == "sacct":
            return sacct
        return 1, "", f"unexpected command {argv}"

    ex = SlurmJobExecutor(config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path, queue_polling_interval=0.05, initial_queue_polling_delay=0.01))
    ex._runner = FakeCommandRunner(respond)
    return ex


def test_slurm_timed_out_job_ends_with_the_steps_signal(tmp_path) -> None:  # type: ignore
    from datetime import timedelta

    from psij import Job, JobAttributes, JobSpec

    ex = _slurm_with_answers(tmp_path, (0, "4242|TIMEOUT|TimeLimit\n"),
                             (0, SACCT_WITH_STEPS.replace("1", "4242", 1).replace(
                                 "1.batch", "4242.batch")))
    job = Job(JobSpec("/bin/sleep", ["600"],
                      attributes=JobAttributes(duration=timedelta(minutes=1))))
    ex.submit(job)
    st = job.wait(timedelta(seconds=20))
    ex.close()
    assert st is not None and st.state is JobState.FAILED, st
    assert st.exit_code == 143, st
    assert "time limit (0:01:00)" in str(st.message) and "SIGTERM" in str(st.message), st


def test_slurm_failed_job_with_unknown_code_says_slurms_reason(tmp_path) -> None:  # type: ignore
    from datetime import timedelta

    from psij import Job, JobSpec

    ex = _slurm_with_answers(tmp_path, (0, "4242|FAILED|NonZeroExitCode\n"),
                             (1, "", "sacct: error: Slurm accounting storage is disabled\n"))
    job = Job(JobSpec("/bin/false"))
    ex.submit(job)
    st = job.wait(timedelta(seconds=20))
    ex.close()
    assert st is not None and st.state is JobState.FAILED and st.exit_code is None, st
    assert "without giving a reason" not in str(st.message), st
    assert "non-zero" in str(st.message) and "NonZeroExitCode" in str(st.message), st


# As the real Slurm 22.05 of tests/setup shows jobs over their --mem (task/cgroup): one whose
# batch script was killed (1), one whose srun step was (2: the job FAILED with srun's exit
# code 1, only the step OUT_OF_MEMORY; squeue's DerivedEC 253 is Slurm's SIG_OOM), one whose
# srun step exited 7 (3), and one that asks for more nodes than its partition has (4).
SQUEUE_MEMORY = ("1|OUT_OF_MEMORY|OutOfMemory|0\n2|FAILED|NonZeroExitCode|253\n"
                 "3|COMPLETED|None|1792\n4|PENDING|PartitionNodeLimit|0\n")
SACCT_MEMORY = """1|OUT_OF_MEMORY|0:125|None
1.batch|OUT_OF_MEMORY|0:125|
2|FAILED|1:0|None
2.batch|FAILED|1:0|
2.0|OUT_OF_MEMORY|0:125|
3|COMPLETED|0:0|None
3.batch|COMPLETED|0:0|
3.0|FAILED|7:0|
"""


def test_slurm_squeue_asks_for_the_steps_derived_exit_code(slurm_ex: SlurmJobExecutor) -> None:
    argv = slurm_ex.get_status_command(["1"])
    assert argv[-1] == "--Format=JobArrayID:|,State:|,Reason:|,DerivedEC:|,RestartCnt:"


def test_slurm_squeue_names_memory_for_the_job_or_a_step(slurm_ex: SlurmJobExecutor) -> None:
    parsed = slurm_ex.parse_status_output(0, SQUEUE_MEMORY)
    for nid in ("1", "2"):
        assert parsed[nid].state is JobState.FAILED, nid
        assert parsed[nid].metadata["cause"] == "out_of_memory", nid  # type: ignore[index]
    assert parsed["2"].message is None  # the cause says it, not "non-zero exit code"
    assert parsed["3"].state is JobState.COMPLETED and "cause" not in parsed["3"].metadata  # type: ignore[operator]
    assert parsed["4"].metadata["unstartable"] == "PartitionNodeLimit"  # type: ignore[index]
    # A step's other ends (exit 7 is 1792; a signal is its number) say nothing of memory.
    other = slurm_ex.parse_status_output(0, "5|FAILED|NonZeroExitCode|1792\n"
                                            "6|FAILED|NonZeroExitCode|9\n")
    assert "cause" not in other["5"].metadata  # type: ignore[operator]
    assert "cause" not in other["6"].metadata  # type: ignore[operator]


def test_slurm_sacct_names_memory_for_the_job_or_a_step(slurm_ex: SlurmJobExecutor) -> None:
    parsed = slurm_ex.parse_accounting_output(0, SACCT_MEMORY)
    # 0:125 is Slurm's mark of an end out of memory, no signal: the code is not known.
    assert (parsed["1"].state, parsed["1"].exit_code) == (JobState.FAILED, None)
    assert (parsed["2"].state, parsed["2"].exit_code) == (JobState.FAILED, 1)
    for nid in ("1", "2"):
        assert parsed[nid].metadata["cause"] == "out_of_memory", nid  # type: ignore[index]
    assert (parsed["3"].state, parsed["3"].exit_code) == (JobState.COMPLETED, 0)
    assert "cause" not in parsed["3"].metadata  # type: ignore[operator]


def test_slurm_job_whose_srun_step_ran_out_of_memory_says_so(tmp_path) -> None:  # type: ignore
    from datetime import timedelta

    from psij import Job, JobSpec

    ex = _slurm_with_answers(tmp_path, (0, "4242|FAILED|NonZeroExitCode|253\n"),
                             (0, "4242|FAILED|1:0|None\n4242.batch|FAILED|1:0|\n"
                                 "4242.0|OUT_OF_MEMORY|0:125|\n"))
    job = Job(JobSpec("/bin/true", launcher="srun"))
    ex.submit(job)
    (tmp_path / "slurm" / "4242.ec").write_text("1\n")
    st = job.wait(timedelta(seconds=20))
    ex.close()
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 1, st
    assert "ran out of memory" in str(st.message), st
    assert st.metadata is not None and st.metadata["cause"] == "out_of_memory"


SGE_ACTIVE = ["r", "t", "Rr", "Rt", "s", "ts", "S", "tS", "T", "tT", "Rs", "Rts", "RS", "RtS",
              "RT", "RtT", "dr", "dt", "dRr", "dRt", "ds", "dS", "dT", "dRs", "dRS", "dRT"]
SGE_QUEUED = ["qw", "hqw", "hRwq", "Rq", "dqw", "dhqw"]
SGE_HELD = ["hqw", "hRwq", "dhqw"]  # queued with a hold (qhold, qsub -h)
SGE_ERROR = ["Eqw", "Ehqw", "EhRqw"]


def test_sge_map_is_fully_covered() -> None:
    assert set(sge.STATE_MAP) == set(SGE_ACTIVE + SGE_QUEUED + SGE_ERROR)


def _qstat_xml(states: "list[str]") -> str:
    entries = "".join(
        f"""    <job_list state="{'running' if 'r' in s else 'pending'}">
      <JB_job_number>{200 + i}</JB_job_number>
      <JAT_prio>0.50000</JAT_prio>
      <JB_name>x</JB_name>
      <JB_owner>root</JB_owner>
      <state>{s}</state>
      <slots>1</slots>
    </job_list>
""" for i, s in enumerate(states))
    return ("<?xml version='1.0'?>\n<job_info xmlns:xsd=\"http://arc.liv.ac.uk/x.xsd\">\n"
            f"  <queue_info>\n{entries}  </queue_info>\n  <job_info>\n  </job_info>\n"
            "</job_info>\n")


def test_sge_qstat_every_state(sge_ex: SgeJobExecutor) -> None:
    states = SGE_ACTIVE + SGE_QUEUED + SGE_ERROR
    parsed = sge_ex.parse_status_output(0, _qstat_xml(states))
    assert len(parsed) == len(states)
    for i, code in enumerate(states):
        st = parsed[str(200 + i)]
        expected = (JobState.ACTIVE if code in SGE_ACTIVE else
                    JobState.QUEUED if code in SGE_QUEUED else JobState.FAILED)
        assert st.state is expected, code
        assert st.metadata is not None and st.metadata["native_state"] == code
        assert (st.metadata.get("held_by") == "scheduler") == (code in SGE_HELD), code
        if code in SGE_ERROR:
            assert st.metadata["cause"] == "held_error" and "error state" in str(st.message)


def test_sge_empty_queue_and_garbage(sge_ex: SgeJobExecutor) -> None:
    empty = ("<?xml version='1.0'?>\n<job_info>\n  <queue_info>\n  </queue_info>\n"
             "  <job_info>\n  </job_info>\n</job_info>\n")
    assert sge_ex.parse_status_output(0, empty) == {}
    for bad in ("not xml at all", "<html><body>x</body></html>", _qstat_xml(["zz"])):
        with pytest.raises(ValueError):
            sge_ex.parse_status_output(0, bad)
    with pytest.raises(RuntimeError):
        sge_ex.parse_status_output(1, "error: commlib error: got select error\n")


QACCT = """==============================================================
qname        all.q
hostname     vm
jobname      x
jobnumber    {n}
failed       {failed}
exit_status  {exit}
"""


@pytest.mark.parametrize("failed,exit,state,code,cause", [
    ("0", "0", JobState.COMPLETED, 0, None),
    ("0", "3", JobState.FAILED, 3, None),
    ("37  : qmaster enforced h_rt, h_cpu, or h_vmem limit", "137                  (Killed)",
     JobState.FAILED, 137, "time_limit"),
    ("100 : assumedly after job", "137                  (Killed)", JobState.FAILED, 137, None),
    ("26  : opening input/output file", "0", JobState.FAILED, 0, None),
])
def test_sge_qacct_records(sge_ex: SgeJobExecutor, failed: str, exit: str, state: JobState,
                           code: int, cause: "str | None") -> None:
    parsed = sge_ex.parse_accounting_output(0, QACCT.format(n=31, failed=failed, exit=exit))
    st = parsed["31"]
    assert (st.state, st.exit_code) == (state, code)
    assert st.metadata is not None and st.metadata.get("cause") == cause
    if failed.startswith("26"):
        assert "could not run the job" in str(st.message)


def test_sge_qacct_unknown_job_is_no_record(sge_ex: SgeJobExecutor) -> None:
    assert sge_ex.parse_accounting_output(1, "error: job id 99999 not found\n") == {}


def test_sge_submit_and_cancel_outputs(sge_ex: SgeJobExecutor) -> None:
    from psij.executors.batch.batch_scheduler_executor import InvalidJobStateError

    assert sge_ex.job_id_from_submit_output("123\n") == "123"
    assert sge_ex.job_id_from_submit_output("123.1-10:1\n") == "123"
    with pytest.raises(InvalidJobStateError):
        sge_ex.process_cancel_command_output(1, 'denied: job "14" does not exist\n')


def test_batch_test_every_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ex = BatchTestJobExecutor(config=batch_test.BatchTestExecutorConfig(
        work_directory=tmp_path))
    expected = {"PENDING": JobState.QUEUED, "RUNNING": JobState.ACTIVE,
                "COMPLETED": JobState.COMPLETED, "FAILED": JobState.FAILED,
                "CANCELLED": JobState.CANCELED, "TIMEOUT": JobState.FAILED,
                "HELD": JobState.QUEUED}
    assert set(batch_test.STATE_MAP) == set(expected)
    out = "".join(f"{i}|{code}|None\n" for i, code in enumerate(expected))
    parsed = ex.parse_status_output(0, out)
    for i, (code, state) in enumerate(expected.items()):
        assert parsed[str(i)].state is state
        held = parsed[str(i)].metadata.get("held_by") == "scheduler"  # type: ignore[union-attr]
        assert held == (code == "HELD"), code
    assert parsed["5"].metadata["cause"] == "time_limit"  # type: ignore[index]
    with pytest.raises(ValueError):
        ex.parse_status_output(0, "garbage\n")
