"""The signal a job asks for some time before its time limit: the custom attribute
``psij.signal_before_end`` (``"USR1@60"``: USR1 sixty seconds before the end).

:func:`parse_end_signal` reads a value (the declared attribute's check, see
:mod:`psij._declared_attributes`); :func:`end_signal` reads a job's attributes and also
refuses a lead that the time limit does not leave room for. The signal is one of
:data:`SIGNALS`, the ones every submit script and launcher passes on to the job (or lives
through); the lead is whole seconds, at most :data:`MAX_SECONDS` (Slurm's own bound).
How each executor sends it is told in ``docs/keeping-work.rst``. Pure: no I/O.
"""

import re
from typing import TYPE_CHECKING, Any, Optional

from psij._record import Record
from psij.exceptions import InvalidJobException

if TYPE_CHECKING:
    from datetime import timedelta

__all__ = ["ATTRIBUTE", "MAX_SECONDS", "SIGNALS", "EndSignal", "end_signal", "fitting_end_signal",
           "parse_end_signal"]

ATTRIBUTE = "psij.signal_before_end"
# The signals the scripts handle: those a scheduler or a user sends to ask a job to stop,
# checkpoint or reload (QUIT is left alone: bash keeps it ignored in background jobs).
SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2")
MAX_SECONDS = 65535
_FORM = re.compile(r"\s*([A-Za-z0-9]+)\s*@\s*([+-]?[0-9]{1,18})\s*")
_ACCEPTED = (f"SIGNAL@SECONDS, SIGNAL one of {', '.join(SIGNALS)} and SECONDS a whole number "
             f"from 1 to {MAX_SECONDS} (e.g. 'USR1@60')")


class EndSignal(Record):
    """Signal ``signal`` (a name of :data:`SIGNALS`, without ``SIG``) ``seconds`` before the
    job's time limit."""

    signal: str
    seconds: int

    def after(self, limit: "timedelta") -> float:
        """Seconds from the job's start to the signal, for a job limited to ``limit``."""
        return limit.total_seconds() - self.seconds


def parse_end_signal(name: str, value: Any) -> EndSignal:
    """``value`` (``"USR1@60"``; ``SIG`` may lead the signal, in any case) as an
    :class:`EndSignal`; InvalidJobException naming the attribute ``name`` for anything else."""
    if not isinstance(value, str):
        raise InvalidJobException(f"custom attribute {name}: expected {_ACCEPTED}, got "
                                  f"{value!r}")
    match = _FORM.fullmatch(value)
    if match is None:
        raise InvalidJobException(f"custom attribute {name}: expected {_ACCEPTED}, got "
                                  f"{value!r}")
    signal = match.group(1).upper()
    if signal.startswith("SIG"):
        signal = signal[3:]
    if signal not in SIGNALS:
        raise InvalidJobException(f"custom attribute {name}: {match.group(1)!r} is not a "
                                  f"signal psij passes on to a job; accepted: "
                                  f"{', '.join(SIGNALS)} (in {value!r})")
    seconds = int(match.group(2))
    if not 1 <= seconds <= MAX_SECONDS:
        raise InvalidJobException(f"custom attribute {name}: the lead must be a whole number "
                                  f"of seconds from 1 to {MAX_SECONDS}, got {seconds} (in "
                                  f"{value!r})")
    return EndSignal(signal, seconds)


def end_signal(custom: Any, limit: "Optional[timedelta]", limit_field: str
               ) -> Optional[EndSignal]:
    """The :class:`EndSignal` asked for in ``custom`` (a job's custom attributes), or None;
    InvalidJobException when it is malformed, or when the job's time limit ``limit`` (read
    from ``limit_field``, named in the message) is unset or not longer than the lead."""
    value = custom.get(ATTRIBUTE) if custom else None
    return None if value is None else fitting_end_signal(value, limit, limit_field)


def fitting_end_signal(value: Any, limit: "Optional[timedelta]", limit_field: str) -> EndSignal:
    """``value`` of ``psij.signal_before_end`` read, and checked against the time limit
    ``limit`` (see :func:`end_signal`)."""
    wanted = parse_end_signal(ATTRIBUTE, value)
    if limit is None:
        raise InvalidJobException(f"custom attribute {ATTRIBUTE}: the job has no time limit "
                                  f"({limit_field} is not set), so it has no end to be "
                                  "warned of")
    if wanted.after(limit) <= 0:
        raise InvalidJobException(f"custom attribute {ATTRIBUTE}: {wanted.seconds} s before "
                                  f"the end is not within the job's time limit ({limit_field} "
                                  f"= {limit.total_seconds():g} s); ask for a shorter lead or "
                                  "a longer limit")
    return wanted
