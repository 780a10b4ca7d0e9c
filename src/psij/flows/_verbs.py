"""The requests of the flow protocol, answered by the flow machine (the wire form is in the
flows guide). Each verb reads its fields, refuses what it cannot accept with an error that
names the field, and answers with :class:`~psij.controller.Send` (or asks the service to, for
``upload`` and ``output``)."""

import base64
import binascii
import hashlib
from typing import Any, Callable, Dict, List, Optional, Tuple

from psij.controller import Send
from psij.flows._core import Core, Payload
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

__all__ = ["FIELDS", "VERBS", "Verbs"]

VERBS = ("create", "grow", "shrink", "renew", "status", "problems", "instances", "output",
         "delete", "destroy", "upload", "list")
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
}
"""The fields each verb reads (besides ``op`` and ``id``); any other is refused, named."""
VICTIMS = ("not_running", "shortest", "longest")
_Answer = Optional[Dict[str, Any]]


class Verbs(Core):
    """The request side of the machine."""

    def request(self, conn: int, message: Any, now: float) -> None:
        rid = request_id(message)
        try:
            answer = self._answer(conn, rid, message, now)
        except BadRequest as bad:
            error: Dict[str, Any] = {"code": bad.code, "message": bad.message}
            if bad.code == "bad_request":
                error["field"] = bad.field
            if bad.reason is not None:
                error["reason"] = bad.reason
            self.out.append(Send(conn, {"id": rid, "ok": False, "error": error}))
            return
        if answer is not None:
            answer = dict(answer)
            answer.update(id=rid, ok=True)
            self.out.append(Send(conn, answer))

    def _answer(self, conn: int, rid: Any, message: Any, now: float) -> _Answer:
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
        uid = self.conn_uid.get(conn, -1)
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
        handler: Callable[[Fields, int, int, Any, float], _Answer] = getattr(self, f"_op_{op}")
        return handler(Fields(message), uid, conn, rid, now)

    # -- helpers ------------------------------------------------------------------------------

    def _owned(self, fields: Fields, uid: int, valid: bool = False) -> Handle:
        hid = fields.text("handle", max_len=40)
        h = self.handles.get(hid)
        if h is None or h.uid != uid:
            raise BadRequest("handle", f"handle: no handle {hid!r} is known to you",
                             code="unknown_handle")
        if valid and not h.valid:
            raise BadRequest("handle", f"handle: {hid} ended ({h.end_reason}); create a new "
                             "one", code="handle_ended")
        return h

    def _totals(self, uid: int, without: Optional[Handle] = None) -> Tuple[int, int, int]:
        """The sums of counts of ``uid``'s valid handles and of all, and ``uid``'s number of
        valid handles."""
        mine = total = handles = 0
        for h in self.handles.values():
            if h.valid and h is not without:
                total += h.count
                if h.uid == uid:
                    mine += h.count
                    handles += 1
        return mine, total, handles

    def _over(self, h_max: int, count: int, uid: int, without: Optional[Handle]
              ) -> Optional[Tuple[str, str]]:
        config = self.config
        mine, total, _ = self._totals(uid, without)
        if count > h_max:
            return "over_handle_max", f"at most {h_max} per handle"
        if mine + count > config.max_per_user:
            return "over_user_max", (f"at most {config.max_per_user} for all your handles; "
                                     f"{mine} are requested by the others")
        if total + count > config.max_total:
            return "over_service_max", (f"the service keeps at most {config.max_total} in "
                                        f"all; {total} are requested")
        return None

    @staticmethod
    def _granted(changed: List[Dict[str, Any]], field: str, asked: float, granted: float
                 ) -> float:
        if granted != asked:
            changed.append({"field": field, "asked": asked, "granted": granted})
        return granted

    def _leases(self, h: Handle, fields: Fields, now: float, creating: bool
                ) -> List[Dict[str, Any]]:
        config = self.config
        changed: List[Dict[str, Any]] = []
        lease = fields.positive("lease", config.default_lease if creating else None)
        if lease is not None:
            granted = self._granted(changed, "lease", lease, min(lease, config.max_lease))
            h.lease_expires = now + granted
        prov = fields.positive("provisioning_lease",
                               config.default_provisioning_lease if creating else None)
        if prov is not None:
            limit = min(config.max_provisioning_lease, max(0.0, h.lease_expires - now))
            granted = self._granted(changed, "provisioning_lease", prov, min(prov, limit))
            h.provisioning_expires = now + granted
        elif lease is not None:
            h.provisioning_expires = min(h.provisioning_expires, h.lease_expires)
        self.check_lease(h, now)
        return changed

    def _remaining(self, h: Handle, now: float) -> Dict[str, Any]:
        return {"lease_remaining": max(0.0, h.lease_expires - now) if h.valid else 0.0,
                "provisioning_remaining": max(0.0, h.provisioning_expires - now)
                if h.valid else 0.0,
                "lease_expires": h.lease_expires,
                "provisioning_expires": h.provisioning_expires}

    # -- verbs --------------------------------------------------------------------------------

    def _op_create(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        config = self.config
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
        if payload is not None and (uid, payload) not in self.payloads:
            raise BadRequest("payload", f"payload: no payload {payload} was uploaded by you",
                             code="refused", reason="unknown_payload")
        if spec.executable is None and payload is None:
            raise BadRequest("spec", "spec: needs an executable (or give a payload)")
        max_count = fields.count("max_count") if fields.has("max_count") else None
        rate = fields.positive("rate", config.default_rate) or config.default_rate
        term = self._termination(fields)
        intervals, changed = self._intervals(fields)
        quota = fields.count("quota_bytes", config.default_quota, maximum=2**62)
        if quota < 1:
            raise BadRequest("quota_bytes", "quota_bytes: expected a whole number of bytes "
                             "from 1")
        policy = fields.choice("quota_policy", ("stop", "delete_oldest"), "stop")
        keep = fields.strings("keep_classes", (*CLASSES, "removed"))
        h_max = config.max_per_handle if max_count is None else min(max_count,
                                                                    config.max_per_handle)
        over = self._over(h_max, count, uid, None)
        if over is not None:
            raise BadRequest("count", f"count: {count} refused: {over[1]}", code="refused",
                             reason=over[0])
        if self._totals(uid)[2] >= config.max_handles_per_user:
            raise BadRequest("handle", f"you hold {config.max_handles_per_user} handles, the "
                             f"most this service allows", code="refused",
                             reason="too_many_handles")
        hid = f"f{self.next_handle}"
        self.next_handle += 1
        h = Handle(hid, uid, doc, spec, executor, count, now)
        h.max_count = max_count
        h.set_rate(self._granted(changed, "rate", rate, min(rate, config.max_rate)), now)
        h.set_intervals(intervals)
        h.termination = term
        h.quota = int(self._granted(changed, "quota_bytes", quota, min(quota,
                                                                        config.max_quota)))
        h.policy = policy
        h.keep_classes = tuple(keep)
        h.payload = payload
        h.sandbox = f"{config.sandbox_root}/{uid}/{hid}"
        changed += self._leases(h, fields, now, creating=True)
        if payload is not None:
            p = self.payloads[(uid, payload)]
            p.refs += 1
            p.unused_since = None
            self.put_payload(uid, payload)
        self.handles[hid] = h
        self.out.append(MakeSandbox(h.sandbox, uid))
        self.put_handle(h)
        self.out.append(JournalPut("meta", "machine", {"next_handle": self.next_handle}))
        self.wake(h, now)
        answer = {"handle": hid, "count": count, "lease": h.lease_expires - now,
                  "provisioning_lease": h.provisioning_expires - now, "rate": h.rate,
                  "intervals": h.intervals, "quota_bytes": h.quota,
                  "shortened": bool(changed), "changed": changed}
        answer.update(self._remaining(h, now))
        return answer

    def _termination(self, fields: Fields) -> Any:
        try:
            return parse_map(fields.raw("termination_map"))
        except ValueError as error:
            raise BadRequest("termination_map", str(error)) from None

    def _intervals(self, fields: Fields) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
        config = self.config
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

    def _op_grow(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        h = self._owned(fields, uid, valid=True)
        n = fields.count("n")
        h_max = self.config.max_per_handle if h.max_count is None else min(
            h.max_count, self.config.max_per_handle)
        over = self._over(h_max, h.count + n, uid, h)
        if over is not None:
            return {"accepted": False, "count": h.count, "reason": over[0],
                    "message": f"growing {h.hid} by {n} denied: {over[1]}"}
        h.count += n
        self.put_handle(h)
        self.wake(h, now)
        return {"accepted": True, "count": h.count}

    def _op_shrink(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        h = self._owned(fields, uid, valid=True)
        n = fields.count("n")
        how = fields.choice("victims", VICTIMS, "not_running")
        signum = fields.signal()
        grace = fields.seconds("grace", None, nullable=True)
        end_if_zero = fields.flag("end_if_zero")
        h.count = max(0, h.count - n)
        excess = h.live_wanted - h.count
        victims: List[str] = []
        if excess > 0:
            for inst in self._victims(h, how)[:excess]:
                victims.append(inst.key)
                self.make_victim(inst, signum, grace, now)
        if h.count == 0 and end_if_zero:
            h.end_if_zero = True
            self.end_handle(h, "shrunk_to_zero", now, kill=False)
        else:
            self.put_handle(h)
            self.wake(h, now)  # drops the restarts no longer owed
        return {"count": h.count, "victims": victims}

    @staticmethod
    def _victims(h: Handle, how: str) -> List[Instance]:
        wanted = [inst for inst in h.live.values() if not inst.victim]
        waiting = sorted((i for i in wanted if i.state != ACTIVE), key=lambda i: -i.n)
        if how == "not_running":
            return waiting
        running = sorted((i for i in wanted if i.state == ACTIVE),
                         key=lambda i: (i.started or 0.0, i.n), reverse=(how == "shortest"))
        return waiting + running

    def _op_renew(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        h = self._owned(fields, uid, valid=True)
        if not fields.has("lease") and not fields.has("provisioning_lease"):
            raise BadRequest("lease", "lease: give lease or provisioning_lease (seconds), or "
                             "both")
        changed = self._leases(h, fields, now, creating=False)
        self.put_handle(h)
        self.wake(h, now)
        answer: Dict[str, Any] = {"shortened": bool(changed), "changed": changed}
        answer.update(self._remaining(h, now))
        return answer

    def _op_status(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        h = self._owned(fields, uid)
        h.trim_recent(now, self.config.recent_window)
        provisioned = waiting = held = 0
        failing = h.consecutive_failures >= self.config.failing_after
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
            "recent_window_s": self.config.recent_window,
            "sandbox_bytes": h.sandbox_bytes, "quota_bytes": h.quota}
        if not h.valid:
            answer["reason"] = h.end_reason
        answer.update(self._remaining(h, now))
        return answer

    def _op_problems(self, fields: Fields, uid: int, conn: int, rid: Any, now: float
                     ) -> _Answer:
        h = self._owned(fields, uid)
        return {"problems": self.problems(h, now)}

    def _op_instances(self, fields: Fields, uid: int, conn: int, rid: Any, now: float
                      ) -> _Answer:
        h = self._owned(fields, uid)
        return {"instances": [{
            "id": inst.id, "key": inst.key, "exit_code": inst.exit_code,
            "class": inst.klass, "started": inst.started, "ended": inst.ended,
            "stdout": f"{h.sandbox}/{inst.n}.out", "stderr": f"{h.sandbox}/{inst.n}.err",
            "size": inst.size, "output": inst.output} for inst in h.records.values()]}

    def _find(self, h: Handle, ident: str) -> Optional[Instance]:
        for inst in h.records.values():
            if inst.id == ident or inst.key == ident:
                return inst
        return None

    def _op_output(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        h = self._owned(fields, uid)
        ident = fields.text("instance", max_len=300)
        stream = fields.choice("stream", ("stdout", "stderr"), "stdout")
        max_bytes = fields.count("max_bytes", 65536, maximum=16 * 2**20)
        inst = self._find(h, ident)
        if inst is None:
            raise BadRequest("instance", f"instance: {h.hid} has no terminated instance "
                             f"{ident!r}", code="unknown_instance")
        if inst.output != "kept":
            raise BadRequest("instance", f"instance: the output of {ident} was {inst.output}",
                             code="output_unavailable")
        path = f"{h.sandbox}/{inst.n}.{'out' if stream == 'stdout' else 'err'}"
        self.out.append(ReadOutput(conn, rid, uid, path, max_bytes))
        return None

    def _op_delete(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        h = self._owned(fields, uid)
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
                self.delete_output(h, inst, "deleted")
            del h.records[inst.key]
            self.out.append(JournalDelete("instance", inst.key))
            deleted.append(ident)
        if h.valid:
            self.wake(h, now)
        return {"deleted": deleted, "unknown": unknown}

    def _op_destroy(self, fields: Fields, uid: int, conn: int, rid: Any, now: float
                    ) -> _Answer:
        h = self._owned(fields, uid)
        self.end_handle(h, "destroyed", now)
        return {}

    def _op_upload(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        limit = self.config.max_payload_bytes
        text = fields.text("data", max_len=4 * (limit // 3 + 2))
        try:
            data = base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, ValueError, UnicodeEncodeError):
            raise BadRequest("data", "data: expected the payload in base64") from None
        if not data or len(data) > limit:
            raise BadRequest("data", f"data: expected a payload of 1 to {limit} bytes, got "
                             f"{len(data)}")
        sha = hashlib.sha256(data).hexdigest()
        p = self.payloads.get((uid, sha))
        if p is None:
            p = self.payloads[(uid, sha)] = Payload(0, now)
        if not p.refs:
            p.unused_since = now
            self.schedule(now + self.config.keep_unused_payload, "payload", (uid, sha))
        self.put_payload(uid, sha)
        self.out.append(StorePayload(conn, rid, uid, sha, data))
        return None

    def _op_list(self, fields: Fields, uid: int, conn: int, rid: Any, now: float) -> _Answer:
        return {"handles": [{"handle": h.hid, "valid": h.valid, "requested": h.count}
                            for h in self.handles.values() if h.uid == uid]}
