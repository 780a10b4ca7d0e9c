"""The flow machine's own events and actions (imported from :mod:`psij.flows.machine`).

The machine is pure: whatever touches a file (its journal, the sandboxes, the payload store)
or sends a signal is asked for with one of these actions, which the service runs through
:class:`~psij.controller.ControllerLoop`'s ``action_handlers``; what it learns back comes as
one of these events, given to the loop with :meth:`~psij.controller.ControllerLoop.post`.
"""

from typing import Any, Mapping, Optional, Tuple

from psij._record import Record

__all__ = [
    "DeleteFiles", "DeletePayload", "JournalDelete", "JournalPut", "MakeSandbox",
    "MeasureSandbox", "PayloadStored", "PayloadVerified", "ReadOutput", "SandboxMeasured",
    "SignalJob", "StorePayload", "VerifyPayload",
]


# -- actions the service carries out -----------------------------------------------------------

class JournalPut(Record):
    """Store ``value`` (a JSON object: dicts, lists, str, int, finite float, bool, None) as the
    record ``key`` of ``kind``, replacing any earlier one. Kinds: ``"handle"`` (key: the
    handle), ``"instance"`` (key: the instance's job key ``"<handle>/<number>"``),
    ``"payload"`` (key: ``"<uid>/<sha256>"``), ``"meta"`` (key: ``"machine"``). Carried out in
    order with the actions around it, before the next one (a record written before a
    :class:`~psij.controller.Submit` is on disk when the submission starts)."""

    kind: str
    key: str
    value: Mapping[str, Any]


class JournalDelete(Record):
    """Remove the record ``key`` of ``kind`` (nothing happens when there is none)."""

    kind: str
    key: str


class SignalJob(Record):
    """Send signal ``signum`` to the job known as ``key`` (PSI/J has no verb for it: the service
    does it per executor, see the flows guide). Answered with
    :class:`~psij.controller.ActionDone` or :class:`~psij.controller.ActionFailed` for ``key``
    with action ``"signal"``; on failure the machine cancels the job at once."""

    key: str
    signum: int


class MakeSandbox(Record):
    """Create the handle's sandbox directory ``path`` for user ``uid`` (the instances' output
    goes there; 0700, owned by ``uid`` when the service runs as root)."""

    path: str
    uid: int


class MeasureSandbox(Record):
    """Measure the files ``paths`` of instance ``instance`` of ``handle`` (missing ones count
    0) and post :class:`SandboxMeasured` with their total size in bytes."""

    handle: str
    instance: str
    paths: Tuple[str, ...]


class DeleteFiles(Record):
    """Remove the files ``paths`` (an instance's output), and the directories ``dirs`` with
    everything in them (a forgotten handle's sandbox). Missing ones are no error."""

    paths: Tuple[str, ...]
    dirs: Tuple[str, ...] = ()

    def _validate(self) -> None:
        if type(self.paths) is not tuple:
            self._set("paths", tuple(self.paths))
        if type(self.dirs) is not tuple:
            self._set("dirs", tuple(self.dirs))


class StorePayload(Record):
    """Write ``data`` (bytes whose sha256 is ``sha256``, already checked) as user ``uid``'s
    payload ``sha256`` (executable, readable by ``uid`` only), then answer the request: send
    ``{"id": request_id, "ok": true, "sha256": ...}`` on ``conn`` (or an error answer with code
    ``"store_failed"``) and post :class:`PayloadStored`."""

    conn: int
    request_id: Any
    uid: int
    sha256: str
    data: bytes


class VerifyPayload(Record):
    """Check that user ``uid``'s payload ``sha256`` is there and still has that sha256, and
    post :class:`PayloadVerified` for ``key`` (the instance about to start)."""

    key: str
    uid: int
    sha256: str


class ReadOutput(Record):
    """Answer an ``output`` request: read at most ``max_bytes`` from the end of the file
    ``path`` and send ``{"id": request_id, "ok": true, "data": <text, undecodable bytes
    replaced>, "size": <file size>, "truncated": <bool>}`` on ``conn``, or an error answer
    with code ``"output_unavailable"`` when the file cannot be read. ``uid`` is the owner the
    file must belong to."""

    conn: int
    request_id: Any
    uid: int
    path: str
    max_bytes: int


class DeletePayload(Record):
    """Remove user ``uid``'s payload ``sha256``: no valid handle uses it any more."""

    uid: int
    sha256: str


# -- events the service posts -------------------------------------------------------------------

class PayloadStored(Record):
    """The outcome of :class:`StorePayload` (``ok`` False: ``message`` says why, and the
    payload is not kept)."""

    uid: int
    sha256: str
    ok: bool
    message: str


class PayloadVerified(Record):
    """The outcome of :class:`VerifyPayload` for ``key``: ``ok`` with ``path`` the file to run,
    or not ok with ``message`` saying what is wrong (missing, changed)."""

    key: str
    ok: bool
    path: Optional[str]
    message: str


class SandboxMeasured(Record):
    """The outcome of :class:`MeasureSandbox`: the instance's files take ``size`` bytes."""

    handle: str
    instance: str
    size: int
