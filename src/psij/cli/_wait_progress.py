"""The progress of ``psij wait`` over many jobs: how many are final, the count in each state,
the rate at which jobs end and the time left.

On a terminal it is one live line redrawn in place (drawn by tqdm); elsewhere (a pipe, a file)
it is a plain line now and then and one when all are final, each a whole line. It writes to
standard error, so what ``psij wait`` prints on standard output is unchanged. tqdm is loaded
only here, when a wait shows its progress. It asks no executor and reads no registry: the
wait hands it the states it saw. It imports no other module of :mod:`psij.cli`.
"""

import math
from typing import IO, Any, Dict, Iterable, Optional

from psij._clock import Clock, MonotonicClock

__all__ = ["Progress", "check_interval", "counts_text"]

DEFAULT_INTERVAL = 10.0
_ORDER = ("NEW", "QUEUED", "ACTIVE", "COMPLETED", "FAILED", "CANCELED")
_FORMAT = "{n_fmt}/{total_fmt} final{bar} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def check_interval(text: str) -> float:
    """``--progress-every``: a number of seconds, finite and at least 0.1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0.1 or value > 86400:
        raise ValueError(f"{text!r} is not a number of seconds from 0.1 to 86400")
    return value


def counts_text(states: Iterable[str]) -> str:
    """``QUEUED 2, ACTIVE 3, COMPLETED 5``: the states present, in the order jobs go through
    them."""
    counts: Dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    names = [s for s in _ORDER if s in counts] + sorted(set(counts) - set(_ORDER))
    return ", ".join(f"{name} {counts[name]}" for name in names)


class Progress:
    """Shows how a wait over ``total`` jobs goes, ``initial`` of them final from the start."""

    def __init__(self, total: int, initial: int, stream: IO[str], live: bool,
                 interval: float = DEFAULT_INTERVAL, clock: Optional[Clock] = None) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped]

        self._tqdm: Any = tqdm
        self._total = total
        self._initial = initial
        self._stream = stream
        self._interval = interval
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._start = self._clock.now()
        self._last_line: Optional[float] = None
        self._done = initial
        self._counts = ""
        self._bar: Any = None
        if live:
            self._bar = tqdm(total=total, initial=initial, file=stream, unit="job",
                             dynamic_ncols=True, mininterval=0.2, leave=True,
                             bar_format=_FORMAT.replace("{bar}", " |{bar}|"))

    def update(self, done: int, states: Iterable[str]) -> None:
        """``done`` jobs are final now; ``states`` are the states of all of them."""
        counts = counts_text(states)
        if self._bar is not None:
            self._bar.set_postfix_str(counts, refresh=False)
            if done > self._done:
                self._bar.update(done - self._done)
            else:
                self._bar.refresh()
        else:
            now = self._clock.now()
            if self._last_line is None or now - self._last_line >= self._interval:
                self._counts = counts
                self._done = done
                self._line(now)
        self._done = done
        self._counts = counts

    def next_line_in(self) -> Optional[float]:
        """Seconds until the next plain line is due (0 when it is), None for the live line."""
        if self._bar is not None:
            return None
        if self._last_line is None:
            return 0.0
        return max(0.0, self._last_line + self._interval - self._clock.now())

    def close(self, done: int, states: Iterable[str]) -> None:
        """All are final (or the wait ends): the last state of things."""
        self._done = done
        self._counts = counts_text(states)
        if self._bar is not None:
            if done > self._bar.n:
                self._bar.update(done - self._bar.n)
            self._bar.set_postfix_str(self._counts, refresh=False)
            self._bar.close()
        else:
            self._line(self._clock.now())

    def _line(self, now: float) -> None:
        self._last_line = now
        text = self._tqdm.format_meter(
            self._done, self._total, now - self._start, unit="job",
            bar_format=_FORMAT.replace("{bar}", ""), postfix=self._counts,
            initial=self._initial)
        try:
            self._stream.write(text + "\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed standard error stops nothing
