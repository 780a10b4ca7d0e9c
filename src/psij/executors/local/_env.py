"""A local job's environment, built once per change of this process's environment.

A job that inherits the environment gets this process's variables (``os.environ``) under its
own (``JobSpec.environment``, ``PSIJ_NODEFILE``, the GPUs the resource pool gave it). Decoding
``os.environ`` costs more than starting a job, so :class:`BaseEnvironment` keeps the decoded
copy and its identity (a number, new at each change) and makes it again only when the raw
variables differ from the ones it was made from (a dict comparison in C). The keeper is sent
the base once per identity; a job carries only its own variables.

:class:`NodeFiles` makes the ``PSIJ_NODEFILE`` file a job names. It must not change
``os.environ`` nor hand out the cached mapping to anything that could
modify it (the copy is shared by every job of the process).
"""

import errno
import os
import socket
import threading
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

from psij.exceptions import SubmitException
from psij.executors._process import MAX_ARG_STRING, start_error_words

__all__ = ["BASE", "BaseEnvironment", "NodeFiles", "check_sizes", "merged"]


class BaseEnvironment:
    """This process's environment, decoded, with an identity that changes when it does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._raw: Optional[Dict[bytes, bytes]] = None
        self._current: Tuple[int, Dict[str, str]] = (0, {})
        self._size = 0
        self._number = 0

    def get(self) -> Tuple[int, Dict[str, str]]:
        """``(identity, variables)``; the variables must not be changed."""
        raw = _raw_environ()
        if raw is not None and raw == self._raw:
            return self._current
        with self._lock:
            raw = _raw_environ()
            if raw is None or raw != self._raw:
                self._number += 1
                env = dict(os.environ)
                self._current = (self._number, env)
                self._size = sum(len(k) + len(v) + 2 for k, v in env.items())
                self._raw = dict(raw) if raw is not None else None
            return self._current

    def size(self) -> int:
        """About how many bytes the variables take in a new process (as of the last get)."""
        return self._size


def _raw_environ() -> Optional[Dict[bytes, bytes]]:
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else None


BASE = BaseEnvironment()


def merged(base: Optional[Mapping[str, str]], own: Mapping[str, str]) -> Dict[str, str]:
    """The whole environment of a job: ``base`` (None: nothing inherited) under ``own``."""
    if base is None:
        return dict(own)
    env = dict(base)
    env.update(own)
    return env


def check_sizes(what: str, argv: Sequence[str], own: Mapping[str, str],
                base_size: int) -> None:
    """Refuse (SubmitException, saying ``what`` could not start), as the system would refuse
    to start it, a job whose variables or arguments are more than a new process may have:
    checked at submit because the job is started later, by the keeper."""
    total = base_size
    for text in argv:
        total += _measure(text, 1, what)
    for name, value in own.items():
        total += _measure(value, len(name) + 2, what)
    if total > _ARG_MAX:
        _refuse(what)


def _measure(text: str, extra: int, what: str) -> int:
    size = len(text) + extra
    if size > MAX_ARG_STRING // 4:  # characters: up to 4 bytes each
        try:
            size = len(os.fsencode(text)) + extra
        except UnicodeEncodeError:
            return size  # refused with its own words by the texts check
        if size > MAX_ARG_STRING:
            _refuse(what)
    return size


def _refuse(what: str) -> None:
    error = OSError(errno.E2BIG, os.strerror(errno.E2BIG))
    raise SubmitException(f"{what}: {start_error_words(error)}")


def _arg_max() -> int:
    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        value = -1
    return value if value > 0 else 2 * 1024 * 1024


_ARG_MAX = _arg_max()


class NodeFiles:
    """The ``PSIJ_NODEFILE`` files of an executor: this host's name once per process of the
    job, one file per number of processes, made on first use in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._paths: Dict[int, str] = {}
        self._hostname: Optional[str] = None

    def path(self, n: int) -> str:
        path = self._paths.get(n)
        if path is None:
            if self._hostname is None:
                self._hostname = socket.gethostname()
            path = str(self._dir / f"nodefile-{n}")
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
            with open(tmp, "w") as f:
                f.write((self._hostname + "\n") * n)
            os.replace(tmp, path)
            self._paths[n] = path
        return path
