"""The flow service as a real process on the local executor: its files, its answers to bad
requests, keeping the count, output, restart after kill -9 without duplicates, the CLI."""

import json
import os
import secrets
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

from psij.flows.client import FlowClient, FlowError, FlowUnavailable
from support.flow_helpers import Service, processes_with, wait_for
from support.hostile_lines import Prober, exchange, hostile_lines


def _spec(command: str, marker: str) -> Dict[str, Any]:
    return {"executable": "/bin/sh", "arguments": ["-c", command + "; :", marker]}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path / "state", str(tmp_path / "flow.sock"),
                  ["aggregate_problem_interval=0", 'default_intervals={"no_problem": 0, '
                   '"unknown": 0, "failed_init": 0, "failed_after_work": 0, '
                   '"never_claimed": 0, "no_work": 0}']).start()
    yield svc
    svc.destroy_all()
    svc.stop()


def _raw(path: str, data: bytes, timeout: float = 10.0) -> List[Dict[str, Any]]:
    """Send raw bytes; the answers read until the service closes or goes quiet."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    try:
        sock.sendall(data)
    except OSError:
        pass
    buf = b""
    sock.settimeout(1.5)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    except (socket.timeout, OSError):
        pass
    sock.close()
    return [json.loads(line) for line in buf.splitlines() if line.strip()]


def test_state_is_private_and_journal_is_wal(service: Service) -> None:
    state = service.state_dir
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    journal = state / "flow.sqlite"
    assert stat.S_IMODE(os.stat(journal).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(service.socket).st_mode) == 0o600
    with sqlite3.connect(str(journal)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_bad_requests_are_refused_and_others_still_served(service: Service) -> None:
    with service.client() as good:
        handle = good.create(_spec("sleep 30", "psij-flow-bad"), 1, "local", lease=60,
                             provisioning_lease=30)["handle"]
        answers = _raw(service.socket, b"this is not json\n")
        assert answers and answers[0]["ok"] is False
        assert "json" in answers[0]["error"]["message"].lower()
        cases = [
            ({"op": "status", "handle": "f999999"}, "unknown_handle", None),
            ({"op": "grow", "handle": handle, "n": -3}, "bad_request", "n"),
            ({"op": "shrink", "handle": handle, "n": 1, "signal": "SIGNOPE"}, "bad_request",
             "signal"),
            ({"op": "create", "spec": {"executable": "/bin/true"}, "count": -1,
              "executor": "local"}, "bad_request", "count"),
            ({"op": "create", "spec": {"executable": "/bin/true"}, "count": float("inf"),
              "executor": "local"}, "bad_request", "count"),
            ({"op": "fly"}, "unknown_op", None),
            ({"op": "create", "spec": {"executable": "/bin/true"}, "count": 1,
              "executor": "flow"}, "refused", None),
        ]
        for number, (request, code, field) in enumerate(cases):
            line = json.dumps({"id": number, **request}).replace("Infinity", "1e999")
            reply = _raw(service.socket, line.encode() + b"\n")
            assert reply, request
            assert reply[0]["id"] == number and reply[0]["ok"] is False, reply
            assert reply[0]["error"]["code"] == code, reply
            assert reply[0]["error"]["message"], reply
            if field is not None:
                assert field in reply[0]["error"]["message"] or \
                    reply[0]["error"].get("field") == field, reply
        # A line over the limit closes that connection; the service keeps serving.
        huge = b'{"op": "status", "handle": "' + b"x" * (4 << 20) + b'"}\n'
        _raw(service.socket, huge)
        assert good.status(handle)["valid"] is True


def test_keeps_the_count_while_instances_end_and_hands_back_output(service: Service) -> None:
    marker = f"psij-flow-keep-{secrets.token_hex(4)}"
    with service.client() as client:
        script = "echo out-$$; echo err-$$ >&2; sleep $(( $$ % 3 + 1 )); exit $(( $$ % 2 ))"
        handle = client.create(_spec(script, marker), 3, "local", lease=120,
                               provisioning_lease=60)["handle"]
        wait_for("3 running", lambda: client.status(handle)["provisioned"] == 3)
        ended = wait_for("6 ended instances",
                         lambda: [i for i in client.instances(handle) if i.get("ended")]
                         if len(client.instances(handle)) >= 6 else None, timeout=40)
        for _ in range(10):
            assert len(processes_with(marker)) <= 3
            time.sleep(0.2)
        wait_for("3 running again", lambda: client.status(handle)["provisioned"] == 3)
        first = ended[0]
        pid = first["id"].split(".")[0]
        assert client.output(handle, first["id"]) == f"out-{pid}\n"
        assert client.output(handle, first["id"], "stderr") == f"err-{pid}\n"
        assert first["exit_code"] == int(pid) % 2
        assert client.delete(handle, [first["id"]]) == [first["id"]]
        with pytest.raises(FlowError):
            client.output(handle, first["id"])
        client.destroy(handle)
        wait_for("every instance gone", lambda: not processes_with(marker), timeout=10)


def test_restart_after_kill_9_keeps_everything_and_starts_no_duplicate(
        service: Service) -> None:
    marker = f"psij-flow-restart-{secrets.token_hex(4)}"
    with service.client() as client:
        handle = client.create(_spec("sleep 300", marker), 2, "local", lease=600,
                               provisioning_lease=300)["handle"]
        short = client.create(_spec("exit 3", marker + "-short"), 1, "local", lease=600,
                              provisioning_lease=300)["handle"]
        wait_for("2 running", lambda: len(processes_with(marker + " ")) == 2
                 or len(processes_with(marker)) - len(processes_with(marker + "-short")) == 2)
        wait_for("ended records", lambda: len(client.instances(short)) >= 2)
        before = set(processes_with(marker)) - set(processes_with(marker + "-short"))
        status = client.status(handle)
        records = {i["id"] for i in client.instances(short)}
    service.kill9()
    service.start()
    with service.client() as client:
        assert sorted(h["handle"] if isinstance(h, dict) else h for h in client.list()) == \
            sorted([handle, short])
        after = client.status(handle)
        assert after["requested"] == 2
        assert after["lease_remaining"] <= status["lease_remaining"]
        assert after["lease_remaining"] > status["lease_remaining"] - 60
        assert records <= {i["id"] for i in client.instances(short)}
        for _ in range(15):  # no duplicate while the service takes its jobs back
            now = set(processes_with(marker)) - set(processes_with(marker + "-short"))
            assert now == before
            time.sleep(0.2)
        wait_for("re-attached as running", lambda: client.status(handle)["provisioned"] == 2)
        # The attached instances are followed: one killed is replaced.
        os.kill(sorted(before)[0], 9)
        wait_for("replaced", lambda: len(set(processes_with(marker))
                                         - set(processes_with(marker + "-short"))) == 2
                 and sorted(before)[0] not in processes_with(marker))
        client.destroy(handle)
        client.destroy(short)


def test_cli_talks_to_the_service(service: Service, tmp_path: Path) -> None:
    env = dict(os.environ, PSIJ_FLOW_SOCKET=service.socket)
    payload = tmp_path / "payload.sh"
    payload.write_text("#!/bin/sh\necho from-payload \"$@\"\n")
    payload.chmod(0o755)

    def psij(*words: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([sys.executable, "-m", "psij", "flow", *words], env=env,
                              capture_output=True, text=True, timeout=60)

    made = psij("create", "--count", "1", "--executor", "local", "--lease", "60",
                "--provisioning-lease", "30", "--payload", str(payload), "--", "x", "hello")
    assert made.returncode == 0, made.stderr
    handle = json.loads(made.stdout)["handle"]
    ended = wait_for("an ended instance", lambda: json.loads(psij("instances", handle).stdout)
                     ["instances"])
    out = psij("output", handle, ended[0]["id"])
    assert out.returncode == 0 and out.stdout == "from-payload hello\n", out
    status = json.loads(psij("status", handle).stdout)
    assert status["valid"] is True and status["requested"] == 1
    refused = psij("grow", handle, "-1")
    assert refused.returncode == 2
    unknown = psij("status", "f424242")
    assert unknown.returncode == 1 and "unknown_handle" in unknown.stderr
    watched = psij("watch", handle)  # changes were made: answered at once
    assert watched.returncode == 0 and json.loads(watched.stdout)["change"] > 0, watched
    assert psij("watch", "--after", "-1").returncode == 2
    assert psij("destroy", handle).returncode == 0
    assert json.loads(psij("status", handle).stdout)["valid"] is False


def test_payload_changed_after_upload_is_refused_before_start(service: Service) -> None:
    with service.client() as client:
        sha = client.upload(b"#!/bin/sh\necho safe\n")
        path = service.state_dir / "areas" / str(os.geteuid()) / "payloads" / sha
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o500
        os.chmod(path, 0o700)
        path.write_text("#!/bin/sh\necho tampered\n")
        handle = client.create({"executable": "payload"}, 1, "local", payload=sha, lease=60,
                               provisioning_lease=30)
        name = handle["handle"]
        wait_for("a submission error", lambda: client.status(name)["submission_errors"] >= 1)
        assert all(i.get("exit_code") is None for i in client.instances(name))
        client.destroy(name)


def test_client_reports_no_service(tmp_path: Path) -> None:
    with pytest.raises(FlowError) as info:
        FlowClient(str(tmp_path / "nothing.sock")).list()
    assert info.value.code == "unavailable" and "nothing.sock" in info.value.message


def test_requests_are_answered_while_instances_churn_at_full_speed(service: Service) -> None:
    with service.client() as client:
        churn = client.create({"executable": "/bin/true"}, 4, "local", lease=60,
                              provisioning_lease=60, rate=1000)["handle"]
        wait_for("churning", lambda: client.status(churn)["recently_terminated"] > 200)
    # A fresh connection, as another client's: every answer comes while the churn goes on.
    with FlowClient(service.socket, timeout=10.0) as other:
        for _ in range(5):
            assert other.status(churn)["valid"] is True
            assert other.list()
            time.sleep(0.5)
        assert other.status(churn)["recently_terminated"] > 200
        other.destroy(churn)


def test_grace_runs_from_the_signal_to_the_kill_and_destroy_kills_at_once(
        service: Service) -> None:
    # Instances that ignore TERM: only a KILL ends them, so when they end says when it came.
    # The local executor's own cancel gives 5 s more: none of it may be added.
    marker = f"psij-flow-grace-{secrets.token_hex(4)}"
    ignore = "trap '' TERM; sleep 300"
    with service.client() as client:
        handles = {name: client.create(_spec(ignore, f"{marker}-{name}"), 1, "local",
                                       lease=120, provisioning_lease=60)["handle"]
                   for name in ("grace", "zero", "destroy")}
        for name in handles:  # the shell (the sleep ignores TERM too: inherited)
            wait_for(f"{name} running", lambda n=name: processes_with(f"{marker}-{n}"))

        def gone_after(name: str, request: Callable[[], Any]) -> float:
            started = time.monotonic()
            request()
            wait_for(f"{name} killed", lambda: not processes_with(f"{marker}-{name}"),
                     timeout=30)
            return time.monotonic() - started

        waited = gone_after("grace", lambda: client.shrink(handles["grace"], 1, "longest",
                                                            "SIGTERM", grace=2))
        assert 1.5 <= waited < 5, f"a grace of 2 s ended the instance after {waited:.1f} s"
        waited = gone_after("zero", lambda: client.shrink(handles["zero"], 1, "longest",
                                                           None, grace=0))  # type: ignore
        assert waited < 4, f"a grace of 0 ended the instance after {waited:.1f} s"
        waited = gone_after("destroy", lambda: client.destroy(handles["destroy"]))
        assert waited < 4, f"destroy ended the instance after {waited:.1f} s"


def test_hostile_lines_are_refused_while_another_client_is_served(service: Service) -> None:
    # Issue 21: "[" * 1100 + "]" * 1100 raised RecursionError and the service was gone.
    with FlowClient(service.socket, timeout=10.0) as other, Prober(other.list) as prober:
        for name, line in hostile_lines():
            answer = exchange(service.socket, line)
            if len(line) > (1 << 20) and answer is None:
                continue  # over the line limit: that connection may just be closed
            assert answer is not None, name
            assert answer["ok"] is False and answer["error"]["code"] == "bad_request", \
                (name, answer)
            assert answer["error"]["message"], name
    prober.check()
    assert service.proc is not None and service.proc.poll() is None
    # Several bad lines on one connection: each answered, and the connection goes on.
    answers = _raw(service.socket, b"[" * 1100 + b"]" * 1100 + b"\n\xff\n"
                   + b'{"id": 5, "op": "list"}\n')
    assert [a["ok"] for a in answers] == [False, False, True], answers


def test_refusals_say_why_in_the_client_and_the_cli(service: Service) -> None:
    spec = {"executable": "/bin/true"}
    with service.client() as client:
        with pytest.raises(FlowError) as info:
            client.create(spec, 10**6, "local")
        assert info.value.code == "refused" and info.value.reason == "over_handle_max"
        assert "over_handle_max" in str(info.value)
        with pytest.raises(FlowError) as info:
            client.create(spec, 1, "local", provisioning_leas=60)
        assert info.value.code == "bad_request" and info.value.field == "provisioning_leas"
        assert "provisioning_leas" in info.value.message
        # NaN is refused by the service's reading of the line, naming where it was.
        with pytest.raises(FlowError) as info:
            client.create(spec, 1, "local", intervals={"unknown": float("nan")})
        assert info.value.field == "intervals.unknown"
        assert "intervals.unknown" in info.value.message
        assert client.list() == []  # the connection goes on
    env = dict(os.environ, PSIJ_FLOW_SOCKET=service.socket)

    def create(*words: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([sys.executable, "-m", "psij", "flow", "create", "--executor",
                               "local", *words, "--", "/bin/true"], env=env,
                              capture_output=True, text=True, timeout=60)

    over = create("--count", str(10**6))
    assert over.returncode == 1 and "[refused: over_handle_max]" in over.stderr, over.stderr
    misspelt = create("--count", "1", "--option", "provisioning_leas=60")
    assert misspelt.returncode == 1 and "provisioning_leas: not a field" in misspelt.stderr
    nan = create("--count", "1", "--option", 'intervals={"unknown": NaN}')
    assert nan.returncode == 1 and "intervals.unknown" in nan.stderr, nan.stderr


def test_the_aggregate_restart_limit_is_shared_by_handles_that_fail_at_once(
        tmp_path: Path) -> None:
    # Issue 21: two handles of 5 instances that exit 1 at once, with the service's aggregate
    # limit of one such restart a second: one handle had 18 restarts in 12 s and the other
    # none, and the starved one's problems never said why.
    svc = Service(tmp_path / "agg", str(tmp_path / "agg.sock")).start()
    try:
        with svc.client() as client:
            handles = [client.create(_spec("exit 1", "psij-flow-agg"), 5, "local", lease=60,
                                     provisioning_lease=60, intervals={"unknown": 0})["handle"]
                       for _ in range(2)]
            throttled = set()
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                for handle in handles:
                    if any(p["code"] == "restarts_throttled" and p["limit"] == "aggregate"
                           for p in client.problems(handle)):
                        throttled.add(handle)
                time.sleep(0.2)
            ended = [len(client.instances(h)) for h in handles]
            for handle in handles:
                client.destroy(handle)
        restarts = [n - 5 for n in ended]  # each handle's first 5 are not restarts
        assert min(restarts) >= 2 and abs(restarts[0] - restarts[1]) <= 2, ended
        assert throttled == set(handles)
    finally:
        svc.stop()


def test_a_closed_client_opens_no_new_connection(service: Service) -> None:
    # The flow executor's poller could still be asking when the executor closed its client:
    # the connection it reopened was never closed (a ResourceWarning in a later test).
    client = FlowClient(service.socket, timeout=10.0)
    assert client.list() == []
    client.close()
    with pytest.raises(FlowUnavailable, match="is closed"):
        client.list()
    assert client._sock is None
