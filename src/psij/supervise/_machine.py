"""The supervisor's machine: a server job, the client jobs it asks for, and what happens when
the server dies. Pure: it does no I/O, reads no clock and starts no thread (its state table
is in the guide, :doc:`/supervise`; the loop that runs it is
:class:`psij.controller.ControllerLoop`).

Events (:mod:`psij.controller`): :class:`~psij.controller.Started`,
:class:`~psij.controller.Tick`, :class:`~psij.controller.TimerFired`,
:class:`~psij.controller.SignalReceived`, :class:`~psij.controller.Connected`,
:class:`~psij.controller.MessageReceived`, :class:`~psij.controller.BadMessage`,
:class:`~psij.controller.Disconnected`, :class:`~psij.controller.JobStatusChanged`,
:class:`~psij.controller.ActionDone`, :class:`~psij.controller.ActionFailed`. Actions:
:class:`~psij.controller.Submit`, :class:`~psij.controller.Attach`,
:class:`~psij.controller.Cancel`, :class:`~psij.controller.Forget`,
:class:`~psij.controller.Call` (a look-up by name), :class:`~psij.controller.Send`,
:class:`~psij.controller.Close`, :class:`~psij.controller.SetTimer`,
:class:`~psij.controller.CancelTimer`, :class:`~psij.controller.Log`,
:class:`~psij.controller.Stop`, and :class:`Journal`. An event of another class raises
``psij._machine.IllegalEvent`` and changes nothing. An event of a known class that no longer
applies (the status of a job already final, a message on a connection closed since, a late
timer) is the normal course of an asynchronous world: it is dropped and changes nothing.

Its state is a handful of counters and maps of :class:`JobEntry` values (replaced, never
changed), kept on the machine object so that one event costs a few dictionary operations
whatever the number of jobs.

No job is ever left behind unknown: every submission is journaled *before* its submit command
runs, with its job name (unique: :func:`~psij.supervise._messages.marked_name`). A submission
whose outcome is unknown (its command was killed on its timeout, or stopped when the
supervisor stopped) is looked up by that name and cancelled, at once when the supervisor runs,
or by the next one (and ``psij supervise --cleanup``) when it had to exit first. When the
supervisor stops it waits, at most ``stop_grace`` seconds, until every job it cancelled has
its final state in the journal.
"""

import collections
import logging
import secrets
from typing import Any, Callable, ClassVar, Deque, Dict, List, Optional, Sequence, Tuple

from psij._machine import StateMachine, handles
from psij._record import replace
from psij.controller import (
    Action,
    ActionDone,
    ActionFailed,
    ActionKind,
    Attach,
    BadMessage,
    Cancel,
    CancelTimer,
    Close,
    Connected,
    Disconnected,
    Event,
    Forget,
    JobStatusChanged,
    Log,
    MessageReceived,
    Send,
    SetTimer,
    SignalReceived,
    Started,
    Stop,
    Submit,
    Tick,
    TimerFired,
    exit_code_for_signal,
)
from psij.supervise._entries import (
    _REPORTED,
    _STOP_TIMER,
    EntryKind,
    EntryState,
    JobEntry,
    Journal,
    Settings,
    _peer,
    _Pending,
    _plain,
    _state_name,
    outcome_unknown,
)
from psij.supervise._lookups import NameLookUps
from psij.supervise._messages import (
    ENV_ADDRESS,
    ENV_CLIENT,
    ENV_FAULT_TOLERANCE,
    ENV_GENERATION,
    ENV_GROUP_SIZE,
    ENV_MELISSA_FAULT_TOLERANCE,
    ENV_TOKEN,
    ENV_UID,
    Request,
    RequestError,
    RequestKind,
    build_spec,
    read_request,
)

__all__ = ["EntryKind", "EntryState", "JobEntry", "Journal", "Settings", "Supervisor"]

class Supervisor(NameLookUps, StateMachine):
    """The supervisor's rules: ``step(event, now) -> actions`` (the state table is in
    :doc:`/supervise`).

    :param settings: the study's settings.
    :param new_token: makes the secret of each server generation (tests give fixed ones).
    :param leftovers: the jobs (uid, native id) an earlier supervisor of the same output
        directory submitted and did not see end: attached and cancelled at the start.
    :param first_uid: the first uid to give (after those of the journal).
    :param first_generation: the generation before the first server's.
    :param unsure: the submissions (uid, job name) of an earlier supervisor whose outcome is
        unknown (it exited, or its submit command was killed, before it returned): looked up
        by name and cancelled at the start.
    :param cancel_named: cancels the jobs in the queue with a job name and returns their
        native ids (run on a worker thread; the executor's ``cancel_jobs_named``); None when
        the executor cannot look jobs up by name.
    :param marker: ends every job name (with the uid), so that this supervisor's jobs are found
        by name (a new random one by default).
    :param cleanup: only cancel what ``leftovers`` and ``unsure`` name, wait for them to end
        (at most ``stop_grace`` seconds) and stop: 0 when everything was settled, 1 otherwise
        (``psij supervise --cleanup``).
    """

    def __init__(self, settings: Settings,
                 new_token: Callable[[], str] = lambda: secrets.token_hex(16),
                 leftovers: Sequence[Tuple[int, str]] = (), first_uid: int = 0,
                 first_generation: int = 0, unsure: Sequence[Tuple[int, str]] = (),
                 cancel_named: Optional[Callable[[str], Sequence[str]]] = None,
                 marker: Optional[str] = None, cleanup: bool = False) -> None:
        self.settings = settings
        self._new_token = new_token
        self._leftovers = tuple(leftovers)
        self._unsure = tuple(unsure)
        self._cancel_named = cancel_named
        self.marker = marker if marker is not None else secrets.token_hex(4)
        self.cleanup = cleanup
        self.next_uid = first_uid
        self.generation = first_generation
        self.token = ""
        self.old_tokens: Dict[str, int] = {}
        self.server_uid: Optional[int] = None
        self.server_conn: Optional[int] = None
        self.server_active_since: Optional[float] = None
        self.last_seen = 0.0
        self.done = False
        self.restarts = 0
        self.stopped = False
        self.exit_code: Optional[int] = None
        self.stop_reason = ""
        self.stop_deadline = 0.0
        self.stop_sent = False  # Stop given to the loop (the jobs ended, or stop_grace passed)
        self._stop_timer = False
        self.jobs: Dict[int, JobEntry] = {}
        self.lookups: Dict[int, str] = {}  # look-ups by name under way: uid -> job name
        self.clients: Dict[str, int] = {}  # client id of the current generation -> uid
        self.queue: Deque[_Pending] = collections.deque()
        self.running_clients = 0  # client jobs submitted and not final (all generations)
        self.strangers: Dict[int, float] = {}  # connections that have not said hello yet

    # -- the machine ------------------------------------------------------------------------

    def step(self, event: Event, now: float) -> List[Action]:
        """Take one event at time ``now``; return the actions. An event of a class no rule
        takes raises ``psij._machine.IllegalEvent`` and changes nothing."""
        handler = self.event_handlers[type(event)]
        actions: List[Action] = []
        handler(self, event, now, actions)
        if self.stopped and not self.stop_sent:
            self._settle_stop(now, actions)
        return actions

    def _take_uid(self) -> int:
        uid = self.next_uid
        self.next_uid += 1
        return uid

    # -- the server -------------------------------------------------------------------------

    @handles(Started)
    def _on_started(self, event: Started, now: float, out: List[Action]) -> None:
        if self.cleanup:
            out.append(Log(f"supervisor: cleaning up {self.settings.output_dir}"))
        else:
            out.append(Log(f"supervisor: output in {self.settings.output_dir}; the server "
                           f"connects to {self.settings.address}"))
        if self._leftovers:
            out.append(Log(f"supervisor: cancelling {len(self._leftovers)} job(s) an earlier "
                           f"supervisor left: {', '.join(n for _, n in self._leftovers)}",
                           logging.WARNING))
        for uid, native in self._leftovers:
            self.jobs[uid] = JobEntry(uid, EntryKind.LEFTOVER, None, 0, EntryState.SUBMITTING,
                                      native, True)
            out.append(Attach(uid, native))
        if self._unsure:
            out.append(Log(f"supervisor: looking for {len(self._unsure)} job(s) whose "
                           f"submission an earlier supervisor did not see return, to cancel "
                           f"them: {', '.join(n for _, n in self._unsure)}", logging.WARNING))
        for uid, name in self._unsure:
            self._look_up(uid, name, out)
        if self.cleanup:
            if not self._leftovers and not self._unsure:
                out.append(Log("supervisor: the journal names no job left to cancel"))
            self._stop(0, "cleaning up", now, out)
            return
        self._submit_server(now, out)

    def _submit_server(self, now: float, out: List[Action]) -> None:
        settings = self.settings
        if self.token:
            self.old_tokens[self.token] = self.generation
        self.generation += 1
        self.token = self._new_token()
        uid = self._take_uid()
        env = {ENV_ADDRESS: settings.address, ENV_TOKEN: self.token,
               ENV_GENERATION: str(self.generation), ENV_UID: str(uid),
               ENV_FAULT_TOLERANCE: "1" if settings.fault_tolerance else "0",
               ENV_MELISSA_FAULT_TOLERANCE: "ON" if settings.fault_tolerance else "OFF"}
        try:
            spec = build_spec(settings.server, uid, "server", env, settings.output_dir,
                              settings.std_output, self.marker)
        except RequestError as error:  # checked with the settings: only a bug gets here
            self._stop(1, f"cannot make the server job: {error}", now, out)
            return
        self.server_uid = uid
        self.server_conn = None
        self.server_active_since = None
        out.append(Log(f"supervisor: submitting server generation {self.generation} "
                       f"(uid {uid})"))
        self._submit(JobEntry(uid, EntryKind.SERVER, None, self.generation,
                              EntryState.SUBMITTING, None, False, spec.name), spec, out)

    def _submit(self, entry: JobEntry, spec: Any, out: List[Action]) -> None:
        """Journal the submission (so that a supervisor that exits before it returns leaves
        its job name behind), then submit."""
        self.jobs[entry.uid] = entry
        out.append(Journal({"uid": entry.uid, "kind": entry.kind.value, "client": entry.client,
                            "generation": entry.generation, "name": entry.name}))
        out.append(Submit(entry.uid, spec))

    def _server_dead(self, reason: str, now: float, out: List[Action]) -> None:
        """The current server is gone: cancel everything, then restart or stop."""
        out.append(Log(f"supervisor: server generation {self.generation} is dead: {reason}",
                       logging.ERROR))
        self._cancel_all(out)
        if self.server_conn is not None:
            out.append(Close(self.server_conn))
        self.server_conn = None
        self.server_uid = None
        settings = self.settings
        if not settings.fault_tolerance:
            self._stop(1, f"server died ({reason}); fault_tolerance is off", now, out)
        elif self.restarts >= settings.max_server_restarts:
            self._stop(1, f"server died ({reason}) and was restarted "
                          f"{self.restarts} time(s) already (max_server_restarts="
                          f"{settings.max_server_restarts})", now, out)
        else:
            self.restarts += 1
            out.append(Log(f"supervisor: restarting the server ({self.restarts} of "
                           f"{settings.max_server_restarts})", logging.WARNING))
            self._submit_server(now, out)

    def _cancel_all(self, out: List[Action]) -> None:
        """Cancel every job not final (at once, without waiting), forget the requests."""
        for pending in self.queue:
            out.append(Log(f"supervisor: dropping queued client {pending.client!r} "
                           f"(uid {pending.uid})", logging.DEBUG))
        self.queue.clear()
        self.clients.clear()
        jobs = self.jobs
        for uid, entry in list(jobs.items()):
            if entry.cancel:
                continue
            jobs[uid] = replace(entry, cancel=True)
            if entry.state is not EntryState.SUBMITTING:  # the rest once their submission returns
                out.append(Cancel(uid))

    def _stop(self, code: int, reason: str, now: float, out: List[Action]) -> None:
        """Cancel every job and stop once each one has ended (journaled), or after
        ``stop_grace`` (see :meth:`_settle_stop`)."""
        if self.stopped:
            return
        self._cancel_all(out)
        self.stopped = True
        if self.exit_code is None:  # (a clean-up may have failed already: 1)
            self.exit_code = code
        self.stop_reason = reason
        self.stop_deadline = now + self.settings.stop_grace
        if not self.cleanup:
            out.append(Log(f"supervisor: stopping with exit code {code}: {reason}",
                           logging.INFO if code == 0 else logging.ERROR))

    def _settle_stop(self, now: float, out: List[Action]) -> None:
        """Stopped: give the loop its Stop once no job and no look-up is left (the time left
        of ``stop_grace`` for the calls still in flight), else wait for them until then."""
        if self.jobs or self.lookups:
            if not self._stop_timer:
                self._stop_timer = True
                out.append(SetTimer(_STOP_TIMER, max(0.0, self.stop_deadline - now)))
            return
        if self._stop_timer:
            out.append(CancelTimer(_STOP_TIMER))
        self._send_stop(max(0.0, self.stop_deadline - now), out)

    def _send_stop(self, grace: float, out: List[Action]) -> None:
        self.stop_sent = True
        assert self.exit_code is not None
        if self.cleanup:
            self.stop_reason = ("cleaned up" if self.exit_code == 0 else
                                "cleaned up, but some jobs could not be settled")
            out.append(Log(f"supervisor: {self.stop_reason}"))
        out.append(Stop(self.exit_code, self.stop_reason, grace))

    def _give_up_waiting(self, why: str, out: List[Action]) -> None:
        """Stop now, though jobs have not been seen ending: they stay in the journal, for
        the next supervisor of this output directory (or ``--cleanup``) to cancel."""
        left = [f"uid {e.uid} ({e.native_id or e.name or 'not submitted yet'})"
                for e in self.jobs.values()]
        left += [f"uid {uid} (named {name})" for uid, name in self.lookups.items()]
        if left:
            if self.cleanup:
                self.exit_code = 1
            out.append(Log(f"supervisor: {why}; {len(left)} job(s) not seen ending: "
                           f"{', '.join(left)}. They stay in the journal: `psij supervise "
                           f"--cleanup` with this configuration (or its next run) cancels "
                           f"them", logging.WARNING))
        self._send_stop(0.0, out)

    @handles(TimerFired)
    def _on_timer(self, event: TimerFired, now: float, out: List[Action]) -> None:
        if event.name != _STOP_TIMER or not self.stopped or self.stop_sent:
            return
        self._stop_timer = False
        self._give_up_waiting(f"stop_grace ({self.settings.stop_grace:g} s) has passed", out)

    # -- jobs -------------------------------------------------------------------------------

    @handles(ActionDone)
    def _on_done(self, event: ActionDone, now: float, out: List[Action]) -> None:
        if event.action is ActionKind.CALL:
            self._looked_up(event.key, event.result, None, out)
            return
        if event.action is not ActionKind.SUBMIT and event.action is not ActionKind.ATTACH:
            return
        entry = self.jobs.get(event.key)  # type: ignore[call-overload]
        if entry is None:
            return
        native = None if event.result is None else str(event.result)
        state = (EntryState.SUBMITTED if entry.state is EntryState.SUBMITTING
                 else entry.state)
        self.jobs[entry.uid] = replace(entry, native_id=native, state=state)
        if entry.kind is EntryKind.LEFTOVER:
            out.append(Cancel(entry.uid))
            return
        out.append(Journal({"uid": entry.uid, "kind": entry.kind.value, "client": entry.client,
                            "generation": entry.generation, "name": entry.name,
                            "native_id": native}))
        who = f"client {entry.client!r}" if entry.kind is EntryKind.CLIENT else "server"
        out.append(Log(f"supervisor: uid {entry.uid} ({who} of generation "
                       f"{entry.generation}) is job {native}", logging.DEBUG))
        if entry.cancel or self.stopped:  # stopped: no job may outlive the supervisor
            out.append(Cancel(entry.uid))

    @handles(ActionFailed)
    def _on_failed(self, event: ActionFailed, now: float, out: List[Action]) -> None:
        if event.action is ActionKind.CALL:
            self._looked_up(event.key, None, event.message, out)
            return
        entry = self.jobs.get(event.key)  # type: ignore[call-overload]
        if entry is None:
            return
        if entry.kind is EntryKind.LEFTOVER and event.action is ActionKind.ATTACH:
            del self.jobs[entry.uid]
            out.append(Forget(entry.uid))
            out.append(Journal({"uid": entry.uid, "final": "UNKNOWN"}))
            out.append(Log(f"supervisor: job {entry.native_id} left by an earlier supervisor "
                           f"cannot be followed (gone already?): {event.message}",
                           logging.WARNING))
            return
        if event.action is not ActionKind.SUBMIT:
            out.append(Log(f"supervisor: {event.action.value} of uid {entry.uid} failed: "
                           f"{event.message}", logging.WARNING))
            return
        unknown = outcome_unknown(event.message) and entry.name is not None
        if unknown:  # before _finished, which may stop: the stop waits for the look-up
            out.append(Log(f"supervisor: the submission of uid {entry.uid} may have queued "
                           f"its job all the same ({event.message}); cancelling any job "
                           f"named {entry.name}", logging.WARNING))
            self._look_up(entry.uid, entry.name, out)
        self._finished(entry, "FAILED", None, f"submission failed: {event.message}", now, out,
                       journal=not unknown)

    # -- submissions whose outcome is unknown -------------------------------------------------

    @handles(JobStatusChanged)
    def _on_status(self, event: JobStatusChanged, now: float, out: List[Action]) -> None:
        entry = self.jobs.get(event.key)  # type: ignore[call-overload]
        if entry is None:
            return
        status = event.status
        name = _state_name(status)
        if status.state.final:
            self._finished(entry, name, status.exit_code, status.message, now, out)
            return
        state = _REPORTED.get(name)  # None for NEW
        if state is None or state is entry.state:
            return
        self.jobs[entry.uid] = replace(entry, state=state)
        if entry.kind is EntryKind.SERVER:
            if entry.uid == self.server_uid and state is EntryState.ACTIVE:
                self.server_active_since = now
            elif entry.uid == self.server_uid and state is EntryState.QUEUED:
                # Run again (psij.requeue, psij.retry): it has until connect_timeout after
                # it is ACTIVE again.
                self.server_active_since = None
            return
        self._tell(entry, name, None, status.message, out)

    def _finished(self, entry: JobEntry, state: str, exit_code: Optional[int],
                  message: Optional[str], now: float, out: List[Action],
                  journal: bool = True) -> None:
        del self.jobs[entry.uid]
        out.append(Forget(entry.uid))
        if journal:  # every job is journaled when it is submitted: now final
            out.append(Journal({"uid": entry.uid, "final": state}))
        if entry.kind is EntryKind.LEFTOVER:
            return
        if entry.kind is EntryKind.SERVER:
            if entry.uid != self.server_uid or self.stopped:
                return
            if self.done:
                if state == "COMPLETED" and not exit_code:
                    self._stop(0, "the server finished", now, out)
                else:
                    self._stop(1, f"the server said it was done, then ended {state} "
                                  f"(exit code {exit_code}): {message or ''}".rstrip(": "),
                               now, out)
                return
            words = f"server job ended {state}"
            if exit_code is not None:
                words += f" with exit code {exit_code}"
            if message:
                words += f": {message}"
            if state == "COMPLETED":
                words += " (without saying done)"
            self._server_dead(words, now, out)
            return
        self.running_clients -= 1
        if self.clients.get(entry.client) == entry.uid:  # type: ignore[arg-type]
            del self.clients[entry.client]  # type: ignore[arg-type]
        self._tell(entry, state, exit_code, message, out)
        self._submit_queued(out)

    def _tell(self, entry: JobEntry, state: str, exit_code: Optional[int],
              message: Optional[str], out: List[Action]) -> None:
        """A status update to the server, for a client of its generation."""
        conn = self.server_conn
        if conn is None or entry.generation != self.generation or self.stopped:
            return
        out.append(Send(conn, {"type": "update", "client": entry.client, "uid": entry.uid,
                               "state": state, "exit_code": exit_code, "message": message}))

    # -- clients ----------------------------------------------------------------------------

    def _submit_client(self, pending: _Pending, out: List[Action]) -> None:
        self.running_clients += 1
        self._submit(JobEntry(pending.uid, EntryKind.CLIENT, pending.client, self.generation,
                              EntryState.SUBMITTING, None, False, pending.spec.name),
                     pending.spec, out)

    def _submit_queued(self, out: List[Action]) -> None:
        queue, limit = self.queue, self.settings.job_limit
        while queue and self.running_clients < limit:
            self._submit_client(queue.popleft(), out)

    def _request(self, conn: int, message: Any, now: float, out: List[Action]) -> None:
        try:
            request = read_request(message)
        except RequestError as error:
            ref = message.get("ref") if isinstance(message, dict) else None
            out.append(Send(conn, {"type": "refused", "ref": _plain(ref),
                                   "reason": str(error)}))
            out.append(Log(f"supervisor: refused a message from the server: {error}",
                           logging.WARNING))
            return
        self._request_rules[request.kind](self, conn, request, out)

    def _ask_pong(self, conn: int, request: Request, out: List[Action]) -> None:
        """The server's answer to a ping: it is alive (seen by :meth:`_on_message`)."""

    def _ask_ping(self, conn: int, request: Request, out: List[Action]) -> None:
        out.append(Send(conn, {"type": "pong"} if request.ref is None
                        else {"type": "pong", "ref": _plain(request.ref)}))

    def _ask_done(self, conn: int, request: Request, out: List[Action]) -> None:
        self.done = True
        out.append(Send(conn, {"type": "accepted", "ref": request.ref}))
        out.append(Log("supervisor: the server is done; cancelling its clients left"))
        self._cancel_clients(out)

    def _ask_hello(self, conn: int, request: Request, out: List[Action]) -> None:
        self._refuse(conn, request, "already connected: hello comes once", out)

    def _refuse(self, conn: int, request: Request, reason: str, out: List[Action]) -> None:
        out.append(Send(conn, {"type": "refused", "ref": request.ref, "client": request.client,
                               "reason": reason}))
        out.append(Log(f"supervisor: refused {request.kind.value} of client {request.client!r}: "
                       f"{reason}", logging.WARNING))

    def _ask_submit(self, conn: int, request: Request, out: List[Action]) -> None:
        client = request.client
        assert client is not None
        if self.stopped:
            self._refuse(conn, request, "the supervisor is stopping", out)
            return
        if self.done:
            self._refuse(conn, request, "the server said it was done", out)
            return
        if client in self.clients:
            self._refuse(conn, request, f"client {client!r} is already submitted and not "
                                        f"final (uid {self.clients[client]})", out)
            return
        settings = self.settings
        if request.spec is not None:
            doc = request.spec
        elif settings.client_template is None:
            self._refuse(conn, request, "no client_template is configured: give the job as "
                                        "'spec'", out)
            return
        else:
            doc = dict(settings.client_template)
            doc["arguments"] = list(doc.get("arguments") or []) + list(request.arguments or [])
        uid = self.next_uid
        env = {ENV_CLIENT: client, ENV_UID: str(uid), ENV_GROUP_SIZE: str(request.group_size),
               ENV_GENERATION: str(self.generation)}
        try:
            spec = build_spec(doc, uid, client, env, settings.output_dir, settings.std_output,
                              self.marker)
        except RequestError as error:
            self._refuse(conn, request, str(error), out)
            return
        self._take_uid()
        self.clients[client] = uid
        queued = self.running_clients >= settings.job_limit
        out.append(Send(conn, {"type": "accepted", "ref": request.ref, "client": client,
                               "uid": uid, "queued": queued}))
        pending = _Pending(uid, client, spec)
        if queued:
            self.queue.append(pending)
        else:
            self._submit_client(pending, out)

    def _ask_cancel(self, conn: int, request: Request, out: List[Action]) -> None:
        client = request.client
        uid = self.clients.get(client)  # type: ignore[arg-type]
        if uid is None:
            self._refuse(conn, request, f"no client {client!r} is submitted and not final",
                         out)
            return
        out.append(Send(conn, {"type": "accepted", "ref": request.ref, "client": client,
                               "uid": uid}))
        entry = self.jobs.get(uid)
        if entry is None:  # still queued: it ends here
            self.queue = collections.deque(p for p in self.queue if p.uid != uid)
            del self.clients[client]  # type: ignore[arg-type]
            out.append(Send(conn, {"type": "update", "client": client, "uid": uid,
                                   "state": "CANCELED", "exit_code": None,
                                   "message": "cancelled before it was submitted"}))
            return
        self._cancel(entry, out)

    def _cancel(self, entry: JobEntry, out: List[Action]) -> None:
        if entry.cancel:
            return
        self.jobs[entry.uid] = replace(entry, cancel=True)
        if entry.state is not EntryState.SUBMITTING:
            out.append(Cancel(entry.uid))

    def _cancel_clients(self, out: List[Action]) -> None:
        self.queue.clear()
        for entry in list(self.jobs.values()):
            if entry.kind is EntryKind.CLIENT:
                self._cancel(entry, out)

    # -- connections ------------------------------------------------------------------------

    @handles(Connected)
    def _on_connected(self, event: Connected, now: float, out: List[Action]) -> None:
        if self.stopped:
            out.append(Close(event.conn))
            return
        self.strangers[event.conn] = now
        out.append(Log(f"supervisor: connection {event.conn} from {_peer(event.peer)}",
                       logging.DEBUG))

    @handles(MessageReceived)
    def _on_message(self, event: MessageReceived, now: float, out: List[Action]) -> None:
        conn = event.conn
        if conn == self.server_conn:
            self.last_seen = now
            self._request(conn, event.message, now, out)
        elif conn in self.strangers:
            self._hello(conn, event.message, now, out)

    def _hello(self, conn: int, message: Any, now: float, out: List[Action]) -> None:
        del self.strangers[conn]
        token = message.get("token") if isinstance(message, dict) else None
        reason = None
        if not isinstance(message, dict) or message.get("type") != "hello":
            reason = "the first message must be {\"type\": \"hello\", \"token\": ...}"
        elif not isinstance(token, str) or not token:
            reason = "hello: 'token' must be the text of PSIJ_SUPERVISOR_TOKEN"
        elif token in self.old_tokens:
            reason = (f"hello: token of server generation {self.old_tokens[token]}, which "
                      f"was replaced by generation {self.generation}")
        elif token != self.token or self.server_uid is None:
            reason = "hello: wrong token"
        elif self.server_conn is not None:
            reason = f"hello: server generation {self.generation} is already connected"
        if reason is not None:
            out.append(Send(conn, {"type": "refused", "reason": reason}))
            out.append(Close(conn))
            out.append(Log(f"supervisor: refused connection {conn}: {reason}",
                           logging.WARNING))
            return
        self.server_conn = conn
        self.last_seen = now
        out.append(Send(conn, {"type": "welcome", "generation": self.generation,
                               "uid": self.server_uid, "ping_interval": self.settings.tick,
                               "fault_tolerance": self.settings.fault_tolerance}))
        out.append(Log(f"supervisor: server generation {self.generation} connected"))

    @handles(BadMessage)
    def _on_bad_message(self, event: BadMessage, now: float, out: List[Action]) -> None:
        conn = event.conn
        if conn == self.server_conn:
            self.last_seen = now
        refused = {"type": "refused", "reason": f"bad message: {event.reason}"}
        if isinstance(event.message, dict) and _plain(event.message.get("ref")) is not None:
            refused["ref"] = _plain(event.message["ref"])  # its caller waits for it
        out.append(Send(conn, refused))
        out.append(Log(f"supervisor: bad message on connection {conn}: {event.reason}",
                       logging.WARNING))

    @handles(Disconnected)
    def _on_disconnected(self, event: Disconnected, now: float, out: List[Action]) -> None:
        conn = event.conn
        self.strangers.pop(conn, None)
        if conn != self.server_conn:
            return
        self.server_conn = None
        if self.done or self.stopped:
            return
        self._server_dead(f"connection shut down ({event.reason})", now, out)

    # -- time and signals -------------------------------------------------------------------

    @handles(Tick)
    def _on_tick(self, event: Tick, now: float, out: List[Action]) -> None:
        if self.stopped:
            return
        tick = self.settings.tick
        for stranger, since in list(self.strangers.items()):
            if now - since > 2 * tick:
                del self.strangers[stranger]
                out.append(Send(stranger, {"type": "refused", "reason": "no hello in time"}))
                out.append(Close(stranger))
        conn = self.server_conn
        if conn is not None:
            silent = now - self.last_seen
            if silent > 2 * tick and not self.done:
                self._server_dead(f"no message for {silent:.1f} s (limit {2 * tick:g} s)",
                                  now, out)
                return
            out.append(Send(conn, {"type": "ping"}))
            return
        active = self.server_active_since
        if active is not None and self.server_uid is not None \
                and now - active > self.settings.connect_timeout:
            self._server_dead(f"running for {now - active:.1f} s without connecting "
                              f"(connect_timeout {self.settings.connect_timeout:g} s)",
                              now, out)

    @handles(SignalReceived)
    def _on_signal(self, event: SignalReceived, now: float, out: List[Action]) -> None:
        if self.stopped:
            if not self.stop_sent:  # a second signal: stop without waiting any more
                if self._stop_timer:
                    self._stop_timer = False
                    out.append(CancelTimer(_STOP_TIMER))
                self._give_up_waiting(f"signal {event.signum} while waiting", out)
            return
        self._stop(exit_code_for_signal(event.signum), f"signal {event.signum}", now, out)

    # A server's requests, by kind: read_request refuses any other kind before this.
    _request_rules: ClassVar[Dict[RequestKind, Callable[["Supervisor", int, Request,
                                                         List[Action]], None]]] = {
        RequestKind.SUBMIT: _ask_submit, RequestKind.CANCEL: _ask_cancel,
        RequestKind.PING: _ask_ping, RequestKind.PONG: _ask_pong, RequestKind.DONE: _ask_done,
        RequestKind.HELLO: _ask_hello}
