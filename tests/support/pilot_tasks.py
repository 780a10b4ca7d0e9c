"""Requests and task names shared by the tests of the pilot's scheduler
(tests/test_pilot_scheduler_placement.py and tests/test_pilot_scheduler_order.py)."""

from typing import List, Optional, Tuple

from psij import ResourceSpecV1
from psij.executors.pilot.resources import ResourceRequest
from psij.executors.pilot.scheduler import Placement, TaskRequest, TaskState

GIB = 1 << 30

QUEUED, WAITING, RUNNING = TaskState.QUEUED, TaskState.WAITING, TaskState.RUNNING
SUCCEEDED, FAILED = TaskState.SUCCEEDED, TaskState.FAILED
CANCELED, OMITTED = TaskState.CANCELED, TaskState.OMITTED


def cores(n: int) -> ResourceRequest:
    return ResourceRequest.from_qcg({"exact": n})


def spec(**kwargs: object) -> ResourceRequest:
    return ResourceRequest.from_resource_spec(ResourceSpecV1(**kwargs))  # type: ignore[arg-type]


def task(name: str, resources: Optional[ResourceRequest] = None, priority: int = 0,
         after: Tuple[str, ...] = ()) -> TaskRequest:
    return TaskRequest(name, resources or cores(1), priority=priority, after=after)


def started(placements: List[Placement]) -> List[str]:
    return [p.task_id for p in placements]
