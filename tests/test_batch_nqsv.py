"""The NQSV executor's reading of NQSV's command output (qsub, qstat -F rid,stt -n -l, qdel);
its scripts and runs against the fake commands are in tests/test_batch_sites_*.py."""

import pytest

from psij import JobExecutor, JobState
from psij.executors.batch.batch_scheduler_executor import InvalidJobStateError
from psij.executors.batch.nqsv import NQSVJobExecutor


@pytest.fixture
def ex() -> NQSVJobExecutor:
    executor = JobExecutor.get_instance("nqsv")
    assert isinstance(executor, NQSVJobExecutor)
    return executor


def test_native_id_is_the_request_number(ex: NQSVJobExecutor) -> None:
    assert ex.job_id_from_submit_output("Request 1234.bsv0 submitted to queue: batch.\n") \
        == "1234"
    assert ex.job_id_from_submit_output("Request 77 submitted to queue: q.") == "77"
    with pytest.raises(Exception, match="NQSV|native|id|1234"):
        ex.job_id_from_submit_output("qsub: something else 1234\n")


def test_status_lines(ex: NQSVJobExecutor) -> None:
    found = ex.parse_status_output(0, "12.bsv0 RUN\n13.bsv0 HLD\n14.bsv0 QUE\n15.bsv0 EXT\n"
                                      "16 SUS\n")
    assert {k: v.state for k, v in found.items()} == {
        "12": JobState.ACTIVE, "13": JobState.QUEUED, "14": JobState.QUEUED,
        "15": JobState.ACTIVE, "16": JobState.ACTIVE}
    assert found["13"].metadata is not None and found["13"].metadata.get("held_by")
    assert found["14"].metadata is not None and not found["14"].metadata.get("held_by")
    assert ex.parse_status_output(0, "") == {}


@pytest.mark.parametrize("out", ["12.bsv0 XYZ\n", "12.bsv0\n", "garbage line here\n"])
def test_status_output_not_understood_raises(ex: NQSVJobExecutor, out: str) -> None:
    with pytest.raises(ValueError):
        ex.parse_status_output(0, out)


def test_status_command_and_list(ex: NQSVJobExecutor) -> None:
    assert ex.get_status_command(["12", "13"]) == ["qstat", "-F", "rid,stt", "-n", "-l",
                                                   "12", "13"]
    assert ex.parse_list_output("12.bsv0\n\n13.bsv0\nnot an id\n") == ["12", "13"]
    assert ex.get_list_command()[:5] == ["qstat", "-F", "rid", "-n", "-l"]


def test_cancel_of_a_request_gone(ex: NQSVJobExecutor) -> None:
    with pytest.raises(InvalidJobStateError):
        ex.process_cancel_command_output(1, "qdel: ERROR: Request 12.bsv0 does not exist.\n")
    with pytest.raises(Exception, match="permission"):
        ex.process_cancel_command_output(1, "qdel: ERROR: permission denied\n")
