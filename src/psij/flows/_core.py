"""The flow machine's rules for instances: starting (throttled), following, ending, killing,
leases, payloads, quotas, the problems a handle reports, and the one timer.

Plain functions over the machine's state: one that reads or changes it takes the
:class:`~psij.flows.machine.FlowMachine` first (``m``; its ``__init__`` declares that state),
and one that gives actions appends them, in order, to ``out``, the list of the step it runs in
(``FlowMachine.step`` makes one per step and returns it). Nothing here keeps an action, reads
a clock, or does I/O. The requests are in :mod:`psij.flows._verbs`; the dispatch of events
and the restore are in :mod:`psij.flows.machine`."""

import copy
import enum
import logging
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from psij.controller import Cancel, CancelTimer, Forget, Log, SetTimer, Submit
from psij.executors.batch._status_table import is_held_by_scheduler
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

__all__ = [
    "NO_PROBLEM", "WAKE", "Due", "Payload", "arm", "check_lease", "delete_output", "end_handle",
    "ended", "executor_name", "kill", "make_victim", "measured", "problems", "put_handle",
    "put_instance", "put_payload", "run_due", "schedule", "status_changed", "submission_failed",
    "submit", "submitted", "wake",
]

if TYPE_CHECKING:  # the machine holds the state these functions read and change
    from psij.flows.machine import FlowMachine

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


# -- the one timer ----------------------------------------------------------------------------


class Due(enum.Enum):
    """What an entry of the machine's one timer (``m.due``: ``(Due, ref)`` by due time) is
    for; the rule of each is in ``_DUE_RULES``."""

    HANDLE = "handle"                # try to start instances of the handle ``ref``
    LEASE = "lease"                  # check the leases of the handle ``ref``
    KILL = "kill"                    # kill the instance ``ref`` (a key) whose grace is over
    TURN = "turn"                    # the next class's turn at the aggregate limit
    FORGET_HANDLE = "forget_handle"  # forget the ended handle ``ref``
    PAYLOAD = "payload"              # forget the payload ``ref`` (uid, sha256) if still unused


def schedule(m: "FlowMachine", when: float, kind: Due, ref: Any) -> None:
    m.due.push(when, (kind, ref))


def wake(m: "FlowMachine", h: Handle, when: float) -> None:
    """Try to start instances of ``h`` at ``when`` (or earlier if already planned)."""
    if h.wake_at is None or when < h.wake_at:
        h.wake_at = when
        schedule(m, when, Due.HANDLE, h.hid)


def run_due(m: "FlowMachine", now: float, out: List[Any]) -> None:
    due = m.due
    for _ in range(1000000):
        entry = due.pop_due(now)
        if entry is None:
            return
        when, (kind, ref) = entry
        _DUE_RULES[kind](m, when, ref, now, out)


def _due_handle(m: "FlowMachine", when: float, hid: str, now: float, out: List[Any]) -> None:
    h = m.handles.get(hid)
    if h is not None and h.wake_at == when:
        h.wake_at = None
        pump(m, h, now, out)


def _due_lease(m: "FlowMachine", when: float, hid: str, now: float, out: List[Any]) -> None:
    h = m.handles.get(hid)
    if h is not None and h.lease_check_at == when:
        h.lease_check_at = None
        check_lease(m, h, now, out)


def _due_kill(m: "FlowMachine", when: float, key: str, now: float, out: List[Any]) -> None:
    inst = m.by_key.get(key)
    if inst is not None and inst.kill_at is not None and inst.kill_at <= now:
        kill(m, inst, now, out)


def _due_turn(m: "FlowMachine", when: float, ref: None, now: float, out: List[Any]) -> None:
    if m.turn_at == when:
        m.turn_at = None
        give_turn(m, now, out)


def arm(m: "FlowMachine", now: float, out: List[Any]) -> None:
    when = m.due.next_due()
    if when is None:
        if m.armed is not None:
            out.append(CancelTimer(WAKE))
            m.armed = None
        return
    if when != m.armed:
        m.armed = when
        out.append(SetTimer(WAKE, max(0.0, when - now)))


# -- journal ----------------------------------------------------------------------------------


def put_handle(h: Handle, out: List[Any]) -> None:
    out.append(JournalPut("handle", h.hid, h.journal()))


def put_instance(inst: Instance, out: List[Any]) -> None:
    out.append(JournalPut("instance", inst.key, inst.journal()))


def put_payload(m: "FlowMachine", uid: int, sha: str, out: List[Any]) -> None:
    p = m.payloads[(uid, sha)]
    out.append(JournalPut("payload", f"{uid}/{sha}",
                          {"uid": uid, "sha256": sha, "unused_since": p.unused_since}))


# -- starting ---------------------------------------------------------------------------------


def executor_name(m: "FlowMachine", h: Handle) -> str:
    return f"{h.executor}@{h.uid}" if m.config.multi_user else h.executor


def pump(m: "FlowMachine", h: Handle, now: float, out: List[Any]) -> None:
    """Start what ``h`` lacks, as far as its leases, quota and throttles allow now; plan
    the next try when something must wait."""
    if not h.valid:
        return
    deficit = h.count - h.live_wanted
    if deficit <= 0:
        h.owed.clear()
        return
    trim_owed(h, deficit)
    if now >= h.provisioning_expires:
        return  # renew wakes it
    if h.policy == "stop" and h.sandbox_bytes >= h.quota:
        return  # a delete or a smaller measurement wakes it
    if now < h.failure_backoff_until:
        wake(m, h, h.failure_backoff_until)
        return
    while deficit > 0:
        ready = max(h.bucket.ready_at(now), m.submit_bucket.ready_at(now))
        if ready > now:
            wake(m, h, ready)
            return
        reason: Optional[str] = None
        if deficit <= h.owed_total():
            reason, ready, waits_turn = next_restart(m, h, now)
            if ready > now:
                if waits_turn:
                    wait_turn(m, h, now)
                if ready != _NEVER:
                    wake(m, h, ready)
                return
        start(m, h, reason, now, out)
        deficit -= 1


def next_restart(m: "FlowMachine", h: Handle, now: float
                 ) -> Tuple[Optional[str], float, bool]:
    """The class of the owed restart that may come first, and when; and whether a restart
    of another class is due but waits for its turn at the aggregate limit (that one is
    started by :func:`give_turn`, and is not in the "when")."""
    best: Optional[str] = None
    best_at = _NEVER
    waits_turn = False
    shared = m.problem_spacing.ready_at(now)
    mine = shared <= now and m.turns.first() in (None, h.hid)
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


# -- the aggregate limit's turns --------------------------------------------------------------
#
# The aggregate limit lets one restart of a problem class through every
# ``aggregate_problem_interval`` seconds, across all handles. Left to whichever handle
# woke first, the handle that happened to come first in the timer's order took every
# turn and the others none. So a handle whose restart is due but for that limit waits
# in line (``turns``), and each turn goes to the handle that has waited longest (on a
# tie, the one whose last turn is oldest); one that took a turn and still owes a
# restart joins the line again, behind those already in it.


def wait_turn(m: "FlowMachine", h: Handle, now: float) -> None:
    m.turns.join(h.hid, now, h.last_turn)
    plan_turn(m, now)


def plan_turn(m: "FlowMachine", now: float) -> None:
    """Give the next turn when the limit frees it, if a handle waits."""
    if not m.turns:
        return
    when = m.problem_spacing.ready_at(now)
    if m.turn_at is None or when < m.turn_at:
        m.turn_at = when
        schedule(m, when, Due.TURN, None)


def give_turn(m: "FlowMachine", now: float, out: List[Any]) -> None:
    """The turn is free: to the first handle in line that can use it now; one that
    cannot (its restart is no longer owed, or its own limits hold it) leaves the line."""
    turns = m.turns
    while turns and m.problem_spacing.ready_at(now) <= now:
        hid = turns.first()
        assert hid is not None
        h = m.handles.get(hid)
        taken = m.turns_taken
        if h is not None:
            # start() takes it out of the line when it takes the turn; it may come back
            # at the end of the line if it owes more.
            pump(m, h, now, out)
        if m.turns_taken == taken:
            turns.leave(hid)
    plan_turn(m, now)


def turn_estimate(m: "FlowMachine", h: Handle, now: float) -> Tuple[float, int]:
    """When ``h``'s turn at the aggregate limit may come (one interval more for each
    handle in line before it), and how many handles are in line before it."""
    ahead = m.turns.ahead(h.hid)
    return m.problem_spacing.ready_at(now) + ahead * m.problem_spacing.interval, ahead


def trim_owed(h: Handle, deficit: int) -> None:
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


def start(m: "FlowMachine", h: Handle, reason: Optional[str], now: float, out: List[Any]
          ) -> None:
    inst = Instance(h.hid, h.next_n, now, VERIFYING if h.payload else SUBMITTING)
    h.next_n += 1
    h.live[inst.key] = inst
    h.live_wanted += 1
    m.by_key[inst.key] = inst
    h.bucket.take(now)
    m.submit_bucket.take(now)
    if reason is not None:
        h.owed[reason] -= 1
        if not h.owed[reason]:
            del h.owed[reason]
        spacing = h.class_spacing.get(reason)
        if spacing is not None:
            spacing.take(now)
        if reason != NO_PROBLEM:
            m.problem_spacing.take(now)
            m.turns_taken += 1
            h.last_turn = now
            m.turns.leave(h.hid)
            plan_turn(m, now)
    put_instance(inst, out)
    if h.payload:
        out.append(VerifyPayload(inst.key, h.uid, h.payload))
    else:
        submit(m, h, inst, None, now, out)


def submit(m: "FlowMachine", h: Handle, inst: Instance, path: Optional[str], now: float,
           out: List[Any]) -> None:
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
        submission_failed(m, h, inst, f"cannot make the job's spec: {error}", now, out)
        return
    out.append(Submit(inst.key, spec, executor_name(m, h)))


def submission_failed(m: "FlowMachine", h: Handle, inst: Instance, message: str, now: float,
                      out: List[Any]) -> None:
    drop(m, h, inst, out)
    h.recent_errors.append(now)
    h.consecutive_failures += 1
    h.last_error = message
    backoff = min(_MAX_BACKOFF, 2.0 ** min(h.consecutive_failures - 1, 10))
    h.failure_backoff_until = now + backoff
    out.append(Log(f"flow {h.hid}: submission of {inst.key} failed ({message}); next "
                   f"try in {backoff:g} s", logging.WARNING))
    if h.valid:
        wake(m, h, h.failure_backoff_until)


def drop(m: "FlowMachine", h: Handle, inst: Instance, out: List[Any]) -> None:
    """Forget a live instance that never ran (no record is kept)."""
    if h.live.pop(inst.key, None) is not None and not inst.victim:
        h.live_wanted -= 1
    m.by_key.pop(inst.key, None)
    inst.state = ENDED
    out.append(Forget(inst.key))
    out.append(JournalDelete("instance", inst.key))


# -- following --------------------------------------------------------------------------------


def submitted(m: "FlowMachine", inst: Instance, native_id: Any, out: List[Any]) -> None:
    h = m.handles[inst.handle]
    inst.native_id = None if native_id is None else str(native_id)
    if inst.state == SUBMITTING:
        inst.state = QUEUED
    h.consecutive_failures = 0
    put_instance(inst, out)
    if inst.cancelled:
        out.append(Cancel(inst.key, kill=True))


def status_changed(m: "FlowMachine", inst: Instance, status: Any, now: float, out: List[Any]
                   ) -> None:
    state = getattr(status, "state", None)
    h = m.handles[inst.handle]
    if getattr(state, "final", False):
        code = getattr(status, "exit_code", None)
        if isinstance(code, bool) or not isinstance(code, int):
            code = None
        ended(m, h, inst, code, now, getattr(state, "name", "?"), out)
    elif getattr(state, "name", None) == "ACTIVE":
        if inst.started is None:
            inst.started = now
            h.recent_starts.append(now)
        inst.state = ACTIVE
        inst.held = False
        h.consecutive_failures = 0
        put_instance(inst, out)
    elif inst.state in (SUBMITTING, QUEUED) or (
            inst.state == ACTIVE and getattr(state, "name", None) == "QUEUED"):
        # QUEUED after ACTIVE: the job is run again (psij.requeue, psij.retry) and waits
        # for its next run, no longer counted as running.
        inst.state = QUEUED
        # Held by the scheduler: it starts only once released. (Held back by the client,
        # max_queued_per_shape, it goes out by itself: it is waiting.)
        inst.held = is_held_by_scheduler(getattr(status, "metadata", None))


def ended(m: "FlowMachine", h: Handle, inst: Instance, exit_code: Optional[int], now: float,
          how: str, out: List[Any]) -> None:
    ran = inst.started is not None or exit_code is not None
    if not ran:
        if inst.cancelled:
            drop(m, h, inst, out)
        else:
            submission_failed(m, h, inst, f"the job ended {how} before it started", now, out)
        return
    if h.live.pop(inst.key, None) is not None and not inst.victim:
        h.live_wanted -= 1
    m.by_key.pop(inst.key, None)
    out.append(Forget(inst.key))
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
    put_instance(inst, out)
    out.append(MeasureSandbox(h.hid, inst.key, (f"{h.sandbox}/{inst.n}.out",
                                                f"{h.sandbox}/{inst.n}.err")))
    if h.valid and not inst.victim:
        h.owed[klass] = h.owed.get(klass, 0) + 1
        wake(m, h, now)


# -- ending -----------------------------------------------------------------------------------


def kill(m: "FlowMachine", inst: Instance, now: float, out: List[Any], hard: bool = True
         ) -> None:
    """Remove ``inst`` at once (cancel it, or drop it when nothing was submitted yet). A
    ``hard`` cancel kills its processes at once (:meth:`psij.JobExecutor.kill`): the grace
    a shrink gives is the time from its signal to this kill, and a destroy kills at once,
    with no grace period of the executor added; otherwise the executor's own cancel."""
    if inst.cancelled:
        return
    inst.cancelled = True
    inst.kill_at = None
    h = m.handles[inst.handle]
    if inst.state == VERIFYING:
        drop(m, h, inst, out)
        return
    if inst.state != SUBMITTING:
        out.append(Cancel(inst.key, kill=hard))
    put_instance(inst, out)


def make_victim(m: "FlowMachine", inst: Instance, signum: Optional[int], grace: Optional[float],
                now: float, out: List[Any]) -> None:
    h = m.handles[inst.handle]
    if not inst.victim:
        inst.victim = True
        h.live_wanted -= 1
    if inst.state != ACTIVE or grace == 0:
        kill(m, inst, now, out)
        return
    if signum is not None:
        out.append(SignalJob(inst.key, signum))
    if grace is not None:
        inst.kill_at = now + grace
        schedule(m, inst.kill_at, Due.KILL, inst.key)
    put_instance(inst, out)


def end_handle(m: "FlowMachine", h: Handle, reason: str, now: float, out: List[Any],
               kill_live: bool = True) -> None:
    """``h`` is no longer valid: nothing is started again; with ``kill_live`` every instance is
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
        if kill_live:
            kill(m, inst, now, out)
    if h.payload:
        release_payload(m, h.uid, h.payload, now, out)
    put_handle(h, out)
    out.append(Log(f"flow {h.hid} of uid {h.uid} ended: {reason}"))
    schedule(m, now + m.config.keep_ended, Due.FORGET_HANDLE, h.hid)


def forget_handle(m: "FlowMachine", hid: str, now: float, out: List[Any]) -> None:
    h = m.handles.get(hid)
    if h is None or h.valid or h.ended_at is None:
        return
    if h.live:
        schedule(m, now + 60.0, Due.FORGET_HANDLE, hid)  # its kills are not done yet
        return
    for key in h.records:
        out.append(JournalDelete("instance", key))
    out.append(JournalDelete("handle", hid))
    out.append(DeleteFiles((), (h.sandbox,)))
    del m.handles[hid]


def check_lease(m: "FlowMachine", h: Handle, now: float, out: List[Any]) -> None:
    """End ``h`` when its cleanup lease is over; plan the next look at its leases."""
    if not h.valid:
        return
    if now >= h.lease_expires:
        end_handle(m, h, "lease_expired", now, out)
        return
    at = h.lease_expires if now >= h.provisioning_expires else \
        min(h.lease_expires, h.provisioning_expires)
    if at != h.lease_check_at:
        h.lease_check_at = at
        schedule(m, at, Due.LEASE, h.hid)


# -- payloads ---------------------------------------------------------------------------------


def release_payload(m: "FlowMachine", uid: int, sha: str, now: float, out: List[Any]) -> None:
    p = m.payloads.get((uid, sha))
    if p is None:
        return
    p.refs = max(0, p.refs - 1)
    if not p.refs:
        p.unused_since = now
        put_payload(m, uid, sha, out)
        schedule(m, now + m.config.keep_unused_payload, Due.PAYLOAD, (uid, sha))


def collect_payload(m: "FlowMachine", ref: Tuple[int, str], now: float, out: List[Any]
                    ) -> None:
    p = m.payloads.get(ref)
    if p is None or p.refs or p.unused_since is None:
        return
    if now < p.unused_since + m.config.keep_unused_payload:
        schedule(m, p.unused_since + m.config.keep_unused_payload, Due.PAYLOAD, ref)
        return
    del m.payloads[ref]
    out.append(DeletePayload(ref[0], ref[1]))
    out.append(JournalDelete("payload", f"{ref[0]}/{ref[1]}"))


# -- sandbox quota ----------------------------------------------------------------------------


def measured(m: "FlowMachine", h: Handle, inst: Instance, size: int, now: float,
             out: List[Any]) -> None:
    if inst.output != "kept":
        return
    h.sandbox_bytes += size - inst.size
    inst.size = size
    put_instance(inst, out)
    enforce_quota(m, h, now, out)


def enforce_quota(m: "FlowMachine", h: Handle, now: float, out: List[Any]) -> None:
    if h.policy == "delete_oldest" and h.sandbox_bytes > h.quota:
        keep = set(h.keep_classes)
        for spare_kept in (False, True):
            for key in list(h.kept):
                if h.sandbox_bytes <= h.quota:
                    return
                inst = h.records[key]
                if (inst.klass in keep) == spare_kept:
                    delete_output(m, h, inst, "quota", out)
    elif h.valid:
        wake(m, h, now)


def delete_output(m: "FlowMachine", h: Handle, inst: Instance, why: str, out: List[Any]
                  ) -> None:
    out.append(DeleteFiles((f"{h.sandbox}/{inst.n}.out", f"{h.sandbox}/{inst.n}.err")))
    h.kept.pop(inst.key, None)
    h.sandbox_bytes -= inst.size
    inst.size = 0
    inst.output = f"deleted ({why})"
    put_instance(inst, out)


# -- problems ---------------------------------------------------------------------------------


def problems(m: "FlowMachine", h: Handle, now: float) -> List[Dict[str, Any]]:
    found: List[Dict[str, Any]] = []
    config = m.config
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
        held = throttled(m, h, now)
        if held is not None:
            found.append(held)
    return found


def throttled(m: "FlowMachine", h: Handle, now: float) -> Optional[Dict[str, Any]]:
    """The ``restarts_throttled`` problem of ``h``: when a restart it owes waits for the
    aggregate limit (however briefly), or the next one is more than a second away."""
    turn, ahead = turn_estimate(m, h, now)
    shared: Optional[str] = None  # a class whose restart the aggregate limit holds
    for klass, owed in h.owed.items():
        spacing = h.class_spacing.get(klass)
        if owed and klass != NO_PROBLEM and turn > max(now, spacing.ready_at(now)
                                                       if spacing is not None else now):
            shared = klass
            break
    waiting = h.owed_total()
    if shared is not None:
        interval = m.problem_spacing.interval
        return {"code": "restarts_throttled", "waiting": waiting, "class": shared,
                "limit": "aggregate", "handles_before": ahead,
                "next_restart_in_s": round(turn - now, 3),
                "message": f"{waiting} restart(s) wait for the service's limit on "
                           f"restarts across all handles (one every {interval:g} s; "
                           f"{ahead} handle(s) wait before this one); the next in about "
                           f"{turn - now:.0f} s ({shared})"}
    name, at, _ = next_restart(m, h, now)
    if name is not None and at > now + 1.0:
        return {"code": "restarts_throttled", "waiting": waiting, "class": name,
                "limit": "interval", "next_restart_in_s": round(at - now, 3),
                "message": f"{waiting} restart(s) wait for the restart limits; the next "
                           f"in {at - now:.0f} s ({name})"}
    return None


def _due_forget_handle(m: "FlowMachine", when: float, hid: str, now: float,
                       out: List[Any]) -> None:
    forget_handle(m, hid, now, out)


def _due_payload(m: "FlowMachine", when: float, ref: Tuple[int, str], now: float,
                 out: List[Any]) -> None:
    collect_payload(m, ref, now, out)


_DUE_RULES: Dict[Due, Callable[["FlowMachine", float, Any, float, List[Any]], None]] = {
    Due.HANDLE: _due_handle, Due.LEASE: _due_lease, Due.KILL: _due_kill, Due.TURN: _due_turn,
    Due.FORGET_HANDLE: _due_forget_handle, Due.PAYLOAD: _due_payload,
}
