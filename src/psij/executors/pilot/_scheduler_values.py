"""The values of the pilot's task scheduler (:mod:`psij.executors.pilot.scheduler`): the
task requests it takes, its events and its actions.

Values only (``Record`` subclasses, checked when made): no rule, no state, no I/O. The rules
and the machine that takes these events are in :mod:`psij.executors.pilot.scheduler`, which
gives these names as its own.
"""

from typing import Optional, Tuple, Union

from psij import _check
from psij._record import Record
from psij.executors.pilot._task_state import TaskState
from psij.executors.pilot.resources import NodeShare, NodeSpec, ResourceRequest

__all__ = [
    "SCHEDULE", "Action", "CancelAsked", "Event", "Forgotten", "NodeAdded", "NodeLost", "Placement",
    "Schedule", "SucceededBefore", "TaskFinished", "TaskRequest", "TaskSubmitted",
    "Transition",
]


_DEFAULT_REQUEST = ResourceRequest()


class TaskRequest(Record):
    """One task to schedule: a unique name, its resources, priority and dependencies.

    ``after`` names tasks or iteration groups that must all succeed first. ``group`` names the
    iteration group the task belongs to (see
    :func:`~psij.executors.pilot.scheduler.expand_iterations`).
    """

    name: str
    resources: ResourceRequest = _DEFAULT_REQUEST
    priority: int = 0
    after: Tuple[str, ...] = ()
    group: Optional[str] = None

    def _validate(self) -> None:
        name, resources, priority = self.name, self.resources, self.priority
        after, group = self.after, self.group
        # The common valid case passes a test or two; the full checks give the messages.
        if type(name) is not str or not name or "\x00" in name:
            _check.req_str("TaskRequest.name", name)
            raise ValueError("TaskRequest.name: a task needs a non-empty name")
        if type(resources) is not ResourceRequest:
            _check.instance("TaskRequest.resources", resources, ResourceRequest,
                            "ResourceRequest", False)
        if type(priority) is not int \
                and _check.opt_int("TaskRequest.priority", priority) is None:
            raise _check.fail_type("TaskRequest.priority", None, "int")
        if type(after) is not tuple or not all(type(a) is str and "\x00" not in a
                                               for a in after):
            self._set("after", tuple(_check.opt_str_list("TaskRequest.after", after) or ()))
        if group is not None and (type(group) is not str or not group or "\x00" in group) \
                and _check.opt_str("TaskRequest.group", group) == "":
            raise ValueError("TaskRequest.group: an empty group name is not accepted; use None")


class Placement(Record):
    """Where a started task runs: one share per node, in pool order."""

    task_id: str
    shares: Tuple[NodeShare, ...]

    @property
    def nodes(self) -> Tuple[str, ...]:
        return tuple(share.node for share in self.shares)

    @property
    def process_count(self) -> int:
        return sum(share.processes for share in self.shares)

    @property
    def core_count(self) -> int:
        return sum(len(share.cores) for share in self.shares)


class Transition(Record):
    """A task reaching a final state, and why."""

    task_id: str
    state: "TaskState"
    message: Optional[str] = None


Action = Union[Placement, Transition]

# ------------------------------------------------------------------------------------- events


class TaskSubmitted(Record):
    """A task arrives; its id is its name. Actions: its :class:`Transition` if it ended at
    once (FAILED: it can never fit; OMITTED: a dependency already failed), else none."""

    request: TaskRequest

    def _validate(self) -> None:
        if type(self.request) is not TaskRequest:
            _check.instance("request", self.request, TaskRequest, "TaskRequest", False)


class SucceededBefore(Record):
    """A task SUCCEEDED in an earlier run of the pilot, as a member of ``group`` if given:
    tasks submitted after it may depend on it or on its group. No actions."""

    task_id: str
    group: Optional[str] = None

    def _validate(self) -> None:
        _check.req_str("task_id", self.task_id)
        if self.task_id == "":
            raise ValueError("task_id: a task needs a non-empty name")
        if _check.opt_str("group", self.group) == "":
            raise ValueError("group: an empty group name is not accepted; use None")


class Schedule(Record):
    """Start every queued task that may start now (see the ordering rule). Actions: a
    :class:`Placement` per task started; the caller runs each and later feeds
    :class:`TaskFinished` for it."""


SCHEDULE = Schedule()  # it has no fields: one value serves every pass


class _TaskEvent(Record):
    """An event about one known task."""

    task_id: str


class TaskFinished(_TaskEvent):
    """A RUNNING task ended (``succeeded``: it reported success). Actions: its
    :class:`Transition`, then those of the dependents it omitted."""

    succeeded: bool

    def _validate(self) -> None:
        if self.succeeded is not True and self.succeeded is not False:
            raise _check.fail_type("succeeded", self.succeeded, "bool")


class CancelAsked(_TaskEvent):
    """Cancel a task (see the rules). Actions: the tasks that ended, itself first."""


class NodeLost(Record):
    """Place nothing more on ``node`` (``why``: its agent is gone). Actions: the waiting and
    queued tasks that can no longer fit, each followed by its dependents."""

    node: str
    why: str


class NodeAdded(Record):
    """Node ``node`` joined the pool (an elastic pilot's allocation started). No actions: the
    next :class:`Schedule` may place tasks there."""

    node: NodeSpec

    def _validate(self) -> None:
        _check.instance("NodeAdded.node", self.node, NodeSpec, "NodeSpec", False)


class Forgotten(_TaskEvent):
    """Drop an ended task, so that its name can be used again. No actions."""


Event = Union[TaskSubmitted, SucceededBefore, Schedule, TaskFinished, CancelAsked, NodeLost,
              NodeAdded, Forgotten]
