"""The ``watch`` request of the flow protocol: an answer that comes when something changed.

A client that follows handles (the ``flow`` executor) asks ``watch`` instead of asking
``status`` and ``instances`` over and over: the answer comes as soon as one of its handles (or
the one it names) changes, so that an instance's end is known to it when the service knows it,
whatever its polling interval.

- Every step of the machine that writes or deletes the journal record of a handle or of one of
  its instances is a change; changes are numbered by the machine (``m.change``, from 1), and
  each handle, and each user, keeps the number of its last one.
- ``watch`` (fields ``handle``, optional: the caller's handles; ``after``, optional: the
  number of the last change the caller saw, 0 by default) is answered ``{"change": N}`` at
  once when a change later than ``after`` was made (N: the number of the latest), else as soon
  as one is. ``after`` larger than any change made waits for the next one.
- Watches wait on their connection: at most :data:`MAX_WATCHES` on one (another is refused,
  ``bad_request`` on ``after``), forgotten when it closes. Nothing of them is journaled: a
  restarted service numbers its changes from 1 again, so a client connected again asks with
  ``after`` 0 first.

Plain functions over the machine's state, as :mod:`psij.flows._verbs`: nothing here reads a
clock or does I/O.
"""

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set

from psij.controller import Send
from psij.flows._flow_values import JournalDelete, JournalPut
from psij.flows._requests import BadRequest, Fields

if TYPE_CHECKING:
    from psij.flows.machine import FlowMachine

__all__ = ["MAX_WATCHES", "WatchState", "changed", "forget", "op_watch"]

MAX_WATCHES = 64
"""The most watches waiting on one connection."""
_MAX_AFTER = 2**62


class WatchState:
    """What the machine keeps for ``watch``: the change numbers, and the waiting watches of
    each connection (request id, user, handle or None, ``after``)."""

    __slots__ = ("by_handle", "by_uid", "change", "waiting")

    def __init__(self) -> None:
        self.change = 0
        self.by_handle: Dict[str, int] = {}
        self.by_uid: Dict[int, int] = {}
        self.waiting: Dict[int, List[Any]] = {}


def op_watch(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
             out: List[Any]) -> Optional[Dict[str, Any]]:
    """The ``watch`` verb: answered now when a change later than ``after`` is known, else
    kept until one is made."""
    state = m.watch
    hid: Optional[str] = None
    if fields.has("handle"):
        hid = fields.text("handle", max_len=40)
        h = m.handles.get(hid)
        if h is None or h.uid != uid:
            raise BadRequest("handle", f"handle: no handle {hid!r} is known to you",
                             code="unknown_handle")
    after = fields.count("after", 0, maximum=_MAX_AFTER)
    last = state.by_handle.get(hid, 0) if hid is not None else state.by_uid.get(uid, 0)
    if last > after:
        return {"change": last}
    waiting = state.waiting.setdefault(conn, [])
    if len(waiting) >= MAX_WATCHES:
        raise BadRequest("after", f"after: {MAX_WATCHES} watches already wait on this "
                         "connection; expected one at a time")
    waiting.append((rid, uid, hid, after))
    return None


def changed(m: "FlowMachine", out: List[Any]) -> None:
    """After a step: number the change its journal actions make to handles, and answer the
    watches it concerns."""
    touched: Set[str] = set()
    for action in out:
        if isinstance(action, (JournalPut, JournalDelete)):
            if action.kind == "handle":
                touched.add(action.key)
            elif action.kind == "instance":
                touched.add(action.key.partition("/")[0])
    if not touched:
        return
    state = m.watch
    state.change += 1
    number = state.change
    uids: Set[int] = set()
    for hid in touched:
        state.by_handle[hid] = number
        h = m.handles.get(hid)
        if h is not None:
            uids.add(h.uid)
    for uid in uids:
        state.by_uid[uid] = number
    if not state.waiting:
        return
    for conn, waiting in list(state.waiting.items()):
        left = []
        for rid, uid, hid, after in waiting:
            if (hid in touched) if hid is not None else (uid in uids):
                out.append(Send(conn, {"id": rid, "ok": True, "change": number}))
            else:
                left.append((rid, uid, hid, after))
        if left:
            state.waiting[conn] = left
        else:
            del state.waiting[conn]
    for hid in touched:  # a handle forgotten: its watches are told, then its number goes
        if hid not in m.handles:
            state.by_handle.pop(hid, None)


def forget(m: "FlowMachine", conn: int) -> None:
    """The connection closed: its watches go."""
    m.watch.waiting.pop(conn, None)
