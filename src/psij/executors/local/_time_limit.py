"""The opt-in time limit of ``local`` jobs (``LocalJobExecutorConfig(enforce_duration=True)``).

A :class:`TimeLimit` waits on the timers and clock of the executor's process watch, and when
the job's ``duration`` has passed while it still runs, sends TERM to its process group and KILL
after the grace period (the process layer's :func:`terminate_group`), and notes that it did; a
job that asked for a signal before its end (``psij.signal_before_end``) is sent it to its
process group that many seconds before the duration has passed. The
executor reads :attr:`TimeLimit.expired` when the job exits to end it FAILED with
:func:`time_limit_message`. It runs on the watch thread, so it is quick and sets no job state;
it never runs user code.
"""

import signal
from datetime import timedelta
from typing import Callable, Optional

from psij._end_signal import EndSignal
from psij.executors._process import terminate_group
from psij.executors._process_watch import ProcessWatch

__all__ = ["TimeLimit", "time_limit_message"]


def time_limit_message(duration: timedelta) -> str:
    total = int(duration.total_seconds())
    text = f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"
    return (f"the job reached its time limit ({text}) and was stopped by the local executor "
            "(enforce_duration is set); ask for a longer duration (JobAttributes.duration)")


class TimeLimit:
    """Ends process group ``pgid`` once ``duration`` has passed on the watch's clock, unless
    ``ended()`` says the job is over by then."""

    def __init__(self, watch: ProcessWatch, pgid: int, duration: timedelta, grace: float,
                 ended: Callable[[], bool], warning: Optional[EndSignal] = None) -> None:
        self._watch = watch
        self._clock = watch.clock
        self._pgid = pgid
        self._grace = grace
        self._ended = ended
        self._deadline = self._clock.now() + duration.total_seconds()
        self._warning = warning
        self.expired = False
        self.warned = False

    def arm(self) -> None:
        if self._warning is not None and not self.warned:
            self._watch.call_later(self._deadline - self._warning.seconds - self._clock.now(),
                                   self._warn)
        self._watch.call_later(self._deadline - self._clock.now(), self._check)

    def _warn(self) -> None:
        warning = self._warning
        assert warning is not None
        if self._ended() or self.warned:
            return
        if self._clock.now() < self._deadline - warning.seconds:
            self._watch.call_later(self._deadline - warning.seconds - self._clock.now(),
                                   self._warn)
            return
        self.warned = True
        self._watch.signal_group(self._pgid, int(getattr(signal, "SIG" + warning.signal)))

    def _check(self) -> None:
        if self._ended():
            return
        if self._clock.now() < self._deadline:
            # timers wait at most a day at a time: a longer limit is not over yet
            self._watch.call_later(self._deadline - self._clock.now(), self._check)
            return
        # On the watch thread, as the reaping is: if the job had exited, ended() said so.
        self.expired = True
        terminate_group(self._watch, self._pgid, self._grace)
