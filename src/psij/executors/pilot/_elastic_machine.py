"""An elastic pilot's decisions: when to ask for an allocation and when to give one back.

A pure machine: no I/O, no threads, no clock (time comes with each event, as ``now``, in
seconds of any monotonic clock). The pilot's loop feeds :meth:`ElasticMachine.step` what
happened and carries out the actions it returns; it asks :meth:`ElasticMachine.next_wake`
when to feed a :class:`Tick` next.

Events: :class:`Tick` (time passed), :class:`BacklogChanged` (how many tasks wait for
resources that no running allocation has free), :class:`Submitted` (an allocation's job was
accepted, with its native id), :class:`SubmitFailed`, :class:`AllocationStarted` (its agents
joined the pilot), :class:`TasksChanged` (how many tasks run on it), :class:`AllocationEnded`
(its job ended, for whatever reason) and :class:`Closing` (the pilot stops).
Actions: :class:`SubmitAllocation`, :class:`GiveBack` (place no more tasks there and cancel
its job) and :class:`StopAsking` (said once, with the reason).

Rules:

- Allocations are ``"a1"``, ``"a2"``, ... in the order they were asked for, never reused. Each
  is SUBMITTING (asked for, the executor has not answered), PENDING (queued by the
  scheduler), RUNNING (its agents joined), DRAINING (being given back) or ENDED.
- *Held* allocations are those not ENDED; *kept* ones are held and not DRAINING. The pilot
  asks for one more allocation while fewer than ``min_allocations`` are kept ("to keep the
  minimum"), or while the backlog wants more allocations on the way than there are
  (SUBMITTING or PENDING): ``ceil(backlog / backlog_per_allocation)`` ("backlog of N tasks");
  never while ``max_allocations`` are held, after it stopped asking, while closing, or before
  the retry time that follows a failure, nor, after a failure, while another allocation is
  on the way (one at a time, until one starts). When an allocation starts, the backlog counts
  as 0 until the next :class:`BacklogChanged`: the waiting work goes to its nodes first.
- A RUNNING allocation that has run no task for ``idle_timeout`` seconds is given back
  ("idle for S s"), unless that would leave fewer than ``min_allocations`` kept, or tasks
  wait (they are being placed on it: an allocation is never given back while work waits).
  The longest idle goes first.
- A failure is a submission refused (:class:`SubmitFailed`) or an allocation that ended before
  its agents joined and that the pilot did not give back. After one, the next submission
  waits ``retry_delay`` seconds, doubled after each further failure in a row (at most 300 s);
  after ``max_failures`` failures in a row, the pilot stops asking (:class:`StopAsking`, with
  the last failure's reason) until it closes. An allocation that starts ends the run of
  failures.
- :class:`Closing` gives back every held allocation ("the pilot is closing"); one still
  SUBMITTING is given back as soon as its native id is known.

An event about an allocation the machine does not know, or that does not fit the
allocation's state (a start after its end, a second answer to a submission), raises
:class:`~psij._machine.IllegalEvent` and changes nothing.
"""

import math
from typing import Dict, List, Optional, Union

from psij import _check
from psij._machine import IllegalEvent, StateMachine, handles
from psij._record import Record
from psij.executors.pilot.allocation_policy import AllocationPolicy

__all__ = [
    "DRAINING", "ENDED", "PENDING", "RUNNING", "SUBMITTING", "Action", "AllocationEnded",
    "AllocationStarted", "AllocationView", "BacklogChanged", "Closing", "ElasticMachine",
    "Event", "GiveBack", "StopAsking", "SubmitAllocation", "SubmitFailed", "Submitted",
    "TasksChanged", "Tick",
]

SUBMITTING = "submitting"
PENDING = "pending"
RUNNING = "running"
DRAINING = "draining"
ENDED = "ended"

_MAX_RETRY_DELAY = 300.0


def _id(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _check.fail_type(field, value, "an allocation id such as 'a1'")
    return value


# -- events -----------------------------------------------------------------------------------


class Tick(Record):
    """Time passed (the loop feeds one at :meth:`ElasticMachine.next_wake`)."""


class BacklogChanged(Record):
    """``waiting`` tasks wait for resources that no running allocation has free."""

    waiting: int

    def _validate(self) -> None:
        _check.opt_int("BacklogChanged.waiting", self.waiting, minimum=0)
        if self.waiting is None:
            raise _check.fail_type("BacklogChanged.waiting", None, "int")


class Submitted(Record):
    """The executor accepted the allocation's job; ``native_id`` is the scheduler's id."""

    allocation: str
    native_id: str

    def _validate(self) -> None:
        _id("Submitted.allocation", self.allocation)
        _check.req_str("Submitted.native_id", self.native_id)


class SubmitFailed(Record):
    """The executor refused the allocation's job (``why``: its message)."""

    allocation: str
    why: str

    def _validate(self) -> None:
        _id("SubmitFailed.allocation", self.allocation)
        _check.req_str("SubmitFailed.why", self.why)


class AllocationStarted(Record):
    """The allocation's agents joined the pilot: its nodes take tasks."""

    allocation: str

    def _validate(self) -> None:
        _id("AllocationStarted.allocation", self.allocation)


class TasksChanged(Record):
    """``running`` tasks run on the allocation now (0: it is idle from now on)."""

    allocation: str
    running: int

    def _validate(self) -> None:
        _id("TasksChanged.allocation", self.allocation)
        if _check.opt_int("TasksChanged.running", self.running, minimum=0) is None:
            raise _check.fail_type("TasksChanged.running", None, "int")


class AllocationEnded(Record):
    """The allocation's job ended (``why``: its state and message, in words)."""

    allocation: str
    why: str

    def _validate(self) -> None:
        _id("AllocationEnded.allocation", self.allocation)
        _check.req_str("AllocationEnded.why", self.why)


class Closing(Record):
    """The pilot stops: every allocation is given back, none asked for."""


Event = Union[Tick, BacklogChanged, Submitted, SubmitFailed, AllocationStarted, TasksChanged,
              AllocationEnded, Closing]


# -- actions ----------------------------------------------------------------------------------


class SubmitAllocation(Record):
    """Submit a new allocation's job; answer with :class:`Submitted` or :class:`SubmitFailed`."""

    allocation: str
    why: str


class GiveBack(Record):
    """Place no more tasks on the allocation and cancel its job (its native id, when known);
    :class:`AllocationEnded` follows."""

    allocation: str
    native_id: Optional[str]
    why: str


class StopAsking(Record):
    """No allocation will be asked for any more (``why``: the reason, for the user)."""

    why: str


Action = Union[SubmitAllocation, GiveBack, StopAsking]


class AllocationView(Record):
    """What is known of one allocation (for status displays)."""

    allocation: str
    state: str
    native_id: Optional[str]
    asked_because: str
    ended_because: Optional[str]
    running_tasks: int
    idle_since: Optional[float]


class _Allocation:
    __slots__ = ("asked_because", "ended_because", "given_back", "idle_since", "name",
                 "native_id", "running", "state")

    def __init__(self, name: str, why: str) -> None:
        self.name = name
        self.state = SUBMITTING
        self.native_id: Optional[str] = None
        self.asked_because = why
        self.ended_because: Optional[str] = None
        self.given_back: Optional[str] = None  # why, once the pilot gave it back
        self.running = 0
        self.idle_since: Optional[float] = None

    def view(self) -> AllocationView:
        return AllocationView(self.name, self.state, self.native_id, self.asked_because,
                              self.ended_because if self.ended_because is not None
                              else self.given_back, self.running, self.idle_since)


class ElasticMachine(StateMachine):
    """Decides when to ask for allocations and give them back (see the module notes).

    :param policy: the pilot's allocation policy.
    """

    def __init__(self, policy: AllocationPolicy) -> None:
        _check.instance("policy", policy, AllocationPolicy, "AllocationPolicy", False)
        self.policy = policy
        self._allocations: Dict[str, _Allocation] = {}
        self._next = 1
        self._backlog = 0
        self._failures = 0  # in a row
        self._last_failure: Optional[str] = None
        self._retry_at: Optional[float] = None
        self.stopped: Optional[str] = None  # why the pilot stopped asking
        self._closing = False

    # -- queries ----------------------------------------------------------------------------

    @property
    def backlog(self) -> int:
        return self._backlog

    @property
    def failures_in_a_row(self) -> int:
        return self._failures

    def allocations(self) -> List[AllocationView]:
        """Every allocation asked for, in order (ended ones included)."""
        return [a.view() for a in self._allocations.values()]

    def allocation(self, name: str) -> AllocationView:
        return self._get(name).view()

    def next_wake(self) -> Optional[float]:
        """When a :class:`Tick` may change something (an idle allocation's timeout, the end of
        the wait after a failure); None when only other events can."""
        times: List[float] = []
        if self._retry_at is not None and self._may_ask():
            times.append(self._retry_at)
        if self._backlog == 0:
            timeout = self.policy.idle_timeout
            times += [a.idle_since + timeout for a in self._allocations.values()
                      if a.state == RUNNING and a.idle_since is not None]
        return min(times) if times else None

    # -- events -----------------------------------------------------------------------------

    def step(self, event: Event, now: float) -> List[Action]:
        """Take ``event`` at time ``now``; the actions to carry out, in order."""
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise _check.fail_type("now", now, "a finite number of seconds")
        out: List[Action] = []
        self.event_handlers[type(event)](self, event, now, out)
        self._decide(now, out)
        return out

    @handles(Tick)
    def _tick(self, event: Tick, now: float, out: List[Action]) -> None:
        pass

    @handles(BacklogChanged)
    def _backlog_changed(self, event: BacklogChanged, now: float, out: List[Action]) -> None:
        self._backlog = event.waiting

    @handles(Submitted)
    def _submitted(self, event: Submitted, now: float, out: List[Action]) -> None:
        alloc = self._in(event, event.allocation, SUBMITTING)
        alloc.native_id = event.native_id
        if alloc.given_back is not None:  # closing meanwhile: cancel it now
            alloc.state = DRAINING
            out.append(GiveBack(alloc.name, alloc.native_id, alloc.given_back))
        else:
            alloc.state = PENDING

    @handles(SubmitFailed)
    def _submit_failed(self, event: SubmitFailed, now: float, out: List[Action]) -> None:
        alloc = self._in(event, event.allocation, SUBMITTING)
        alloc.state = ENDED
        alloc.ended_because = f"its submission failed: {event.why}"
        self._failed(alloc.ended_because, now, out)

    @handles(AllocationStarted)
    def _started(self, event: AllocationStarted, now: float, out: List[Action]) -> None:
        alloc = self._in(event, event.allocation, PENDING, DRAINING)
        self._failures = 0
        self._retry_at = None
        if alloc.state == PENDING:
            alloc.state = RUNNING
            alloc.idle_since = now
            # The waiting work goes to the new nodes first: what is left comes with the next
            # BacklogChanged, and asks for more then.
            self._backlog = 0

    @handles(TasksChanged)
    def _tasks_changed(self, event: TasksChanged, now: float, out: List[Action]) -> None:
        alloc = self._in(event, event.allocation, RUNNING, DRAINING)
        if event.running == 0:
            if alloc.running != 0 or alloc.idle_since is None:
                alloc.idle_since = now
        else:
            alloc.idle_since = None
        alloc.running = event.running

    @handles(AllocationEnded)
    def _ended(self, event: AllocationEnded, now: float, out: List[Action]) -> None:
        alloc = self._in(event, event.allocation, PENDING, RUNNING, DRAINING)
        never_started = alloc.state == PENDING
        alloc.state = ENDED
        alloc.running = 0
        alloc.idle_since = None
        alloc.ended_because = event.why if alloc.given_back is None \
            else f"{alloc.given_back}; then {event.why}"
        if never_started and alloc.given_back is None:
            self._failed(f"allocation {alloc.name} ({alloc.native_id}) ended before its "
                         f"agents joined: {event.why}", now, out)

    @handles(Closing)
    def _closing_event(self, event: Closing, now: float, out: List[Action]) -> None:
        self._closing = True
        for alloc in self._allocations.values():
            if alloc.state in (ENDED, DRAINING) or alloc.given_back is not None:
                continue
            alloc.given_back = "given back: the pilot is closing"
            if alloc.state != SUBMITTING:
                alloc.state = DRAINING
                out.append(GiveBack(alloc.name, alloc.native_id, alloc.given_back))

    # -- rules ------------------------------------------------------------------------------

    def _get(self, name: str) -> _Allocation:
        alloc = self._allocations.get(name)
        if alloc is None:
            raise IllegalEvent(f"allocation {name!r}: not known")
        return alloc

    def _in(self, event: Record, name: str, *states: str) -> _Allocation:
        alloc = self._get(name)
        if alloc.state not in states:
            raise IllegalEvent(f"allocation {name!r}: {type(event).__name__} while "
                               f"{alloc.state}")
        return alloc

    def _failed(self, why: str, now: float, out: List[Action]) -> None:
        self._failures += 1
        self._last_failure = why
        policy = self.policy
        delay = min(_MAX_RETRY_DELAY, policy.retry_delay * 2 ** min(self._failures - 1, 20))
        self._retry_at = now + delay
        if self._failures >= policy.max_failures and self.stopped is None:
            self.stopped = (f"stopped asking for allocations after {self._failures} failures "
                            f"in a row (max_failures is {policy.max_failures}); the last: "
                            f"{why}")
            out.append(StopAsking(self.stopped))

    def _may_ask(self) -> bool:
        return self.stopped is None and not self._closing

    def _decide(self, now: float, out: List[Action]) -> None:
        if self._closing:
            return
        self._give_back_idle(now, out)
        if self._retry_at is not None:
            if now < self._retry_at:
                return
            self._retry_at = None
        if not self._may_ask():
            return
        policy = self.policy
        allocations = self._allocations.values()
        held = sum(1 for a in allocations if a.state != ENDED)
        kept = sum(1 for a in allocations if a.state not in (ENDED, DRAINING))
        coming = sum(1 for a in allocations if a.state in (SUBMITTING, PENDING))
        wanted = -(-self._backlog // policy.backlog_per_allocation)
        while held < policy.max_allocations:
            if self._failures and coming:
                break  # after a failure, one at a time: its answer says whether to go on
            if kept < policy.min_allocations:
                why = f"to keep the minimum of {policy.min_allocations}"
            elif coming < wanted:
                why = f"backlog of {self._backlog} tasks"
            else:
                break
            name = f"a{self._next}"
            self._next += 1
            self._allocations[name] = _Allocation(name, why)
            out.append(SubmitAllocation(name, why))
            held += 1
            kept += 1
            coming += 1

    def _give_back_idle(self, now: float, out: List[Action]) -> None:
        if self._backlog:
            return
        policy = self.policy
        kept = sum(1 for a in self._allocations.values() if a.state not in (ENDED, DRAINING))
        idle = sorted((a for a in self._allocations.values() if a.state == RUNNING
                       and a.idle_since is not None
                       and now - a.idle_since >= policy.idle_timeout),
                      key=lambda a: (a.idle_since, self._order(a.name)))
        for alloc in idle:
            if kept <= policy.min_allocations:
                break
            assert alloc.idle_since is not None
            alloc.state = DRAINING
            alloc.given_back = f"given back: idle for {now - alloc.idle_since:.3g} s"
            out.append(GiveBack(alloc.name, alloc.native_id, alloc.given_back))
            kept -= 1

    @staticmethod
    def _order(name: str) -> int:
        return int(name[1:])
