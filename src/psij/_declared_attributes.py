"""The custom attributes psij itself reads, with their types.

============================ ========================================= =====================
attribute                    value                                     read by
============================ ========================================= =====================
``psij.priority``            a finite number; higher goes first        batch executors, the
                                                                       local resource pool,
                                                                       the pilot
``pilot.priority``           the same (its older name)                 the same
``psij.tmp``                 a whole number of bytes (per node), >= 0  batch executors, the
                                                                       local resource pool
``pilot.time_limit``         a number of seconds above 0               the pilot
``psij.signal_before_end``   ``SIGNAL@SECONDS`` (``USR1@60``), see     every executor
                             :mod:`psij._end_signal`
``psij.requeue``             a whole number of requeues, 0 to 1000     executors that run
                                                                       jobs again (batch,
                                                                       local, pilot)
``psij.retry``               a retry policy (mapping, text or          the same
                             ``RetryPolicy``), see :mod:`psij._retry`
============================ ========================================= =====================

Every executor refuses, at submit (``JobExecutor._check_job``, before anything is held or
started), a job whose declared attribute has a value of the wrong kind, whether or not that
executor reads it: a job that one executor refuses is refused by all, with the same error
(InvalidJobException naming the attribute). :func:`from_text` reads a value given as text (the
``psij`` command's ``--attr KEY=VALUE``) by the declared kind, so ``--attr psij.tmp=1073741824``
is a number (``psij.signal_before_end`` stays text, checked); other attributes stay text.
Pure: no I/O.
"""

import math
import re
from typing import Any, Callable, Dict, Optional, Union

from psij import _check
from psij._end_signal import ATTRIBUTE as END_SIGNAL_ATTRIBUTE
from psij._end_signal import parse_end_signal
from psij._priority import ATTRIBUTE, LEGACY_ATTRIBUTE, priority_value
from psij._retry import REQUEUE_ATTRIBUTE, RETRY_ATTRIBUTE, parse_requeue, parse_retry
from psij.exceptions import InvalidJobException

__all__ = ["DECLARED", "TMP_ATTRIBUTE", "check_declared", "from_text", "tmp_bytes"]

TMP_ATTRIBUTE = "psij.tmp"
TIME_LIMIT_ATTRIBUTE = "pilot.time_limit"
_INTEGER = re.compile(r"[+-]?[0-9]+")


def tmp_bytes(name: str, value: Any) -> int:
    """``value`` as a whole number of bytes (a whole float is taken); InvalidJobException
    naming the attribute ``name`` for anything else."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidJobException(f"custom attribute {name}: expected a whole number of bytes "
                                  f"(at least 0), got {value!r}")
    return value


def _seconds(name: str, value: Any) -> float:
    try:
        return _check.seconds(f"custom attribute {name}", value, positive=True)
    except (TypeError, ValueError) as ex:
        raise InvalidJobException(str(ex)) from None


# Each declared attribute's check: the value as read, or InvalidJobException naming it.
DECLARED: Dict[str, Callable[[str, Any], object]] = {
    ATTRIBUTE: priority_value,
    LEGACY_ATTRIBUTE: priority_value,
    TMP_ATTRIBUTE: tmp_bytes,
    TIME_LIMIT_ATTRIBUTE: _seconds,
    END_SIGNAL_ATTRIBUTE: parse_end_signal,
    REQUEUE_ATTRIBUTE: parse_requeue,
    RETRY_ATTRIBUTE: parse_retry,
}
# Declared attributes whose values are text.
_TEXTS = frozenset({END_SIGNAL_ATTRIBUTE, RETRY_ATTRIBUTE})


def check_declared(custom: Optional[Dict[str, object]]) -> None:
    """Refuse (InvalidJobException) a declared attribute of ``custom`` (a JobAttributes'
    custom attributes) whose value is not of its kind; None values are unset."""
    if not custom:
        return
    for name, check in DECLARED.items():
        value = custom.get(name)
        if value is not None:
            check(name, value)


def from_text(name: str, text: str) -> object:
    """The value of the attribute ``name`` given as ``text``: a number for the declared
    attributes (ValueError naming it when ``text`` is not one of their kind), ``text``
    itself for the others."""
    check = DECLARED.get(name)
    if check is None:
        return text
    word = text.strip()
    if name in _TEXTS:
        try:
            check(name, word)
        except InvalidJobException as ex:
            raise ValueError(str(ex)) from None
        return word
    try:
        number: Union[int, float] = int(word) if _INTEGER.fullmatch(word) else float(word)
        return check(name, number)
    except (ValueError, InvalidJobException) as ex:
        raise ValueError(str(ex) if isinstance(ex, InvalidJobException) else
                         f"custom attribute {name}: expected a number, got {text!r}") from None
