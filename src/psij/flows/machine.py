"""The flow machine: "keep N jobs running" handles, as a pure :mod:`psij.controller` machine.

A handle holds a :class:`~psij.JobSpec` (the payload), a count and an executor; the machine
keeps that many instances submitted, and replaces each one that ends, as fast as the
handle's rate, the restart limits of the class it ended in (per handle and across all
handles) and its leases and sandbox quota allow. The flows guide states the rules; the
notes here are the interface with the service that runs the machine.

- ``now`` is Unix epoch seconds (leases and records outlive the process that set them).
- Handles are ``"f<number>"``, never reused. An instance of handle ``h`` is the job
  ``"<h>/<n>"`` (:class:`~psij.controller.Submit`, :class:`~psij.controller.Attach`,
  :class:`~psij.controller.Cancel`, :class:`~psij.controller.Forget` and the
  :class:`~psij.controller.JobStatusChanged` that come back), ``n`` counting the handle's
  instances from 0; its id on the wire is ``"<native id>.<n>"``.
- The machine sets one timer, named ``WAKE`` (``("flow", "wake")``); it needs no
  :class:`~psij.controller.Tick`.
- What touches files or signals a job is asked for with the actions below
  (:class:`JournalPut`, :class:`SignalJob`, ...), which the service runs through the loop's
  ``action_handlers``, and answered with the events below (:class:`PayloadVerified`, ...).
- :meth:`FlowMachine.restore` takes the journal back after a restart.

Events (each taken by the method marked for its class, ``psij._machine``): the
controller's :class:`~psij.controller.Started`, :class:`~psij.controller.Tick` (nothing to do),
:class:`~psij.controller.TimerFired`, :class:`~psij.controller.SignalReceived`,
:class:`~psij.controller.Connected`, :class:`~psij.controller.MessageReceived`,
:class:`~psij.controller.BadMessage`, :class:`~psij.controller.Disconnected`,
:class:`~psij.controller.JobStatusChanged`, :class:`~psij.controller.ActionDone`,
:class:`~psij.controller.ActionFailed`, and :class:`PayloadVerified`,
:class:`SandboxMeasured`, :class:`PayloadStored`. Actions: the controller's
:class:`~psij.controller.Submit`, :class:`~psij.controller.Attach`,
:class:`~psij.controller.Cancel`, :class:`~psij.controller.Forget`,
:class:`~psij.controller.Send`, :class:`~psij.controller.SetTimer`,
:class:`~psij.controller.CancelTimer`, :class:`~psij.controller.Log`,
:class:`~psij.controller.Stop`, and :class:`JournalPut`, :class:`JournalDelete`,
:class:`SignalJob`, :class:`MakeSandbox`, :class:`MeasureSandbox`, :class:`DeleteFiles`,
:class:`StorePayload`, :class:`VerifyPayload`, :class:`ReadOutput`, :class:`DeletePayload`.

:meth:`FlowMachine.step`, unlike the other machines, never raises (a rule's bug must not stop
the service): an event of a class it does not take (``IllegalEvent`` from its table) is logged
and dropped and changes nothing, a request it cannot accept is answered with an error naming
the field.

Where the rules live: :class:`FlowMachine` owns the state (declared in its ``__init__``), the
table of events and the restore, here; the rules for instances (starting, following, ending,
leases, payloads, quotas, the timer) are plain functions over that state in
``psij.flows._core``, the requests' in ``psij.flows._verbs``, and the ``watch`` request's
(answered when a handle changes) in ``psij.flows._watch``. ``step`` makes a new
list of actions for each event, hands it down to every rule it runs (``out``) and returns it:
a step's actions are exactly what it returns, and none is kept on the machine after it.
"""

import logging
from typing import Any, Dict, Iterable, List, Optional, Tuple

from psij._machine import IllegalEvent, StateMachine, handles
from psij._wakeup import TimerHeap
from psij.controller import (
    ActionDone,
    ActionFailed,
    ActionKind,
    Attach,
    BadMessage,
    Cancel,
    Connected,
    Disconnected,
    JobStatusChanged,
    Log,
    MessageReceived,
    Send,
    SignalReceived,
    Started,
    Stop,
    Tick,
    TimerFired,
)
from psij.flows import _core, _verbs, _watch
from psij.flows._core import WAKE, Payload
from psij.flows._flow_config import FlowConfig
from psij.flows._flow_values import (
    DeleteFiles,
    DeletePayload,
    JournalDelete,
    JournalPut,
    MakeSandbox,
    MeasureSandbox,
    PayloadStored,
    PayloadVerified,
    ReadOutput,
    SandboxMeasured,
    SignalJob,
    StorePayload,
    VerifyPayload,
)
from psij.flows._handle import ENDED, SUBMITTING, VERIFYING, Handle, Instance
from psij.flows._requests import request_id
from psij.flows._throttle import Bucket, Spacing, TurnLine
from psij.serialize import _spec_from_json

__all__ = [
    "WAKE", "DeleteFiles", "DeletePayload", "FlowConfig", "FlowMachine", "JournalDelete",
    "JournalPut", "MakeSandbox", "MeasureSandbox", "PayloadStored", "PayloadVerified",
    "ReadOutput", "SandboxMeasured", "SignalJob", "StorePayload", "VerifyPayload",
]


class FlowMachine(StateMachine):
    """The flows of one service (see the module notes and the flows guide).

    :param config: the service's limits and defaults.
    """

    def __init__(self, config: FlowConfig) -> None:
        if not isinstance(config, FlowConfig):
            raise TypeError(f"FlowMachine: config: expected a FlowConfig, got {config!r}")
        self.config = config
        self.handles: Dict[str, Handle] = {}
        self.next_handle = 1
        self.conn_uid: Dict[int, int] = {}
        self.payloads: Dict[Tuple[int, str], Payload] = {}
        self.by_key: Dict[str, Instance] = {}
        self.due: TimerHeap[Tuple[_core.Due, Any]] = TimerHeap()
        self.armed: Optional[float] = None
        self.submit_bucket = Bucket(config.max_submit_rate, config.max_submit_rate,
                                    float("-inf"))
        self.problem_spacing = Spacing(config.aggregate_problem_interval)
        # The handles whose restart only the aggregate limit holds (see "turns" in _core).
        self.turns = TurnLine()
        self.turn_at: Optional[float] = None  # when the next turn is planned, if it is
        self.turns_taken = 0  # how many restarts the aggregate limit let through
        # What restore gave, given again as the answer to Started (then emptied).
        self._on_start: Tuple[Any, ...] = ()
        self.events = 0
        """How many events the machine has been given."""
        self.watch = _watch.WatchState()  # the changes of handles, and who waits for one

    def step(self, event: Any, now: float) -> List[Any]:
        """The actions for ``event`` at time ``now``; never raises on any input."""
        self.events += 1
        out: List[Any] = []
        # Each part on its own, so that the timer is set again whatever failed before it.
        try:
            self._dispatch(event, now, out)
        except Exception as error:  # a rule's bug must not stop the service
            _log_failure(event, error, out)
        try:
            _core.run_due(self, now, out)
        except Exception as error:
            _log_failure(event, error, out)
        try:
            _core.arm(self, now, out)
        except Exception as error:
            _log_failure(event, error, out)
        try:
            _watch.changed(self, out)
        except Exception as error:
            _log_failure(event, error, out)
        return out

    def _dispatch(self, event: Any, now: float, out: List[Any]) -> None:
        try:
            handler = self.event_handlers[type(event)]
        except IllegalEvent:  # never raised out of step: dropped, as its docstring says
            out.append(Log(f"flow machine: ignoring {event!r}", logging.DEBUG))
            return
        handler(self, event, now, out)

    @handles(JobStatusChanged)
    def _status_changed(self, event: JobStatusChanged, now: float, out: List[Any]) -> None:
        inst = self.by_key.get(event.key)  # type: ignore[call-overload]
        if inst is not None:
            _core.status_changed(self, inst, event.status, now, out)

    @handles(TimerFired)
    def _timer(self, event: TimerFired, now: float, out: List[Any]) -> None:
        if event.name == WAKE:
            self.armed = None

    @handles(MessageReceived)
    def _message(self, event: MessageReceived, now: float, out: List[Any]) -> None:
        _verbs.request(self, event.conn, event.message, now, out)

    @handles(Connected)
    def _connected(self, event: Connected, now: float, out: List[Any]) -> None:
        uid = getattr(event.peer, "uid", -1)
        self.conn_uid[event.conn] = uid if isinstance(uid, int) else -1

    @handles(Disconnected)
    def _disconnected(self, event: Disconnected, now: float, out: List[Any]) -> None:
        self.conn_uid.pop(event.conn, None)
        _watch.forget(self, event.conn)

    @handles(BadMessage)
    def _bad_message(self, event: BadMessage, now: float, out: List[Any]) -> None:
        error = {"code": "bad_request", "field": event.field,
                 "message": f"{event.reason}; expected one JSON object per line"}
        out.append(Send(event.conn, {"id": request_id(event.message), "ok": False,
                                     "error": error}))

    @handles(Started)
    def _started(self, event: Started, now: float, out: List[Any]) -> None:
        out.extend(self._on_start)
        self._on_start = ()

    @handles(SignalReceived)
    def _signal(self, event: SignalReceived, now: float, out: List[Any]) -> None:
        out.append(Stop(0, f"signal {event.signum}: stopping; the instances keep running and "
                           "are attached again at the next start", 10.0))

    @handles(Tick)
    def _tick(self, event: Tick, now: float, out: List[Any]) -> None:
        """Nothing: the machine keeps its own timer (``WAKE``)."""

    @handles(ActionDone)
    def _done(self, event: ActionDone, now: float, out: List[Any]) -> None:
        inst = self.by_key.get(str(event.key))
        if inst is None:
            return
        if event.action is ActionKind.SUBMIT:
            _core.submitted(self, inst, event.result, out)
        elif event.action is ActionKind.ATTACH and inst.cancelled:
            out.append(Cancel(inst.key, kill=True))

    @handles(ActionFailed)
    def _failed(self, event: ActionFailed, now: float, out: List[Any]) -> None:
        inst = self.by_key.get(str(event.key))
        if inst is None:
            return
        h = self.handles[inst.handle]
        if event.action is ActionKind.SUBMIT:
            _core.submission_failed(self, h, inst, str(event.message), now, out)
        elif event.action is ActionKind.ATTACH:
            out.append(Log(f"flow {h.hid}: {inst.key} (native id {inst.native_id}) cannot be "
                           f"attached again: {event.message}", logging.WARNING))
            _core.ended(self, h, inst, None, now, "unreachable", out)
        elif event.action is ActionKind.SIGNAL:
            out.append(Log(f"flow {h.hid}: cannot signal {inst.key} ({event.message}); "
                           "cancelling it", logging.WARNING))
            # The executor's cancel stands for the signal.
            _core.kill(self, inst, now, out, hard=False)
        else:
            out.append(Log(f"flow {h.hid}: {event.action.value} of {inst.key} failed: "
                           f"{event.message}", logging.WARNING))

    @handles(PayloadVerified)
    def _verified(self, event: PayloadVerified, now: float, out: List[Any]) -> None:
        inst = self.by_key.get(event.key)
        if inst is None or inst.state != VERIFYING:
            return
        h = self.handles[inst.handle]
        if event.ok and isinstance(event.path, str) and event.path:
            h.payload_error = None
            inst.state = SUBMITTING
            _core.put_instance(inst, out)
            _core.submit(self, h, inst, event.path, now, out)
        else:
            h.payload_error = str(event.message)
            _core.submission_failed(self, h, inst, f"payload {h.payload}: {event.message}",
                                    now, out)

    @handles(SandboxMeasured)
    def _measured(self, event: SandboxMeasured, now: float, out: List[Any]) -> None:
        h = self.handles.get(event.handle)
        if h is None:
            return
        inst = h.records.get(event.instance)
        size = event.size
        if inst is not None and isinstance(size, int) and not isinstance(size, bool) \
                and 0 <= size < 2**62:
            _core.measured(self, h, inst, size, now, out)

    @handles(PayloadStored)
    def _stored(self, event: PayloadStored, now: float, out: List[Any]) -> None:
        ref = (event.uid, event.sha256)
        p = self.payloads.get(ref)
        if event.ok or p is None:
            return
        out.append(Log(f"payload {event.sha256} of uid {event.uid} was not stored: "
                       f"{event.message}", logging.WARNING))
        if not p.refs:
            del self.payloads[ref]
            out.append(JournalDelete("payload", f"{event.uid}/{event.sha256}"))

    # -- restart ------------------------------------------------------------------------------

    def restore(self, records: Iterable[Tuple[str, str, Any]], now: float) -> List[Any]:
        """Take back the journal after a restart, before any event: ``records`` are the
        ``(kind, key, value)`` last written by :class:`JournalPut` and not deleted since.
        Returns the actions to carry out first, which the machine also gives as its answer
        to :class:`~psij.controller.Started`: attaching every instance that has a native id
        and has not ended, removing what cannot be used, setting the timer. An instance
        whose submission was under way (no native id) is counted as a lost submission and
        replaced; no instance is ever submitted twice otherwise."""
        out: List[Any] = []
        by_kind: Dict[str, List[Tuple[str, Any]]] = {}
        for record in records:
            try:
                kind, key, value = record
                by_kind.setdefault(str(kind), []).append((str(key), value))
            except (TypeError, ValueError):
                out.append(Log(f"flow journal: ignoring {record!r}", logging.ERROR))
        for key, value in by_kind.get("meta", []):
            if key == "machine" and isinstance(value, dict):
                self.next_handle = max(self.next_handle, int(value.get("next_handle", 1)))
        for key, value in by_kind.get("payload", []):
            try:
                self.payloads[(int(value["uid"]), str(value["sha256"]))] = Payload(
                    0, value.get("unused_since"))
            except (TypeError, ValueError, KeyError) as error:
                out.append(Log(f"flow journal: payload {key}: {error!r}", logging.ERROR))
        for key, value in by_kind.get("handle", []):
            self._restore_handle(key, value, now, out)
        instances: List[Instance] = []
        for key, value in by_kind.get("instance", []):
            try:
                instances.append(Instance.from_journal(value))
            except (TypeError, ValueError, KeyError) as error:
                out.append(Log(f"flow journal: instance {key}: {error!r}", logging.ERROR))
        instances.sort(key=lambda i: (i.ended or 0.0, i.handle, i.n))
        for inst in instances:
            self._restore_instance(inst, now, out)
        for hid, h in self.handles.items():
            if h.valid:
                out.append(MakeSandbox(h.sandbox, h.uid))
                h.lease_check_at = now
                _core.schedule(self, now, _core.Due.LEASE, hid)
                _core.wake(self, h, now)
            else:
                _core.schedule(self, (h.ended_at or now) + self.config.keep_ended,
                               _core.Due.FORGET_HANDLE, hid)
        for ref, p in self.payloads.items():
            if not p.refs:
                if p.unused_since is None:
                    p.unused_since = now
                _core.schedule(self, p.unused_since + self.config.keep_unused_payload,
                               _core.Due.PAYLOAD, ref)
        self._on_start = tuple(out)
        return out

    def _restore_handle(self, hid: str, value: Any, now: float, out: List[Any]) -> None:
        try:
            number = int(hid[1:])
            h = Handle(hid, int(value["uid"]), value["spec"], _spec_from_json(value["spec"]),
                       str(value["executor"]), int(value["count"]), now)
            h.restore_fields(value, now)
        except (TypeError, ValueError, KeyError, AttributeError) as error:
            out.append(Log(f"flow journal: handle {hid} cannot be restored: {error!r}",
                           logging.ERROR))
            return
        self.next_handle = max(self.next_handle, number + 1)
        self.handles[hid] = h
        if h.valid and h.payload:
            p = self.payloads.setdefault((h.uid, h.payload), Payload(0, None))
            p.refs += 1
            p.unused_since = None

    def _restore_instance(self, inst: Instance, now: float, out: List[Any]) -> None:
        h = self.handles.get(inst.handle)
        if h is None:
            out.append(JournalDelete("instance", inst.key))
            return
        h.next_n = max(h.next_n, inst.n + 1)
        if inst.state == ENDED:
            h.records[inst.key] = inst
            if inst.output == "kept":
                h.kept[inst.key] = None
                h.sandbox_bytes += inst.size
            return
        if inst.native_id is None:
            # Its submission was under way: whether it reached the scheduler is unknown.
            h.recent_errors.append(now)
            h.last_error = "the service restarted while the instance was being submitted"
            out.append(JournalDelete("instance", inst.key))
            out.append(Log(f"flow {h.hid}: {inst.key} was being submitted when the service "
                           "stopped; counted as lost", logging.WARNING))
            return
        h.live[inst.key] = inst
        self.by_key[inst.key] = inst
        if not h.valid:
            inst.victim = True
        if not inst.victim:
            h.live_wanted += 1
        out.append(Attach(inst.key, inst.native_id, _core.executor_name(self, h)))
        if not h.valid and not inst.cancelled:
            inst.cancelled = True  # cancelled once attached
            _core.put_instance(inst, out)
        if inst.kill_at is not None and not inst.cancelled:
            _core.schedule(self, inst.kill_at, _core.Due.KILL, inst.key)


def _log_failure(event: Any, error: Exception, out: List[Any]) -> None:
    """Log a rule's failure on ``event``; the step goes on with its next part."""
    logging.getLogger("psij.flows").exception("flow machine failed on %r", event)
    out.append(Log(f"flow machine: failed on {type(event).__name__}: {error!r}", logging.ERROR))


# Documented and shown as this module's own.
for _name in __all__:
    _value = globals()[_name]
    if isinstance(_value, type):
        _value.__module__ = __name__
del _name, _value
