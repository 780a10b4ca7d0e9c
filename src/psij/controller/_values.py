"""The events and actions of :mod:`psij.controller` (imported from there; the rules are
stated there).

Values only: nothing here does I/O, starts a thread, reads a clock or imports the loop
(``psij.controller._loop``, ``psij.controller._io``).
"""


import logging
from enum import Enum
from typing import Any, Callable, Hashable, Iterable, Optional, Protocol

from psij._record import Record

__all__ = [
    "Action", "ActionDone", "ActionFailed", "ActionKind", "Attach", "BadMessage", "Call", "Cancel",
    "CancelTimer", "Close", "Connected", "Disconnected", "Event", "Forget", "JobStatusChanged",
    "Log", "Machine", "MessageReceived", "Peer", "Send", "SetTimer", "SignalReceived", "Started",
    "Stop", "Submit", "Tick", "TimerFired", "exit_code_for_signal",
]


# -- events -----------------------------------------------------------------------------------

class Started(Record):
    """The loop started: the first event a machine gets."""


class Tick(Record):
    """The loop's periodic tick (every ``tick`` seconds when the loop was given one)."""


class TimerFired(Record):
    """The timer ``name`` set by :class:`SetTimer` came due."""

    name: Hashable


class SignalReceived(Record):
    """The process received the stop signal ``signum`` (SIGINT, SIGTERM)."""

    signum: int


class Peer(Record):
    """Who is at the other end of a connection: for a Unix socket the process id, user id and
    group id the kernel vouches for (``SO_PEERCRED``; -1 where unknown); for TCP ``address``
    is ``host:port`` and the ids are -1."""

    pid: int
    uid: int
    gid: int
    address: str


class Connected(Record):
    """A connection was accepted on one of the loop's listeners; ``conn`` names it from now
    on (a number never used again by this loop)."""

    conn: int
    peer: Peer
    listener: str


class MessageReceived(Record):
    """One JSON value arrived on connection ``conn``."""

    conn: int
    message: Any


class BadMessage(Record):
    """A line on ``conn`` could not be read as JSON, was too long, or held a value no message
    may hold (nesting too deep, a number that is not finite, a lone surrogate); ``reason``
    says which, ``field`` names the refused value's place in the message (``"line"`` when
    the line as a whole is refused), and ``message`` is the JSON value read when only such a
    value was refused (None otherwise), so that the answer can carry the request's id."""

    conn: int
    reason: str
    field: str = "line"
    message: Any = None


class Disconnected(Record):
    """Connection ``conn`` is closed: by its peer, by :class:`Close`, or after an error
    (``reason`` says which)."""

    conn: int
    reason: str


class JobStatusChanged(Record):
    """The job submitted or attached under ``key`` entered a new state (a
    :class:`~psij.JobStatus`)."""

    key: Hashable
    status: Any


class ActionKind(str, Enum):
    """Which action an :class:`ActionDone` or :class:`ActionFailed` answers. Its value is the
    action's name in words (``"submit"``: compared equal to it, and given as it by older
    callers, which the answers convert)."""

    SUBMIT = "submit"
    ATTACH = "attach"
    CANCEL = "cancel"
    CALL = "call"
    SIGNAL = "signal"  # the flow service's SignalJob, carried out through a Call


_ACTION_KINDS = {kind.value: kind for kind in ActionKind}


def _action_kind(record: Record, value: Any) -> None:
    if type(value) is not ActionKind:
        kind = _ACTION_KINDS.get(value) if isinstance(value, str) else None
        if kind is None:
            raise ValueError(f"{type(record).__name__}.action: expected one of "
                             f"{', '.join(_ACTION_KINDS)}, got {value!r}")
        record._set("action", kind)


class ActionDone(Record):
    """The executor call for ``key`` returned: for :class:`Submit` and :class:`Attach` the
    ``result`` is the job's native id, for :class:`Cancel` None, for :class:`Call` what the
    function returned."""

    key: Hashable
    action: ActionKind
    result: Any

    def _validate(self) -> None:
        _action_kind(self, self.action)


class ActionFailed(Record):
    """The executor call for ``key`` raised (or could not be made); ``message`` says why and
    ``error`` is the exception (None when the loop refused the action itself)."""

    key: Hashable
    action: ActionKind
    message: str
    error: Optional[BaseException]

    def _validate(self) -> None:
        _action_kind(self, self.action)


# -- actions ----------------------------------------------------------------------------------

class Submit(Record):
    """Submit a job made from ``spec`` (a :class:`~psij.JobSpec`) to the executor named
    ``executor`` ("" for the loop's default), known as ``key`` from now on."""

    key: Hashable
    spec: Any
    executor: str = ""


class Attach(Record):
    """Attach a job known to the executor by ``native_id`` (submitted earlier, perhaps by
    another process), known as ``key`` from now on."""

    key: Hashable
    native_id: str
    executor: str = ""


class Cancel(Record):
    """Cancel the job known as ``key`` (on a worker thread: ``scancel`` may hang); with
    ``kill``, at once, without the executor's grace period (:meth:`psij.JobExecutor.kill`),
    for a job that had its grace from the machine already."""

    key: Hashable
    kill: bool = False

    def _validate(self) -> None:
        if self.kill is not True and self.kill is not False:
            self._set("kill", bool(self.kill))


class Forget(Record):
    """Drop the loop's :class:`~psij.Job` for ``key`` (after its final state): a controller
    that runs for weeks must not keep every job it ever submitted."""

    key: Hashable


class Call(Record):
    """Run ``function()`` on a worker thread; its result or exception comes back for
    ``key``. The way for a machine to ask for any other blocking work."""

    key: Hashable
    function: Callable[[], Any]


class Send(Record):
    """Send ``message`` (anything ``json.dumps`` writes) as one line on connection ``conn``."""

    conn: int
    message: Any


class Close(Record):
    """Close connection ``conn`` once what was sent on it is written."""

    conn: int


class SetTimer(Record):
    """Deliver :class:`TimerFired` for ``name`` in ``delay`` seconds (replacing a timer of the
    same name)."""

    name: Hashable
    delay: float


class CancelTimer(Record):
    """Forget the timer ``name`` (nothing happens when there is none)."""

    name: Hashable


class Log(Record):
    """Write ``message`` to the controller's log at ``level``."""

    message: str
    level: int = logging.INFO


class Stop(Record):
    """End the loop with ``exit_code`` once no executor call is in flight, or after ``grace``
    seconds (see the module notes); ``reason`` is logged."""

    exit_code: int
    reason: str = ""
    grace: float = 30.0


Event = Record
Action = Record


class Machine(Protocol):
    """A controller's state and rules: takes one event and the time, returns the actions."""

    def step(self, event: Event, now: float) -> Iterable[Action]:
        ...


def exit_code_for_signal(signum: int) -> int:
    """The shell's exit code for a process stopped by ``signum``: 130 for SIGINT, 143 for
    SIGTERM."""
    return 128 + int(signum)
