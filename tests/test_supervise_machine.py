"""The supervisor machine (psij.supervise.Supervisor) driven by events on a manual clock:
every transition of the guide's state table, and hostile messages."""

import logging
from typing import Any, Dict, List, Optional

import pytest

from psij import JobState, JobStatus
from psij._clock import ManualClock
from psij.controller import (
    ActionDone,
    ActionFailed,
    Attach,
    BadMessage,
    Call,
    Cancel,
    CancelTimer,
    Close,
    Connected,
    Disconnected,
    Forget,
    JobStatusChanged,
    Log,
    MessageReceived,
    Peer,
    Send,
    SetTimer,
    SignalReceived,
    Started,
    Stop,
    Submit,
    Tick,
    TimerFired,
)
from psij.supervise import EntryState, Settings, Supervisor
from psij.supervise._machine import Journal

T = 1.0
PEER = Peer(1, 2, 3, "")


def settings(**changes: Any) -> Settings:
    values: Dict[str, Any] = dict(
        server={"executable": "/bin/server"}, client_template={"executable": "/bin/client",
                                                               "arguments": ["-x"]},
        output_dir="/out", address="unix:/out/s", job_limit=1000, tick=T,
        fault_tolerance=True, max_server_restarts=2, std_output=True, connect_timeout=10.0,
        stop_grace=5.0)
    values.update(changes)
    return Settings(**values)


class Rig:
    """A machine, a manual clock, and helpers that feed it events."""

    def __init__(self, leftovers: Any = (), first_uid: int = 0, first_generation: int = 0,
                 unsure: Any = (), cancel_named: Any = None, cleanup: bool = False,
                 **changes: Any) -> None:
        self.tokens = iter(f"token{i}" for i in range(1, 100))
        self.machine = Supervisor(settings(**changes), new_token=lambda: next(self.tokens),
                                  leftovers=leftovers, first_uid=first_uid,
                                  first_generation=first_generation, marker="m",
                                  unsure=unsure, cancel_named=cancel_named, cleanup=cleanup)
        self.clock = ManualClock(1000.0)
        self.conn = 0

    def step(self, event: Any) -> List[Any]:
        """The actions but the log lines, the journal entries and the stop timer (tested on
        their own)."""
        return [a for a in self.machine.step(event, self.clock.now())
                if type(a) not in (Log, Journal, SetTimer, CancelTimer)]

    def logs(self, event: Any) -> List[Any]:
        return [a for a in self.machine.step(event, self.clock.now()) if type(a) is Log]

    def start(self) -> Submit:
        actions = self.step(Started())
        assert len(actions) == 1 and type(actions[0]) is Submit
        return actions[0]

    def connect(self, token: Optional[str] = None) -> int:
        self.conn += 1
        assert self.step(Connected(self.conn, PEER, "unix")) == []
        actions = self.step(MessageReceived(self.conn, {
            "type": "hello", "token": token or self.machine.token}))
        assert actions[0] == Send(self.conn, {
            "type": "welcome", "generation": self.machine.generation,
            "uid": self.machine.server_uid, "ping_interval": T,
            "fault_tolerance": self.machine.settings.fault_tolerance}), actions
        return self.conn

    def running(self) -> int:
        """Started, the server submitted, running and connected; returns the connection."""
        self.start()
        self.step(ActionDone(0, "submit", "1000"))
        self.step(JobStatusChanged(0, JobStatus(JobState.ACTIVE)))
        return self.connect()

    def ask(self, conn: int, message: Dict[str, Any]) -> List[Any]:
        return self.step(MessageReceived(conn, message))

    def status(self, uid: int, state: JobState, exit_code: Optional[int] = None,
               message: Optional[str] = None) -> List[Any]:
        return self.step(JobStatusChanged(uid, JobStatus(state, message=message,
                                                         exit_code=exit_code)))


def of(actions: List[Any], kind: type) -> List[Any]:
    return [a for a in actions if type(a) is kind]


def sent(actions: List[Any]) -> List[Dict[str, Any]]:
    return [a.message for a in of(actions, Send)]


# -- the server ----------------------------------------------------------------------------

def test_start_submits_the_server_with_address_token_generation_and_uid_named_output() -> None:
    rig = Rig()
    submit = rig.start()
    assert submit.key == 0
    env = submit.spec.environment
    assert env["PSIJ_SUPERVISOR"] == "unix:/out/s"
    assert env["PSIJ_SUPERVISOR_TOKEN"] == "token1"
    assert env["PSIJ_SUPERVISOR_GENERATION"] == "1"
    assert env["PSIJ_SUPERVISE_UID"] == "0"
    assert str(submit.spec.stdout_path) == "/out/job.0.server.out"
    assert str(submit.spec.stderr_path) == "/out/job.0.server.err"
    assert submit.spec.executable == "/bin/server"


def test_a_jobs_state_is_an_entry_state_from_submission_to_its_last_reported_state() -> None:
    rig = Rig()
    rig.start()
    assert rig.machine.jobs[0].state is EntryState.SUBMITTING
    rig.step(ActionDone(0, "submit", "1000"))
    assert rig.machine.jobs[0].state is EntryState.SUBMITTED
    assert rig.status(0, JobState.NEW) == [] and rig.machine.jobs[0].state is EntryState.SUBMITTED
    rig.status(0, JobState.QUEUED)
    assert rig.machine.jobs[0].state is EntryState.QUEUED
    rig.status(0, JobState.ACTIVE)
    assert rig.machine.jobs[0].state is EntryState.ACTIVE
    assert rig.machine.server_active_since == rig.clock.now()
    # Every non-final PSI/J state but NEW is one, by the same name (what the server is told).
    assert {s.value for s in EntryState} - {"SUBMITTING", "SUBMITTED"} == \
        {s.name for s in JobState if not s.final and s is not JobState.NEW}


def test_std_output_false_gives_no_job_output_files() -> None:
    rig = Rig(std_output=False)
    submit = rig.start()
    assert submit.spec.stdout_path is None and submit.spec.stderr_path is None


def test_server_connects_with_its_token_and_is_pinged_every_tick() -> None:
    rig = Rig()
    conn = rig.running()
    rig.clock.advance(T)
    assert rig.step(Tick()) == [Send(conn, {"type": "ping"})]


def test_any_message_counts_as_alive_and_silence_over_2t_is_death() -> None:
    rig = Rig()
    conn = rig.running()
    rig.clock.advance(1.5 * T)
    rig.ask(conn, {"type": "pong"})
    rig.clock.advance(2 * T)  # exactly 2T since the pong: still alive
    assert rig.step(Tick()) == [Send(conn, {"type": "ping"})]
    rig.clock.advance(0.01)
    actions = rig.step(Tick())
    assert Cancel(0) in actions  # the server job
    assert Close(conn) in actions
    assert of(actions, Submit)[0].key == 1  # a new server, next uid
    assert rig.machine.generation == 2


def test_server_job_failing_is_death_clients_cancelled_and_a_new_server_submitted() -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": ["1"]})
    rig.step(ActionDone(1, "submit", "1001"))
    actions = rig.status(0, JobState.FAILED, exit_code=9, message="boom")
    assert Cancel(1) in actions and Forget(0) in actions
    assert Cancel(0) not in actions  # already final
    submit = of(actions, Submit)[0]
    assert submit.key == 2
    assert submit.spec.environment["PSIJ_SUPERVISOR_TOKEN"] == "token2"
    assert submit.spec.environment["PSIJ_SUPERVISOR_GENERATION"] == "2"
    # The cancelled client's end is not told to the new server.
    rig.connect()
    assert rig.status(1, JobState.CANCELED) == [Forget(1)]


def test_connection_shutdown_is_death() -> None:
    rig = Rig()
    conn = rig.running()
    actions = rig.step(Disconnected(conn, "closed by the peer"))
    assert Cancel(0) in actions and of(actions, Submit)[0].key == 1


def test_fault_tolerance_off_stops_with_exit_code_1_and_the_reason() -> None:
    rig = Rig(fault_tolerance=False)
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    rig.step(ActionDone(1, "submit", "1001"))
    actions = rig.step(Disconnected(conn, "closed by the peer"))
    assert Cancel(0) in actions and Cancel(1) in actions
    assert not of(actions, Submit) and not of(actions, Stop)  # the jobs end first
    rig.status(0, JobState.CANCELED)
    rig.clock.advance(1.0)
    stop = of(rig.status(1, JobState.CANCELED), Stop)[0]
    assert stop.exit_code == 1 and "fault_tolerance is off" in stop.reason
    assert "connection shut down" in stop.reason and stop.grace == 4.0  # what is left of 5


def test_restart_limit_stops_with_an_error() -> None:
    rig = Rig(max_server_restarts=2)
    rig.start()
    for generation in (1, 2):
        actions = rig.step(ActionFailed(rig.machine.server_uid, "submit", "sbatch: error",
                                        None))
        assert of(actions, Submit), generation
    actions = rig.step(ActionFailed(rig.machine.server_uid, "submit", "sbatch: error", None))
    stop = of(actions, Stop)[0]
    assert stop.exit_code == 1 and "max_server_restarts=2" in stop.reason
    assert "submission failed: sbatch: error" in stop.reason


def test_running_server_that_never_connects_is_dead_after_connect_timeout() -> None:
    rig = Rig(connect_timeout=10.0)
    rig.start()
    rig.status(0, JobState.QUEUED)
    rig.clock.advance(100)  # queued for long: no limit
    assert rig.step(Tick()) == []
    rig.status(0, JobState.ACTIVE)
    rig.clock.advance(10)
    assert rig.step(Tick()) == []
    rig.clock.advance(0.5)
    actions = rig.step(Tick())
    assert Cancel(0) in actions and of(actions, Submit)


def test_a_server_job_queued_again_before_it_connected_gets_its_time_again() -> None:
    # Requeued (psij.requeue) while it had not connected yet: the connect_timeout counts
    # from its next start, not from the first.
    rig = Rig(connect_timeout=10.0)
    rig.start()
    rig.status(0, JobState.QUEUED)
    rig.status(0, JobState.ACTIVE)
    rig.clock.advance(8)
    assert rig.step(Tick()) == []
    rig.status(0, JobState.QUEUED)
    rig.clock.advance(100)  # queued again for long: no limit
    assert rig.step(Tick()) == []
    rig.status(0, JobState.ACTIVE)
    rig.clock.advance(10)
    assert rig.step(Tick()) == []
    rig.clock.advance(0.5)
    actions = rig.step(Tick())
    assert Cancel(0) in actions and of(actions, Submit)


# -- hello ---------------------------------------------------------------------------------

def test_wrong_token_refused_logged_and_closed() -> None:
    rig = Rig()
    rig.start()
    rig.step(Connected(5, PEER, "unix"))
    actions = rig.machine.step(MessageReceived(5, {"type": "hello", "token": "nope"}), 0)
    assert Send(5, {"type": "refused", "reason": "hello: wrong token"}) in actions
    assert Close(5) in actions
    assert any(type(a) is Log and a.level == logging.WARNING for a in actions)
    assert rig.machine.server_conn is None


def test_stale_generation_refused_naming_it() -> None:
    rig = Rig()
    conn = rig.running()
    rig.step(Disconnected(conn, "closed by the peer"))  # generation 2 submitted
    rig.step(Connected(9, PEER, "unix"))
    actions = rig.ask(9, {"type": "hello", "token": "token1"})
    assert "generation 1" in sent(actions)[0]["reason"]
    assert Close(9) in actions
    rig.connect("token2")  # the current one still gets in


def test_first_message_must_be_hello_and_a_second_server_connection_is_refused() -> None:
    rig = Rig()
    rig.running()
    rig.step(Connected(7, PEER, "unix"))
    actions = rig.ask(7, {"type": "submit", "client": "x", "arguments": []})
    assert "first message must be" in sent(actions)[0]["reason"] and Close(7) in actions
    rig.step(Connected(8, PEER, "unix"))
    actions = rig.ask(8, {"type": "hello", "token": "token1"})
    assert "already connected" in sent(actions)[0]["reason"]


def test_a_connection_without_hello_is_closed_after_2t() -> None:
    rig = Rig()
    rig.start()
    rig.step(Connected(4, PEER, "unix"))
    rig.clock.advance(2 * T + 0.1)
    assert Close(4) in rig.step(Tick())


# -- clients -------------------------------------------------------------------------------

def test_client_submit_by_arguments_accepted_with_uid_and_updates_sent() -> None:
    rig = Rig()
    conn = rig.running()
    actions = rig.ask(conn, {"type": "submit", "client": "c1", "arguments": ["7"], "ref": 3,
                             "group_size": 4})
    assert sent(actions) == [{"type": "accepted", "ref": 3, "client": "c1", "uid": 1,
                              "queued": False}]
    submit = of(actions, Submit)[0]
    assert submit.key == 1 and submit.spec.executable == "/bin/client"
    assert submit.spec.arguments == ["-x", "7"]
    env = submit.spec.environment
    assert env["PSIJ_SUPERVISE_CLIENT"] == "c1" and env["PSIJ_SUPERVISE_GROUP_SIZE"] == "4"
    assert str(submit.spec.stdout_path) == "/out/job.1.c1.out"
    assert rig.step(ActionDone(1, "submit", "77")) == []
    assert sent(rig.status(1, JobState.QUEUED)) == [
        {"type": "update", "client": "c1", "uid": 1, "state": "QUEUED", "exit_code": None,
         "message": None}]
    actions = rig.status(1, JobState.COMPLETED, exit_code=0)
    assert sent(actions)[0]["state"] == "COMPLETED" and sent(actions)[0]["exit_code"] == 0
    assert Forget(1) in actions
    # The id is free again: a new attempt gets the next uid.
    actions = rig.ask(conn, {"type": "submit", "client": "c1", "arguments": []})
    assert sent(actions)[0]["uid"] == 2


def test_client_submit_by_spec_and_bad_specs_refused() -> None:
    rig = Rig(client_template=None)
    conn = rig.running()
    actions = rig.ask(conn, {"type": "submit", "client": "s", "spec": {
        "executable": "/bin/echo", "arguments": ["hi"], "name": "my/job"}})
    submit = of(actions, Submit)[0]
    assert submit.spec.arguments == ["hi"]
    assert str(submit.spec.stdout_path) == "/out/job.1.my_job.out"
    refused = sent(rig.ask(conn, {"type": "submit", "client": "t", "arguments": ["1"]}))
    assert "no client_template" in refused[0]["reason"]
    refused = sent(rig.ask(conn, {"type": "submit", "client": "u",
                                  "spec": {"executable": 5}}))
    assert refused[0]["type"] == "refused" and "JobSpec.executable" in refused[0]["reason"]
    refused = sent(rig.ask(conn, {"type": "submit", "client": "s", "spec": {
        "executable": "/bin/echo"}}))
    assert "already submitted" in refused[0]["reason"]
    assert rig.machine.next_uid == 2  # refusals take no uid


def test_cancel_of_a_running_client_a_queued_one_and_an_unknown_one() -> None:
    rig = Rig(job_limit=1)
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    queued = rig.ask(conn, {"type": "submit", "client": "b", "arguments": []})
    assert sent(queued)[0]["queued"] is True and not of(queued, Submit)
    rig.step(ActionDone(1, "submit", "11"))
    actions = rig.ask(conn, {"type": "cancel", "client": "a", "ref": "x"})
    assert Cancel(1) in actions and sent(actions)[0]["type"] == "accepted"
    actions = rig.ask(conn, {"type": "cancel", "client": "b"})
    assert [m["type"] for m in sent(actions)] == ["accepted", "update"]
    assert sent(actions)[1]["state"] == "CANCELED"
    actions = rig.ask(conn, {"type": "cancel", "client": "zz"})
    assert sent(actions)[0]["type"] == "refused" and "'zz'" in sent(actions)[0]["reason"]
    # b was dropped from the queue: a's end submits nothing.
    assert not of(rig.status(1, JobState.CANCELED), Submit)


def test_job_limit_queues_requests_in_order() -> None:
    rig = Rig(job_limit=2)
    conn = rig.running()
    for name in "abcd":
        rig.ask(conn, {"type": "submit", "client": name, "arguments": []})
    assert [p.client for p in rig.machine.queue] == ["c", "d"]
    rig.step(ActionDone(1, "submit", "1"))
    actions = rig.status(1, JobState.COMPLETED, exit_code=0)
    assert [a.key for a in of(actions, Submit)] == [3]  # c, in order
    actions = rig.step(ActionFailed(2, "submit", "no", None))  # b failed to submit
    assert [a.key for a in of(actions, Submit)] == [4]  # d
    assert rig.machine.running_clients == 2


def test_a_client_submit_that_raises_is_told_as_failed() -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    actions = rig.step(ActionFailed(1, "submit", "sbatch: error: invalid account", None))
    assert sent(actions) == [{"type": "update", "client": "a", "uid": 1, "state": "FAILED",
                              "exit_code": None,
                              "message": "submission failed: sbatch: error: invalid account"}]
    assert rig.machine.running_clients == 0 and Forget(1) in actions


def test_server_dying_while_a_client_submission_is_in_flight_cancels_it_when_it_returns() -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    actions = rig.step(Disconnected(conn, "closed by the peer"))
    assert Cancel(1) not in actions  # not submitted yet
    assert rig.step(ActionDone(1, "submit", "55")) == [Cancel(1)]


def test_done_then_server_completing_stops_with_0_and_cancels_clients_left() -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    rig.step(ActionDone(1, "submit", "1"))
    actions = rig.ask(conn, {"type": "done", "ref": 1})
    assert {"type": "accepted", "ref": 1} in sent(actions) and Cancel(1) in actions
    assert "said it was done" in sent(rig.ask(conn, {"type": "submit", "client": "b",
                                                     "arguments": []}))[0]["reason"]
    assert rig.step(Disconnected(conn, "closed by the peer")) == []
    actions = rig.status(0, JobState.COMPLETED, exit_code=0)
    assert not of(actions, Stop)  # client a, cancelled, has not ended yet
    assert Stop(0, "the server finished", 5.0) in rig.status(1, JobState.CANCELED)


def test_done_then_server_failing_stops_with_1() -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "done"})
    stop = of(rig.status(0, JobState.FAILED, exit_code=3), Stop)[0]
    assert stop.exit_code == 1 and "exit code 3" in stop.reason


# -- signals -------------------------------------------------------------------------------

@pytest.mark.parametrize("signum,code", [(2, 130), (15, 143)])
def test_signal_cancels_every_job_and_stops_with_the_shell_code(signum: int, code: int) -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    rig.ask(conn, {"type": "submit", "client": "b", "arguments": []})
    rig.step(ActionDone(1, "submit", "1"))
    actions = rig.machine.step(SignalReceived(signum), rig.clock.now())
    assert Cancel(0) in actions and Cancel(1) in actions and Cancel(2) not in actions
    # Stopping waits for the jobs to end, at most stop_grace.
    assert not of(actions, Stop) and SetTimer(("psij.supervise", "stop"), 5.0) in actions
    assert rig.step(ActionDone(2, "submit", "2")) == [Cancel(2)]  # in flight: cancelled now
    assert rig.step(Connected(9, PEER, "unix")) == [Close(9)]
    # Requests that were on their way are refused; nothing is submitted any more.
    actions = rig.ask(conn, {"type": "submit", "client": "late", "arguments": []})
    assert sent(actions)[0]["reason"] == "the supervisor is stopping"
    assert not of(actions, Submit)
    for uid in (0, 1):
        assert not of(rig.status(uid, JobState.CANCELED), Stop)
    rig.clock.advance(2.0)
    actions = rig.machine.step(JobStatusChanged(2, JobStatus(JobState.CANCELED)),
                               rig.clock.now())
    assert Stop(code, f"signal {signum}", 3.0) in actions
    assert CancelTimer(("psij.supervise", "stop")) in actions
    assert not of(rig.step(SignalReceived(signum)), Stop)  # one stop


def test_stop_grace_passing_stops_without_the_jobs_that_did_not_end_and_names_them() -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    rig.step(SignalReceived(2))
    rig.status(0, JobState.CANCELED)
    actions = rig.machine.step(TimerFired(("psij.supervise", "stop")), rig.clock.now())
    assert Stop(130, "signal 2", 0.0) in actions
    words = next(a.message for a in of(actions, Log))
    assert "1 job(s) not seen ending: uid 1 (a.u1.m)" in words and "--cleanup" in words


def test_a_second_signal_while_jobs_end_stops_at_once() -> None:
    rig = Rig()
    rig.running()
    rig.step(SignalReceived(15))
    actions = rig.machine.step(SignalReceived(15), rig.clock.now())
    assert Stop(143, "signal 15", 0.0) in actions
    assert CancelTimer(("psij.supervise", "stop")) in actions
    assert any("uid 0 (1000)" in a.message for a in of(actions, Log))


# -- hostile messages ----------------------------------------------------------------------

@pytest.mark.parametrize("message,words", [
    ([1, 2], "JSON object"),
    ("text", "JSON object"),
    ({"type": "frobnicate"}, "type: expected one of submit"),
    ({"no": "type"}, "type: expected one of"),
    ({"type": ["ping"]}, "type: expected one of submit, cancel, ping, pong, done, hello"),
    ({"type": "PING"}, "type: expected one of"),
    ({"type": "submit", "client": "a"}, "either as 'spec'"),
    ({"type": "submit", "client": "a", "arguments": [], "spec": {}}, "either as 'spec'"),
    ({"type": "submit", "client": "", "arguments": []}, "client: expected a non-empty"),
    ({"type": "submit", "client": "x" * 300, "arguments": []}, "at most 256"),
    ({"type": "submit", "client": "a\ud800", "arguments": []}, "lone surrogate"),
    ({"type": "submit", "client": "a\0", "arguments": []}, "without NUL"),
    ({"type": "submit", "client": 5, "arguments": []}, "client: expected"),
    ({"type": "submit", "client": "a", "arguments": [1]}, "arguments[0]"),
    ({"type": "submit", "client": "a", "arguments": "ls"}, "arguments: expected a list"),
    ({"type": "submit", "client": "a", "arguments": [], "group_size": float("nan")},
     "group_size"),
    ({"type": "submit", "client": "a", "arguments": [], "group_size": float("inf")},
     "group_size"),
    ({"type": "submit", "client": "a", "arguments": [], "group_size": -1}, "group_size"),
    ({"type": "submit", "client": "a", "arguments": [], "group_size": 10 ** 30},
     "group_size"),
    ({"type": "submit", "client": "a", "arguments": [], "group_size": True}, "group_size"),
    ({"type": "submit", "client": "a", "spec": [1]}, "spec: expected a JSON object"),
    ({"type": "submit", "client": "a", "spec": {"executable": "/x", "bogus": 1}}, "bogus"),
    ({"type": "submit", "client": "a", "spec": {"executable": "/x", "environment": 3}},
     "environment"),
    ({"type": "submit", "client": "a", "spec": {"executable": "/x", "arguments": ["\udfff"]}},
     "spec.arguments[0]: '\\udfff' holds a lone surrogate"),
    ({"type": "submit", "client": "a", "arguments": ["ok", "\ud800x"]},
     "arguments[1]: '\\ud800x' holds a lone surrogate"),
    ({"type": "submit", "client": "a", "spec": {"executable": "/x", "environment": {
        "\ud800": "v"}}}, "spec.environment key"),
    ({"type": "cancel"}, "cancel: client"),
    ({"type": "ping", "extra": 1}, "unknown field"),
])
def test_bad_messages_are_refused_and_the_machine_goes_on(message: Any, words: str) -> None:
    rig = Rig()
    conn = rig.running()
    actions = rig.machine.step(MessageReceived(conn, message), rig.clock.now())
    answers = sent(actions)
    assert answers[0]["type"] == "refused" and words in answers[0]["reason"], answers
    assert of(actions, Close) == [] and rig.machine.server_conn == conn
    assert sent(rig.ask(conn, {"type": "ping"})) == [{"type": "pong"}]


def test_garbage_and_too_long_lines_are_refused_and_count_as_alive() -> None:
    rig = Rig()
    conn = rig.running()
    rig.clock.advance(1.9 * T)
    actions = rig.step(BadMessage(conn, "line is not JSON: Expecting value"))
    assert sent(actions)[0]["type"] == "refused" and "ref" not in sent(actions)[0]
    # JSON with a value no message may hold: refused with its ref, for the waiting caller.
    actions = rig.step(BadMessage(conn, "group_size: NaN is not a finite number",
                                  "group_size", {"type": "submit", "ref": 4,
                                                 "group_size": float("nan")}))
    assert sent(actions)[0] == {"type": "refused", "ref": 4, "reason": "bad message: "
                                "group_size: NaN is not a finite number"}
    rig.clock.advance(1.9 * T)
    assert rig.step(Tick()) == [Send(conn, {"type": "ping"})]
    # A too long line closes the connection in the loop: that is a shutdown.
    rig.step(BadMessage(conn, "line longer than 1048576 bytes"))
    assert of(rig.step(Disconnected(conn, "line too long")), Submit)


def test_unknown_events_and_strangers_status_are_ignored() -> None:
    rig = Rig()
    rig.running()
    assert rig.status(99, JobState.COMPLETED) == []
    assert rig.step(ActionDone(99, "cancel", None)) == []
    assert rig.step(MessageReceived(42, {"type": "ping"})) == []


# -- the journal and the jobs an earlier supervisor left ------------------------------------

def test_the_journal_records_each_submission_before_it_runs_and_each_end() -> None:
    rig = Rig()
    machine = rig.machine
    started = machine.step(Started(), 0)
    # Journaled first, with its unique job name: found by it if the submission is cut short.
    assert [type(a) for a in started if type(a) in (Journal, Submit)] == [Journal, Submit]
    assert of(started, Journal) == [Journal(
        {"uid": 0, "kind": "server", "client": None, "generation": 1, "name": "server.u0.m"})]
    assert of(started, Submit)[0].spec.name == "server.u0.m"
    assert of(machine.step(ActionDone(0, "submit", "900"), 0), Journal) == [Journal(
        {"uid": 0, "kind": "server", "client": None, "generation": 1, "name": "server.u0.m",
         "native_id": "900"})]
    rig.connect()
    asked = machine.step(MessageReceived(rig.conn, {"type": "submit", "client": "a",
                                                    "arguments": []}), 0)
    assert of(asked, Journal)[0].entry["name"] == "a.u1.m"
    assert of(machine.step(ActionDone(1, "submit", "901"), 0), Journal)[0].entry["client"] \
        == "a"
    ended = machine.step(JobStatusChanged(1, JobStatus(JobState.COMPLETED, exit_code=0)), 0)
    assert of(ended, Journal) == [Journal({"uid": 1, "final": "COMPLETED"})]
    # A submission that failed ends FAILED in the journal.
    machine.step(MessageReceived(rig.conn, {"type": "submit", "client": "b",
                                            "arguments": []}), 0)
    assert of(machine.step(ActionFailed(2, "submit", "no", None), 0), Journal) == [
        Journal({"uid": 2, "final": "FAILED"})]


def test_journal_lines_are_written_as_before_kinds_were_an_enum() -> None:
    import json

    from psij.supervise import EntryKind
    rig = Rig()
    lines = []
    for event in (Started(), ActionDone(0, "submit", "900")):
        for action in rig.machine.step(event, 0):
            if type(action) is Journal:
                assert type(action.entry["kind"]) is str
                lines.append(json.dumps(action.entry, separators=(",", ":")))
    assert lines == [
        '{"uid":0,"kind":"server","client":null,"generation":1,"name":"server.u0.m"}',
        '{"uid":0,"kind":"server","client":null,"generation":1,"name":"server.u0.m",'
        '"native_id":"900"}']
    assert rig.machine.jobs[0].kind is EntryKind.SERVER
    rig.connect()
    rig.ask(rig.conn, {"type": "submit", "client": "a", "arguments": []})
    assert rig.machine.jobs[1].kind is EntryKind.CLIENT


def test_every_kind_of_request_has_one_rule() -> None:
    from psij.supervise._messages import KINDS, RequestKind, read_request
    assert set(Supervisor._request_rules) == set(RequestKind)
    assert KINDS == ("submit", "cancel", "ping", "pong", "done", "hello")
    extra = {RequestKind.SUBMIT: {"client": "a", "arguments": []},
             RequestKind.CANCEL: {"client": "a"}}
    for kind in RequestKind:
        assert read_request({"type": kind.value, **extra.get(kind, {})}).kind is kind


def test_job_names_are_plain_unique_and_at_most_64_characters() -> None:
    from psij._scripts.quoting import plain_job_name
    from psij.supervise._messages import marked_name

    for given in ("c17", "my/job", "9lives", "a b,c;d\u00e9", "x" * 300, "-"):
        name = marked_name(given, 12345, "0a1b2c3d")
        assert name.endswith(".u12345.0a1b2c3d") and len(name) <= 64
        assert plain_job_name(name) == name  # every scheduler writes it as it is
    assert marked_name("c17", 3, "m") == "c17.u3.m"
    rig = Rig(client_template=None)
    conn = rig.running()
    submit = of(rig.ask(conn, {"type": "submit", "client": "s", "spec": {
        "executable": "/bin/echo", "name": "my job"}}), Submit)[0]
    assert submit.spec.name == "my_job.u1.m"
    assert str(submit.spec.stdout_path) == "/out/job.1.my_job.out"
    assert Supervisor(settings()).marker != Supervisor(settings()).marker


def test_the_server_is_told_whether_fault_tolerance_is_on() -> None:
    for on, ours, melissa in ((True, "1", "ON"), (False, "0", "OFF")):
        env = Rig(fault_tolerance=on).start().spec.environment
        assert env["PSIJ_FAULT_TOLERANCE"] == ours and env["MELISSA_FAULT_TOLERANCE"] == melissa
    rig = Rig(fault_tolerance=False)
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    client = of(rig.ask(conn, {"type": "submit", "client": "b", "arguments": []}), Submit)[0]
    assert "PSIJ_FAULT_TOLERANCE" not in client.spec.environment  # the server's only


def test_a_submission_whose_outcome_is_unknown_is_looked_up_by_name_and_cancelled() -> None:
    asked: List[str] = []
    rig = Rig(cancel_named=lambda name: asked.append(name) or ["77"])
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    actions = rig.machine.step(ActionFailed(1, "submit", "job 1: submitting failed: `sbatch "
                                            "--parsable` did not finish within 30 s and was "
                                            "killed", None), 0)
    assert sent(actions)[0]["state"] == "FAILED"  # the server is told, as for any failure
    assert Journal({"uid": 1, "final": "FAILED"}) not in actions  # not settled yet
    call = of(actions, Call)[0]
    assert call.key == ("lookup", 1) and rig.machine.lookups == {1: "a.u1.m"}
    assert call.function() == ["77"] and asked == ["a.u1.m"]
    done = rig.machine.step(ActionDone(("lookup", 1), "call", ["77"]), 0)
    assert Journal({"uid": 1, "final": "CANCELED", "native_ids": ["77"]}) in done
    # Not found: it was never queued.
    rig.ask(conn, {"type": "submit", "client": "b", "arguments": []})
    rig.machine.step(ActionFailed(2, "submit", "`sbatch` was stopped before it finished; the "
                                               "job may have been submitted", None), 0)
    done = rig.machine.step(ActionDone(("lookup", 2), "call", []), 0)
    assert Journal({"uid": 2, "final": "NOT_SUBMITTED"}) in done
    # A failed look-up leaves the submission open in the journal, for the next supervisor.
    rig.ask(conn, {"type": "submit", "client": "c", "arguments": []})
    rig.machine.step(ActionFailed(3, "submit", "may have been submitted", None), 0)
    failed = rig.machine.step(ActionFailed(("lookup", 3), "call", "squeue: timeout", None), 0)
    assert not of(failed, Journal) and rig.machine.lookups == {}
    assert "squeue: timeout" in of(failed, Log)[0].message


def test_stopping_waits_for_a_look_up_under_way() -> None:
    rig = Rig(cancel_named=lambda name: [])
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    rig.step(ActionFailed(1, "submit", "may have been submitted", None))
    rig.step(SignalReceived(2))
    assert not of(rig.status(0, JobState.CANCELED), Stop)
    assert of(rig.step(ActionDone(("lookup", 1), "call", [])), Stop)


def test_without_a_look_up_by_name_an_unknown_outcome_is_said_and_journaled_unknown() -> None:
    rig = Rig()
    conn = rig.running()
    rig.ask(conn, {"type": "submit", "client": "a", "arguments": []})
    actions = rig.machine.step(ActionFailed(1, "submit", "may have been submitted", None), 0)
    assert Journal({"uid": 1, "final": "UNKNOWN"}) in actions and not of(actions, Call)
    assert any("a.u1.m" in a.message and "look for it" in a.message
               for a in of(actions, Log))


def test_cleanup_cancels_what_the_journal_names_and_stops_once_it_is_settled() -> None:
    rig = Rig(leftovers=[(4, "700")], unsure=[(5, "c.u5.x")], cleanup=True,
              cancel_named=lambda name: ["701"], first_uid=6)
    actions = rig.step(Started())
    assert Attach(4, "700") in actions and of(actions, Call)[0].key == ("lookup", 5)
    assert not of(actions, Submit) and not of(actions, Stop)
    assert rig.step(ActionDone(4, "attach", "700")) == [Cancel(4)]
    assert not of(rig.step(ActionDone(("lookup", 5), "call", ["701"])), Stop)
    assert Stop(0, "cleaned up", 5.0) in rig.status(4, JobState.CANCELED)
    # Nothing to clean up: stops at once; something that cannot be settled: exit code 1.
    assert Stop(0, "cleaned up", 5.0) in Rig(cleanup=True).step(Started())
    stuck = Rig(leftovers=[(4, "700")], cleanup=True)
    stuck.step(Started())
    stop = of(stuck.step(TimerFired(("psij.supervise", "stop"))), Stop)[0]
    assert stop.exit_code == 1 and stop.grace == 0.0
    blind = Rig(unsure=[(5, "c.u5.x")], cleanup=True)  # the executor cannot look it up
    assert Stop(1, "cleaned up, but some jobs could not be settled", 5.0) in blind.step(
        Started())


def test_leftover_jobs_are_attached_and_cancelled_and_numbering_goes_on() -> None:
    rig = Rig(leftovers=[(4, "700"), (6, "701")], first_uid=7, first_generation=2)
    actions = rig.step(Started())
    assert actions[:2] == [Attach(4, "700"), Attach(6, "701")]
    submit = of(actions, Submit)[0]
    assert submit.key == 7 and submit.spec.environment["PSIJ_SUPERVISOR_GENERATION"] == "3"
    assert rig.step(ActionDone(4, "attach", "700")) == [Cancel(4)]
    assert rig.status(4, JobState.CANCELED) == [Forget(4)]
    # One that is gone already cannot be attached: forgotten, with a warning.
    actions = rig.machine.step(ActionFailed(6, "attach", "no such job", None), 0)
    assert Forget(6) in actions and Journal({"uid": 6, "final": "UNKNOWN"}) in actions
    assert any(type(a) is Log and "701" in a.message for a in actions)
    assert set(rig.machine.jobs) == {7}
