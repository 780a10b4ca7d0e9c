"""The one way our commands turn "stop" signals (SIGINT, SIGTERM, SIGHUP) into a stop.

Used by ``psij run``, ``psij pilot run`` and ``psij pilot serve``. While a :class:`StopSignals`
is active (a ``with`` block on the main thread) each stop signal calls ``on_stop(signum)`` in
the main thread; ``on_stop`` may raise to interrupt what the main thread is doing. A signal
that arrives while the stop is held (:meth:`StopSignals.hold`, :meth:`StopSignals.held`) is
kept and delivered when the hold ends, so that a submission is never cut in two. With
``once``, only the first signal is delivered: a second one must not interrupt the clean-up
the first one started.

On any other thread the handlers cannot be installed and the signals keep their handlers.
The previous handlers are put back at the end of the ``with`` block.
"""

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable, Dict, Iterator, Optional, Sequence

__all__ = ["STOP_SIGNALS", "StopSignals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Stop signals delivered to ``on_stop`` while active (see the module notes)."""

    def __init__(self, on_stop: Callable[[int], None],
                 signals: Sequence[int] = STOP_SIGNALS, once: bool = False,
                 hold: bool = False) -> None:
        self._on_stop = on_stop
        self._signals = tuple(signals)
        self._once = once
        self._holding = hold
        self._pending: Optional[int] = None
        self._delivered = False
        self._previous: Dict[int, Any] = {}

    @property
    def stopping(self) -> bool:
        """Whether a stop signal has been delivered."""
        return self._delivered

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._holding:
            self._pending = signum
        else:
            self._deliver(signum)

    def _deliver(self, signum: int) -> None:
        if self._once and self._delivered:
            return
        self._delivered = True
        self._on_stop(signum)

    def hold(self) -> None:
        """From now on keep a stop signal until :meth:`release`."""
        self._holding = True

    def release(self) -> None:
        """Deliver from now on, starting with a signal kept while held (``on_stop`` may raise
        here)."""
        self._holding = False
        pending, self._pending = self._pending, None
        if pending is not None:
            self._deliver(pending)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A stop signal arriving inside waits until the end of the block."""
        self.hold()
        try:
            yield
        finally:
            self._holding = False
        self.release()

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)
