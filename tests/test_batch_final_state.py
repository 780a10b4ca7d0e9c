"""The final-state rules of batch jobs (psij.executors.batch._final_state), one table row per
rule: what was observed in, the final status out. No files, no commands, no threads."""

from datetime import timedelta
from typing import Optional

import pytest

from psij.executors.batch._final_state import (
    CAUSE_MESSAGES,
    Seen,
    final_state,
    final_status,
    needs_accounting,
)
from psij.executors.batch._tracking import Observation
from psij.job_state import JobState

C, F, X, A = JobState.COMPLETED, JobState.FAILED, JobState.CANCELED, JobState.ACTIVE


def obs(state: JobState, message: Optional[str] = None, exit_code: Optional[int] = None,
        **metadata: object) -> Observation:
    return Observation(state, message, exit_code, dict(metadata))


# observed state, cause, cancel asked here, exit code -> final state
@pytest.mark.parametrize("state,cause,asked,code,expected", [
    (C, None, False, None, C),        # completed, exit code unknown: completed
    (C, None, False, 0, C),
    (C, None, False, 3, F),           # "completed" with a non-zero exit code is a failure
    # Our cancel reached the job (a cancel that finds the job gone is not counted), which then
    # left by itself: cancelled. Its script passes the cancel's signal on and the job may end
    # with 0 (Grid Engine then only has the exit-code file).
    (C, None, True, 0, X),
    (X, None, False, None, X),
    (X, None, True, 143, X),
    (F, None, True, 143, X),          # failed after our cancel, no cause: our cancel did it
    (F, "time_limit", True, 143, F),  # a cause wins over our cancel
    (F, "launch_failure", True, 137, X),  # its batch shell killed by our kill(): the cancel
    (F, "launch_failure", False, 137, F),
    (F, None, False, 1, F),
    (A, None, False, None, F),        # anything else that ended is a failure
])
def test_final_state_table(state: JobState, cause: Optional[str], asked: bool,
                           code: Optional[int], expected: JobState) -> None:
    o = obs(state, cause=cause) if cause else obs(state)
    assert final_state(o, asked, code) is expected
    assert final_status(Seen("7", o, asked, code)).state is expected


def test_accounting_is_asked_only_without_an_exit_code_and_not_for_cancelled_jobs() -> None:
    assert needs_accounting(obs(F), None)
    assert needs_accounting(obs(C), None)
    assert not needs_accounting(obs(F), 2)
    assert not needs_accounting(obs(X), None)


def test_completed_gets_exit_code_zero_and_keeps_metadata() -> None:
    st = final_status(Seen("7", obs(C, native_state="CD"), False, None))
    assert (st.state, st.exit_code, st.message) == (C, 0, None)
    assert st.metadata == {"native_state": "CD", "native_id": "7"}


def test_cancelled_from_outside_is_said() -> None:
    st = final_status(Seen("7", obs(X), False, None))
    assert st.message is not None and "outside this executor" in st.message
    assert final_status(Seen("7", obs(X), True, None)).message is None
    assert final_status(Seen("7", obs(X, "by admin"), False, None)).message == "by admin"


def test_failure_message_parts_in_order() -> None:
    seen = Seen("7", obs(F, "scheduler words", cause="time_limit"), False, 137,
                time_limit=timedelta(minutes=5), launcher_failure="mpirun: no slots",
                stderr_tail="Killed")
    st = final_status(seen)
    assert st.state is F and st.exit_code == 137
    message = str(st.message)
    cause_words = CAUSE_MESSAGES["time_limit"].split("(")[0]
    positions = [message.index(cause_words), message.index("the launcher failed: mpirun"),
                 message.index("137"), message.index("last lines of the job's stderr:\nKilled")]
    assert positions == sorted(positions)
    assert "scheduler words" not in message  # the cause's words replace the scheduler's
    assert "(0:05:00)" in message


def test_failure_without_anything_says_so() -> None:
    st = final_status(Seen("7", obs(F), False, None))
    assert st.message == "the scheduler reported the job as failed without giving a reason"
    st = final_status(Seen("7", obs(F, cause="time_limit"), False, None))
    assert "(unknown)" in str(st.message)


def test_unknown_cause_falls_back_to_the_scheduler_message() -> None:
    st = final_status(Seen("7", obs(F, "qacct: failed 26", cause="nonsense"), False, 1))
    assert str(st.message).startswith("qacct: failed 26")
