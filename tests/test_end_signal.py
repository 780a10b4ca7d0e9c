"""psij.signal_before_end's values (psij._end_signal): the forms read, hostile values refused
with an error naming the attribute, and a lead that must fit in the time limit."""

from datetime import timedelta

import pytest

from psij import InvalidJobException
from psij._declared_attributes import check_declared, from_text
from psij._end_signal import ATTRIBUTE, MAX_SECONDS, EndSignal, end_signal, parse_end_signal


@pytest.mark.parametrize("text,signal,seconds", [
    ("USR1@60", "USR1", 60), ("SIGTERM@1", "TERM", 1), (" usr2 @ 65535 ", "USR2", MAX_SECONDS),
    ("sigHup@+30", "HUP", 30), ("INT@0600", "INT", 600)])
def test_the_forms_read(text: str, signal: str, seconds: int) -> None:
    assert parse_end_signal(ATTRIBUTE, text) == EndSignal(signal, seconds)


@pytest.mark.parametrize("value,words", [
    ("KILL@60", "'KILL' is not a signal psij passes on"),
    ("STOP@60", "'STOP' is not a signal"),
    ("NOSUCH@60", "'NOSUCH' is not a signal"),
    ("10@60", "'10' is not a signal"),
    ("USR1@0", "from 1 to 65535, got 0"),
    ("USR1@-5", "from 1 to 65535, got -5"),
    ("USR1@65536", "from 1 to 65535, got 65536"),
    ("USR1@" + "9" * 18, "from 1 to 65535"),
    ("USR1@" + "9" * 5000, "expected SIGNAL@SECONDS"),
    ("USR1@nan", "expected SIGNAL@SECONDS"),
    ("USR1@inf", "expected SIGNAL@SECONDS"),
    ("USR1@1.5", "expected SIGNAL@SECONDS"),
    ("USR1", "expected SIGNAL@SECONDS"),
    ("@60", "expected SIGNAL@SECONDS"),
    ("", "expected SIGNAL@SECONDS"),
    ("USR1@60; rm -rf ~", "expected SIGNAL@SECONDS"),
    ("USR1@60\nUSR2@5", "expected SIGNAL@SECONDS"),
    (float("nan"), "got nan"),
    (60, "got 60"),
    (-1.0, "got -1.0"),
    (True, "got True"),
    (("USR1", 60), "got ('USR1', 60)"),
])
def test_hostile_values_are_refused_naming_the_attribute(value: object, words: str) -> None:
    with pytest.raises(InvalidJobException) as info:
        check_declared({ATTRIBUTE: value})  # every executor's check at submit
    assert str(info.value).startswith(f"custom attribute {ATTRIBUTE}: ")
    assert words in str(info.value)


def test_text_from_the_command_line_stays_text_and_is_checked() -> None:
    assert from_text(ATTRIBUTE, " USR1@60 ") == "USR1@60"
    with pytest.raises(ValueError, match=f"custom attribute {ATTRIBUTE}: 'KILL'"):
        from_text(ATTRIBUTE, "KILL@60")


def test_the_lead_must_fit_in_the_time_limit() -> None:
    custom = {ATTRIBUTE: "USR1@60"}
    assert end_signal(custom, timedelta(seconds=61), "X.limit") == EndSignal("USR1", 60)
    assert EndSignal("USR1", 60).after(timedelta(minutes=10)) == 540
    assert end_signal({}, None, "X.limit") is None and end_signal(None, None, "X") is None
    for limit in (timedelta(seconds=60), timedelta(seconds=59)):
        with pytest.raises(InvalidJobException, match=r"not within the job's time limit "
                                                      r"\(X.limit = "):
            end_signal(custom, limit, "X.limit")
    with pytest.raises(InvalidJobException, match=r"no time limit \(X.limit is not set\)"):
        end_signal(custom, None, "X.limit")
