"""The flow machine's state and rules for instances: starting (throttled), following, ending,
killing, leases, quotas and the one timer. The requests are in :mod:`psij.flows._verbs`,
the dispatch and restore in :mod:`psij.flows.machine`."""

import copy
import logging
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from psij._wakeup import TimerHeap
from psij.controller import Cancel, CancelTimer, Forget, Log, SetTimer, Submit
from psij.executors.batch._status_table import is_held_by_scheduler
from psij.flows._flow_config import FlowConfig
from psij.flows._flow_values import (
    DeleteFiles,
    DeletePayload,
    JournalDelete,
    JournalPut,
    MeasureSandbox,
    SignalJob,
    VerifyPayload,
)
from psij.flows._handle import ACTIVE, ENDED, QUEUED, SUBMITTING, VERIFYING, Handle, Instance
from psij.flows._throttle import Bucket, Spacing, TurnLine

__all__ = ["WAKE", "Core", "Payload"]

WAKE = ("flow", "wake")
NO_PROBLEM = "no_problem"
REMOVED = "removed"
_MAX_BACKOFF = 300.0
_NEVER = float("inf")


class Payload:
    """A user's uploaded payload: how many valid handles use it, since when none does."""

    __slots__ = ("refs", "unused_since")

    def __init__(self, refs: int, unused_since: Optional[float]) -> None:
        self.refs = refs
        self.unused_since = unused_since


class Core:
    """State and instance rules (see the module notes)."""

    def __init__(self, config: FlowConfig) -> None:
        if not isinstance(config, FlowConfig):
            raise TypeError(f"FlowMachine: config: expected a FlowConfig, got {config!r}")
        self.config = config
        self.handles: Dict[str, Handle] = {}
        self.next_handle = 1
        self.conn_uid: Dict[int, int] = {}
        self.payloads: Dict[Tuple[int, str], Payload] = {}
        self.by_key: Dict[str, Instance] = {}
        self.due: TimerHeap[Tuple[str, Any]] = TimerHeap()
        self.armed: Optional[float] = None
        self.submit_bucket = Bucket(config.max_submit_rate, config.max_submit_rate,
                                    float("-inf"))
        self.problem_spacing = Spacing(config.aggregate_problem_interval)
        # The handles whose restart only the aggregate limit holds (see "turns" below).
        self.turns = TurnLine()
        self.turn_at: Optional[float] = None  # when the next turn is planned, if it is
        self.turns_taken = 0  # how many restarts the aggregate limit let through
        self.out: List[Any] = []

    # -- the one timer ------------------------------------------------------------------------

    def schedule(self, when: float, kind: str, ref: Any) -> None:
        self.due.push(when, (kind, ref))

    def wake(self, h: Handle, when: float) -> None:
        """Try to start instances of ``h`` at ``when`` (or earlier if already planned)."""
        if h.wake_at is None or when < h.wake_at:
            h.wake_at = when
            self.schedule(when, "handle", h.hid)

    def run_due(self, now: float) -> None:
        due = self.due
        for _ in range(1000000):
            entry = due.pop_due(now)
            if entry is None:
                return
            when, (kind, ref) = entry
            if kind == "handle":
                h = self.handles.get(ref)
                if h is not None and h.wake_at == when:
                    h.wake_at = None
                    self.pump(h, now)
            elif kind == "lease":
                h = self.handles.get(ref)
                if h is not None and h.lease_check_at == when:
                    h.lease_check_at = None
                    self.check_lease(h, now)
            elif kind == "kill":
                inst = self.by_key.get(ref)
                if inst is not None and inst.kill_at is not None and inst.kill_at <= now:
                    self.kill(inst, now)
            elif kind == "turn":
                if self.turn_at == when:
                    self.turn_at = None
                    self.give_turn(now)
            elif kind == "forget_handle":
                self.forget_handle(ref, now)
            elif kind == "payload":
                self.collect_payload(ref, now)

    def arm(self, now: float) -> None:
        when = self.due.next_due()
        if when is None:
            if self.armed is not None:
                self.out.append(CancelTimer(WAKE))
                self.armed = None
            return
        if when != self.armed:
            self.armed = when
            self.out.append(SetTimer(WAKE, max(0.0, when - now)))

    # -- journal ------------------------------------------------------------------------------

    def put_handle(self, h: Handle) -> None:
        self.out.append(JournalPut("handle", h.hid, h.journal()))

    def put_instance(self, inst: Instance) -> None:
        self.out.append(JournalPut("instance", inst.key, inst.journal()))

    def put_payload(self, uid: int, sha: str) -> None:
        p = self.payloads[(uid, sha)]
        self.out.append(JournalPut("payload", f"{uid}/{sha}",
                                   {"uid": uid, "sha256": sha, "unused_since": p.unused_since}))

    # -- starting -----------------------------------------------------------------------------

    def executor_name(self, h: Handle) -> str:
        return f"{h.executor}@{h.uid}" if self.config.multi_user else h.executor

    def pump(self, h: Handle, now: float) -> None:
        """Start what ``h`` lacks, as far as its leases, quota and throttles allow now; plan
        the next try when something must wait."""
        if not h.valid:
            return
        deficit = h.count - h.live_wanted
        if deficit <= 0:
            h.owed.clear()
            return
        self.trim_owed(h, deficit)
        if now >= h.provisioning_expires:
            return  # renew wakes it
        if h.policy == "stop" and h.sandbox_bytes >= h.quota:
            return  # a delete or a smaller measurement wakes it
        if now < h.failure_backoff_until:
            self.wake(h, h.failure_backoff_until)
            return
        while deficit > 0:
            ready = max(h.bucket.ready_at(now), self.submit_bucket.ready_at(now))
            if ready > now:
                self.wake(h, ready)
                return
            reason: Optional[str] = None
            if deficit <= h.owed_total():
                reason, ready, waits_turn = self.next_restart(h, now)
                if ready > now:
                    if waits_turn:
                        self.wait_turn(h, now)
                    if ready != _NEVER:
                        self.wake(h, ready)
                    return
            self.start(h, reason, now)
            deficit -= 1

    def next_restart(self, h: Handle, now: float) -> Tuple[Optional[str], float, bool]:
        """The class of the owed restart that may come first, and when; and whether a restart
        of another class is due but waits for its turn at the aggregate limit (that one is
        started by :meth:`give_turn`, and is not in the "when")."""
        best: Optional[str] = None
        best_at = _NEVER
        waits_turn = False
        shared = self.problem_spacing.ready_at(now)
        mine = shared <= now and self.turns.first() in (None, h.hid)
        for name, owed in h.owed.items():
            if not owed:
                continue
            spacing = h.class_spacing.get(name)
            at = spacing.ready_at(now) if spacing is not None else now
            if name != NO_PROBLEM:
                if at <= now and not mine:
                    waits_turn = True
                    continue
                at = max(at, shared)
            if at < best_at:
                best, best_at = name, at
        return best, best_at, waits_turn

    # -- the aggregate limit's turns ----------------------------------------------------------
    #
    # The aggregate limit lets one restart of a problem class through every
    # ``aggregate_problem_interval`` seconds, across all handles. Left to whichever handle
    # woke first, the handle that happened to come first in the timer's order took every
    # turn and the others none. So a handle whose restart is due but for that limit waits
    # in line (``turns``), and each turn goes to the handle that has waited longest (on a
    # tie, the one whose last turn is oldest); one that took a turn and still owes a
    # restart joins the line again, behind those already in it.

    def wait_turn(self, h: Handle, now: float) -> None:
        self.turns.join(h.hid, now, h.last_turn)
        self.plan_turn(now)

    def plan_turn(self, now: float) -> None:
        """Give the next turn when the limit frees it, if a handle waits."""
        if not self.turns:
            return
        when = self.problem_spacing.ready_at(now)
        if self.turn_at is None or when < self.turn_at:
            self.turn_at = when
            self.schedule(when, "turn", None)

    def give_turn(self, now: float) -> None:
        """The turn is free: to the first handle in line that can use it now; one that
        cannot (its restart is no longer owed, or its own limits hold it) leaves the line."""
        turns = self.turns
        while turns and self.problem_spacing.ready_at(now) <= now:
            hid = turns.first()
            assert hid is not None
            h = self.handles.get(hid)
            taken = self.turns_taken
            if h is not None:
                # start() takes it out of the line when it takes the turn; it may come back
                # at the end of the line if it owes more.
                self.pump(h, now)
            if self.turns_taken == taken:
                turns.leave(hid)
        self.plan_turn(now)

    def turn_estimate(self, h: Handle, now: float) -> Tuple[float, int]:
        """When ``h``'s turn at the aggregate limit may come (one interval more for each
        handle in line before it), and how many handles are in line before it."""
        ahead = self.turns.ahead(h.hid)
        return self.problem_spacing.ready_at(now) + ahead * self.problem_spacing.interval, ahead

    def trim_owed(self, h: Handle, deficit: int) -> None:
        extra = h.owed_total() - deficit
        if extra <= 0:
            return
        # Drop the restarts that would wait longest first.
        for name in sorted(h.owed, key=lambda c: -h.intervals.get(c, 0.0)):
            cut = min(extra, h.owed[name])
            h.owed[name] -= cut
            extra -= cut
            if not h.owed[name]:
                del h.owed[name]
            if not extra:
                return

    def start(self, h: Handle, reason: Optional[str], now: float) -> None:
        inst = Instance(h.hid, h.next_n, now, VERIFYING if h.payload else SUBMITTING)
        h.next_n += 1
        h.live[inst.key] = inst
        h.live_wanted += 1
        self.by_key[inst.key] = inst
        h.bucket.take(now)
        self.submit_bucket.take(now)
        if reason is not None:
            h.owed[reason] -= 1
            if not h.owed[reason]:
                del h.owed[reason]
            spacing = h.class_spacing.get(reason)
            if spacing is not None:
                spacing.take(now)
            if reason != NO_PROBLEM:
                self.problem_spacing.take(now)
                self.turns_taken += 1
                h.last_turn = now
                self.turns.leave(h.hid)
                self.plan_turn(now)
        self.put_instance(inst)
        if h.payload:
            self.out.append(VerifyPayload(inst.key, h.uid, h.payload))
        else:
            self.submit(h, inst, None, now)

    def submit(self, h: Handle, inst: Instance, path: Optional[str], now: float) -> None:
        try:
            template = h.template
            if template is None:
                template = h.template = copy.copy(h.spec)
                if template.directory is None:
                    template.directory = h.sandbox
                h.sandbox_file = Path(h.sandbox, "-")
            spec = copy.copy(template)
            spec.name = f"flow-{h.hid}-{inst.n}"
            base = h.sandbox_file
            spec.stdout_path = base.with_name(f"{inst.n}.out")
            spec.stderr_path = base.with_name(f"{inst.n}.err")
            if path is not None:
                spec.executable = path
        except (TypeError, ValueError) as error:
            self.submission_failed(h, inst, f"cannot make the job's spec: {error}", now)
            return
        self.out.append(Submit(inst.key, spec, self.executor_name(h)))

    def submission_failed(self, h: Handle, inst: Instance, message: str, now: float) -> None:
        self.drop(h, inst)
        h.recent_errors.append(now)
        h.consecutive_failures += 1
        h.last_error = message
        backoff = min(_MAX_BACKOFF, 2.0 ** min(h.consecutive_failures - 1, 10))
        h.failure_backoff_until = now + backoff
        self.out.append(Log(f"flow {h.hid}: submission of {inst.key} failed ({message}); next "
                            f"try in {backoff:g} s", logging.WARNING))
        if h.valid:
            self.wake(h, h.failure_backoff_until)

    def drop(self, h: Handle, inst: Instance) -> None:
        """Forget a live instance that never ran (no record is kept)."""
        if h.live.pop(inst.key, None) is not None and not inst.victim:
            h.live_wanted -= 1
        self.by_key.pop(inst.key, None)
        inst.state = ENDED
        self.out.append(Forget(inst.key))
        self.out.append(JournalDelete("instance", inst.key))

    # -- following ----------------------------------------------------------------------------

    def submitted(self, inst: Instance, native_id: Any) -> None:
        h = self.handles[inst.handle]
        inst.native_id = None if native_id is None else str(native_id)
        if inst.state == SUBMITTING:
            inst.state = QUEUED
        h.consecutive_failures = 0
        self.put_instance(inst)
        if inst.cancelled:
            self.out.append(Cancel(inst.key, kill=True))

    def status_changed(self, inst: Instance, status: Any, now: float) -> None:
        state = getattr(status, "state", None)
        h = self.handles[inst.handle]
        if getattr(state, "final", False):
            code = getattr(status, "exit_code", None)
            if isinstance(code, bool) or not isinstance(code, int):
                code = None
            self.ended(h, inst, code, now, getattr(state, "name", "?"))
        elif getattr(state, "name", None) == "ACTIVE":
            if inst.started is None:
                inst.started = now
                h.recent_starts.append(now)
            inst.state = ACTIVE
            inst.held = False
            h.consecutive_failures = 0
            self.put_instance(inst)
        elif inst.state in (SUBMITTING, QUEUED):
            inst.state = QUEUED
            # Held by the scheduler: it starts only once released. (Held back by the client,
            # max_queued_per_shape, it goes out by itself: it is waiting.)
            inst.held = is_held_by_scheduler(getattr(status, "metadata", None))

    def ended(self, h: Handle, inst: Instance, exit_code: Optional[int], now: float,
              how: str) -> None:
        ran = inst.started is not None or exit_code is not None
        if not ran:
            if inst.cancelled:
                self.drop(h, inst)
            else:
                self.submission_failed(h, inst, f"the job ended {how} before it started", now)
            return
        if h.live.pop(inst.key, None) is not None and not inst.victim:
            h.live_wanted -= 1
        self.by_key.pop(inst.key, None)
        self.out.append(Forget(inst.key))
        inst.state = ENDED
        inst.ended = now
        inst.exit_code = exit_code
        klass = REMOVED if inst.cancelled else h.termination.classify(exit_code)
        inst.klass = klass
        h.records[inst.key] = inst
        h.kept[inst.key] = None
        h.recent_ends.append(now)
        if inst.started is not None and klass != REMOVED:
            h.runtimes.append(now - inst.started)
        self.put_instance(inst)
        self.out.append(MeasureSandbox(h.hid, inst.key, (f"{h.sandbox}/{inst.n}.out",
                                                         f"{h.sandbox}/{inst.n}.err")))
        if h.valid and not inst.victim:
            h.owed[klass] = h.owed.get(klass, 0) + 1
            self.wake(h, now)

    # -- ending -------------------------------------------------------------------------------

    def kill(self, inst: Instance, now: float, hard: bool = True) -> None:
        """Remove ``inst`` at once (cancel it, or drop it when nothing was submitted yet). A
        ``hard`` cancel kills its processes at once (:meth:`psij.JobExecutor.kill`): the grace
        a shrink gives is the time from its signal to this kill, and a destroy kills at once,
        with no grace period of the executor added; otherwise the executor's own cancel."""
        if inst.cancelled:
            return
        inst.cancelled = True
        inst.kill_at = None
        h = self.handles[inst.handle]
        if inst.state == VERIFYING:
            self.drop(h, inst)
            return
        if inst.state != SUBMITTING:
            self.out.append(Cancel(inst.key, kill=hard))
        self.put_instance(inst)

    def make_victim(self, inst: Instance, signum: Optional[int], grace: Optional[float],
                    now: float) -> None:
        h = self.handles[inst.handle]
        if not inst.victim:
            inst.victim = True
            h.live_wanted -= 1
        if inst.state != ACTIVE or grace == 0:
            self.kill(inst, now)
            return
        if signum is not None:
            self.out.append(SignalJob(inst.key, signum))
        if grace is not None:
            inst.kill_at = now + grace
            self.schedule(inst.kill_at, "kill", inst.key)
        self.put_instance(inst)

    def end_handle(self, h: Handle, reason: str, now: float, kill: bool = True) -> None:
        """``h`` is no longer valid: nothing is started again; with ``kill`` every instance is
        removed at once."""
        if not h.valid:
            return
        h.end_reason = reason
        h.ended_at = now
        h.owed.clear()
        for inst in list(h.live.values()):
            if not inst.victim:
                inst.victim = True
                h.live_wanted -= 1
            if kill:
                self.kill(inst, now)
        if h.payload:
            self.release_payload(h.uid, h.payload, now)
        self.put_handle(h)
        self.out.append(Log(f"flow {h.hid} of uid {h.uid} ended: {reason}"))
        self.schedule(now + self.config.keep_ended, "forget_handle", h.hid)

    def forget_handle(self, hid: str, now: float) -> None:
        h = self.handles.get(hid)
        if h is None or h.valid or h.ended_at is None:
            return
        if h.live:
            self.schedule(now + 60.0, "forget_handle", hid)  # its kills are not done yet
            return
        for key in h.records:
            self.out.append(JournalDelete("instance", key))
        self.out.append(JournalDelete("handle", hid))
        self.out.append(DeleteFiles((), (h.sandbox,)))
        del self.handles[hid]

    def check_lease(self, h: Handle, now: float) -> None:
        """End ``h`` when its cleanup lease is over; plan the next look at its leases."""
        if not h.valid:
            return
        if now >= h.lease_expires:
            self.end_handle(h, "lease_expired", now)
            return
        at = h.lease_expires if now >= h.provisioning_expires else \
            min(h.lease_expires, h.provisioning_expires)
        if at != h.lease_check_at:
            h.lease_check_at = at
            self.schedule(at, "lease", h.hid)

    # -- payloads -----------------------------------------------------------------------------

    def release_payload(self, uid: int, sha: str, now: float) -> None:
        p = self.payloads.get((uid, sha))
        if p is None:
            return
        p.refs = max(0, p.refs - 1)
        if not p.refs:
            p.unused_since = now
            self.put_payload(uid, sha)
            self.schedule(now + self.config.keep_unused_payload, "payload", (uid, sha))

    def collect_payload(self, ref: Tuple[int, str], now: float) -> None:
        p = self.payloads.get(ref)
        if p is None or p.refs or p.unused_since is None:
            return
        if now < p.unused_since + self.config.keep_unused_payload:
            self.schedule(p.unused_since + self.config.keep_unused_payload, "payload", ref)
            return
        del self.payloads[ref]
        self.out.append(DeletePayload(ref[0], ref[1]))
        self.out.append(JournalDelete("payload", f"{ref[0]}/{ref[1]}"))

    # -- sandbox quota ------------------------------------------------------------------------

    def measured(self, h: Handle, inst: Instance, size: int, now: float) -> None:
        if inst.output != "kept":
            return
        h.sandbox_bytes += size - inst.size
        inst.size = size
        self.put_instance(inst)
        self.enforce_quota(h, now)

    def enforce_quota(self, h: Handle, now: float) -> None:
        if h.policy == "delete_oldest" and h.sandbox_bytes > h.quota:
            keep = set(h.keep_classes)
            for spare_kept in (False, True):
                for key in list(h.kept):
                    if h.sandbox_bytes <= h.quota:
                        return
                    inst = h.records[key]
                    if (inst.klass in keep) == spare_kept:
                        self.delete_output(h, inst, "quota")
        elif h.valid:
            self.wake(h, now)

    def delete_output(self, h: Handle, inst: Instance, why: str) -> None:
        self.out.append(DeleteFiles((f"{h.sandbox}/{inst.n}.out", f"{h.sandbox}/{inst.n}.err")))
        h.kept.pop(inst.key, None)
        h.sandbox_bytes -= inst.size
        inst.size = 0
        inst.output = f"deleted ({why})"
        self.put_instance(inst)

    # -- problems -----------------------------------------------------------------------------

    def problems(self, h: Handle, now: float) -> List[Dict[str, Any]]:
        found: List[Dict[str, Any]] = []
        config = self.config
        if not h.valid:
            found.append({"code": "handle_ended", "reason": h.end_reason,
                          "message": f"the handle ended ({h.end_reason}); nothing is started"})
        if h.consecutive_failures >= config.failing_after:
            found.append({"code": "submit_failing", "consecutive": h.consecutive_failures,
                          "last_error": h.last_error,
                          "message": f"the last {h.consecutive_failures} submissions failed; "
                                     f"last error: {h.last_error}"})
        if h.payload_error is not None:
            found.append({"code": "payload_invalid", "payload": h.payload,
                          "message": f"the payload cannot be used: {h.payload_error}"})
        if len(h.runtimes) >= config.fast_samples:
            median = statistics.median(h.runtimes)
            if median < config.fast_runtime:
                found.append({"code": "terminating_fast", "median_runtime_s": round(median, 3),
                              "samples": len(h.runtimes),
                              "message": f"instances end too fast: median run time "
                                         f"{median:.0f} s over the last {len(h.runtimes)}"})
        if h.valid and now >= h.provisioning_expires:
            found.append({"code": "provisioning_lease_expired",
                          "expired_s_ago": round(now - h.provisioning_expires, 3),
                          "message": "the provisioning lease expired: no new instance is "
                                     "started until it is renewed"})
        if h.policy == "stop" and h.sandbox_bytes >= h.quota:
            found.append({"code": "quota_full", "sandbox_bytes": h.sandbox_bytes,
                          "quota_bytes": h.quota,
                          "message": f"the sandbox is full ({h.sandbox_bytes} of {h.quota} "
                                     f"bytes): no new instance is started until records are "
                                     f"deleted"})
        if h.valid and h.owed:
            throttled = self.throttled(h, now)
            if throttled is not None:
                found.append(throttled)
        return found

    def throttled(self, h: Handle, now: float) -> Optional[Dict[str, Any]]:
        """The ``restarts_throttled`` problem of ``h``: when a restart it owes waits for the
        aggregate limit (however briefly), or the next one is more than a second away."""
        turn, ahead = self.turn_estimate(h, now)
        shared: Optional[str] = None  # a class whose restart the aggregate limit holds
        for klass, owed in h.owed.items():
            spacing = h.class_spacing.get(klass)
            if owed and klass != NO_PROBLEM and turn > max(now, spacing.ready_at(now)
                                                           if spacing is not None else now):
                shared = klass
                break
        waiting = h.owed_total()
        if shared is not None:
            interval = self.problem_spacing.interval
            return {"code": "restarts_throttled", "waiting": waiting, "class": shared,
                    "limit": "aggregate", "handles_before": ahead,
                    "next_restart_in_s": round(turn - now, 3),
                    "message": f"{waiting} restart(s) wait for the service's limit on "
                               f"restarts across all handles (one every {interval:g} s; "
                               f"{ahead} handle(s) wait before this one); the next in about "
                               f"{turn - now:.0f} s ({shared})"}
        name, at, _ = self.next_restart(h, now)
        if name is not None and at > now + 1.0:
            return {"code": "restarts_throttled", "waiting": waiting, "class": name,
                    "limit": "interval", "next_restart_in_s": round(at - now, 3),
                    "message": f"{waiting} restart(s) wait for the restart limits; the next "
                               f"in {at - now:.0f} s ({name})"}
        return None
