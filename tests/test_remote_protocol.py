"""psij.remote._protocol: status events and failed answers on the wire, read back."""

import math

import pytest

from psij import InvalidJobException, JobState, JobStatus, SubmitException
from psij.remote._protocol import (
    RemoteError,
    error_answer,
    job_id,
    raised,
    status_from_wire,
    status_to_wire,
)


def test_a_status_goes_over_and_comes_back_the_same() -> None:
    status = JobStatus(JobState.FAILED, time=1234.5, message="out of memory", exit_code=137,
                       metadata={"reason": "oom", "native_id": "42"})
    message = status_to_wire("j-1", "42", status)
    assert message["ev"] == "status" and message["job"] == "j-1"
    assert message["native_id"] == "42"
    back = status_from_wire(message)
    assert (back.state, back.time, back.message, back.exit_code, back.metadata) == (
        JobState.FAILED, 1234.5, "out of memory", 137, {"reason": "oom", "native_id": "42"})


def test_metadata_json_cannot_carry_is_sent_as_text() -> None:
    deep: object = "bottom"
    for _ in range(20):
        deep = [deep]
    status = JobStatus(JobState.ACTIVE, time=1.0, metadata={
        "nan": math.nan, "inf": math.inf, "obj": object(), "tuple": (1, 2), 3: "key",
        "deep": deep})
    metadata = status_to_wire("j", None, status)["metadata"]
    assert metadata["nan"] == "nan" and metadata["inf"] == "inf"
    assert metadata["obj"].startswith("<object object")
    assert metadata["tuple"] == [1, 2] and metadata["3"] == "key"
    level = metadata["deep"]
    depth = 0
    while isinstance(level, list):
        level = level[0]
        depth += 1
    assert isinstance(level, str) and depth < 20


@pytest.mark.parametrize("change, field", [
    ({"state": "RUNNING"}, "status.state"),
    ({"state": None}, "status.state"),
    ({"state": "__class__"}, "status.state"),
    ({"time": "now"}, "status.time"),
    ({"time": True}, "status.time"),
    ({"time": math.inf}, "status.time"),
    ({"exit_code": 1.5}, "status.exit_code"),
    ({"exit_code": False}, "status.exit_code"),
    ({"message": 7}, "status.message"),
    ({"metadata": [1]}, "status.metadata"),
])
def test_a_status_that_is_not_one_is_refused_naming_the_field(change: dict, field: str) -> None:
    message = {"state": "ACTIVE", "time": 1.0, "exit_code": None, "message": None,
               "metadata": None, **change}
    with pytest.raises(ValueError, match=field):
        status_from_wire(message)


def test_a_failed_answer_is_raised_again_as_the_same_kind_naming_the_host() -> None:
    for ex in (SubmitException("sbatch: error: invalid partition"),
               InvalidJobException("job x has no JobSpec"), ValueError("bad"), KeyError("k")):
        answer = error_answer(7, ex)
        assert answer["re"] == 7 and answer["ok"] is False
        again = raised(answer, "me@cluster")
        assert type(again) is type(ex)
        assert "(on me@cluster)" in str(again)
    # Any other kind, and a kind the client does not know, is a RemoteError.
    answer = error_answer(1, OSError("disk full"))
    assert answer["kind"] == "RemoteError" and answer["error"] == "disk full"
    assert type(raised({"kind": "SystemExit", "error": "x"}, "h")) is RemoteError
    assert type(raised({"kind": 5, "error": None}, "h")) is RemoteError


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a/b", "x" * 129, None, 5, "é", "a\nb"])
def test_job_ids_are_plain_words(bad: object) -> None:
    with pytest.raises(ValueError, match="job id"):
        job_id(bad)
    assert job_id("0f8e-4c2a_1.2:3") == "0f8e-4c2a_1.2:3"
