"""Scheduler-facing attributes of a job: duration, queue, account, reservation, custom options."""

import re
from datetime import timedelta
from typing import Any, Dict, Optional, Union

from psij import _check

__all__ = ["JobAttributes"]

_DEFAULT_DURATION = timedelta(minutes=10)


class JobAttributes:
    """Attributes that a scheduler uses to place the job.

    Custom attributes are a dict with str keys. A key ``"<executor>.<option>"`` (``slurm.qos``)
    is an option for the executor with that prefix, which renders it when the job is submitted;
    other keys (``ATTR1``) are kept and serialized but rendered by no built-in executor. The dict
    passed in is the one held (as in psij-python): a key added to it later is seen at submit,
    where the executor refuses an option of its own that it cannot render safely.

    ``duration`` is a ``datetime.timedelta``, a number of seconds (``duration=3600``) or text
    in the forms the command line takes (:meth:`parse_walltime`: ``"1:30:00"``, ``"90m"``,
    ``"2h"``; bare digits are minutes there, as in ``"90"``); it is always stored as a
    timedelta.
    """

    duration: timedelta

    def __init__(
        self,
        duration: Union[timedelta, float, str] = _DEFAULT_DURATION,
        queue_name: Optional[str] = None,
        account: Optional[str] = None,
        reservation_id: Optional[str] = None,
        custom_attributes: Optional[Dict[str, object]] = None,
        project_name: Optional[str] = None,
    ) -> None:
        self.duration = _duration(duration)
        self.queue_name = queue_name
        self.account = account
        self.reservation_id = reservation_id
        self._custom_attributes: Optional[Dict[str, object]] = None
        self.custom_attributes = custom_attributes
        if project_name is not None:
            _check.opt_name("JobAttributes.project_name", project_name)
            if account is not None and account != project_name:
                raise ValueError(
                    "JobAttributes: account and its deprecated alias project_name disagree "
                    f"({account!r} vs {project_name!r}); pass only account")
            self.account = project_name

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "duration":
            value = _duration(value)
        elif name in ("queue_name", "account", "reservation_id"):
            value = _check.opt_name(f"JobAttributes.{name}", value)
        object.__setattr__(self, name, value)

    @property
    def project_name(self) -> Optional[str]:
        """Deprecated alias of ``account``."""
        return self.account

    @project_name.setter
    def project_name(self, value: Optional[str]) -> None:
        self.account = _check.opt_name("JobAttributes.project_name", value)

    @property
    def custom_attributes(self) -> Optional[Dict[str, object]]:
        """Executor options, keyed ``"<executor>.<option>"``: the dict itself, not a copy."""
        return self._custom_attributes

    @custom_attributes.setter
    def custom_attributes(self, value: Optional[Dict[str, object]]) -> None:
        if value is None:
            self._custom_attributes = None
            return
        if not isinstance(value, dict):
            raise _check.fail_type("JobAttributes.custom_attributes", value,
                                   "a dict of str to value, or None")
        for k, v in value.items():
            check_custom_value(check_custom_name(k), v)
        # The caller's dict is kept, not copied: psij-python code fills it after construction.
        self._custom_attributes = value

    def set_custom_attribute(self, name: str, value: object) -> None:
        """Set one custom attribute, e.g. ``set_custom_attribute("slurm.qos", "debug")``."""
        name = check_custom_name(name)
        value = check_custom_value(name, value)
        if self._custom_attributes is None:
            self._custom_attributes = {}
        self._custom_attributes[name] = value

    def get_custom_attribute(self, name: str) -> Optional[object]:
        """The value of a custom attribute, or None if it is not set."""
        if self._custom_attributes is None:
            return None
        return self._custom_attributes.get(name)

    @staticmethod
    def parse_walltime(walltime: str) -> timedelta:
        """Parse ``hh:mm:ss``, ``hh:mm``, ``mm`` or ``N h|m|s`` (``"90 m"``, ``"2h"``)."""
        if not isinstance(walltime, str):
            raise _check.fail_type("walltime", walltime, "str")
        s = walltime.strip()
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([hms])", s)
        if m:
            n = float(m.group(1))
            unit = {"h": "hours", "m": "minutes", "s": "seconds"}[m.group(2)]
            return timedelta(**{unit: n})
        parts = s.split(":")
        if 1 <= len(parts) <= 3 and all(p.isascii() and p.isdigit() for p in parts):
            nums = [int(p) for p in parts]
            if len(nums) == 1:
                return timedelta(minutes=nums[0])
            if len(nums) == 2:
                return timedelta(hours=nums[0], minutes=nums[1])
            return timedelta(hours=nums[0], minutes=nums[1], seconds=nums[2])
        raise ValueError(
            f"walltime: cannot parse {walltime!r}; accepted: hh:mm:ss, hh:mm, mm, or N followed "
            "by h, m or s")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobAttributes):
            return NotImplemented
        return (self.duration, self.queue_name, self.account, self.reservation_id,
                self.custom_attributes or None) == (
            other.duration, other.queue_name, other.account, other.reservation_id,
            other.custom_attributes or None)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"JobAttributes(duration={self.duration!r}, queue_name={self.queue_name!r}, "
                f"account={self.account!r}, reservation_id={self.reservation_id!r}, "
                f"custom_attributes={self.custom_attributes!r})")


def _duration(value: Any) -> timedelta:
    """``JobAttributes.duration`` from a timedelta, a number of seconds or walltime text."""
    if isinstance(value, str):
        try:
            value = JobAttributes.parse_walltime(value)
        except OverflowError:
            raise ValueError(f"JobAttributes.duration: {value!r} is longer than a "
                             "datetime.timedelta holds") from None
        except ValueError as ex:
            raise ValueError(f"JobAttributes.duration: {ex}; or give a datetime.timedelta or "
                             "a number of seconds") from None
    try:
        return _check.duration("JobAttributes.duration", value)
    except TypeError:
        raise _check.fail_type("JobAttributes.duration", value, "datetime.timedelta, a number "
                               "of seconds or walltime text (hh:mm:ss, hh:mm, mm, N[hms])"
                               ) from None


def check_custom_name(name: Any) -> str:
    """A custom attribute key: any str (psij-python accepts ``"ATTR1"``); else TypeError.

    An executor checks the keys it renders when the job is submitted.
    """
    if not isinstance(name, str):
        raise _check.fail_type("JobAttributes.custom_attributes key", name, "str")
    return name


def check_custom_value(name: str, value: Any) -> object:
    """A custom attribute value: a str without NUL, an int, float, bool or None."""
    if isinstance(value, str):
        _check.no_nul(f"JobAttributes.custom_attributes[{name!r}]", value)
    elif value is not None and not isinstance(value, (int, float, bool)):
        raise _check.fail_type(f"JobAttributes.custom_attributes[{name!r}]", value,
                               "str, int, float or bool")
    return value
