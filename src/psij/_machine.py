"""What the state machines of psij share: the one error an event they cannot accept raises.

Each machine (the batch tracker, the holding machine, the local executor's pool, ...) keeps its
own rules in its own module; an event that breaks them raises :class:`IllegalEvent` and changes
nothing, so a caller can tell a refused event from any other error with one ``except``. This
module holds no machine and imports nothing of psij.
"""

__all__ = ["IllegalEvent"]


class IllegalEvent(Exception):
    """An event a state machine cannot accept in its current state (the message names the
    event, and the job when the machine tracks several)."""
