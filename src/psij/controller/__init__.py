"""Controllers: a pure machine fed by events, and the one I/O loop that runs it.

A controller watches jobs on some executor and decides what to submit, cancel or say next:
the supervisor of a server and its clients, the "keep N running" flows, a user's own. Each
is split in two, as this module's types are (the time comes from a :class:`Clock`, which
tests replace by a :class:`ManualClock`):

- **The machine** (anything with ``step(event, now) -> actions``, see :class:`Machine`)
  holds the controller's state and rules. It does no I/O, starts no thread and reads no
  clock: it is given the time with every event, and it answers with actions. Tests drive it
  by feeding events and reading the actions back.
- **The loop** (:class:`ControllerLoop`) does everything else, on one thread: it waits with
  ``selectors`` on its listening sockets, their connections, a self-pipe fed by the event
  queue and the signal pipe (``signal.set_wakeup_fd``), and uses the wait's timeout as its
  timer. Every executor call that may block (``submit``, ``attach``, ``cancel`` on a batch
  executor that runs ``sbatch`` or ``scancel``) runs on a small pool of worker threads, and
  its completion comes back as :class:`ActionDone` or :class:`ActionFailed`. Executors'
  status callbacks only put :class:`JobStatusChanged` on the queue. So the loop answers
  Ctrl+C, a connection or a timer at once even while an ``sbatch`` hangs.

Rules of the loop:

- Events reach the machine one at a time, in the order they happened on the loop's thread
  (a status change a callback posted before a submission returned comes before its
  :class:`ActionDone`). :class:`Started` comes first, once.
- A machine whose ``step`` raises fails only that event: the error is logged with the event
  and the loop goes on with the next one. An action that cannot be carried out (an unknown
  job key, a send to a connection that is gone) is logged and, for job actions, answered
  with :class:`ActionFailed`.
- Connections speak JSON lines: one JSON value per line, UTF-8, read by the one decoder every
  psij protocol shares. A line that is not JSON (or not UTF-8), or that holds what no message
  may (lists and objects nested more than 64 deep, a number that is not finite or has more than
  100 digits, a lone surrogate but those standing for undecodable bytes), gives
  :class:`BadMessage` and the connection stays open; a line longer than ``max_line_bytes`` gives
  :class:`BadMessage` and the connection is closed (:class:`Disconnected` follows). No line
  stops the loop or delays the other connections longer than it takes to read it. A connection
  whose peer stops reading while more than ``max_pending_bytes`` wait to be sent is closed as
  well.
- :class:`Stop` ends :meth:`ControllerLoop.run` once no executor call is in flight, or after
  its ``grace`` seconds, whichever comes first; the machine still gets events meanwhile
  (the completion of a submission it must now cancel, for instance). A second stop signal
  during that time ends the loop at once. The worker threads are daemon threads: a call that
  hangs past the grace does not keep the process alive.
- Signals are caught only when the loop runs on the main thread (Python allows signal
  handlers nowhere else); the previous handlers and wake-up file are put back when
  :meth:`~ControllerLoop.run` returns.

Everything here is public: users write their own machines against it. The package's modules
are private and hold what this one re-exports: ``_values`` the events, actions and
:class:`Machine`, ``_loop`` the :class:`ControllerLoop`, ``_io`` its worker pool and peers.
Import from ``psij.controller`` only; this module defines nothing of its own.
"""

from psij._clock import Clock, ManualClock, MonotonicClock
from psij.controller._loop import ControllerLoop
from psij.controller._values import (
    Action,
    ActionDone,
    ActionFailed,
    ActionKind,
    Attach,
    BadMessage,
    Call,
    Cancel,
    CancelTimer,
    Close,
    Connected,
    Disconnected,
    Event,
    Forget,
    JobStatusChanged,
    Log,
    Machine,
    MessageReceived,
    Peer,
    Send,
    SetTimer,
    SignalReceived,
    Started,
    Stop,
    Submit,
    Tick,
    TimerFired,
    exit_code_for_signal,
)

__all__ = [
    "Action", "ActionDone", "ActionFailed", "ActionKind", "Attach", "BadMessage", "Call",
    "Cancel",
    "CancelTimer", "Clock", "Close", "Connected", "ControllerLoop", "Disconnected", "Event",
    "Forget", "JobStatusChanged", "Log", "Machine", "ManualClock", "MessageReceived",
    "MonotonicClock", "Peer", "Send", "SetTimer", "SignalReceived", "Started", "Stop", "Submit",
    "Tick", "TimerFired", "exit_code_for_signal",
]

# Documented and shown as this module's own (but the common base of events and actions).
for _name in __all__:
    _value = globals()[_name]
    if _name not in ("Action", "Event") and callable(_value):
        try:
            _value.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _value
