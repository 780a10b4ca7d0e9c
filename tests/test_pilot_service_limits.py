"""The served pilot under abuse: no file descriptors left, over-long and very long request lines.

The server is a real ``psij pilot serve`` process; its descriptor limit is lowered with
setrlimit before it starts. The framing is also tested alone, on its operation count.
"""

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from psij._line_framing import DEFAULT_MAX_LINE_BYTES, LineFramer
from psij.executors.pilot.service import PilotClient, PilotUnavailable, answering
from support.hostile_lines import Prober, exchange, hostile_lines

# -- the framing alone ------------------------------------------------------------------------


def test_framing_cuts_lines_whatever_the_chunks() -> None:
    stream = b"first\nsecond line\n\nthird {\"a\": 1}\nunfinished"
    for size in (1, 2, 3, 5, 7, 64):
        framer = LineFramer(limit=100)
        lines: List[bytes] = []
        for i in range(0, len(stream), size):
            lines += framer.feed(stream[i:i + size])
        assert lines == [b"first", b"second line", b"", b"third {\"a\": 1}"], size
        assert framer.pending == len(b"unfinished") and not framer.too_long


def test_framing_work_is_linear_in_the_bytes_fed() -> None:
    # A 4 MB line in chunks of 1 to 9 bytes, then a newline: joining the buffer and the chunk
    # and splitting again at every chunk (the old way) is quadratic, ~10^12 byte operations.
    total = 4 * 1024 * 1024
    framer = LineFramer(limit=DEFAULT_MAX_LINE_BYTES)
    piece = b"abcdefghi"
    fed = 0
    size = 1
    while fed < total:
        framer.feed(piece[:size])
        fed += size
        size = size % 9 + 1
    assert framer.pending == fed
    lines = framer.feed(b"tail\nnext")
    assert len(lines) == 1 and len(lines[0]) == fed + 4
    fed += 9
    # Each byte: fed once, searched once, copied into its line once (plus the moved tail).
    assert framer.work <= 4 * fed, framer.work


def test_framing_stops_at_the_limit_and_keeps_nothing_beyond() -> None:
    framer = LineFramer(limit=10)
    assert framer.feed(b"0123456789\nok\n") == [b"0123456789", b"ok"]  # exactly the limit
    assert framer.feed(b"01234") == [] and framer.pending == 5
    # The line is not finished but already too long: stop before the newline ever comes.
    assert framer.feed(b"567890") == []
    assert framer.too_long and framer.pending == 0
    assert framer.feed(b"more\n") == []
    # Lines before an over-long one in the same chunk are still given.
    framer = LineFramer(limit=3)
    assert framer.feed(b"ab\nabcd\ncd\n") == [b"ab"] and framer.too_long
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="line limit"):
            LineFramer(limit=bad)  # type: ignore[arg-type]


# -- a real served pilot ------------------------------------------------------------------------


class Served:
    """``psij pilot serve`` with a descriptor limit of ``nofile`` (when given)."""

    def __init__(self, folder: Path, nofile: Optional[int] = None, *extra: str) -> None:
        self.socket = str(folder / "pilot.sock")
        self.log = folder / "serve.log"
        wd = folder / "wd"

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "psij", "pilot", "serve", "--socket", self.socket,
                 "--cores", "1", "--wd", str(wd), *extra],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit)
        deadline = time.monotonic() + 60
        while not answering(self.socket, timeout=1):
            assert self.proc.poll() is None, f"serve exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, "the pilot did not start"
            time.sleep(0.05)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def open_descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        return self.log.read_text()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="pj"))  # Unix socket paths are short
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _raw(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(path)
    return sock


def _replies(sock: socket.socket) -> List[Dict[str, Any]]:
    """Every line the server sends until it closes the connection."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def test_an_over_long_request_line_gets_an_error_then_the_connection_closes(
        short_dir: Path) -> None:
    served = Served(short_dir, None, "--max-request-bytes", "1000")
    try:
        sock = _raw(served.socket)
        sock.sendall(b'{"id": 1, "op": "ping"}\n' + b"x" * 1500)  # no newline needed
        replies = _replies(sock)  # returns only because the server closed the connection
        sock.close()
        assert replies[0]["id"] == 1 and replies[0]["ok"] is True
        assert len(replies) == 2
        assert replies[1]["ok"] is False and replies[1]["id"] is None
        assert replies[1]["kind"] == "ValueError"
        assert "longer than 1000 bytes" in replies[1]["error"]
        assert "--max-request-bytes" in replies[1]["error"]
        # The client tells why the pilot hung up.
        client = PilotClient(served.socket)
        with pytest.raises(PilotUnavailable, match="longer than 1000 bytes"):
            client.request("ping", pad="y" * 2000)
        client.close()
        # Others are served as before.
        assert answering(served.socket)
    finally:
        served.stop()


def test_a_10_mb_request_line_in_small_pieces_is_served(short_dir: Path) -> None:
    served = Served(short_dir)
    try:
        line = json.dumps({"id": 7, "op": "ping", "pad": "z" * (10 * 1000 * 1000)}).encode()
        sock = _raw(served.socket)
        for i in range(0, len(line), 4096):
            sock.sendall(line[i:i + 4096])
        sock.sendall(b"\n")
        sock.shutdown(socket.SHUT_WR)
        replies = _replies(sock)
        sock.close()
        assert [r["id"] for r in replies] == [7] and replies[0]["ok"] is True
        assert DEFAULT_MAX_LINE_BYTES > len(line)
    finally:
        served.stop()


def test_hostile_lines_are_refused_while_another_client_is_served(short_dir: Path) -> None:
    served = Served(short_dir)
    try:
        client = PilotClient(served.socket)
        with Prober(lambda: client.request("ping", timeout=10.0)) as prober:
            for name, line in hostile_lines():
                answer = exchange(served.socket, line)
                if len(line) > DEFAULT_MAX_LINE_BYTES and answer is None:
                    continue  # over the line limit: that connection may just be closed
                assert answer is not None and answer["ok"] is False, (name, answer)
                assert answer["kind"] == "ValueError" and answer["error"], (name, answer)
            # A value refused in a request that could be read is answered with its id.
            assert exchange(served.socket, b'{"id": 9, "op": "ping", "x": NaN}') == {
                "id": 9, "ok": False, "kind": "ValueError",
                "error": "x: NaN is not a finite number; expected a number a float can hold"}
        prober.check()
        assert client.request("ping")["ok"]
        client.close()
    finally:
        log = served.stop()
    assert "Traceback" not in log, log


def test_out_of_descriptors_the_server_backs_off_and_recovers(short_dir: Path) -> None:
    served = Served(short_dir, 64)
    held: List[socket.socket] = []
    try:
        first = PilotClient(served.socket)  # accepted while descriptors are left
        assert first.request("ping")["ok"]
        free = 64 - served.open_descriptors()
        assert 2 < free < 64, free
        # Fill every descriptor the server has left, and then some (they wait in the backlog).
        for _ in range(free + 10):
            held.append(_raw(served.socket))
        deadline = time.monotonic() + 30
        while served.open_descriptors() < 64:
            assert time.monotonic() < deadline, served.open_descriptors()
            time.sleep(0.05)
        # One that waits in the backlog asks now, and is answered once the server recovers.
        waiting = _raw(served.socket)
        answer: List[bytes] = []
        reader = threading.Thread(target=lambda: answer.append(waiting.recv(65536)))
        waiting.sendall(b'{"id": 3, "op": "ping"}\n')
        reader.start()
        # Out of descriptors: no busy loop (a spinning accept would burn ~2 s of CPU here) ...
        cpu = served.cpu_seconds()
        time.sleep(2)
        assert served.cpu_seconds() - cpu < 0.5
        assert served.proc.poll() is None
        # ... and the connections it has are served all along.
        assert first.request("ping", timeout=10)["ok"]
        assert not answer
        for sock in held:
            sock.close()
        reader.join(30)
        assert answer and json.loads(answer[0])["id"] == 3
        # Recovered: new connections are accepted and served again.
        for _ in range(3):
            client = PilotClient(served.socket)
            assert client.request("ping", timeout=10)["ok"]
            client.close()
        waiting.close()
        first.close()
    finally:
        for sock in held:
            sock.close()
        log = served.stop()
    assert "cannot accept connections" in log and "Too many open files" in log
    assert "accepting connections again" in log
    assert "Traceback" not in log


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", "lots", "inf", "NaN", "١٢"])
def test_max_request_bytes_must_be_a_positive_whole_number(short_dir: Path, bad: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "psij", "pilot", "serve", "--socket", str(short_dir / "s"),
         "--max-request-bytes", bad], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert "--max-request-bytes" in result.stderr and "at least 1" in result.stderr
    assert not (short_dir / "s").exists()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, float("nan"), "64"])
def test_pilot_service_refuses_a_bad_max_request_bytes(bad: object) -> None:
    from psij.executors.pilot.service import PilotService

    with pytest.raises(ValueError, match="max_request_bytes: expected a whole number"):
        PilotService(None, "/nonexistent.sock", max_request_bytes=bad)  # type: ignore
