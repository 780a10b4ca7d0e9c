"""Rate limits of the flow machine, as plain numbers on the time it is given.

A :class:`Bucket` allows ``rate`` starts per second with bursts of ``burst``; a
:class:`Spacing` allows one event every ``interval`` seconds; a :class:`TurnLine` orders
those who wait for a shared limit. They only answer "when" or "who" and record "now": the
machine decides.
"""

import heapq
from typing import Dict, List, Optional, Tuple

__all__ = ["Bucket", "Spacing", "TurnLine"]


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


class TurnLine:
    """Who waits for a turn at a shared limit, first the one waiting longest: by the time it
    joined, then (joined at the same time) by the time of its last turn, then by arrival.

    ``first`` and ``join`` cost a logarithm of the length; ``ahead`` (for reports) the
    length. One that leaves is dropped from the heap lazily.
    """

    __slots__ = ("_heap", "_keys", "_seq")

    def __init__(self) -> None:
        self._keys: Dict[str, Tuple[float, float, int]] = {}
        self._heap: List[Tuple[float, float, int, str]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, who: str) -> bool:
        return who in self._keys

    def join(self, who: str, now: float, last_turn: float) -> None:
        """``who`` waits from ``now`` (nothing changes if it already waits)."""
        if who not in self._keys:
            self._seq += 1
            key = self._keys[who] = (now, last_turn, self._seq)
            heapq.heappush(self._heap, (*key, who))

    def leave(self, who: str) -> None:
        self._keys.pop(who, None)

    def first(self) -> Optional[str]:
        """Who waits longest, or None."""
        heap, keys = self._heap, self._keys
        while heap and keys.get(heap[0][3]) != heap[0][:3]:
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def ahead(self, who: str) -> int:
        """How many wait before ``who`` (all of them when it does not wait)."""
        mine = self._keys.get(who)
        if mine is None:
            return len(self._keys)
        return sum(1 for key in self._keys.values() if key < mine)

    def since(self, who: str) -> Optional[float]:
        key = self._keys.get(who)
        return None if key is None else key[0]
