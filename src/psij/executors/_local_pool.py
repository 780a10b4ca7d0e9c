"""A resource pool for jobs run on this machine, as a pure machine (used by the batch executors'
``fallback="local"``).

It decides when a job may start: it knows the machine's capacity (cores, memory, temporary
disk) and what each running job holds; it is driven by events and answers with actions, and
runs, reads and starts nothing itself.

Rules:

- A job's demand is its cores (processes times cores per process), memory and temporary disk,
  summed over its nodes, each clamped to the machine's capacity: a job that asks for more than
  the machine has runs alone, once everything else has ended. A capacity of None is not
  counted (unknown amounts never hold a job back).
- Waiting jobs start in priority order (higher first), then by arrival. Priority is a barrier:
  while the first waiting job does not fit, no job behind it starts, so a wide job is never
  starved by narrow ones. Choosing costs one look at the head of one heap.
- ``Ended`` gives back what a running job held and starts what now fits; ``Cancel`` of a
  waiting job drops it (:class:`Dropped`); an illegal event (unknown job, a job arriving twice,
  ``Ended`` of a job that is not running, ``Cancel`` of a running one) raises
  :class:`IllegalEvent` and changes nothing.
"""

from heapq import heappop, heappush
from typing import Dict, Hashable, List, Optional, Tuple, Union

from psij._record import Record

__all__ = ["Amounts", "Arrived", "Cancel", "Dropped", "Ended", "IllegalEvent", "LocalPool",
           "Start", "Wait"]

Key = Hashable


class IllegalEvent(Exception):
    """An event the pool cannot accept for the job it names."""


class _Keyed(Record):
    """An event or action about one job."""

    _fields = ("key",)
    __slots__ = _fields
    key: Key


class Amounts(Record):
    """Cores, memory and temporary disk (bytes); None: not known / not asked for."""

    _fields = ("cores", "memory", "tmp")
    __slots__ = _fields
    cores: int
    memory: Optional[int]
    tmp: Optional[int]


class Arrived(Record):
    """A job wants ``demand``; higher ``priority`` first."""

    _fields = ("key", "demand", "priority")
    __slots__ = _fields
    key: Key
    demand: Amounts
    priority: Union[int, float]


class Wait(Record):
    """The job waits for resources (``ahead`` jobs wait with it)."""

    _fields = ("key", "ahead")
    __slots__ = _fields
    key: Key
    ahead: int


class Ended(_Keyed):
    """A running job ended (or could not be started)."""

    __slots__ = ()


class Cancel(_Keyed):
    """Cancel a waiting job."""

    __slots__ = ()


class Start(_Keyed):
    """Start this job now; its resources are taken."""

    __slots__ = ()


class Dropped(_Keyed):
    """A waiting job was cancelled."""

    __slots__ = ()


Event = Union[Arrived, Ended, Cancel]
Action = Union[Start, Wait, Dropped]


class LocalPool:
    """The pool: ``step(event, now)`` gives the actions (see the module's rules)."""

    def __init__(self, capacity: Amounts) -> None:
        self.capacity = capacity
        self._free = [capacity.cores, capacity.memory, capacity.tmp]
        self._running: Dict[Key, Tuple[Optional[int], ...]] = {}
        self._waiting: Dict[Key, Tuple[int, Amounts]] = {}
        self._heap: List[Tuple[Union[int, float], int, Key]] = []
        self._arrivals = 0

    def is_waiting(self, key: Key) -> bool:
        """Whether the job waits for resources."""
        return key in self._waiting

    def step(self, event: Event, now: float = 0.0) -> List[Action]:
        """Apply ``event``; the actions to carry out."""
        if isinstance(event, Arrived):
            if event.key in self._waiting or event.key in self._running:
                raise IllegalEvent(f"Arrived: job {event.key!r} is already known")
            self._arrivals += 1
            demand = self._clamped(event.demand)
            self._waiting[event.key] = (self._arrivals, demand)
            heappush(self._heap, (-event.priority, self._arrivals, event.key))
            actions = self._start_what_fits()
            if Start(event.key) not in actions:
                actions.append(Wait(event.key, len(self._waiting)))
            return actions
        if isinstance(event, Ended):
            held = self._running.get(event.key)
            if held is None:
                raise IllegalEvent(f"Ended: job {event.key!r} is not running")
            del self._running[event.key]
            for i, amount in enumerate(held):
                if amount is not None and self._free[i] is not None:
                    self._free[i] += amount  # type: ignore[operator]
            return self._start_what_fits()
        if isinstance(event, Cancel):
            if event.key not in self._waiting:
                raise IllegalEvent(f"Cancel: job {event.key!r} is not waiting")
            del self._waiting[event.key]  # its heap entry is skipped when it comes up
            return [Dropped(event.key), *self._start_what_fits()]
        raise IllegalEvent(f"unknown event {event!r}")

    def _clamped(self, demand: Amounts) -> Amounts:
        cap = self.capacity

        def clamp(asked: Optional[int], have: Optional[int]) -> Optional[int]:
            if asked is None or have is None:
                return None
            return min(max(asked, 0), have)

        return Amounts(clamp(demand.cores, cap.cores) or 0, clamp(demand.memory, cap.memory),
                       clamp(demand.tmp, cap.tmp))

    def _start_what_fits(self) -> List[Action]:
        actions: List[Action] = []
        heap = self._heap
        while heap:
            _, arrival, key = heap[0]
            entry = self._waiting.get(key)
            if entry is None or entry[0] != arrival:
                heappop(heap)  # cancelled
                continue
            need = (entry[1].cores, entry[1].memory, entry[1].tmp)
            if any(n is not None and f is not None and n > f for n, f in zip(need, self._free)):
                break  # the barrier: nothing behind it starts
            heappop(heap)
            del self._waiting[key]
            for i, amount in enumerate(need):
                if amount is not None and self._free[i] is not None:
                    self._free[i] -= amount  # type: ignore[operator]
            self._running[key] = need
            actions.append(Start(key))
        return actions
