"""What the state machines of psij share: the one error an event they cannot accept raises, and
the one way a machine finds the rule for an event.

Each machine (the batch tracker, the holding machine, the local executor's pool, the
supervisor, ...) keeps its own rules in its own module; an event that breaks them raises
:class:`IllegalEvent` and changes nothing, so a caller can tell a refused event from any other
error with one ``except``. This module holds no machine and imports nothing of psij.

Dispatch, the rule chosen: a machine that is a class subclasses :class:`StateMachine` and marks
the method that takes each event class with :func:`handles`. The table from event class to
method (:class:`EventTable`, the class attribute ``event_handlers``) is built once, when the
class is made; ``step`` looks the event's exact class up there
(``self.event_handlers[type(event)](self, event, ...)``), and an event no method takes raises
:class:`IllegalEvent` naming its class. The look-up costs the same whatever the number of
events: about what two ``isinstance`` tests cost, so a chain is faster for its first event
only, as fast on average with three events, and slower beyond; no machine keeps a chain. A
machine written as a pure function over immutable state
(:func:`psij.executors.batch._tracking.step`) keeps its own form: it has no class to hold a
table.
"""

from typing import Any, Callable, ClassVar, Dict, Tuple, TypeVar

__all__ = ["EventTable", "IllegalEvent", "StateMachine", "handles"]

_Method = TypeVar("_Method", bound=Callable[..., Any])
_MARK = "_psij_handles"


class IllegalEvent(Exception):
    """An event a state machine cannot accept in its current state (the message names the
    event, and the job when the machine tracks several)."""


def handles(*events: type) -> Callable[[_Method], _Method]:
    """Mark a method of a :class:`StateMachine` as the rule for events of these classes."""
    if not events or not all(isinstance(event, type) for event in events):
        raise TypeError(f"handles: expected one or more event classes, got {events!r}")

    def mark(method: _Method) -> _Method:
        setattr(method, _MARK, getattr(method, _MARK, ()) + events)
        return method

    return mark


class EventTable(Dict[type, Callable[..., Any]]):
    """A machine class's rules: event class -> the method (a plain function: pass the machine
    first) that takes it. Looking up a class no method takes raises :class:`IllegalEvent`."""

    def __missing__(self, event: type) -> Callable[..., Any]:
        raise IllegalEvent(f"unknown event {getattr(event, '__qualname__', event)}")


class StateMachine:
    """A machine whose ``step`` takes each event to the method marked ``@handles`` for its
    class: ``self.event_handlers[type(event)](self, event, ...)``. A subclass inherits the
    table of its bases and may add rules or replace them."""

    event_handlers: ClassVar[EventTable] = EventTable()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table = EventTable()
        for base in reversed(cls.__mro__[1:]):
            table.update(getattr(base, "event_handlers", {}))
        own: Dict[type, str] = {}
        for name, member in vars(cls).items():
            events: Tuple[type, ...] = getattr(member, _MARK, ())
            for event in events:
                if event in own:
                    raise TypeError(f"{cls.__name__}: {event.__name__} is taken by both "
                                    f"{own[event]} and {name}")
                own[event] = name
                table[event] = member
        cls.event_handlers = table
