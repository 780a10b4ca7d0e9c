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


def test_slurm_failed_reasons_give_causes(slurm_ex: SlurmJobExecutor) -> None:
    parsed = slurm_ex.parse_status_output(
        0, "1|FAILED|JobLaunchFailure\n2|FAILED|NonZeroExitCode\n3|PENDING|None\n")
    assert parsed["1"].metadata["cause"] == "launch_failure"  # type: ignore[index]
    assert "cause" not in parsed["2"].metadata  # type: ignore[operator]
    assert parsed["3"].metadata["reason"] is None  # type: ignore[index]


def test_slurm_squeue_purged_single_job_is_no_rows(slurm_ex: SlurmJobExecutor) -> None:
    assert slurm_ex.parse_status_output(
        1, "slurm_load_jobs error: Invalid job id specified\n") == {}


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


SGE_ACTIVE = ["r", "t", "Rr", "Rt", "s", "ts", "S", "tS", "T", "tT", "Rs", "Rts", "RS", "RtS",
              "RT", "RtT", "dr", "dt", "dRr", "dRt", "ds", "dS", "dT", "dRs", "dRS", "dRT"]
SGE_QUEUED = ["qw", "hqw", "hRwq", "Rq", "dqw", "dhqw"]
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
                "CANCELLED": JobState.CANCELED, "TIMEOUT": JobState.FAILED}
    assert set(batch_test.STATE_MAP) == set(expected)
    out = "".join(f"{i}|{code}|None\n" for i, code in enumerate(expected))
    parsed = ex.parse_status_output(0, out)
    for i, (_code, state) in enumerate(expected.items()):
        assert parsed[str(i)].state is state
    assert parsed["5"].metadata["cause"] == "time_limit"  # type: ignore[index]
    with pytest.raises(ValueError):
        ex.parse_status_output(0, "garbage\n")
