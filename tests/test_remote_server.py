"""psij.remote._server: the requests of the remote protocol answered by this host's executors,
in the process (Server) and as the ``psij remote serve`` command on pipes."""

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

import psij.registry
from psij import JobSpec, JobState
from psij.remote._protocol import HELLO_KEY, PROTOCOL
from psij.remote._server import Server
from psij.serialize import _spec_to_json

Sent = List[Dict[str, Any]]


class Collector:
    """The messages a server sends, with a way to wait for a job's final status."""

    def __init__(self) -> None:
        self.sent: Sent = []
        self.cv = threading.Condition()

    def __call__(self, message: Any) -> None:
        with self.cv:
            self.sent.append(json.loads(json.dumps(message)))
            self.cv.notify_all()

    def states(self, job_id: str) -> List[str]:
        with self.cv:
            return [m["state"] for m in self.sent if m.get("ev") == "status"
                    and m["job"] == job_id]

    def final(self, job_id: str, timeout: float = 30.0) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for m in self.sent:
                    if m.get("ev") == "status" and m["job"] == job_id and \
                            JobState[m["state"]].final:
                        return m
                left = deadline - time.monotonic()
                assert left > 0, f"no final status of {job_id}: {self.sent}"
                self.cv.wait(left)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Tuple[Server, Collector]]:
    collector = Collector()
    server = Server(collector, work_directory=tmp_path / "work")
    yield server, collector
    server.close()


LOCAL = {"name": "local", "version": None, "config": None}


def submit_request(*jobs: Tuple[str, JobSpec], rid: int = 1) -> Dict[str, Any]:
    return {"id": rid, "op": "submit", "ex": LOCAL,
            "jobs": [{"id": i, "spec": _spec_to_json(s)} for i, s in jobs]}


def appender(tmp_path: Path, name: str = "runs", sleep: float = 0) -> JobSpec:
    """A job that appends one line to a file each time it runs."""
    return JobSpec("/bin/sh", ["-c", f"sleep {sleep}; echo ran >> {tmp_path / name}"])


def test_a_submission_is_answered_with_the_native_id_and_its_states_are_pushed(
        served: Tuple[Server, Collector], tmp_path: Path) -> None:
    server, sent = served
    answer = server.handle(submit_request(("job-1", appender(tmp_path))))
    assert answer["re"] == 1 and answer["ok"] is True
    [item] = answer["value"]
    assert item["id"] == "job-1"
    assert item["status"]["state"] in ("QUEUED", "ACTIVE", "COMPLETED")
    final = sent.final("job-1")
    assert final["state"] == "COMPLETED" and final["exit_code"] == 0
    assert final["native_id"] and item["native_id"] in (None, final["native_id"])
    states = sent.states("job-1")
    assert states.index("QUEUED") < states.index("ACTIVE") < states.index("COMPLETED")
    assert (tmp_path / "runs").read_text() == "ran\n"


def test_the_same_job_id_is_run_once_by_one_server_and_by_another_of_the_same_user(
        tmp_path: Path) -> None:
    first, second = Collector(), Collector()
    a = Server(first, work_directory=tmp_path / "work")
    b = Server(second, work_directory=tmp_path / "work")
    try:
        request = submit_request(("job-once", appender(tmp_path, sleep=0.5)))
        assert a.handle(request)["ok"] is True
        assert a.handle(request)["ok"] is True
        # Another server (a new connection) finds the job in the registry and follows it.
        assert b.handle(request)["ok"] is True
        native = first.final("job-once")["native_id"]
        assert native is not None and second.final("job-once")["native_id"] == native
        assert second.final("job-once")["state"] == "COMPLETED"
        assert (tmp_path / "runs").read_text() == "ran\n"
    finally:
        a.close()
        b.close()


def test_the_submit_lock_makes_a_second_server_wait_for_the_first(tmp_path: Path) -> None:
    a = Server(Collector(), work_directory=tmp_path / "work")
    b = Server(Collector(), work_directory=tmp_path / "work")
    answers: List[Dict[str, Any]] = []
    try:
        with a._submit_lock():
            worker = threading.Thread(target=lambda: answers.append(b.handle(
                submit_request(("job-locked", appender(tmp_path))))))
            worker.start()
            worker.join(1.0)
            assert worker.is_alive() and not answers  # b waits for a's lock
        worker.join(30)
        assert answers[0]["ok"] is True and answers[0]["value"][0]["id"] == "job-locked"
    finally:
        a.close()
        b.close()


def test_a_bad_job_in_a_submission_fails_alone(served: Tuple[Server, Collector],
                                               tmp_path: Path) -> None:
    server, sent = served
    request = submit_request(("good-1", appender(tmp_path)))
    request["jobs"].insert(0, {"id": "bad-1", "spec": {"executable": 5}})
    request["jobs"].append({"id": "bad id", "spec": {}})
    answer = server.handle(request)
    assert answer["ok"] is False and "job id" in answer["error"]
    del request["jobs"][-1]
    bad, good = server.handle(request)["value"]
    assert bad["ok"] is False and bad["kind"] == "InvalidJobException"
    assert "bad-1" in bad["error"]
    assert good["id"] == "good-1" and sent.final("good-1")["state"] == "COMPLETED"


@pytest.mark.parametrize("request_, words", [
    ([1, 2], "a request must be a JSON object"),
    ({"id": 3, "op": "shutdown"}, "unknown op 'shutdown'"),
    ({"id": 3, "op": 7}, "unknown op '7'"),
    ({"id": 3, "op": "list"}, "ex: expected an object"),
    ({"id": 3, "op": "list", "ex": {"name": "no-such-executor"}}, "no-such-executor"),
    ({"id": 3, "op": "list", "ex": {"name": ""}}, "ex.name"),
    ({"id": 3, "op": "list", "ex": {"name": "local", "config": {"nope": 1}}},
     "takes no 'nope'"),
    ({"id": 3, "op": "list", "ex": {"name": "local", "config": {"a": [1]}}},
     "plain values"),
    ({"id": 3, "op": "submit", "ex": LOCAL, "jobs": []}, "jobs: expected a list"),
    ({"id": 3, "op": "cancel", "ex": LOCAL, "job": "nobody"}, "not known on this host"),
    ({"id": 3, "op": "follow", "ex": LOCAL, "jobs": "x"}, "jobs: expected a list"),
    ({"id": 3, "op": "attach", "ex": LOCAL, "job": "j", "native_id": None}, "native_id"),
])
def test_bad_requests_get_an_error_answer_naming_what_is_wrong(
        served: Tuple[Server, Collector], request_: Any, words: str) -> None:
    server, _ = served
    answer = server.handle(request_)
    assert answer["ok"] is False and words in answer["error"]
    # The server still answers.
    assert server.handle({"id": 9, "op": "ping"}) == {"re": 9, "ok": True, "value": "pong"}


def test_cancel_list_attach_and_follow(served: Tuple[Server, Collector],
                                       tmp_path: Path) -> None:
    server, sent = served
    server.handle(submit_request(("long-1", JobSpec("/bin/sleep", ["30"]))))
    native = server._jobs["long-1"].native_id  # waits until the job has started
    assert native in server.handle({"id": 2, "op": "list", "ex": LOCAL})["value"]
    followed = server.handle({"id": 3, "op": "follow", "ex": LOCAL, "jobs": [
        {"id": "long-1", "native_id": native}, {"id": "gone-1"}]})["value"]
    assert followed[0]["native_id"] == native and followed[1]["ok"] is False
    # A job attached by native id under another id is followed too.
    attached = server.handle({"id": 4, "op": "attach", "ex": LOCAL, "job": "other-1",
                              "native_id": native})
    assert attached["ok"] is True and attached["value"]["native_id"] == native
    assert server.handle({"id": 5, "op": "cancel", "ex": LOCAL, "job": "long-1"})["ok"]
    assert sent.final("long-1")["state"] == "CANCELED"
    assert sent.final("other-1")["state"] in ("CANCELED", "FAILED")


def test_a_new_server_follows_a_finished_job_from_the_registry(tmp_path: Path) -> None:
    a = Server(Collector(), work_directory=tmp_path / "work")
    first = Collector()
    a._send = first
    try:
        a.handle(submit_request(("done-1", JobSpec("/bin/false"))))
        assert first.final("done-1")["state"] == "FAILED"
        psij.registry.flush()
    finally:
        a.close()
    later = Collector()
    b = Server(later, work_directory=tmp_path / "work")
    try:
        [answer] = b.handle({"id": 1, "op": "follow", "ex": LOCAL,
                             "jobs": [{"id": "done-1"}]})["value"]
        assert answer["status"]["state"] == "FAILED" and answer["status"]["exit_code"] == 1
    finally:
        b.close()


def serve_process(home: Path) -> "subprocess.Popen[bytes]":
    env = {**os.environ, "HOME": str(home)}
    return subprocess.Popen([sys.executable, "-m", "psij", "remote", "serve"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def test_psij_remote_serve_says_hello_answers_garbage_and_ends_with_its_input(
        tmp_path: Path) -> None:
    proc = serve_process(tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    hello = json.loads(proc.stdout.readline())
    assert hello[HELLO_KEY] == PROTOCOL and hello["pid"] == proc.pid
    job_id = str(uuid.uuid4())
    spec = JobSpec("/bin/sh", ["-c", "echo printed-by-the-job; exit 3"])
    lines = [b"\xff\xfe not json\n", b'{"id": 1, "op": "ping"}\n',
             b'{"id": 2, "op": "list", "ex": {"name": "local"}, "deep": ' + b"[" * 5000
             + b"]" * 5000 + b"}\n",
             json.dumps(submit_request((job_id, spec), rid=3)).encode() + b"\n"]
    proc.stdin.write(b"".join(lines))
    proc.stdin.flush()
    answers = {}
    nones = []
    while 3 not in answers or "final" not in answers:
        message = json.loads(proc.stdout.readline())
        if message.get("re", 0) is None:
            nones.append(message["error"])
        elif "re" in message:
            answers[message["re"]] = message
        elif JobState[message["state"]].final:
            answers["final"] = message
    assert len(nones) == 2 and all("not a request" in n for n in nones)
    assert "not UTF-8" in nones[0] or "UTF-8" in nones[0]
    assert 2 not in answers  # the too deep request was refused before its id was read
    assert answers[1]["value"] == "pong"
    assert answers[3]["ok"] is True
    assert answers["final"]["state"] == "FAILED" and answers["final"]["exit_code"] == 3
    rest, _ = proc.communicate(timeout=30)  # closes the server's input first
    assert proc.returncode == 0
    assert rest == b""  # nothing after the end, and nothing the job printed
    [record] = psij.registry.find(ids=[job_id], work_directory=tmp_path / ".psij" / "work")
    assert record.state is JobState.FAILED and record.exit_code == 3
