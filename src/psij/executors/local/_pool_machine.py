"""A resource pool for jobs run on this machine, as a pure machine (used by the batch executors'
``fallback="local"``).

It decides when a job may start: it knows the machine's capacity (cores, memory, temporary
disk, GPUs) and what each running job holds; it is driven by events and answers with actions,
and runs, reads and starts nothing itself.

Events (:meth:`LocalPool.step`): :class:`Arrived`, :class:`Ended`, :class:`Cancel`. Actions:
:class:`Start`, :class:`Wait`, :class:`Dropped`.

Rules:

- A job's demand is its cores (processes times cores per process), memory, temporary disk and
  GPUs (processes times GPUs per process), summed over its nodes. A capacity of None is not
  counted (unknown amounts never hold a job back), nor is a demand of None (not asked for).
- A job that asks for more than the pool has of *any* resource runs alone: it starts once
  every running job has ended, and nothing else starts beside it until it ends. What it holds
  is its demand clamped to the pool (every GPU, for one that asks for more GPUs than there
  are).
- A job that asks for GPUs gets that many distinct GPU ids (the lowest free ones, in the order
  of the pool's ids, as the pilot hands them out), given back when it ends: two jobs never
  share a GPU.
- Waiting jobs start in priority order (higher first), then by arrival. Priority is a barrier:
  while the first waiting job does not fit, no job behind it starts, so a wide job is never
  starved by narrow ones. Choosing costs one look at the head of one heap.
- ``Ended`` gives back what a running job held and starts what now fits; ``Cancel`` of a
  waiting job drops it (:class:`Dropped`); an illegal event (unknown job, a job arriving twice,
  ``Ended`` of a job that is not running, ``Cancel`` of a running one, an event of a class the
  pool does not take) raises :class:`IllegalEvent` and changes nothing.
"""

from heapq import heappop, heappush
from typing import Dict, Hashable, List, Optional, Sequence, Tuple, Union

from psij._machine import IllegalEvent, StateMachine, handles
from psij._record import Record

__all__ = ["Amounts", "Arrived", "Cancel", "Dropped", "Ended", "IllegalEvent", "LocalPool",
           "Start", "Wait"]

Key = Hashable


class _Keyed(Record):
    """An event or action about one job."""

    key: Key


class Amounts(Record):
    """Cores, memory and temporary disk (bytes), GPUs; None: not known / not asked for."""

    cores: int
    memory: Optional[int]
    tmp: Optional[int]
    gpus: Optional[int] = None


class Arrived(Record):
    """A job wants ``demand``; higher ``priority`` first."""

    key: Key
    demand: Amounts
    priority: Union[int, float]


class Wait(Record):
    """The job waits for resources (``ahead`` jobs wait with it)."""

    key: Key
    ahead: int


class Ended(_Keyed):
    """A running job ended (or could not be started)."""


class Cancel(_Keyed):
    """Cancel a waiting job."""


class Start(Record):
    """Start this job now; its resources are taken, and ``gpus`` (ids) are its own."""

    key: Key
    gpus: Tuple[str, ...] = ()

    def _validate(self) -> None:
        if type(self.gpus) is not tuple:
            self._set("gpus", tuple(self.gpus))


class Dropped(_Keyed):
    """A waiting job was cancelled."""


Event = Union[Arrived, Ended, Cancel]
Action = Union[Start, Wait, Dropped]


class LocalPool(StateMachine):
    """The pool: ``step(event, now)`` gives the actions (see the module's rules).

    ``gpu_ids`` names the ``capacity.gpus`` GPUs (``"0"``, ``"1"``, ... by default)."""

    def __init__(self, capacity: Amounts, gpu_ids: Optional[Sequence[str]] = None) -> None:
        self.capacity = capacity
        gpus = capacity.gpus or 0
        self.gpu_ids: Tuple[str, ...] = (tuple(str(i) for i in range(gpus)) if gpu_ids is None
                                         else tuple(gpu_ids))
        if len(self.gpu_ids) != gpus:
            raise ValueError(f"LocalPool: {len(self.gpu_ids)} GPU ids for {gpus} GPUs")
        self._free = [capacity.cores, capacity.memory, capacity.tmp, capacity.gpus]
        self._free_gpus = list(range(gpus))  # indices into gpu_ids, lowest first
        self._running: Dict[Key, Tuple[Tuple[Optional[int], ...], List[int]]] = {}
        self._waiting: Dict[Key, Tuple[int, Amounts, bool]] = {}
        self._heap: List[Tuple[Union[int, float], int, Key]] = []
        self._arrivals = 0
        self._alone: Optional[Key] = None  # the job running alone, if one does

    def is_waiting(self, key: Key) -> bool:
        """Whether the job waits for resources."""
        return key in self._waiting

    def step(self, event: Event, now: float = 0.0) -> List[Action]:
        """Apply ``event``; the actions to carry out."""
        actions: List[Action] = self.event_handlers[type(event)](self, event)
        return actions

    @handles(Arrived)
    def _arrived(self, event: Arrived) -> List[Action]:
        if event.key in self._waiting or event.key in self._running:
            raise IllegalEvent(f"Arrived: job {event.key!r} is already known")
        self._arrivals += 1
        demand, alone = self._clamped(event.demand)
        self._waiting[event.key] = (self._arrivals, demand, alone)
        heappush(self._heap, (-event.priority, self._arrivals, event.key))
        actions = self._start_what_fits()
        if not any(isinstance(a, Start) and a.key == event.key for a in actions):
            actions.append(Wait(event.key, len(self._waiting)))
        return actions

    @handles(Ended)
    def _ended(self, event: Ended) -> List[Action]:
        entry = self._running.get(event.key)
        if entry is None:
            raise IllegalEvent(f"Ended: job {event.key!r} is not running")
        del self._running[event.key]
        held, gpus = entry
        for i, amount in enumerate(held):
            if amount is not None and self._free[i] is not None:
                self._free[i] += amount  # type: ignore[operator]
        if gpus:
            self._free_gpus.extend(gpus)
            self._free_gpus.sort()
        if self._alone == event.key:
            self._alone = None
        return self._start_what_fits()

    @handles(Cancel)
    def _cancel(self, event: Cancel) -> List[Action]:
        if event.key not in self._waiting:
            raise IllegalEvent(f"Cancel: job {event.key!r} is not waiting")
        del self._waiting[event.key]  # its heap entry is skipped when it comes up
        return [Dropped(event.key), *self._start_what_fits()]

    def _clamped(self, demand: Amounts) -> Tuple[Amounts, bool]:
        """The demand clamped to the pool, and whether it exceeds the pool anywhere (the job
        then runs alone)."""
        cap = self.capacity
        alone = False

        def clamp(asked: Optional[int], have: Optional[int]) -> Optional[int]:
            nonlocal alone
            if asked is None or have is None:
                return None
            asked = max(asked, 0)
            if asked > have:
                alone = True
                return have
            return asked

        clamped = Amounts(clamp(demand.cores, cap.cores) or 0, clamp(demand.memory, cap.memory),
                          clamp(demand.tmp, cap.tmp), clamp(demand.gpus, cap.gpus))
        return clamped, alone

    def _start_what_fits(self) -> List[Action]:
        actions: List[Action] = []
        heap = self._heap
        while heap and self._alone is None:  # nothing starts beside a job running alone
            _, arrival, key = heap[0]
            entry = self._waiting.get(key)
            if entry is None or entry[0] != arrival:
                heappop(heap)  # cancelled
                continue
            demand, alone = entry[1], entry[2]
            need = (demand.cores, demand.memory, demand.tmp, demand.gpus)
            if alone:
                if self._running:
                    break  # the barrier: it waits for every running job to end
            elif any(n is not None and f is not None and n > f
                     for n, f in zip(need, self._free)):
                break  # the barrier: nothing behind it starts
            heappop(heap)
            del self._waiting[key]
            for i, amount in enumerate(need):
                if amount is not None and self._free[i] is not None:
                    self._free[i] -= amount  # type: ignore[operator]
            gpus = self._free_gpus[:demand.gpus or 0]
            del self._free_gpus[:len(gpus)]
            self._running[key] = (need, gpus)
            if alone:
                self._alone = key
            actions.append(Start(key, tuple(self.gpu_ids[i] for i in gpus)))
        return actions
