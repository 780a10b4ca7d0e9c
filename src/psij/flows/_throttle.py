"""Rate limits of the flow machine, as plain numbers on the time it is given.

A :class:`Bucket` allows ``rate`` starts per second with bursts of ``burst``; a
:class:`Spacing` allows one event every ``interval`` seconds. Both only answer "when" and
record "now": the machine decides.
"""

__all__ = ["Bucket", "Spacing"]


class Bucket:
    """A token bucket: ``rate`` per second, at most ``burst`` at once."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.stamp = now

    def _fill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def ready_at(self, now: float) -> float:
        """The earliest time a start is allowed (``now`` when one is)."""
        self._fill(now)
        if self.tokens >= 1.0:
            return now
        return now + (1.0 - self.tokens) / self.rate

    def take(self, now: float) -> None:
        """Record a start at ``now``."""
        self._fill(now)
        self.tokens -= 1.0


class Spacing:
    """At most one event every ``interval`` seconds."""

    __slots__ = ("interval", "last")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.last = float("-inf")

    def ready_at(self, now: float) -> float:
        """The earliest time the next event is allowed (``now`` when it is)."""
        return max(now, self.last + self.interval)

    def take(self, now: float) -> None:
        """Record an event at ``now``."""
        self.last = now
