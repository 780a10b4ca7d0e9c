"""Functions the tests of ``psij.futures`` run as jobs: importable on the compute side (the
tests folder reaches the jobs through ``PYTHONPATH``), so they travel by reference."""

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List


class Oops(ValueError):
    """An exception of the tests' own, to see that its type comes back."""


def square(x: float) -> float:
    return x * x


def add(a: Any, b: Any = 0, **more: Any) -> Any:
    return a + b + sum(more.values())


def echo(value: Any) -> Any:
    return value


def fail(message: str) -> None:
    raise Oops(message)


def big(size: int) -> bytes:
    return b"\x5a" * size


def sleep_then(seconds: float, value: Any, marker: str = "") -> Any:
    if marker:
        Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
    return value


def kill_myself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def return_a_lock() -> Any:
    return threading.Lock()


def runner_argv() -> List[str]:
    return list(sys.argv)


def hostile(action: str) -> Any:
    """In one job with other calls (``map(..., chunksize=N)``): ``tamper`` changes the result
    file of call 0, ``remove`` deletes it, anything else is returned."""
    directory = sys.argv[-1]
    result = os.path.join(directory, "c0.out")
    if action == "tamper":
        data = bytearray(Path(result).read_bytes())
        data[-1] ^= 1
        Path(result).write_bytes(bytes(data))
    elif action == "remove":
        os.unlink(result)
    return action


def environment(names: List[str]) -> Dict[str, str]:
    return {name: os.environ.get(name, "") for name in names}
