"""Slurm submissions through a ``slurmrestd`` child: ~2 ms a job instead of sbatch's 4-6.

Most of what ``sbatch`` costs is its own start (libraries, plugins, configuration) before the
one call to the controller. ``slurmrestd`` does that call too; started once, as a child of this
process in its inetd mode (HTTP on its standard input and output, ``rest_auth/local``), it
acts as the user of this process and serves one submission after another. The request is
built by :mod:`psij.executors.batch._slurm_rest` so that the job is the one sbatch would make.

Used only where it is the same Slurm: the ``slurmrestd`` beside the ``sbatch`` found on PATH
(``<dir>/slurmrestd`` or ``<dir>/../sbin/slurmrestd``), with API ``v0.0.38`` (Slurm 22.05 and
23.02); a root process starts it with ``SLURMRESTD_SECURITY=disable_user_check`` (it refuses
root otherwise; the child talks only to this process through its pipes). Not for the first
submission of an executor (a program that submits one job pays no start-up), nor in a child
made by ``fork``. A job goes to sbatch instead when its request cannot be built exactly (see
:mod:`~psij.executors.batch._slurm_rest`) and when slurmrestd refuses it, so that errors are
sbatch's own. A new child is asked for a ping first; when the child fails (does not start,
does not answer the ping, ends, answers garbage) sbatch is used for ``REST_S`` seconds. If it
ends or falls silent after the whole request was written, the job may have been submitted:
the submission fails with a message saying so, and is not retried.

The child is stopped (its input closed; it ends by itself) ``IDLE_S`` seconds after the last
submission, by :meth:`RestSubmitter.close` (the executor's ``close``), and at exit; if this
process dies, its end of the pipe closes and the child ends too.
"""

import logging
import os
import select
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from psij._clock import Clock, MonotonicClock
from psij._spawn import popen
from psij.executors.batch import _slurm_rest as rest
from psij.executors.batch._command import (
    MAY_HAVE_BEEN_SUBMITTED,
    CommandResult,
    close_pipes,
    keep_children,
    kill_group,
    start_failure,
)
from psij.executors.batch._environ import inherited
from psij.executors.batch._spares import _umask

__all__ = ["IDLE_S", "REST_S", "RestSubmitter", "slurmrestd_beside"]

logger = logging.getLogger(__name__)

IDLE_S = 10.0
REST_S = 60.0
_PROBE = (b"GET /slurm/v0.0.38/ping HTTP/1.1\r\nHost: localhost\r\n"
          b"Accept: application/json\r\n\r\n")
_PROBE_TIMEOUT = 30.0
_MAX_HEAD = 65536
_MAX_BODY = 16 << 20


def slurmrestd_beside(sbatch: str, path: Optional[str]) -> Optional[str]:
    """The ``slurmrestd`` of the installation whose ``sbatch`` (as found on ``path``) runs."""
    import shutil

    found = shutil.which(sbatch, path=path)
    if found is None:
        return None
    where = Path(found).resolve().parent
    for candidate in (where / "slurmrestd", where.parent / "sbin" / "slurmrestd"):
        if os.access(candidate, os.X_OK) and candidate.is_file():
            return str(candidate)
    return None


class _Failed(Exception):
    """The child cannot be used; ``sent`` when the whole request had been written."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.sent = sent


class RestSubmitter:
    """One ``slurmrestd`` child and the submissions sent to it (see the module)."""

    def __init__(self, run: Callable[[Sequence[str]], CommandResult],
                 env: Optional[Mapping[str, str]] = None, idle: float = IDLE_S,
                 clock: Optional[Clock] = None) -> None:
        self._run = run  # runs scontrol (the executor's runner)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._env = dict(env) if env is not None else None
        self._idle = idle
        self._lock = threading.Lock()  # one request at a time on the child's pipes
        self._cond = threading.Condition(self._lock)
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._proc_key: Tuple[object, ...] = ()
        self._site: Optional[rest.SiteSettings] = None
        self._located: Tuple[Optional[str], Optional[str]] = ("", None)  # PATH, slurmrestd
        self._calls = 0
        self._last_use = 0.0
        self._off_until = 0.0
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._pid = os.getpid()
        keep_children(self)

    @property
    def child_pid(self) -> Optional[int]:
        """The process id of the running child, if any."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def submit(self, argv: Sequence[str], script: str,
               timeout: float) -> Optional[CommandResult]:
        """Submit ``script`` (the one ``argv``, sbatch's command line, would read on its
        input) through the child: sbatch's answer, or None when sbatch is to be run."""
        if self._closed or os.getpid() != self._pid or len(argv) != 2:
            return None
        fields = rest.job_fields(script)
        if fields is None:
            return None
        env = self._env if self._env is not None else inherited()
        with self._lock:
            self._calls += 1
            self._last_use = self._clock.now()
            if self._calls < 2 or self._last_use < self._off_until or self._closed:
                return None
            try:
                return self._submit_locked(argv[0], script, fields, env, timeout)
            except _Failed as e:
                self._stop_locked()
                self._off_until = self._clock.now() + REST_S
                if not e.sent:
                    logger.debug("slurmrestd not used for %s s: %s", REST_S, e)
                    return None
                logger.warning("slurmrestd failed after a job was given to it: %s", e)
                return CommandResult(("slurmrestd", "POST", rest.API), None, failure=(
                    f"slurmrestd {e} after the job was given to it: the job "
                    f"{MAY_HAVE_BEEN_SUBMITTED} (see squeue)"))
            except Exception as e:  # a defect here: the child goes, its pipes closed
                self._stop_locked()
                self._off_until = self._clock.now() + REST_S
                logger.warning("slurmrestd submission failed: %r", e, exc_info=True)
                return CommandResult(("slurmrestd", "POST", rest.API), None, failure=(
                    f"slurmrestd submission failed ({e!r}): the job "
                    f"{MAY_HAVE_BEEN_SUBMITTED} (see squeue)"))

    def close(self) -> None:
        """Stop the child and the thread that stops it when idle."""
        with self._cond:
            self._closed = True
            self._stop_locked()
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # ------------------------------------------------------------------------ internals

    def _submit_locked(self, sbatch: str, script: str, fields: Dict[str, Any],
                       env: Mapping[str, str], timeout: float) -> Optional[CommandResult]:
        binary = self._slurmrestd(sbatch, env.get("PATH"))
        if binary is None:
            return None
        site = self._site_settings()
        if site is None or site.cli_filters:
            return None
        umask = _umask()
        if umask is None:
            return None
        try:
            environment = rest.job_environment(env, fields, site, umask.decode("ascii"))
            cwd = os.getcwd()
        except OSError:  # the working directory is gone, ...: sbatch says what it says
            return None
        if environment is None:
            return None
        request = rest.request_bytes(script, fields, environment, cwd)
        if request is None:
            return None
        proc = self._child(binary, env)
        status, body = _exchange(proc, request, timeout)
        job_id, said = rest.parse_response(status, body)
        if job_id is None:
            logger.debug("slurmrestd refused a job (%s); sbatch is run for it", said)
            return None
        return rest.submitted(job_id)

    def _slurmrestd(self, sbatch: str, path: Optional[str]) -> Optional[str]:
        if self._located[0] != path:
            self._located = (path, slurmrestd_beside(sbatch, path))
        return self._located[1]

    def _site_settings(self) -> Optional[rest.SiteSettings]:
        if self._site is None:
            result = self._run(("scontrol", "show", "config"))
            if not result.ok:
                raise _Failed(f"scontrol show config failed: {result.describe()}", sent=False)
            try:
                self._site = rest.site_settings(result.stdout)
            except ValueError as e:
                raise _Failed(str(e), sent=False) from e
        return self._site

    def _child(self, binary: str, env: Mapping[str, str]) -> "subprocess.Popen[bytes]":
        key = (binary, env.get("SLURM_CONF"), os.geteuid(), os.getegid(), tuple(os.getgroups()))
        proc = self._proc
        if proc is not None and (proc.poll() is not None or key != self._proc_key):
            self._stop_locked()
            proc = None
        if proc is None:
            child_env = dict(env)
            child_env.pop("SLURMRESTD_SECURITY", None)
            if os.geteuid() == 0:
                child_env["SLURMRESTD_SECURITY"] = "disable_user_check"
            try:
                proc = popen((binary, "-a", "rest_auth/local", "-s", "openapi/v0.0.38"),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env,
                             bufsize=0)
            except OSError as e:
                raise _Failed(start_failure(e), sent=False) from e
            self._proc, self._proc_key = proc, key
            try:  # a child that cannot serve (refuses to run, no controller) takes no job
                status, body = _exchange(proc, _PROBE, _PROBE_TIMEOUT)
            except _Failed as e:
                raise _Failed(f"did not answer a ping: {e}", sent=False) from e
            if status != 200:
                raise _Failed(f"answered a ping with HTTP {status}: {body[:200]!r}", sent=False)
            self._ensure_thread()
        return proc

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        close_pipes(proc)
        try:
            proc.wait(2.0)  # ends by itself at the end of its input
        except subprocess.TimeoutExpired:
            kill_group(proc)
            proc.wait()

    def _ensure_thread(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._idle_loop, daemon=True,
                                            name="psij-slurmrestd-idle")
            self._thread.start()

    def _idle_loop(self) -> None:
        with self._cond:
            while not self._closed and self._proc is not None:
                left = self._last_use + self._idle - self._clock.now()
                if left <= 0:
                    try:
                        self._stop_locked()
                    except Exception:  # the child is forgotten; submissions start another
                        logger.exception("stopping the idle slurmrestd child failed")
                    break
                self._clock.wait(self._cond, left)
            if self._thread is threading.current_thread():
                self._thread = None

    def forget_after_fork(self) -> None:
        """In a forked child: close this process's copies of the child's pipes, use none."""
        self._closed = True
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._thread = None
        proc, self._proc = self._proc, None
        if proc is not None:
            close_pipes(proc)


def _exchange(proc: "subprocess.Popen[bytes]", request: bytes,
              timeout: float) -> Tuple[int, bytes]:
    """Write ``request`` to ``proc`` and read one HTTP response: (status, body)."""
    assert proc.stdin is not None and proc.stdout is not None
    out_fd, in_fd = proc.stdin.fileno(), proc.stdout.fileno()
    if _ready(in_fd, select.POLLIN, 0):
        raise _Failed("wrote or closed its output unasked", sent=False)
    deadline = _PIPE_CLOCK.now() + timeout
    view = memoryview(request)
    while view:
        if not _ready(out_fd, select.POLLOUT, deadline - _PIPE_CLOCK.now()):
            raise _Failed(f"did not read its input within {timeout} s", sent=False)
        try:
            view = view[os.write(out_fd, view):]
        except OSError as e:  # ended: an unfinished request submits nothing
            raise _Failed(f"ended ({e.strerror or e})", sent=False) from e
    data = b""
    while b"\r\n\r\n" not in data:
        data += _read(in_fd, deadline, timeout)
        if len(data) > _MAX_HEAD:
            raise _Failed("answered with a header over 64 KiB", sent=True)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = int(value.strip())
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit() \
            or length is None or length > _MAX_BODY:
        raise _Failed(f"answered what is not a response with a length: {lines[0][:80]!r}",
                      sent=True)
    while len(body) < length:
        body += _read(in_fd, deadline, timeout)
    if len(body) > length:
        raise _Failed("answered more than one response", sent=True)
    return int(parts[1]), body


def _ready(fd: int, event: int, timeout: float) -> bool:
    """Whether ``fd`` is ready for ``event`` (or hung up) within ``timeout`` seconds; poll,
    not select, which refuses descriptors numbered 1024 and above (a program with many open
    files has such)."""
    waiter = select.poll()
    waiter.register(fd, event)
    return bool(waiter.poll(max(0.0, timeout) * 1000))


def _read(fd: int, deadline: float, timeout: float) -> bytes:
    if not _ready(fd, select.POLLIN, deadline - _PIPE_CLOCK.now()):
        raise _Failed(f"did not answer within {timeout} s", sent=True)
    chunk = os.read(fd, 65536)
    if not chunk:
        raise _Failed("ended", sent=True)
    return chunk


_PIPE_CLOCK = MonotonicClock()  # the child answers through its pipes in real time
