"""The flow machine's state of one handle and its instances, and their journal form.

These are the machine's own working state (changed in place by its step, never shared);
the values that cross into the loop are the records of :mod:`psij.flows._flow_values`.
"""

import collections
import enum
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

from psij.flows._termination import TerminationMap, parse_map
from psij.flows._throttle import Bucket, Spacing

__all__ = ["Handle", "Instance", "InstanceState"]


class InstanceState(str, enum.Enum):
    """Where an instance is, in the order it goes through. The values are the words the
    journal keeps (``"state"`` of an instance's record), so a journal written before this
    class existed reads the same."""

    VERIFYING = "verifying"    # the payload is being checked before the submission
    SUBMITTING = "submitting"  # Submit sent, no native id yet
    QUEUED = "queued"
    ACTIVE = "active"
    ENDED = "ended"


VERIFYING = InstanceState.VERIFYING
SUBMITTING = InstanceState.SUBMITTING
QUEUED = InstanceState.QUEUED
ACTIVE = InstanceState.ACTIVE
ENDED = InstanceState.ENDED
LIVE_STATES = (VERIFYING, SUBMITTING, QUEUED, ACTIVE)


class Instance:
    """One job of a handle, from its start until its record is forgotten."""

    __slots__ = ("cancelled", "ended", "exit_code", "handle", "held", "key", "kill_at", "klass",
                 "n", "native_id", "output", "size", "started", "state", "submitted", "victim")

    def __init__(self, handle: str, n: int, submitted: float, state: InstanceState) -> None:
        self.handle = handle
        self.n = n
        self.key = f"{handle}/{n}"
        self.state = state
        self.submitted = submitted
        self.native_id: Optional[str] = None
        self.started: Optional[float] = None
        self.ended: Optional[float] = None
        self.exit_code: Optional[int] = None
        self.klass: Optional[str] = None
        self.size = 0
        self.output = "kept"
        self.held = False
        self.victim = False        # chosen by a shrink or a destroy: never replaced
        self.cancelled = False     # Cancel was sent (or is owed once the submission returns)
        self.kill_at: Optional[float] = None

    @property
    def id(self) -> str:
        """The instance id on the wire: ``<native id>.<number>``."""
        return f"{self.native_id or '-'}.{self.n}"

    def journal(self) -> Dict[str, Any]:
        return {"handle": self.handle, "n": self.n, "state": self.state.value,
                "submitted": self.submitted, "native_id": self.native_id,
                "started": self.started, "ended": self.ended, "exit_code": self.exit_code,
                "class": self.klass, "size": self.size, "output": self.output,
                "victim": self.victim, "cancelled": self.cancelled, "kill_at": self.kill_at}

    @classmethod
    def from_journal(cls, value: Mapping[str, Any]) -> "Instance":
        inst = cls(str(value["handle"]), int(value["n"]), float(value["submitted"]),
                   InstanceState(value["state"]))
        inst.native_id = value.get("native_id")
        inst.started = value.get("started")
        inst.ended = value.get("ended")
        inst.exit_code = value.get("exit_code")
        inst.klass = value.get("class")
        inst.size = int(value.get("size") or 0)
        inst.output = str(value.get("output") or "kept")
        inst.victim = bool(value.get("victim"))
        inst.cancelled = bool(value.get("cancelled"))
        inst.kill_at = value.get("kill_at")
        return inst


class Handle:
    """One "keep N running" request of one user."""

    __slots__ = ("bucket", "class_spacing", "consecutive_failures", "count", "created",
                 "end_if_zero", "end_reason", "ended_at", "executor", "failure_backoff_until",
                 "hid", "intervals", "keep_classes", "kept", "last_error", "last_turn",
                 "lease_check_at", "lease_expires", "live", "live_wanted", "max_count", "next_n",
                 "owed", "payload", "payload_error", "policy", "provisioning_expires", "quota",
                 "rate", "recent_ends", "recent_errors", "recent_starts", "records", "runtimes",
                 "sandbox", "sandbox_bytes", "sandbox_file", "spec", "spec_json", "template",
                 "termination", "uid", "wake_at")

    def __init__(self, hid: str, uid: int, spec_json: Mapping[str, Any], spec: Any,
                 executor: str, count: int, now: float) -> None:
        self.hid = hid
        self.uid = uid
        self.spec_json = dict(spec_json)
        self.spec = spec
        self.executor = executor
        self.count = count
        self.created = now
        self.max_count: Optional[int] = None
        self.rate = 1.0
        self.intervals: Dict[str, float] = {}
        self.termination: TerminationMap = parse_map(None)
        self.lease_expires = now
        self.provisioning_expires = now
        self.quota = 0
        self.policy = "stop"
        self.keep_classes: Tuple[str, ...] = ()
        self.payload: Optional[str] = None
        self.sandbox = ""
        self.template: Any = None                   # the spec with the sandbox as directory
        self.sandbox_file: Any = None               # a path in the sandbox, for with_name
        self.next_n = 0
        self.end_if_zero = False
        self.end_reason: Optional[str] = None
        self.ended_at: Optional[float] = None
        # Working state, rebuilt on restore.
        self.live: Dict[str, Instance] = {}          # not ended, by job key
        self.live_wanted = 0                          # live and not a victim
        self.records: Dict[str, Instance] = {}       # ended and ran, by job key, oldest first
        self.kept: Dict[str, None] = {}             # records whose output is kept, oldest first
        self.sandbox_bytes = 0
        self.owed: Dict[str, int] = {}               # restarts owed, by the class that ended
        self.bucket = Bucket(1.0, 1.0, now)
        self.class_spacing: Dict[str, Spacing] = {}
        self.consecutive_failures = 0
        self.failure_backoff_until = float("-inf")
        self.last_error: Optional[str] = None
        self.payload_error: Optional[str] = None
        self.recent_starts: Deque[float] = collections.deque()
        self.recent_ends: Deque[float] = collections.deque()
        self.recent_errors: Deque[float] = collections.deque()
        self.runtimes: Deque[float] = collections.deque(maxlen=20)
        self.wake_at: Optional[float] = None
        self.lease_check_at: Optional[float] = None
        self.last_turn = float("-inf")               # its last restart by the aggregate limit

    @property
    def valid(self) -> bool:
        return self.end_reason is None

    def set_rate(self, rate: float, now: float) -> None:
        self.rate = rate
        self.bucket = Bucket(rate, max(1.0, rate), now)

    def set_intervals(self, intervals: Mapping[str, float]) -> None:
        self.intervals = dict(intervals)
        self.class_spacing = {name: Spacing(seconds) for name, seconds in intervals.items()}

    def journal(self) -> Dict[str, Any]:
        return {"uid": self.uid, "spec": self.spec_json, "executor": self.executor,
                "count": self.count, "created": self.created, "max_count": self.max_count,
                "rate": self.rate, "intervals": self.intervals,
                "termination_map": self.termination.wire,
                "lease_expires": self.lease_expires,
                "provisioning_expires": self.provisioning_expires, "quota_bytes": self.quota,
                "quota_policy": self.policy, "keep_classes": list(self.keep_classes),
                "payload": self.payload, "sandbox": self.sandbox, "next_n": self.next_n,
                "end_if_zero": self.end_if_zero, "end_reason": self.end_reason,
                "ended_at": self.ended_at}

    def restore_fields(self, value: Mapping[str, Any], now: float) -> None:
        self.created = float(value.get("created", now))
        self.max_count = value.get("max_count")
        self.set_rate(float(value["rate"]), now)
        self.set_intervals(value["intervals"])
        self.termination = parse_map(value.get("termination_map"))
        self.lease_expires = float(value["lease_expires"])
        self.provisioning_expires = float(value["provisioning_expires"])
        self.quota = int(value["quota_bytes"])
        self.policy = str(value["quota_policy"])
        self.keep_classes = tuple(value.get("keep_classes") or ())
        self.payload = value.get("payload")
        self.sandbox = str(value["sandbox"])
        self.next_n = int(value.get("next_n", 0))
        self.end_if_zero = bool(value.get("end_if_zero"))
        self.end_reason = value.get("end_reason")
        self.ended_at = value.get("ended_at")

    def trim_recent(self, now: float, window: float) -> None:
        for series in (self.recent_starts, self.recent_ends, self.recent_errors):
            while series and series[0] < now - window:
                series.popleft()

    def owed_total(self) -> int:
        return sum(self.owed.values())

    def live_by_state(self) -> Dict[InstanceState, List[Instance]]:
        found: Dict[InstanceState, List[Instance]] = {state: [] for state in LIVE_STATES}
        for inst in self.live.values():
            found[inst.state].append(inst)
        return found
