"""The supervisor's look-ups of jobs by name: a submission whose outcome is unknown (its submit
command was killed, or stopped with the supervisor) is found in the queue by its journaled job
name and cancelled, and its end journaled. Part of the pure machine
(:class:`psij.supervise._machine.Supervisor`): it returns actions and does no I/O.
"""

import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from psij.controller import Action, Call, Log
from psij.supervise._entries import _LOOKUP, Journal

__all__ = ["NameLookUps"]


class NameLookUps:
    """Looking jobs up by name and cancelling them, for the supervisor's machine."""

    if TYPE_CHECKING:
        _cancel_named: Optional[Callable[[str], Sequence[str]]]
        cleanup: bool
        exit_code: Optional[int]
        lookups: Dict[int, str]

    def _look_up(self, uid: int, name: str, out: List[Action]) -> None:
        """Cancel the jobs named ``name`` (a submission whose outcome is unknown); its end is
        journaled once that is done."""
        cancel_named = self._cancel_named
        if cancel_named is None:
            if self.cleanup:
                self.exit_code = 1
            out.append(Journal({"uid": uid, "final": "UNKNOWN"}))
            out.append(Log(f"supervisor: uid {uid} may have been submitted as a job named "
                           f"{name}, and this executor cannot look jobs up by name: look for "
                           f"it in the queue", logging.WARNING))
            return
        self.lookups[uid] = name
        out.append(Call((_LOOKUP, uid), lambda: list(cancel_named(name))))

    def _looked_up(self, key: Any, found: Any, error: Optional[str],
                   out: List[Action]) -> None:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == _LOOKUP):
            return
        uid = key[1]
        name = self.lookups.pop(uid, None)
        if name is None:
            return
        if error is not None:  # not journaled as ended: the next supervisor looks again
            if self.cleanup:
                self.exit_code = 1
            out.append(Log(f"supervisor: looking for the job named {name} (uid {uid}) to "
                           f"cancel it failed: {error}", logging.WARNING))
            return
        ids = [str(n) for n in found or ()]
        if ids:
            out.append(Journal({"uid": uid, "final": "CANCELED", "native_ids": ids}))
            out.append(Log(f"supervisor: cancelled job {', '.join(ids)} named {name} (uid "
                           f"{uid}), which a submission that did not return had queued",
                           logging.WARNING))
        else:
            out.append(Journal({"uid": uid, "final": "NOT_SUBMITTED"}))
            out.append(Log(f"supervisor: no job named {name} (uid {uid}) is in the queue: "
                           f"its submission did not queue it"))
