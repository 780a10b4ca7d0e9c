"""Lines a hostile peer may send to a psij server, for the fuzz tests of every server (the
flow service, the served pilot, the supervisor): each is a request line without its newline.

Every server must answer each with a bad-request error on that connection only (a line over
its limit may also close that connection) and keep serving its other clients meanwhile.
"""

import json
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

MB = 1024 * 1024


def _wrap(value: bytes) -> bytes:
    """``value`` as a field of a request each server reads."""
    return b'{"id": 7, "op": "create", "type": "submit", "spec": ' + value + b"}"


def hostile_lines(huge: bool = True) -> List[Tuple[str, bytes]]:
    """(name, line) of the corpus; ``huge`` adds the lines of many megabytes (a 10^6-key
    object, a 100 MB line)."""
    lines = [
        ("issue 21 line", b"[" * 1100 + b"]" * 1100),
        ("deep lists", b"[" * 100_000 + b"]" * 100_000),
        ("deep lists, never closed", b"[" * 1_000_000),
        ("deep objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        ("deep mixed, in a request", _wrap(b'[{"a":' * 20_000 + b"1" + b"}]" * 20_000)),
        ("deep behind brackets in strings",
         _wrap(b'"' + b"]" * 5000 + b'", "x": ' + b"[" * 5000 + b"]" * 5000)),
        ("a comb 300 deep", b"[[]," * 300 + b"1" + b"]" * 300),
        ("a number of 10^5 digits", _wrap(b"9" * 100_000)),
        ("a float of 400 digits", _wrap(b"1" * 400 + b".5")),
        ("1e999", _wrap(b"1e999")),
        ("-1e99999", _wrap(b"-1e99999")),
        ("NaN", _wrap(b"NaN")),
        ("Infinity in a list", _wrap(b"[1, Infinity]")),
        ("-Infinity as a count", b'{"id": 7, "op": "grow", "n": -Infinity}'),
        ("NaN interval", b'{"id": 7, "op": "create", "intervals": {"unknown": NaN}}'),
        ("invalid UTF-8", b'{"id": 7, "op": "\xff\xfe"}'),
        ("overlong UTF-8", b'{"id": 7, "op": "\xc0\xaf"}'),
        ("an encoded surrogate", b'{"id": 7, "op": "\xed\xa0\x80"}'),
        ("a truncated character", b'{"id": 7, "op": "\xe2\x82"}'),
        ("a lone surrogate", _wrap(b'"\\ud800"')),
        ("a lone low surrogate key", _wrap(b'{"\\udfff": 1}')),
        ("a surrogate pair cut", _wrap(b'"\\ud83d x"')),
        ("NUL and controls", b'{"id": 7, "op": "\x00\x01\x1b[2J"}'),
        ("not JSON", b"{{{"),
        ("a bare string", b'"op"'),
        ("a bare number", b"12"),
        ("null", b"null"),
        ("a UTF-8 BOM", b'\xef\xbb\xbf{"op": "list"}'),
        ("a very long key", b'{"' + b"k" * 500_000 + b'": 1}'),
    ]
    if huge:
        keys = b",".join(b'"k%d":0' % i for i in range(1_000_000))
        lines.append(("10^6 keys", b"{" + keys + b"}"))
        lines.append(("100 MB line", b'{"id": 7, "op": "list", "pad": "' + b"x" * (100 * MB)
                      + b'"}'))
    return lines


def exchange(path: str, line: bytes, timeout: float = 20.0) -> Optional[Dict[str, Any]]:
    """Send ``line`` on a new connection to the Unix socket ``path``; the first line answered
    (None when the server closed the connection without one)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    try:
        try:
            sock.sendall(line + b"\n")
        except OSError:
            pass  # it stopped reading a line too long: its answer may still be there
        buffer = b""
        while b"\n" not in buffer:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            buffer += chunk
    finally:
        sock.close()
    first = buffer.split(b"\n", 1)[0]
    return json.loads(first) if first.strip() else None


class Prober:
    """Calls ``probe`` (a good request of another client) over and over on a thread, until
    stopped: how many answers came, the longest wait for one, and what failed."""

    def __init__(self, probe: Callable[[], Any]) -> None:
        self.probe = probe
        self.served = 0
        self.longest = 0.0
        self.failures: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Prober":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                self.probe()
            except Exception as error:  # the test reports it
                self.failures.append(repr(error))
            else:
                self.served += 1
            self.longest = max(self.longest, time.monotonic() - start)
            self._stop.wait(0.02)

    def check(self, at_least: int = 5, longest: float = 5.0) -> None:
        assert self.failures == [], self.failures
        assert self.served >= at_least, self.served
        assert self.longest < longest, self.longest
