"""The controller loop (psij.controller) driven by scripted machines: timers on a manual clock,
connections, executor calls on workers, failures that stay contained, and signals."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

from psij import JobSpec, JobState
from psij._clock import ManualClock
from psij.controller import (
    ActionDone,
    ActionFailed,
    ActionKind,
    BadMessage,
    Call,
    Cancel,
    CancelTimer,
    Close,
    Connected,
    ControllerLoop,
    Disconnected,
    JobStatusChanged,
    Log,
    MessageReceived,
    Send,
    SetTimer,
    Started,
    Stop,
    Submit,
    Tick,
    TimerFired,
)


class Scripted:
    """A machine that records every event and answers with what ``script`` returns."""

    def __init__(self, script: Optional[Callable[[Any, float], List[Any]]] = None) -> None:
        self.events: List[Any] = []
        self.times: List[float] = []
        self.script = script

    def step(self, event: Any, now: float) -> List[Any]:
        self.events.append(event)
        self.times.append(now)
        return self.script(event, now) if self.script else []

    def of(self, kind: type) -> List[Any]:
        return [e for e in self.events if type(e) is kind]


def pump(loop: ControllerLoop, until: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "the loop did not get there in time"
        loop.run_once(0.05)


def test_started_comes_first_and_once() -> None:
    machine = Scripted()
    loop = ControllerLoop(machine, clock=ManualClock())
    loop.run_once(0)
    loop.run_once(0)
    assert machine.events == [Started()]


def test_timers_fire_on_the_manual_clock_in_order_and_can_be_replaced_or_cancelled() -> None:
    clock = ManualClock(100.0)

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [SetTimer("b", 5), SetTimer("a", 2), SetTimer("gone", 1), CancelTimer("gone"),
                    SetTimer("moved", 1), SetTimer("moved", 7)]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, clock=clock)
    loop.run_once(0)
    clock.advance(1.5)
    loop.run_once(0)
    assert machine.of(TimerFired) == []
    clock.advance(4)
    loop.run_once(0)
    assert machine.of(TimerFired) == [TimerFired("a"), TimerFired("b")]
    assert machine.times[-1] == 105.5
    clock.advance(2)
    loop.run_once(0)
    assert machine.of(TimerFired)[-1] == TimerFired("moved")
    assert len(machine.of(TimerFired)) == 3


def test_tick_repeats_every_tick_seconds() -> None:
    clock = ManualClock()
    machine = Scripted()
    loop = ControllerLoop(machine, clock=clock, tick=5)
    loop.run_once(0)
    for _ in range(3):
        clock.advance(5)
        loop.run_once(0)
    assert len(machine.of(Tick)) == 3


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", 10 ** 9])
def test_bad_tick_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match="tick"):
        ControllerLoop(Scripted(), tick=bad)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "4"])
def test_bad_worker_count_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match="workers"):
        ControllerLoop(Scripted(), workers=bad)


def test_events_posted_from_other_threads_arrive_in_order() -> None:
    machine = Scripted()
    loop = ControllerLoop(machine)
    loop.run_once(0)
    threads = [threading.Thread(target=lambda i=i: loop.post(TimerFired(i))) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pump(loop, lambda: len(machine.of(TimerFired)) == 50)
    assert sorted(e.name for e in machine.of(TimerFired)) == list(range(50))


def test_a_machine_that_raises_fails_only_that_event(caplog: pytest.LogCaptureFixture) -> None:
    def script(event: Any, now: float) -> List[Any]:
        if type(event) is TimerFired and event.name == "poison":
            raise RuntimeError("boom")
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine)
    loop.run_once(0)
    loop.post(TimerFired("poison"))
    loop.post(TimerFired("after"))
    with caplog.at_level(logging.ERROR, logger="psij.controller"):
        loop.run_once(0)
    assert machine.events[-1] == TimerFired("after")
    assert "boom" in caplog.text and "poison" in caplog.text


def test_an_unknown_action_is_logged_and_the_next_one_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return ["not an action", SetTimer("t", 0)]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, clock=ManualClock())
    with caplog.at_level(logging.ERROR, logger="psij.controller"):
        loop.run_once(0)
        loop.run_once(0)
    assert "not a controller action" in caplog.text
    assert machine.of(TimerFired) == [TimerFired("t")]


def test_log_action_writes_to_the_controller_log(caplog: pytest.LogCaptureFixture) -> None:
    loop = ControllerLoop(Scripted(lambda e, n: [Log("hello there", logging.WARNING)]
                                   if type(e) is Started else []))
    with caplog.at_level(logging.WARNING, logger="psij.controller"):
        loop.run_once(0)
    assert "hello there" in caplog.text


# -- connections -----------------------------------------------------------------------------

def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.settimeout(10)
    return sock


class Reader:
    """Reads JSON lines from ``sock`` while running ``loop`` (both on the test's thread)."""

    def __init__(self, sock: socket.socket, loop: ControllerLoop) -> None:
        self.sock = sock
        self.loop = loop
        self.buffer = b""
        sock.setblocking(False)

    def line(self) -> Any:
        deadline = time.monotonic() + 20
        while b"\n" not in self.buffer:
            assert time.monotonic() < deadline, "no line came"
            self.loop.run_once(0.01)
            try:
                chunk = self.sock.recv(4096)
            except BlockingIOError:
                continue
            assert chunk, "connection closed before a line came"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def closed(self) -> bool:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            self.loop.run_once(0.01)
            try:
                if self.sock.recv(4096) == b"":
                    return True
            except BlockingIOError:
                continue
        return False


def test_unix_connection_messages_answers_and_peer_credentials(tmp_path: Path) -> None:
    def script(event: Any, now: float) -> List[Any]:
        if type(event) is MessageReceived:
            return [Send(event.conn, {"echo": event.message})]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, max_line_bytes=1000)
    path = loop.listen_unix(str(tmp_path / "s.sock"))
    assert (os.stat(path).st_mode & 0o777) == 0o600
    try:
        loop.run_once(0)
        client = _connect(path)
        pump(loop, lambda: bool(machine.of(Connected)))
        connected = machine.of(Connected)[0]
        assert connected.peer.uid == os.getuid() and connected.peer.pid == os.getpid()
        assert connected.listener == "unix"
        client.sendall(b'{"a": 1}\n[1, 2]\n\n')
        reader = Reader(client, loop)
        assert reader.line() == {"echo": {"a": 1}}
        assert reader.line() == {"echo": [1, 2]}
        client.setblocking(True)
        client.sendall(b"garbage{\n\xff\xfe\n")
        pump(loop, lambda: len(machine.of(BadMessage)) == 2)
        reasons = [e.reason for e in machine.of(BadMessage)]
        assert "not JSON" in reasons[0] and "not UTF-8" in reasons[1]
        client.setblocking(True)
        client.sendall(b'"still open"\n')
        assert reader.line() == {"echo": "still open"}
        client.setblocking(True)
        client.sendall(b"x" * 5000)
        pump(loop, lambda: bool(machine.of(Disconnected)))
        assert "longer than 1000" in machine.of(BadMessage)[-1].reason
        assert machine.of(Disconnected)[0].reason == "line too long"
        client.close()
    finally:
        loop.close()
    assert not os.path.exists(path)


def test_close_sends_what_is_pending_then_closes(tmp_path: Path) -> None:
    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Connected:
            return [Send(event.conn, {"bye": True}), Close(event.conn), Send(event.conn, 1)]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine)
    path = loop.listen_unix(str(tmp_path / "s.sock"))
    try:
        client = _connect(path)
        reader = Reader(client, loop)
        assert reader.line() == {"bye": True}
        assert reader.closed()
        pump(loop, lambda: bool(machine.of(Disconnected)))
        assert machine.of(Disconnected)[0].reason == "closed by the controller"
        client.close()
    finally:
        loop.close()


def test_peer_closing_gives_disconnected(tmp_path: Path) -> None:
    machine = Scripted()
    loop = ControllerLoop(machine)
    path = loop.listen_unix(str(tmp_path / "s.sock"))
    try:
        client = _connect(path)
        pump(loop, lambda: bool(machine.of(Connected)))
        client.close()
        pump(loop, lambda: bool(machine.of(Disconnected)))
        assert machine.of(Disconnected)[0].reason == "closed by the peer"
    finally:
        loop.close()


def test_tcp_listener_reports_the_peer_address() -> None:
    machine = Scripted(lambda e, n: [Send(e.conn, "hi")] if type(e) is Connected else [])
    loop = ControllerLoop(machine)
    host, port = loop.listen_tcp("127.0.0.1", 0)
    try:
        client = socket.create_connection((host, port), timeout=10)
        assert Reader(client, loop).line() == "hi"
        peer = machine.of(Connected)[0].peer
        assert peer.address.startswith("127.0.0.1:") and peer.uid == -1
        client.close()
    finally:
        loop.close()


def test_a_live_socket_is_not_replaced_and_a_stale_one_is(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    first = ControllerLoop(Scripted())
    first.listen_unix(path)
    try:
        with pytest.raises(FileExistsError, match="another process is listening"):
            ControllerLoop(Scripted()).listen_unix(path)
    finally:
        first._listeners[0].sock.close()  # dies without removing its socket file
    assert os.path.exists(path)
    second = ControllerLoop(Scripted())
    second.listen_unix(path)
    second.close()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a socket"):
        ControllerLoop(Scripted()).listen_unix(str(tmp_path / "file"))


# -- executor calls ---------------------------------------------------------------------------

def test_submit_status_changes_and_completion_come_back_as_events() -> None:
    from psij import JobExecutor
    executor = JobExecutor.get_instance("local")

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [Submit("ok", JobSpec("/bin/true")),
                    Submit("bad", JobSpec("/bin/sh", ["-c", "exit 3"]))]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, executors=executor)

    def finals() -> Dict[str, Any]:
        return {e.key: e.status for e in machine.of(JobStatusChanged) if e.status.state.final}

    pump(loop, lambda: len(finals()) == 2 and len(machine.of(ActionDone)) == 2)
    assert finals()["ok"].state == JobState.COMPLETED
    assert finals()["bad"].state == JobState.FAILED and finals()["bad"].exit_code == 3
    done = {e.key: e for e in machine.of(ActionDone)}
    assert done["ok"].action is ActionKind.SUBMIT and done["ok"].result == loop.job("ok").native_id
    loop.close()


def test_submit_that_raises_and_unknown_keys_give_action_failed() -> None:
    class Refusing:
        def submit(self, job: Any) -> None:
            raise RuntimeError("queue is closed")

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [Submit("j", JobSpec("/bin/true")), Submit("k", JobSpec("/bin/true"), "nope"),
                    Cancel("never")]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, executors={"refusing": Refusing()})
    pump(loop, lambda: len(machine.of(ActionFailed)) == 3)
    failed = {e.key: e for e in machine.of(ActionFailed)}
    assert failed["j"].message == "queue is closed" and isinstance(failed["j"].error, RuntimeError)
    assert "no executor named 'nope'" in failed["k"].message and "'refusing'" in failed["k"].message
    assert failed["never"].action is ActionKind.CANCEL and "no job" in failed["never"].message
    assert failed["j"].action is ActionKind.SUBMIT
    loop.close()


def test_an_answer_names_its_action_as_an_action_kind_given_by_name_or_member() -> None:
    assert ActionDone("k", "submit", "7") == ActionDone("k", ActionKind.SUBMIT, "7")
    assert ActionDone("k", "submit", "7").action is ActionKind.SUBMIT
    assert ActionFailed("k", "call", "m", None).action == "call"  # compared with its name
    for bad in ("frobnicate", None, 3):
        with pytest.raises(ValueError, match="ActionFailed.action: expected one of submit, "
                                             "attach, cancel, call, signal"):
            ActionFailed("k", bad, "m", None)


def test_cancel_runs_on_a_worker_and_the_job_ends_cancelled() -> None:
    from psij import JobExecutor
    executor = JobExecutor.get_instance("local")

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [Submit("long", JobSpec("/bin/sleep", ["60"]))]
        if type(event) is JobStatusChanged and event.status.state == JobState.ACTIVE:
            return [Cancel("long")]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, executors=executor)
    pump(loop, lambda: any(e.status.state.final for e in machine.of(JobStatusChanged)))
    assert machine.of(JobStatusChanged)[-1].status.state == JobState.CANCELED
    pump(loop, lambda: any(e.action == "cancel" for e in machine.of(ActionDone)))
    loop.close()


def test_a_cancel_with_kill_calls_the_executors_kill_or_else_its_cancel() -> None:
    calls: List[Any] = []

    class Recording:
        def __init__(self, name: str, with_kill: bool) -> None:
            self.name = name
            if with_kill:
                self.kill = lambda job: calls.append((self.name, "kill"))

        def submit(self, job: Any) -> None:
            job._native_id = "1"

        def cancel(self, job: Any) -> None:
            calls.append((self.name, "cancel"))

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [Submit("a", JobSpec("/bin/true"), "killing"),
                    Submit("b", JobSpec("/bin/true"), "plain"),
                    Submit("c", JobSpec("/bin/true"), "killing")]
        if type(event) is ActionDone and event.action == "submit":
            return [Cancel(event.key, kill=event.key != "c")]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, executors={"killing": Recording("killing", True),
                                              "plain": Recording("plain", False)})
    pump(loop, lambda: len([e for e in machine.of(ActionDone) if e.action == "cancel"]) == 3)
    # kill where the executor has it (JobExecutor.kill), its cancel where it has not.
    assert sorted(calls) == [("killing", "cancel"), ("killing", "kill"), ("plain", "cancel")]
    assert Cancel("x") == Cancel("x", kill=False) != Cancel("x", kill=True)
    loop.close()


def test_blocking_calls_do_not_block_the_loop() -> None:
    release = threading.Event()

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [Call("slow", lambda: release.wait(30)), SetTimer("t", 0)]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, workers=1)
    pump(loop, lambda: bool(machine.of(TimerFired)), seconds=5)
    assert not machine.of(ActionDone)
    release.set()
    pump(loop, lambda: bool(machine.of(ActionDone)))
    assert machine.of(ActionDone)[0].result is True
    loop.close()


def test_stop_waits_for_calls_in_flight_then_returns_the_exit_code() -> None:
    release = threading.Event()

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [Call("c", lambda: release.wait(30) and 42), Stop(7, "done", grace=30),
                    SetTimer("release", 0.05)]
        if type(event) is TimerFired:
            release.set()
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine)
    assert loop.run() == 7
    assert machine.of(ActionDone)[0].result == 42


def test_stop_gives_up_on_a_hanging_call_after_the_grace() -> None:
    machine = Scripted(lambda e, n: [Call("hang", lambda: time.sleep(60)), Stop(3, grace=0.2)]
                       if type(e) is Started else [])
    started = time.monotonic()
    assert ControllerLoop(machine).run() == 3
    assert time.monotonic() - started < 10


# -- signals ----------------------------------------------------------------------------------

_SIGNAL_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    from psij import JobExecutor, JobSpec
    from psij.controller import (ControllerLoop, SignalReceived, Started, Stop, Submit,
                                 exit_code_for_signal)

    log = open(sys.argv[1], "a")

    class Machine:
        def step(self, event, now):
            log.write(json.dumps({"event": type(event).__name__, "t": time.time()}) + "\\n")
            log.flush()
            if type(event) is Started:
                return [Submit("j", JobSpec("/bin/true"))]
            if type(event) is SignalReceived:
                return [Stop(exit_code_for_signal(event.signum), "signal", grace=0.3)]
            return []

    executor = JobExecutor.get_instance("slurm")
    sys.exit(ControllerLoop(Machine(), executors=executor).run())
""")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_stop_signal_is_handled_within_a_second_while_sbatch_hangs(
        tmp_path: Path, signum: int, code: int) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "sbatch-started"
    for name in ("sbatch", "squeue", "sacct", "scancel"):
        tool = fake / name
        body = f"touch {marker}\nsleep 60\n" if name == "sbatch" else "exit 0\n"
        tool.write_text("#!/bin/sh\n" + body)
        tool.chmod(0o755)
    log = tmp_path / "events.jsonl"
    script = tmp_path / "ctl.py"
    script.write_text(_SIGNAL_SCRIPT)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", HOME=str(tmp_path),
               PSIJ_WORK_DIR=str(tmp_path / "work"))
    proc = subprocess.Popen([sys.executable, str(script), str(log)], env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline, "sbatch never started"
            assert proc.poll() is None, "the controller exited early"
            time.sleep(0.02)
        sent = time.time()
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == code
        exited = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    handled = [e["t"] for e in events if e["event"] == "SignalReceived"]
    assert handled, events
    assert handled[0] - sent < 1.0
    # The hanging sbatch was left behind after the grace, not waited for.
    assert exited - sent < 10


def test_executor_factory_and_the_machine_s_own_actions() -> None:
    from psij import JobExecutor
    from psij._record import Record

    class Note(Record):
        text: str

    made: List[str] = []
    notes: List[str] = []

    def factory(name: str) -> Any:
        if name == "broken":
            raise RuntimeError("cannot reach it")
        made.append(name)
        return JobExecutor.get_instance("local")

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is Started:
            return [Note("first"), Submit("a", JobSpec("/bin/true"), "user-1000"),
                    Submit("b", JobSpec("/bin/true"), "user-1000"),
                    Submit("c", JobSpec("/bin/true"), "broken")]
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine, executor_factory=factory,
                          action_handlers={Note: lambda note: notes.append(note.text)})
    pump(loop, lambda: len(machine.of(ActionDone)) == 2 and len(machine.of(ActionFailed)) == 1)
    assert made == ["user-1000"] and notes == ["first"]
    assert "no executor for 'broken': cannot reach it" in machine.of(ActionFailed)[0].message
    loop.close()


def test_a_stream_of_posted_events_does_not_starve_connections(tmp_path: Path) -> None:
    """Each event posts the next one (as executor completions do under load): every round
    still ends, so a connection's message is delivered."""
    loop: Optional[ControllerLoop] = None

    def script(event: Any, now: float) -> List[Any]:
        if type(event) is TimerFired:
            assert loop is not None
            loop.post(TimerFired(event.name + 1))
        return []

    machine = Scripted(script)
    loop = ControllerLoop(machine)
    path = loop.listen_unix(str(tmp_path / "s.sock"))
    try:
        loop.run_once(0)
        loop.post(TimerFired(0))
        client = _connect(path)
        client.sendall(b'"hello"\n')
        for _ in range(200):  # each round ends after the events posted before it
            loop.run_once(0)
            if machine.of(MessageReceived):
                break
        assert [e.message for e in machine.of(MessageReceived)] == ["hello"]
        client.close()
    finally:
        loop.close()
