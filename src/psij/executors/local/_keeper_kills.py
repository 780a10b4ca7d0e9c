"""The signals and KILL timers of the local jobs' keeper (``_keeper``, which says what it does):
a part of its ``Keeper``, with the standard library only, loaded by the keeper from its file
as ``_keeper_rows`` is.

A job's group is signalled only while its leader is a child of the keeper not yet reaped (so
its id cannot have been reused); a group that is not the keeper's gets its KILL while the
pidfd of its leader says that process still holds its id, or, once it was reaped, while no
other process took the id.
"""

import os
import signal
import time
from typing import Any, Dict, Optional, Set

_MAX_GRACE = 366 * 86400.0  # a longer grace waits this long (select's timeout has a limit)


class Kills:
    """The keeper's signals and KILL timers (a part of ``_keeper.Keeper``)."""

    children: Dict[int, Any]  # the keeper's children not reaped yet, by pid (= group)
    canceled: Set[int]  # children whose end is a cancel
    kills: Dict[int, float]  # process group -> when it gets KILL
    leaders: Dict[int, int]  # process group not the keeper's -> pidfd of its leader

    def note(self, text: str) -> None: ...

    def signal(self, pgid: int, signum: int) -> bool:
        if pgid not in self.children:
            return False
        try:
            os.killpg(pgid, signum)
        except OSError:
            return False
        return True

    def terminate(self, pgid: int, grace: float, canceled: bool) -> bool:
        if not grace >= 0:  # NaN too
            raise ValueError(f"grace: expected seconds >= 0, got {grace!r}")
        if pgid not in self.children:
            return False
        if canceled:
            self.canceled.add(pgid)
        if grace == 0:
            if pgid in self.kills:
                self.forget_kill(pgid)
            return self.signal(pgid, signal.SIGKILL)
        sent = self.signal(pgid, signal.SIGTERM)
        when = time.monotonic() + min(grace, _MAX_GRACE)
        self.kills[pgid] = min(when, self.kills.get(pgid, when))
        return sent

    def kill_later(self, pgid: int, grace: float, leader: Optional[int]) -> bool:
        if not grace >= 0 or pgid <= 1:  # NaN too
            raise ValueError(f"expected a group id > 1 and seconds >= 0, got {pgid}, {grace}")
        old = self.leaders.pop(pgid, None)
        if old is not None:
            os.close(old)
        if leader is not None:
            self.leaders[pgid] = leader
        when = time.monotonic() + min(grace, _MAX_GRACE)
        self.kills[pgid] = min(when, self.kills.get(pgid, when))
        return True

    def send_due_kills(self) -> None:
        """KILL the groups whose grace is over: through a leader not yet reaped, or, once it
        was, to what is left of its group (its id cannot be reused while the group has
        members, so a process holding that id means the group is gone)."""
        now = time.monotonic()
        for pgid, when in list(self.kills.items()):
            try:
                self.send_due_kill(pgid, when, now)
            except Exception as ex:  # this group only: it is not tried again, the others are
                self.note(f"keeper: KILL of group {pgid}: {ex!r}")
                self.kills.pop(pgid, None)
                self.leaders.pop(pgid, None)

    def send_due_kill(self, pgid: int, when: float, now: float) -> None:
        if pgid not in self.children and not _leader_holds(self.leaders.get(pgid)):
            if not _group_exists(pgid):  # all gone already: nothing to wait for
                self.forget_kill(pgid)
                return
            try:
                os.kill(pgid, 0)
                self.forget_kill(pgid)  # the id names another process now
                return
            except ProcessLookupError:
                pass
            except OSError:
                self.forget_kill(pgid)
                return
        if when <= now:
            self.forget_kill(pgid)
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass

    def forget_kill(self, pgid: int) -> None:
        del self.kills[pgid]
        leader = self.leaders.pop(pgid, None)
        if leader is not None:
            os.close(leader)


def _leader_holds(pidfd: Optional[int]) -> bool:
    """Whether the process of ``pidfd`` still holds its id (runs, or was not reaped yet)."""
    if pidfd is None:
        return False
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # not ours to signal: it exists
    return True


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
