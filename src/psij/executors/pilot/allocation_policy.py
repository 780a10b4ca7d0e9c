"""An elastic pilot's allocation policy: :class:`AllocationPolicy`, checked when made.

Values only. Which executor submits allocations (any PSI/J executor by name, with its url and
config), the shape of one allocation (nodes, cores and GPUs per node, duration, queue,
account, extra custom attributes), and the rules the pilot follows to ask for allocations and
give them back: the most and the fewest it keeps, how much waiting work asks for one more, how
long an empty allocation is kept, and how many failed submissions or starts in a row make it
stop asking. The decisions themselves are :mod:`psij.executors.pilot._elastic_machine`'s.
"""

import math
import re
from datetime import timedelta
from typing import Any, Dict, Mapping, Optional, Union

from psij import _check
from psij.job_executor_config import JobExecutorConfig

__all__ = ["AllocationPolicy"]

_EXECUTOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
_MOST = 100000  # nodes, cores, GPUs or allocations: more than any site grants
_MOST_BACKLOG = 10 ** 9
_SECONDS = Union[int, float, timedelta]
CustomValue = Union[str, int, float, bool]
_JSON_FIELDS = ("executor", "executor_url", "nodes", "cores_per_node", "gpus_per_node",
                "duration", "queue", "account", "custom_attributes", "max_allocations",
                "min_allocations", "backlog_per_allocation", "idle_timeout", "max_failures",
                "retry_delay")


def _count(field: str, value: Any, minimum: int, most: int = _MOST) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _check.fail_type(field, value, "int")
    if not minimum <= value <= most:
        raise ValueError(f"{field}: expected a whole number from {minimum} to {most}, "
                         f"got {value}")
    return value


def _line(field: str, value: Any) -> Optional[str]:
    """A queue or account: text on one line that a process can receive, or None."""
    text = _check.opt_name(field, value)
    if text is None:
        return None
    if text.strip() == "":
        raise ValueError(f"{field}: an empty name; use None for the scheduler's default")
    if any(c in text for c in "\n\r"):
        raise ValueError(f"{field}: {text!r} holds a line break, which no submit script "
                         "directive can carry; accepted: a name on one line")
    return _check.os_text(field, text)


def _custom(field: str, value: Any) -> Dict[str, CustomValue]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _check.fail_type(field, value, "a dict of str to str, int, float or bool, or "
                                             "None")
    out: Dict[str, CustomValue] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _check.fail_type(f"{field} key", key, "str")
        if key.strip() == "" or any(c in key for c in "\n\r\x00"):
            raise ValueError(f"{field}: {key!r} is not an attribute name (empty, or holds a "
                             "line break or NUL)")
        _check.os_text(f"{field} key", key)
        label = f"{field}[{key!r}]"
        if isinstance(item, str):
            _check.os_text(label, _check.no_nul(label, item))
            if any(c in item for c in "\n\r"):
                raise ValueError(f"{label}: {item!r} holds a line break; accepted: text on "
                                 "one line")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{label}: expected a finite number, got {item!r}")
        elif not isinstance(item, int):  # bool is an int
            raise _check.fail_type(label, item, "str, int, float or bool")
        out[key] = item
    return out


class AllocationPolicy:
    """How an elastic pilot asks for allocations and gives them back.

    :param executor: the name of the executor that submits allocations (``slurm``, ``pbs``,
        ``local`` for tests, or any other executor installed).
    :param executor_url: its url, if it takes one.
    :param executor_config: its :class:`~psij.JobExecutorConfig`, if not the default.
    :param nodes: nodes in one allocation.
    :param cores_per_node: cores per node of an allocation (what its agents offer the pilot's
        tasks); ``None``: the cores the agent finds on its node.
    :param gpus_per_node: GPUs per node asked for (0: none).
    :param duration: how long one allocation lasts (seconds or a ``timedelta``): its wall time.
    :param queue: the queue (partition) to submit to; ``None`` for the scheduler's default.
    :param account: the account (project) charged; ``None`` for the default.
    :param custom_attributes: extra custom attributes of an allocation's job (such as
        ``{"slurm.constraint": "gpu"}``); one-line text, whole or finite numbers, flags.
    :param max_allocations: the most allocations held at once (pending, running or draining).
    :param min_allocations: the fewest kept while the pilot runs, even with no work.
    :param backlog_per_allocation: how many waiting tasks ask for one more allocation: with
        ``b`` waiting tasks the pilot wants ``ceil(b / backlog_per_allocation)`` allocations
        on the way beyond those that run (never more than ``max_allocations``).
    :param idle_timeout: seconds an allocation runs no task before it is given back (never
        below ``min_allocations``).
    :param max_failures: failed submissions or allocations that ended before their agents
        joined, in a row, after which the pilot stops asking and says why.
    :param retry_delay: seconds before the submission that follows a failure, doubled
        after each further failure in a row (at most 300 s).
    """

    def __init__(self, executor: str, *, executor_url: Optional[str] = None,
                 executor_config: Optional[JobExecutorConfig] = None, nodes: int = 1,
                 cores_per_node: Optional[int] = None, gpus_per_node: int = 0,
                 duration: _SECONDS = 3600, queue: Optional[str] = None,
                 account: Optional[str] = None,
                 custom_attributes: Optional[Mapping[str, CustomValue]] = None,
                 max_allocations: int = 1, min_allocations: int = 0,
                 backlog_per_allocation: int = 1, idle_timeout: _SECONDS = 300,
                 max_failures: int = 3, retry_delay: _SECONDS = 5.0) -> None:
        field = "AllocationPolicy."
        if not isinstance(executor, str):
            raise _check.fail_type(field + "executor", executor, "str (an executor name)")
        if not _EXECUTOR_NAME.match(executor):
            raise ValueError(f"{field}executor: {executor!r} is not an executor name; "
                             "accepted: letters, digits, '_', '.' and '-' (such as 'slurm')")
        self.executor = executor
        self.executor_url = _check.opt_str(field + "executor_url", executor_url)
        if self.executor_url is not None:
            _check.os_text(field + "executor_url", self.executor_url)
        self.executor_config = _check.instance(field + "executor_config", executor_config,
                                               JobExecutorConfig, "a JobExecutorConfig")
        self.nodes = _count(field + "nodes", nodes, 1)
        self.cores_per_node = None if cores_per_node is None else _count(
            field + "cores_per_node", cores_per_node, 1)
        self.gpus_per_node = _count(field + "gpus_per_node", gpus_per_node, 0)
        self.duration = _check.seconds(field + "duration", duration, positive=True)
        self.queue = _line(field + "queue", queue)
        self.account = _line(field + "account", account)
        self.custom_attributes = _custom(field + "custom_attributes", custom_attributes)
        self.max_allocations = _count(field + "max_allocations", max_allocations, 1)
        self.min_allocations = _count(field + "min_allocations", min_allocations, 0)
        if self.min_allocations > self.max_allocations:
            raise ValueError(f"{field}min_allocations: {self.min_allocations} is more than "
                             f"max_allocations ({self.max_allocations})")
        self.backlog_per_allocation = _count(field + "backlog_per_allocation",
                                             backlog_per_allocation, 1, _MOST_BACKLOG)
        self.idle_timeout = _check.seconds(field + "idle_timeout", idle_timeout,
                                          positive=True)
        self.max_failures = _count(field + "max_failures", max_failures, 1, 1000)
        self.retry_delay = _check.seconds(field + "retry_delay", retry_delay)

    @classmethod
    def from_json(cls, data: Any, where: str = "allocation policy") -> "AllocationPolicy":
        """A policy from a JSON object of its fields (``executor`` needed; no
        ``executor_config``); an unknown key is refused, naming ``where``."""
        if not isinstance(data, Mapping):
            raise _check.fail_type(where, data, "a JSON object of the policy's fields")
        known = set(_JSON_FIELDS)
        for key in data:
            if key not in known:
                raise ValueError(f"{where}: unknown field {key!r}; accepted: "
                                 f"{', '.join(_JSON_FIELDS)}")
        if "executor" not in data:
            raise ValueError(f"{where}: 'executor' is needed (such as \"slurm\")")
        fields = dict(data)
        return cls(fields.pop("executor"), **fields)

    def to_json(self) -> Dict[str, Any]:
        """The policy's values (without the executor's config) as JSON-ready data."""
        return {key: value for key, value in vars(self).items() if key != "executor_config"}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"AllocationPolicy({shown})"
