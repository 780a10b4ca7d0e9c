"""The pilot's task descriptions and what the engine tells about them, with their JSON.

:class:`TaskSpec` is what a user (or the QCG and PSI/J front ends) asks the engine to run;
:class:`TaskShare` what a started task got; :class:`TaskEvent` a state change given to
listeners; :class:`TaskStatus` a snapshot of one task. Each converts to and from JSON-ready
data (the journal, the served pilot's protocol and the QCG report use these forms).

Values only: no processes, no files, no clock.
"""

import math
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from psij import _check
from psij._end_signal import ATTRIBUTE as END_SIGNAL
from psij._end_signal import fitting_end_signal
from psij._record import Record
from psij.exceptions import InvalidJobException
from psij.executors.pilot.resources import Amount, ResourceRequest
from psij.executors.pilot.scheduler import Placement, TaskState

__all__ = ["Listener", "Prepare", "ReportedUse", "TaskEvent", "TaskShare", "TaskSpec",
           "TaskStatus", "TaskUse", "reported_use", "request_from_json", "request_to_json",
           "sound_count", "sound_seconds"]

_NO_ENV: Mapping[str, str] = MappingProxyType({})
_DEFAULT_REQUEST = ResourceRequest()


def _amount_to_json(amount: Amount) -> List[Optional[int]]:
    return [amount.minimum, amount.maximum, amount.split_into]


def _amount_from_json(field_name: str, value: Any) -> Amount:
    if not isinstance(value, list) or len(value) != 3:
        raise _check.fail_type(field_name, value, "[minimum, maximum or null, split_into or null]")
    return Amount(value[0], value[1], value[2])


def request_to_json(request: ResourceRequest) -> Dict[str, Any]:
    """A ResourceRequest as JSON-ready data (only what differs from one core)."""
    out: Dict[str, Any] = {}
    default = _DEFAULT_REQUEST
    if request.processes != default.processes:
        out["processes"] = _amount_to_json(request.processes)
    if request.nodes is not None:
        out["nodes"] = _amount_to_json(request.nodes)
    if request.processes_per_node != default.processes_per_node:
        out["processes_per_node"] = _amount_to_json(request.processes_per_node)
    for name in ("cores_per_process", "gpus_per_process", "memory_per_process", "exclusive"):
        if getattr(request, name) != getattr(default, name):
            out[name] = getattr(request, name)
    if request.custom:
        out["custom"] = dict(request.custom)
    return out


def request_from_json(data: Any) -> ResourceRequest:
    """The inverse of :func:`request_to_json`; raises naming the bad field."""
    if not isinstance(data, Mapping):
        raise _check.fail_type("resources", data, "a dict")
    known = {"processes", "nodes", "processes_per_node", "cores_per_process",
             "gpus_per_process", "memory_per_process", "exclusive", "custom"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"resources: unknown field {unknown[0]!r}; accepted: "
                         f"{', '.join(sorted(known))}")
    kwargs: Dict[str, Any] = dict(data)
    for name in ("processes", "nodes", "processes_per_node"):
        if kwargs.get(name) is not None:
            kwargs[name] = _amount_from_json(f"resources.{name}", kwargs[name])
    return ResourceRequest(**kwargs)


_OPTIONAL_TEXTS = ("directory", "stdin", "stdout", "stderr", "group")


class TaskSpec(Record):
    """One task for the engine: what to run, where, with which resources and dependencies.

    ``name`` is the task's id and must be unique in the engine. A relative ``directory`` is
    taken from the engine's work directory, relative stream paths from ``directory``.
    ``environment`` is added after the pilot's variables (so it wins). ``after`` names tasks or
    iteration groups that must all succeed first. ``end_signal`` (``SIGNAL@SECONDS``, as
    ``psij.signal_before_end``) asks for that signal that many seconds before ``time_limit``.
    """

    name: str
    executable: str
    arguments: Tuple[str, ...] = ()
    directory: Optional[str] = None
    environment: Mapping[str, str] = _NO_ENV
    inherit_environment: bool = True
    stdin: Optional[str] = None
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    resources: ResourceRequest = _DEFAULT_REQUEST
    priority: int = 0
    after: Tuple[str, ...] = ()
    group: Optional[str] = None
    create_directories: bool = False
    time_limit: Optional[float] = None
    end_signal: Optional[str] = None

    def _validate(self) -> None:
        name, executable = self.name, self.executable
        directory, stdin, stdout, stderr, group = \
            self.directory, self.stdin, self.stdout, self.stderr, self.group
        # Each check first tries the common valid case in a test or two; the full checks
        # (with their messages) run only for what that does not settle.
        if type(name) is not str or not name or "\x00" in name:
            _check.req_str("TaskSpec.name", name)
            raise ValueError("TaskSpec.name: a task needs a non-empty name")
        if type(executable) is not str or not executable or "\x00" in executable:
            _check.req_str("TaskSpec.executable", executable)
            raise ValueError("TaskSpec.executable: a task needs an executable")
        for value in (directory, stdin, stdout, stderr, group):
            if value is not None and (type(value) is not str or not value or "\x00" in value):
                _check_optional_texts(directory, stdin, stdout, stderr, group)
        environment = self.environment
        if environment is not _NO_ENV:
            self._set("environment", MappingProxyType(
                _check.env_dict("TaskSpec.environment", environment) or {})
                if environment else _NO_ENV)
        inherit = self.inherit_environment
        if inherit is not True and inherit is not False:
            _check.opt_bool("TaskSpec.inherit_environment", inherit)
        create = self.create_directories
        if create is not True and create is not False:
            _check.opt_bool("TaskSpec.create_directories", create)
        if type(self.resources) is not ResourceRequest:
            _check.instance("TaskSpec.resources", self.resources, ResourceRequest,
                            "ResourceRequest", False)
        priority = self.priority
        if type(priority) is not int and _check.opt_int("TaskSpec.priority", priority) is None:
            raise _check.fail_type("TaskSpec.priority", None, "int")
        if self.time_limit is not None:
            self._set("time_limit", _check.seconds("TaskSpec.time_limit", self.time_limit,
                                                   positive=True))
        if self.end_signal is not None:
            self._set("end_signal", _checked_end_signal(self.end_signal, self.time_limit))
        # The default, the empty tuple, needs no check.
        arguments, after = self.arguments, self.after
        if arguments != ():
            checked = _str_tuple("TaskSpec.arguments", arguments)
            if checked is not arguments:
                self._set("arguments", checked)
        if after != ():
            checked = _str_tuple("TaskSpec.after", after)
            if checked is not after:
                self._set("after", checked)

    def __hash__(self) -> int:
        return hash((self.name, self.executable, self.arguments, self.directory))

    def to_json(self) -> Dict[str, Any]:
        """JSON-ready data; fields left at their defaults are left out."""
        out: Dict[str, Any] = {"name": self.name, "executable": self.executable}
        if self.arguments:
            out["arguments"] = list(self.arguments)
        for name in ("directory", "stdin", "stdout", "stderr", "group", "time_limit",
                     "end_signal"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.environment:
            out["environment"] = dict(self.environment)
        if not self.inherit_environment:
            out["inherit_environment"] = False
        if self.resources != _DEFAULT_REQUEST:
            out["resources"] = request_to_json(self.resources)
        if self.priority:
            out["priority"] = self.priority
        if self.after:
            out["after"] = list(self.after)
        if self.create_directories:
            out["create_directories"] = True
        return out

    @classmethod
    def from_json(cls, data: Any) -> "TaskSpec":
        """Read :meth:`to_json`'s form; unknown fields and bad values raise naming the field."""
        if not isinstance(data, Mapping):
            raise _check.fail_type("task", data, "a dict")
        unknown = sorted(set(data) - set(cls._fields))
        if unknown:
            raise ValueError(f"task: unknown field {unknown[0]!r}; accepted: "
                             f"{', '.join(cls._fields)}")
        kwargs: Dict[str, Any] = dict(data)
        if "resources" in kwargs:
            kwargs["resources"] = request_from_json(kwargs["resources"])
        for name in ("name", "executable"):
            if name not in kwargs:
                raise ValueError(f"task: the field {name!r} is required")
        return cls(**kwargs)


def _checked_end_signal(value: object, time_limit: Optional[float]) -> str:
    """``TaskSpec.end_signal`` (``SIGNAL@SECONDS`` before ``time_limit``) as ``USR1@60``;
    ValueError naming the field."""
    from datetime import timedelta  # only for tasks that ask for it: not at import

    try:
        wanted = fitting_end_signal(value, None if time_limit is None
                                    else timedelta(seconds=time_limit), "TaskSpec.time_limit")
    except InvalidJobException as ex:
        raise ValueError(str(ex).replace(f"custom attribute {END_SIGNAL}",
                                         "TaskSpec.end_signal")) from None
    return f"{wanted.signal}@{wanted.seconds}"


def _check_optional_texts(directory: Optional[str], stdin: Optional[str], stdout: Optional[str],
                          stderr: Optional[str], group: Optional[str]) -> None:
    for field_name, value in (("directory", directory), ("stdin", stdin),
                              ("stdout", stdout), ("stderr", stderr), ("group", group)):
        if value is not None and _check.opt_str(f"TaskSpec.{field_name}", value) == "":
            raise ValueError(f"TaskSpec.{field_name}: an empty string is not accepted; "
                             f"use None")


def _str_tuple(field_name: str, value: Sequence[str]) -> Tuple[str, ...]:
    """``value`` as a tuple of strings, checked (cheap for the common tuple of str)."""
    if type(value) is tuple:
        if not value:
            return value
        if all(type(item) is str and "\x00" not in item for item in value):
            return value
    return tuple(_check.opt_str_list(field_name, value) or ())


class TaskShare(Record):
    """What a started task got: per node (in pool order) its processes, core and GPU ids."""

    nodes: Tuple[str, ...]
    processes: Tuple[int, ...]
    cores: Tuple[Tuple[int, ...], ...]
    gpus: Tuple[Tuple[int, ...], ...] = ()

    @classmethod
    def of(cls, placement: Placement) -> "TaskShare":
        shares = placement.shares
        if len(shares) == 1:
            share = shares[0]
            return cls((share.node,), (share.processes,), (share.cores,), (share.gpus,))
        return cls(tuple(s.node for s in shares), tuple(s.processes for s in shares),
                   tuple(s.cores for s in shares), tuple(s.gpus for s in shares))

    @property
    def process_count(self) -> int:
        return sum(self.processes)

    @property
    def core_count(self) -> int:
        return sum(len(c) for c in self.cores)

    @property
    def allocation_text(self) -> str:
        """``node:cores`` per node, comma-separated (QCG-PilotJob's ``allocation``)."""
        return ",".join(f"{n}:{len(c)}" for n, c in zip(self.nodes, self.cores))

    @property
    def cores_text(self) -> str:
        """The core ids given on each node, as QCG-PilotJob's later reports write an
        allocation: ``node[0:1],node2[4]``."""
        return ",".join(f"{n}[{':'.join(map(str, c))}]" for n, c in zip(self.nodes, self.cores))

    def to_json(self) -> Dict[str, Any]:
        return {"nodes": list(self.nodes), "processes": list(self.processes),
                "cores": [list(c) for c in self.cores], "gpus": [list(g) for g in self.gpus]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TaskShare":
        return cls(tuple(data["nodes"]), tuple(data["processes"]),
                   tuple(tuple(c) for c in data["cores"]),
                   tuple(tuple(g) for g in data.get("gpus", ())))


_MAX_INT = (1 << 63) - 1


def sound_seconds(value: Any) -> Optional[float]:
    """``value`` as seconds (a time or a duration) when it is a finite, non-negative number
    (not a bool); None for anything else."""
    if type(value) is float:
        return value if value >= 0 and math.isfinite(value) else None
    if type(value) is int:
        return float(value) if 0 <= value <= _MAX_INT else None
    return None


def sound_count(value: Any) -> Optional[int]:
    """``value`` when it is an int (not a bool) from 0 to 2**63 - 1; None for anything else."""
    return value if type(value) is int and 0 <= value <= _MAX_INT else None


ReportedUse = Tuple[Optional[float], Optional[int]]
"""A task process's CPU seconds and peak resident bytes as reported to the engine."""


def reported_use(cpu_seconds: Any, max_rss_bytes: Any) -> Optional[ReportedUse]:
    """The sound parts of a reported use (see :func:`sound_seconds`, :func:`sound_count`);
    None when neither is."""
    cpu, rss = sound_seconds(cpu_seconds), sound_count(max_rss_bytes)
    return None if cpu is None and rss is None else (cpu, rss)


_USE_SECONDS = ("queued_at", "started_at", "ended_at", "cpu_seconds", "requested_seconds")


class TaskUse(Record):
    """The figures of an ended task's run, each None when not known (names as the final
    ``JobStatus.metadata`` of the ``pilot`` executor carries them).

    Times are the pilot's clock (epoch seconds): ``queued_at`` when the pilot accepted the
    task, ``started_at`` when its process was reported started, ``ended_at`` when its end was
    settled. ``cpu_seconds`` (user + system) and ``max_rss_bytes`` are what the system gave for
    the task's process as the process that started it reaped it (``wait4``): its own use and
    that of the descendants it waited for. ``cores`` is the number of cores given;
    ``requested_seconds`` its time limit; ``requested_memory_bytes`` the memory reserved for it.
    """

    queued_at: Optional[float] = None
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    cpu_seconds: Optional[float] = None
    max_rss_bytes: Optional[int] = None
    cores: Optional[int] = None
    requested_seconds: Optional[float] = None
    requested_memory_bytes: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        """The figures that are known, by name."""
        return {name: value for name in self._fields
                if (value := getattr(self, name)) is not None}

    @classmethod
    def from_json(cls, data: Any) -> "Optional[TaskUse]":
        """The figures of :meth:`to_json`'s form that are sound (a value that is not a finite,
        non-negative number of the field's kind is left out); None for what is no mapping."""
        if not isinstance(data, Mapping):
            return None
        values: Dict[str, Any] = {name: (sound_seconds if name in _USE_SECONDS
                                         else sound_count)(data.get(name))
                                  for name in cls._fields}
        return cls(**values)


class TaskEvent(Record):
    """A task's state changed (given to listeners, in order); the final one carries the
    figures of the task's run (``use``)."""

    task_id: str
    state: TaskState
    time: float
    message: Optional[str] = None
    exit_code: Optional[int] = None
    share: Optional[TaskShare] = None
    use: Optional[TaskUse] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"task_id": self.task_id, "state": self.state.value,
                               "time": self.time}
        if self.message is not None:
            out["message"] = self.message
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        if self.share is not None:
            out["share"] = self.share.to_json()
        if self.use is not None:
            out["use"] = self.use.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TaskEvent":
        share = data.get("share")
        return cls(data["task_id"], TaskState(data["state"]), data["time"], data.get("message"),
                   data.get("exit_code"), None if share is None else TaskShare.from_json(share),
                   TaskUse.from_json(data.get("use")))


class TaskStatus(Record):
    """A snapshot of one task: its state, why, where it ran and when each state began."""

    task_id: str
    state: TaskState
    message: Optional[str]
    exit_code: Optional[int]
    share: Optional[TaskShare]
    history: Tuple[Tuple[float, TaskState], ...]
    directory: str
    started: Optional[float]
    ended: Optional[float]
    use: Optional[TaskUse] = None  # once it ended

    def to_json(self) -> Dict[str, Any]:
        out = {"task_id": self.task_id, "state": self.state.value, "message": self.message,
               "exit_code": self.exit_code,
               "share": None if self.share is None else self.share.to_json(),
               "history": [[t, s.value] for t, s in self.history],
               "directory": self.directory, "started": self.started, "ended": self.ended}
        if self.use is not None:
            out["use"] = self.use.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TaskStatus":
        share = data.get("share")
        return cls(data["task_id"], TaskState(data["state"]), data.get("message"),
                   data.get("exit_code"), None if share is None else TaskShare.from_json(share),
                   tuple((t, TaskState(s)) for t, s in data.get("history", ())),
                   data.get("directory", ""), data.get("started"), data.get("ended"),
                   TaskUse.from_json(data.get("use")))


Listener = Callable[[TaskEvent], None]
Prepare = Callable[[TaskSpec, TaskShare], TaskSpec]
