"""The service's limits and defaults for flows (:class:`FlowConfig`), checked when built."""

import math
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Tuple

from psij._record import Record

__all__ = ["CLASSES", "DEFAULT_INTERVALS", "FlowConfig"]

CLASSES = ("failed_init", "failed_after_work", "never_claimed", "no_work", "no_problem",
           "unknown")
"""The termination classes, as the flows guide describes them."""

DEFAULT_INTERVALS: Mapping[str, float] = MappingProxyType({
    "failed_init": 60.0, "failed_after_work": 10.0, "never_claimed": 30.0, "no_work": 60.0,
    "no_problem": 0.0, "unknown": 10.0,
})
"""Seconds between two restarts of one class in one handle, when neither side says more."""


def _seconds(name: str, value: Any, minimum: float = 0.0, maximum: float = 10 * 365 * 86400.0
             ) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not minimum <= value <= maximum:
        raise ValueError(f"FlowConfig.{name}: expected seconds from {minimum:g} to "
                         f"{maximum:g}, got {value!r}")
    return float(value)


def _count(name: str, value: Any, minimum: int = 0, maximum: int = 10**9) -> int:
    if isinstance(value, bool) or not isinstance(value, int) \
            or not minimum <= value <= maximum:
        raise ValueError(f"FlowConfig.{name}: expected a whole number from {minimum} to "
                         f"{maximum}, got {value!r}")
    return value


def _intervals(name: str, value: Any) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"FlowConfig.{name}: expected a mapping of class to seconds, "
                         f"got {value!r}")
    out = dict(DEFAULT_INTERVALS) if name == "default_intervals" else {c: 0.0 for c in CLASSES}
    for key, seconds in value.items():
        if key not in CLASSES:
            raise ValueError(f"FlowConfig.{name}: unknown class {key!r}; accepted: "
                             f"{', '.join(CLASSES)}")
        out[key] = _seconds(f"{name}[{key}]", seconds)
    return MappingProxyType(out)


# How each number of the configuration is checked: the function, then its limits.
_CHECKS: Dict[str, Tuple[Any, ...]] = {
    "max_per_handle": (_count,), "max_per_user": (_count,), "max_total": (_count,),
    "max_handles_per_user": (_count,), "default_lease": (_seconds, 1.0),
    "max_lease": (_seconds, 1.0), "default_provisioning_lease": (_seconds, 1.0),
    "max_provisioning_lease": (_seconds, 1.0), "default_rate": (_seconds, 1e-6, 1e6),
    "max_rate": (_seconds, 1e-6, 1e6), "max_submit_rate": (_seconds, 1e-6, 1e6),
    "aggregate_problem_interval": (_seconds,), "default_intervals": (_intervals,),
    "min_intervals": (_intervals,), "recent_window": (_seconds, 1.0),
    "fast_runtime": (_seconds,), "fast_samples": (_count, 1), "failing_after": (_count, 1),
    "default_quota": (_count, 1, 2**62), "max_quota": (_count, 1, 2**62),
    "max_payload_bytes": (_count, 1), "keep_ended": (_seconds,),
    "keep_unused_payload": (_seconds,),
}


class FlowConfig(Record):
    """What the service allows and what it gives when a client asks for nothing.

    :param sandbox_root: the directory under which each handle's sandbox is
        ``<sandbox_root>/<uid>/<handle>``.
    :param multi_user: True when the service runs as root for every user: instances are
        submitted to the executor ``"<name>@<uid>"`` (the caller's), otherwise to ``"<name>"``.
    :param executors: the executor names a handle may use (None: any).
    :param max_per_handle: the largest count of one handle.
    :param max_per_user: the largest sum of counts of one user's handles.
    :param max_total: the largest sum of counts of all handles.
    :param max_handles_per_user: how many valid handles one user may hold.
    :param default_lease: the cleanup lease given when none is asked (seconds).
    :param max_lease: the longest cleanup lease; a longer one asked is shortened.
    :param default_provisioning_lease: the provisioning lease given when none is asked.
    :param max_provisioning_lease: the longest provisioning lease (never beyond the cleanup
        lease either).
    :param default_rate: starts per second of one handle when none is asked.
    :param max_rate: the most starts per second one handle may ask for.
    :param max_submit_rate: the most starts per second across all handles.
    :param aggregate_problem_interval: the least time between two restarts of any class but
        ``no_problem`` across all handles (1.0: at most one such restart per second).
    :param default_intervals: per class, the least time between two restarts of that class in
        one handle when the client asks for nothing (the flows guide lists the defaults).
    :param min_intervals: per class, the least such time a client may ask for; less is raised
        to it and the answer says so.
    :param recent_window: what "recently" means in status answers (seconds).
    :param fast_runtime: instances whose median run time is under this are "terminating fast".
    :param fast_samples: how many recent terminations that median needs.
    :param failing_after: consecutive failed submissions that make "submit_failing".
    :param default_quota: the sandbox quota of a handle when none is asked (bytes).
    :param max_quota: the largest sandbox quota a client may ask for.
    :param max_payload_bytes: the largest payload one upload may store.
    :param keep_ended: how long an ended handle (destroyed, expired) still answers
        ``status`` with ``valid: false`` and lists its instances before it is forgotten.
    :param keep_unused_payload: how long a payload no valid handle uses is kept.
    """

    sandbox_root: str
    multi_user: bool = False
    executors: Optional[Tuple[str, ...]] = None
    max_per_handle: int = 10000
    max_per_user: int = 100000
    max_total: int = 200000
    max_handles_per_user: int = 1000
    default_lease: float = 86400.0
    max_lease: float = 7 * 86400.0
    default_provisioning_lease: float = 3600.0
    max_provisioning_lease: float = 86400.0
    default_rate: float = 10.0
    max_rate: float = 100.0
    max_submit_rate: float = 100.0
    aggregate_problem_interval: float = 1.0
    default_intervals: Mapping[str, float] = DEFAULT_INTERVALS
    min_intervals: Mapping[str, float] = MappingProxyType({})
    recent_window: float = 600.0
    fast_runtime: float = 60.0
    fast_samples: int = 5
    failing_after: int = 3
    default_quota: int = 100 * 2**20
    max_quota: int = 2**30
    max_payload_bytes: int = 700 * 1024
    keep_ended: float = 86400.0
    keep_unused_payload: float = 86400.0

    def _validate(self) -> None:
        sandbox_root, executors = self.sandbox_root, self.executors
        if not isinstance(sandbox_root, str) or not sandbox_root.startswith("/"):
            raise ValueError(f"FlowConfig.sandbox_root: expected an absolute path, "
                             f"got {sandbox_root!r}")
        self._set("sandbox_root", sandbox_root.rstrip("/") or "/")
        self._set("multi_user", bool(self.multi_user))
        if executors is not None:
            if isinstance(executors, str) or not all(isinstance(e, str) and e
                                                      for e in executors):
                raise ValueError(f"FlowConfig.executors: expected executor names or None, "
                                 f"got {executors!r}")
            self._set("executors", tuple(executors))
        for name in self._fields[3:]:
            check, *limits = _CHECKS[name]
            self._set(name, check(name, getattr(self, name), *limits))
