"""The queue of one task shape in the pilot's scheduler (:class:`ShapeQueue`): its waiting
tasks by priority, then arrival, and the key by which a scheduling pass orders shapes.

Pure bookkeeping for :mod:`psij.executors.pilot.scheduler`, which owns the tasks and decides
what starts; no I/O, no threads, no clock.
"""

from collections import deque
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, Deque, Dict, List

from psij.executors.pilot._task_state import TaskState
from psij.executors.pilot.resource_values import Shape

if TYPE_CHECKING:
    from psij.executors.pilot.scheduler import _Task

__all__ = ["ShapeQueue"]


class ShapeQueue:
    """The queued tasks of one shape: a FIFO per priority, highest priority first.

    While ``live`` > 0, ``top`` and ``top_seq`` are the priority and arrival number of the head,
    and ``key`` is ``[-top, top_seq, self]``, one list kept up to date in place, so that a pass
    orders shapes by their heads (highest priority, then earliest) without touching their
    queues, and the scheduler's list of these keys never needs updating when a head changes.
    Cancelled tasks are dropped lazily when they reach the front.
    """

    __slots__ = ("blocked_epoch", "fits_empty", "key", "levels", "live", "need_cores",
                 "need_gpus", "need_idle", "order", "rank", "shape", "top", "top_seq")

    def __init__(self, shape: Shape, fits_empty: bool, number: int) -> None:
        self.shape = shape
        self.rank = (shape.min_cores, number)
        self.fits_empty = fits_empty
        self.need_cores = shape.min_cores
        self.need_gpus = shape.min_gpus
        self.need_idle = shape.min_idle_nodes
        self.levels: Dict[int, Deque[_Task]] = {}
        self.order: List[int] = []  # heap of negated priorities present in ``levels``
        self.live = 0
        self.top = 0
        self.top_seq = 0
        self.key: List[Any] = [0, 0, self]
        self.blocked_epoch = -1

    def push(self, task: "_Task") -> None:
        level = self.levels.get(task.priority)
        if level is None:
            level = self.levels[task.priority] = deque()
            heappush(self.order, -task.priority)
        level.append(task)
        if not self.live or task.priority > self.top:
            self.top = task.priority
            self.top_seq = task.seq
            key = self.key
            key[0] = -task.priority
            key[1] = task.seq
        self.live += 1

    def head(self) -> "_Task":
        """The first queued task; only called while ``live`` > 0."""
        order, levels = self.order, self.levels
        while True:
            level = levels[-order[0]]
            while level:
                task = level[0]
                if task.state is TaskState.QUEUED:
                    return task
                level.popleft()
            del levels[-heappop(order)]

    def pop_head(self) -> "_Task":
        # ``top`` names a level whose front is the head: ``head()`` cleaned it when it was
        # computed, and a cancel of the head recomputes it.
        level = self.levels[self.top]
        task = level.popleft()
        self.live -= 1
        if not self.live:
            self.clear()
        elif level and level[0].state is TaskState.QUEUED:
            # The usual case: the next task of the same priority is the new head.
            self.top_seq = self.key[1] = level[0].seq
        else:
            self._new_head()
        return task

    def drop(self, task: "_Task") -> None:
        """Forget a queued task that was just cancelled (its entry goes lazily)."""
        self.live -= 1
        if self.live == 0:
            self.clear()
        elif task.seq == self.top_seq:
            self._new_head()

    def _new_head(self) -> None:
        head = self.head()
        self.top = head.priority
        self.top_seq = head.seq
        key = self.key
        key[0] = -head.priority
        key[1] = head.seq

    def clear(self) -> None:
        self.levels.clear()
        self.order.clear()
