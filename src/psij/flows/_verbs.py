"""The requests of the flow protocol, answered by the flow machine (the wire form is in the
flows guide). Each verb reads its fields, refuses what it cannot accept with an error that
names the field, and answers with :class:`~psij.controller.Send` (or asks the service to, for
``upload`` and ``output``).

Plain functions over the machine's state, like :mod:`psij.flows._core`, whose rules they use:
:func:`request` takes the :class:`~psij.flows.machine.FlowMachine` (``m``) and the list of
actions of the step it runs in (``out``), and hands the request to its verb's function
(``_OPS``, one per name of ``VERBS``). Nothing here keeps an action, reads a clock, or does
I/O; the dispatch of events is in :mod:`psij.flows.machine`."""

import base64
import binascii
import hashlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from psij.controller import Send
from psij.flows import _core, _watch
from psij.flows._core import Payload
from psij.flows._flow_config import CLASSES
from psij.flows._flow_values import (
    JournalDelete,
    JournalPut,
    MakeSandbox,
    ReadOutput,
    StorePayload,
)
from psij.flows._handle import ACTIVE, Handle, Instance
from psij.flows._requests import BadRequest, Fields, lone_surrogate_path, request_id, shown
from psij.flows._termination import parse_map
from psij.serialize import _spec_from_json

if TYPE_CHECKING:
    from psij.flows.machine import FlowMachine

__all__ = ["FIELDS", "VERBS", "request"]

VERBS = ("create", "grow", "shrink", "renew", "status", "problems", "instances", "output",
         "delete", "destroy", "upload", "list", "watch")
_LEASES = ("lease", "provisioning_lease")
FIELDS: Dict[str, Tuple[str, ...]] = {
    "create": ("spec", "count", "executor", "payload", "max_count", "rate", "termination_map",
               "intervals", "quota_bytes", "quota_policy", "keep_classes", *_LEASES),
    "grow": ("handle", "n"),
    "shrink": ("handle", "n", "victims", "signal", "grace", "end_if_zero"),
    "renew": ("handle", *_LEASES),
    "status": ("handle",), "problems": ("handle",), "instances": ("handle",),
    "destroy": ("handle",),
    "output": ("handle", "instance", "stream", "max_bytes"),
    "delete": ("handle", "ids"),
    "upload": ("data",),
    "list": (),
    "watch": ("handle", "after"),
}
"""The fields each verb reads (besides ``op`` and ``id``); any other is refused, named."""
VICTIMS = ("not_running", "shortest", "longest")
_Answer = Optional[Dict[str, Any]]
_Op = Callable[["FlowMachine", Fields, int, int, Any, float, List[Any]], _Answer]


def request(m: "FlowMachine", conn: int, message: Any, now: float, out: List[Any]) -> None:
    rid = request_id(message)
    try:
        answer = _answer(m, conn, rid, message, now, out)
    except BadRequest as bad:
        error: Dict[str, Any] = {"code": bad.code, "message": bad.message}
        if bad.code == "bad_request":
            error["field"] = bad.field
        if bad.reason is not None:
            error["reason"] = bad.reason
        out.append(Send(conn, {"id": rid, "ok": False, "error": error}))
        return
    if answer is not None:
        answer = dict(answer)
        answer.update(id=rid, ok=True)
        out.append(Send(conn, answer))


def _answer(m: "FlowMachine", conn: int, rid: Any, message: Any, now: float, out: List[Any]
            ) -> _Answer:
    if not isinstance(message, dict):
        raise BadRequest("request", "request: expected a JSON object with \"op\" and the "
                         f"verb's fields, got {type(message).__name__}")
    if "id" in message and message["id"] is not None and rid is None:
        raise BadRequest("id", "id: expected a string of at most 200 characters, a whole "
                         "number or null")
    where = lone_surrogate_path(message)
    if where is not None:
        raise BadRequest(where, f"{where}: text that is not valid Unicode (a lone "
                         f"surrogate); expected text that can be written as UTF-8")
    uid = m.conn_uid.get(conn, -1)
    if uid < 0:
        raise BadRequest("peer", "the caller's user id is unknown (not a local Unix "
                         "socket); the service only serves identified local users",
                         code="not_identified")
    op = message.get("op")
    if op not in VERBS:
        raise BadRequest("op", f"op: expected one of {', '.join(VERBS)}, got {op!r}",
                         code="bad_request" if not isinstance(op, str) or not op
                         else "unknown_op")
    accepted = FIELDS[op]
    for key in message:
        if key not in accepted and key not in ("op", "id"):
            name = key if key.isidentifier() and len(key) <= 60 else shown(key)
            raise BadRequest(key[:100], f"{name}: not a field of {op}; accepted: "
                             f"{', '.join(accepted) or 'none'} (besides op and id)")
    return _OPS[op](m, Fields(message), uid, conn, rid, now, out)


# -- helpers ----------------------------------------------------------------------------------


def _owned(m: "FlowMachine", fields: Fields, uid: int, valid: bool = False) -> Handle:
    hid = fields.text("handle", max_len=40)
    h = m.handles.get(hid)
    if h is None or h.uid != uid:
        raise BadRequest("handle", f"handle: no handle {hid!r} is known to you",
                         code="unknown_handle")
    if valid and not h.valid:
        raise BadRequest("handle", f"handle: {hid} ended ({h.end_reason}); create a new "
                         "one", code="handle_ended")
    return h


def _totals(m: "FlowMachine", uid: int, without: Optional[Handle] = None
            ) -> Tuple[int, int, int]:
    """The sums of counts of ``uid``'s valid handles and of all, and ``uid``'s number of
    valid handles."""
    mine = total = handles = 0
    for h in m.handles.values():
        if h.valid and h is not without:
            total += h.count
            if h.uid == uid:
                mine += h.count
                handles += 1
    return mine, total, handles


def _over(m: "FlowMachine", h_max: int, count: int, uid: int, without: Optional[Handle]
          ) -> Optional[Tuple[str, str]]:
    config = m.config
    mine, total, _ = _totals(m, uid, without)
    if count > h_max:
        return "over_handle_max", f"at most {h_max} per handle"
    if mine + count > config.max_per_user:
        return "over_user_max", (f"at most {config.max_per_user} for all your handles; "
                                 f"{mine} are requested by the others")
    if total + count > config.max_total:
        return "over_service_max", (f"the service keeps at most {config.max_total} in "
                                    f"all; {total} are requested")
    return None


def _granted(changed: List[Dict[str, Any]], field: str, asked: float, granted: float
             ) -> float:
    if granted != asked:
        changed.append({"field": field, "asked": asked, "granted": granted})
    return granted


def _leases(m: "FlowMachine", h: Handle, fields: Fields, now: float, out: List[Any],
            creating: bool) -> List[Dict[str, Any]]:
    config = m.config
    changed: List[Dict[str, Any]] = []
    lease = fields.positive("lease", config.default_lease if creating else None)
    if lease is not None:
        granted = _granted(changed, "lease", lease, min(lease, config.max_lease))
        h.lease_expires = now + granted
    prov = fields.positive("provisioning_lease",
                           config.default_provisioning_lease if creating else None)
    if prov is not None:
        limit = min(config.max_provisioning_lease, max(0.0, h.lease_expires - now))
        granted = _granted(changed, "provisioning_lease", prov, min(prov, limit))
        h.provisioning_expires = now + granted
    elif lease is not None:
        h.provisioning_expires = min(h.provisioning_expires, h.lease_expires)
    _core.check_lease(m, h, now, out)
    return changed


def _remaining(h: Handle, now: float) -> Dict[str, Any]:
    return {"lease_remaining": max(0.0, h.lease_expires - now) if h.valid else 0.0,
            "provisioning_remaining": max(0.0, h.provisioning_expires - now)
            if h.valid else 0.0,
            "lease_expires": h.lease_expires,
            "provisioning_expires": h.provisioning_expires}


# -- verbs ------------------------------------------------------------------------------------


def _op_create(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
               out: List[Any]) -> _Answer:
    config = m.config
    doc = fields.raw("spec")
    if not isinstance(doc, dict):
        raise BadRequest("spec", "spec: expected a JobSpec as a JSON object (the "
                         "psij.serialize form), got " + type(doc).__name__)
    try:
        spec = _spec_from_json(doc)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise BadRequest("spec", f"spec: {error}") from None
    count = fields.count("count")
    executor = fields.text("executor", max_len=100)
    if "@" in executor or "/" in executor:
        raise BadRequest("executor", f"executor: expected an executor name without '@' or "
                         f"'/', got {executor!r}")
    if config.executors is not None and executor not in config.executors:
        raise BadRequest("executor", f"executor: this service runs "
                         f"{', '.join(config.executors)}; not {executor!r}",
                         code="refused", reason="unknown_executor")
    payload = fields.sha256("payload")
    if payload is not None and (uid, payload) not in m.payloads:
        raise BadRequest("payload", f"payload: no payload {payload} was uploaded by you",
                         code="refused", reason="unknown_payload")
    if spec.executable is None and payload is None:
        raise BadRequest("spec", "spec: needs an executable (or give a payload)")
    max_count = fields.count("max_count") if fields.has("max_count") else None
    rate = fields.positive("rate", config.default_rate) or config.default_rate
    term = _termination(fields)
    intervals, changed = _intervals(m, fields)
    quota = fields.count("quota_bytes", config.default_quota, maximum=2**62)
    if quota < 1:
        raise BadRequest("quota_bytes", "quota_bytes: expected a whole number of bytes "
                         "from 1")
    policy = fields.choice("quota_policy", ("stop", "delete_oldest"), "stop")
    keep = fields.strings("keep_classes", (*CLASSES, "removed"))
    h_max = config.max_per_handle if max_count is None else min(max_count,
                                                                config.max_per_handle)
    over = _over(m, h_max, count, uid, None)
    if over is not None:
        raise BadRequest("count", f"count: {count} refused: {over[1]}", code="refused",
                         reason=over[0])
    if _totals(m, uid)[2] >= config.max_handles_per_user:
        raise BadRequest("handle", f"you hold {config.max_handles_per_user} handles, the "
                         f"most this service allows", code="refused",
                         reason="too_many_handles")
    hid = f"f{m.next_handle}"
    m.next_handle += 1
    h = Handle(hid, uid, doc, spec, executor, count, now)
    h.max_count = max_count
    h.set_rate(_granted(changed, "rate", rate, min(rate, config.max_rate)), now)
    h.set_intervals(intervals)
    h.termination = term
    h.quota = int(_granted(changed, "quota_bytes", quota, min(quota, config.max_quota)))
    h.policy = policy
    h.keep_classes = tuple(keep)
    h.payload = payload
    h.sandbox = f"{config.sandbox_root}/{uid}/{hid}"
    changed += _leases(m, h, fields, now, out, creating=True)
    if payload is not None:
        p = m.payloads[(uid, payload)]
        p.refs += 1
        p.unused_since = None
        _core.put_payload(m, uid, payload, out)
    m.handles[hid] = h
    out.append(MakeSandbox(h.sandbox, uid))
    _core.put_handle(h, out)
    out.append(JournalPut("meta", "machine", {"next_handle": m.next_handle}))
    _core.wake(m, h, now)
    answer = {"handle": hid, "count": count, "lease": h.lease_expires - now,
              "provisioning_lease": h.provisioning_expires - now, "rate": h.rate,
              "intervals": h.intervals, "quota_bytes": h.quota,
              "shortened": bool(changed), "changed": changed}
    answer.update(_remaining(h, now))
    return answer


def _termination(fields: Fields) -> Any:
    try:
        return parse_map(fields.raw("termination_map"))
    except ValueError as error:
        raise BadRequest("termination_map", str(error)) from None


def _intervals(m: "FlowMachine", fields: Fields
               ) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
    config = m.config
    asked = fields.raw("intervals")
    if asked is None:
        asked = {}
    if not isinstance(asked, dict):
        raise BadRequest("intervals", f"intervals: expected an object of class to seconds "
                         f"(classes: {', '.join(CLASSES)})")
    intervals = dict(config.default_intervals)
    changed: List[Dict[str, Any]] = []
    for name in asked:
        if name not in CLASSES:
            raise BadRequest("intervals", f"intervals: unknown class {name!r}; accepted: "
                             f"{', '.join(CLASSES)}")
        try:
            seconds = Fields(asked).seconds(name)
        except BadRequest as bad:
            raise BadRequest(f"intervals.{name}", f"intervals.{bad.message}") from None
        assert seconds is not None
        intervals[name] = seconds
    for name, least in config.min_intervals.items():
        if intervals[name] < least:
            changed.append({"field": f"intervals.{name}", "asked": intervals[name],
                            "granted": least})
            intervals[name] = least
    return intervals, changed


def _op_grow(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
             out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid, valid=True)
    n = fields.count("n")
    h_max = m.config.max_per_handle if h.max_count is None else min(
        h.max_count, m.config.max_per_handle)
    over = _over(m, h_max, h.count + n, uid, h)
    if over is not None:
        return {"accepted": False, "count": h.count, "reason": over[0],
                "message": f"growing {h.hid} by {n} denied: {over[1]}"}
    h.count += n
    _core.put_handle(h, out)
    _core.wake(m, h, now)
    return {"accepted": True, "count": h.count}


def _op_shrink(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
               out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid, valid=True)
    n = fields.count("n")
    how = fields.choice("victims", VICTIMS, "not_running")
    signum = fields.signal()
    grace = fields.seconds("grace", None, nullable=True)
    end_if_zero = fields.flag("end_if_zero")
    h.count = max(0, h.count - n)
    excess = h.live_wanted - h.count
    victims: List[str] = []
    if excess > 0:
        for inst in _victims(h, how)[:excess]:
            victims.append(inst.key)
            _core.make_victim(m, inst, signum, grace, now, out)
    if h.count == 0 and end_if_zero:
        h.end_if_zero = True
        _core.end_handle(m, h, "shrunk_to_zero", now, out, kill_live=False)
    else:
        _core.put_handle(h, out)
        _core.wake(m, h, now)  # drops the restarts no longer owed
    return {"count": h.count, "victims": victims}


def _victims(h: Handle, how: str) -> List[Instance]:
    wanted = [inst for inst in h.live.values() if not inst.victim]
    waiting = sorted((i for i in wanted if i.state != ACTIVE), key=lambda i: -i.n)
    if how == "not_running":
        return waiting
    running = sorted((i for i in wanted if i.state == ACTIVE),
                     key=lambda i: (i.started or 0.0, i.n), reverse=(how == "shortest"))
    return waiting + running


def _op_renew(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
              out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid, valid=True)
    if not fields.has("lease") and not fields.has("provisioning_lease"):
        raise BadRequest("lease", "lease: give lease or provisioning_lease (seconds), or "
                         "both")
    changed = _leases(m, h, fields, now, out, creating=False)
    _core.put_handle(h, out)
    _core.wake(m, h, now)
    answer: Dict[str, Any] = {"shortened": bool(changed), "changed": changed}
    answer.update(_remaining(h, now))
    return answer


def _op_status(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
               out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid)
    h.trim_recent(now, m.config.recent_window)
    provisioned = waiting = held = 0
    failing = h.consecutive_failures >= m.config.failing_after
    for inst in h.live.values():
        if inst.state == ACTIVE:
            provisioned += 1
        elif inst.victim or inst.cancelled:
            continue
        elif inst.held:
            held += 1
        elif inst.native_id is not None or not failing:
            waiting += 1
    answer: Dict[str, Any] = {
        "handle": h.hid, "valid": h.valid, "requested": h.count,
        "provisioned": provisioned, "waiting": waiting, "held": held,
        "recently_started": len(h.recent_starts),
        "recently_terminated": len(h.recent_ends),
        "submission_errors": len(h.recent_errors),
        "recent_window_s": m.config.recent_window,
        "sandbox_bytes": h.sandbox_bytes, "quota_bytes": h.quota}
    if not h.valid:
        answer["reason"] = h.end_reason
    answer.update(_remaining(h, now))
    return answer


def _op_problems(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
                 out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid)
    return {"problems": _core.problems(m, h, now)}


def _op_instances(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
                  out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid)
    return {"instances": [{
        "id": inst.id, "key": inst.key, "exit_code": inst.exit_code,
        "class": inst.klass, "started": inst.started, "ended": inst.ended,
        "stdout": f"{h.sandbox}/{inst.n}.out", "stderr": f"{h.sandbox}/{inst.n}.err",
        "size": inst.size, "output": inst.output} for inst in h.records.values()]}


def _find(h: Handle, ident: str) -> Optional[Instance]:
    for inst in h.records.values():
        if inst.id == ident or inst.key == ident:
            return inst
    return None


def _op_output(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
               out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid)
    ident = fields.text("instance", max_len=300)
    stream = fields.choice("stream", ("stdout", "stderr"), "stdout")
    max_bytes = fields.count("max_bytes", 65536, maximum=16 * 2**20)
    inst = _find(h, ident)
    if inst is None:
        raise BadRequest("instance", f"instance: {h.hid} has no terminated instance "
                         f"{ident!r}", code="unknown_instance")
    if inst.output != "kept":
        raise BadRequest("instance", f"instance: the output of {ident} was {inst.output}",
                         code="output_unavailable")
    path = f"{h.sandbox}/{inst.n}.{'out' if stream == 'stdout' else 'err'}"
    out.append(ReadOutput(conn, rid, uid, path, max_bytes))
    return None


def _op_delete(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
               out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid)
    deleted: List[str] = []
    unknown: List[str] = []
    idents = fields.strings("ids", max_len=300)
    index: Dict[str, Instance] = {}
    for record in h.records.values():
        index[record.id] = index[record.key] = record
    for ident in idents:
        inst = index.pop(ident, None)
        if inst is None or inst.key not in h.records:
            unknown.append(ident)
            continue
        if inst.output == "kept":
            _core.delete_output(m, h, inst, "deleted", out)
        del h.records[inst.key]
        out.append(JournalDelete("instance", inst.key))
        deleted.append(ident)
    if h.valid:
        _core.wake(m, h, now)
    return {"deleted": deleted, "unknown": unknown}


def _op_destroy(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
                out: List[Any]) -> _Answer:
    h = _owned(m, fields, uid)
    _core.end_handle(m, h, "destroyed", now, out)
    return {}


def _op_upload(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
               out: List[Any]) -> _Answer:
    limit = m.config.max_payload_bytes
    text = fields.text("data", max_len=4 * (limit // 3 + 2))
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise BadRequest("data", "data: expected the payload in base64") from None
    if not data or len(data) > limit:
        raise BadRequest("data", f"data: expected a payload of 1 to {limit} bytes, got "
                         f"{len(data)}")
    sha = hashlib.sha256(data).hexdigest()
    p = m.payloads.get((uid, sha))
    if p is None:
        p = m.payloads[(uid, sha)] = Payload(0, now)
    if not p.refs:
        p.unused_since = now
        _core.schedule(m, now + m.config.keep_unused_payload, _core.Due.PAYLOAD, (uid, sha))
    _core.put_payload(m, uid, sha, out)
    out.append(StorePayload(conn, rid, uid, sha, data))
    return None


def _op_list(m: "FlowMachine", fields: Fields, uid: int, conn: int, rid: Any, now: float,
             out: List[Any]) -> _Answer:
    return {"handles": [{"handle": h.hid, "valid": h.valid, "requested": h.count}
                        for h in m.handles.values() if h.uid == uid]}


_OPS: Dict[str, _Op] = {
    "create": _op_create, "grow": _op_grow, "shrink": _op_shrink, "renew": _op_renew,
    "status": _op_status, "problems": _op_problems, "instances": _op_instances,
    "output": _op_output, "delete": _op_delete, "destroy": _op_destroy, "upload": _op_upload,
    "list": _op_list, "watch": _watch.op_watch,
}
"""The function that answers each verb (its fields checked against ``FIELDS`` first)."""
