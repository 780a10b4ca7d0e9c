"""How the local executor hands a job to a keeper without waiting for it to start.

:func:`stream_items` says how the keeper gets a job's standard streams: ``/dev/null`` (None)
and files by path (the keeper, which runs as the same user in the job's directory, opens them
itself), and only a path naming one of this process's own descriptors (``/dev/stdout``) as
that descriptor, passed with the request. :func:`start_failure` makes of the keeper's answer
that a job could not start the final status it ends with, in the words a synchronous start
used (they are the same whether the job was started here or by a keeper). :class:`NativeIds`
lets ``job.native_id`` wait, briefly, for the pid of a job whose start is not answered yet.

It must not set job states (the executor does) nor talk to the keeper itself.
"""

from __future__ import annotations  # nested functions' annotations: not evaluated per call

import errno
import threading
from pathlib import Path
from typing import Callable, List, Optional, Tuple, Union

from psij._clock import Clock, MonotonicClock
from psij.executors._process import own_descriptor, start_error_words
from psij.executors.local._checks import not_executable, not_found
from psij.executors.local._keeper_client import Failure
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["NativeIds", "StreamItem", "start_failure", "stream_items"]

StreamItem = Union[None, str, int]
_NOT_FOUND = (errno.ENOENT, errno.ENOTDIR)
_NOT_EXECUTABLE = (errno.EACCES, errno.EPERM, errno.EISDIR)
_WAIT_SECONDS = 120.0  # a keeper that does not answer by then leaves native_id None
_CLOCK: Clock = MonotonicClock()  # what that wait is measured on


def stream_items(spec: JobSpec) -> Tuple[Tuple[StreamItem, StreamItem, StreamItem], List[int]]:
    """The keeper's stream items of a job started directly, and the descriptors to pass."""
    fds: List[int] = []

    def item(path: Optional[Path]) -> StreamItem:
        if path is None:
            return None
        text = str(path)
        own = own_descriptor(text)
        if own is None:
            return text
        fds.append(own)
        return len(fds) - 1

    stdin, stdout = item(spec.stdin_path), item(spec.stdout_path)
    stderr = stdout if spec.stderr_path is not None and spec.stderr_path == spec.stdout_path \
        else item(spec.stderr_path)
    return (stdin, stdout, stderr), fds


def start_failure(failure: Failure, spec: JobSpec, job_dir: Path, argv0: str) -> JobStatus:
    """The final status of a job the keeper could not start."""
    code, what, words = failure
    if what in ("stdin", "stdout", "stderr"):
        path = getattr(spec, f"{what}_path")
        return _failed(f"JobSpec.{what}_path: cannot open {str(path)!r}: {words}")
    if what == "directory":
        return _failed(f"JobSpec.directory: {str(job_dir)!r} does not exist" if code in
                       _NOT_FOUND else f"JobSpec.directory: {str(job_dir)!r}: {words}")
    if what == "spawn" and code in _NOT_FOUND:
        return not_found(spec.executable)
    if what == "spawn" and code in _NOT_EXECUTABLE:
        return not_executable(spec.executable, words)
    if what == "spawn" and code:
        return _failed(f"could not start {argv0!r}: {start_error_words(OSError(code, words))}")
    return _failed(f"could not start {argv0!r}: {words}")


def _failed(message: str) -> JobStatus:
    return JobStatus(JobState.FAILED, message=message)


class NativeIds:
    """Where ``job.native_id`` waits for the keeper to answer a job's start."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._waiting = 0

    def wait(self, known: Callable[[], bool]) -> None:
        """Return once ``known()`` (checked again at each answer), or after a long while."""
        deadline = _CLOCK.now() + _WAIT_SECONDS
        with self._cv:
            self._waiting += 1
            try:
                while not known():
                    left = deadline - _CLOCK.now()
                    if left <= 0:
                        return
                    _CLOCK.wait(self._cv, min(left, 1.0))
            finally:
                self._waiting -= 1

    def answered(self) -> None:
        """A start was answered (on the watch thread): wake the waiters, if any."""
        if self._waiting:
            with self._cv:
                self._cv.notify_all()


NATIVE_IDS = NativeIds()
