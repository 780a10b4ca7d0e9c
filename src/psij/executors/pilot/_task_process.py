"""Starting one task's process on this node, and cleaning up after it.

Shared by the pilot engine (tasks on its own node) and the agent (tasks on the other nodes), so
that a task is started the same way wherever it runs: its own process group, its directory,
redirections and environment given to the spawn call, a fresh ``TMPDIR`` and a node file
created before and removed after.

It does not decide what runs, when, or where; it does not wait for processes (the shared
``ProcessWatch`` reports exits to the owner, which then calls :meth:`TaskProcesses.finish` on
its own thread, so that removing a large ``TMPDIR`` never delays reaping).
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from psij.executors._process_watch import WATCH, exit_code_of
from psij.executors.local import _failure_message

__all__ = ["Launch", "LaunchError", "TaskProcesses"]

_NEW_GROUP: Dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                              else {"start_new_session": True})
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_SIGTERM = 15
_SIGKILL = 9


class LaunchError(Exception):
    """A task could not be started; the message says why in words a user can act on."""


@dataclass
class Launch:
    """Everything needed to start one task's process on a node (sent to agents as JSON).

    ``environment`` holds what is added to the base environment (this process's own, unless
    ``inherit_environment`` is false). Relative ``stdin``/``stdout``/``stderr`` paths are taken
    from ``directory``. ``nodefile`` is the text of the task's node file.
    """

    task_id: str
    argv: List[str]
    directory: str
    environment: Dict[str, str] = field(default_factory=dict)
    inherit_environment: bool = True
    stdin: Optional[str] = None
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    nodefile: str = ""
    create_directories: bool = False

    def to_json(self) -> Dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Launch":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class _Process:
    __slots__ = ("nodefile", "pid", "popen", "stderr", "tmpdir")

    def __init__(self, popen: "subprocess.Popen[bytes]", tmpdir: str, nodefile: str,
                 stderr: Optional[str]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.tmpdir = tmpdir
        self.nodefile = nodefile
        self.stderr = stderr


class TaskProcesses:
    """The task processes of one owner on this node, by task id.

    ``on_exit(task_id, exit_code)`` is called on the ProcessWatch thread and must only hand the
    exit over to the owner's thread, which then calls :meth:`finish`.
    """

    def __init__(self, tmp_root: Path, on_exit: Callable[[str, Optional[int]], None]) -> None:
        self._tmp_root = Path(tmp_root)
        self._tmp_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._on_exit = on_exit
        self._base_environment = dict(os.environ)
        self._running: Dict[str, _Process] = {}
        self._seq = 0

    @property
    def tmp_root(self) -> Path:
        return self._tmp_root

    def running(self) -> int:
        return len(self._running)

    def pid(self, task_id: str) -> Optional[int]:
        process = self._running.get(task_id)
        return None if process is None else process.pid

    def start(self, launch: Launch) -> int:
        """Start the task's process; returns its pid. Raises LaunchError and leaves nothing
        behind when it cannot be started."""
        if launch.task_id in self._running:
            raise LaunchError(f"task {launch.task_id!r} is already running on this node")
        directory = launch.directory
        if launch.create_directories:
            self._make_directories(launch)
        elif not os.path.isdir(directory):
            raise LaunchError(f"directory {directory!r} does not exist")
        self._seq += 1
        tmpdir = str(self._tmp_root / f"t{self._seq}")
        nodefile = tmpdir + ".nodes"
        env = dict(self._base_environment) if launch.inherit_environment else {}
        env.update(launch.environment)
        env["TMPDIR"] = tmpdir
        env["PSIJ_NODEFILE"] = nodefile
        opened: List[int] = []
        try:
            os.mkdir(tmpdir, 0o700)
            fd = os.open(nodefile, _WRITE, 0o644)
            try:
                os.write(fd, launch.nodefile.encode())
            finally:
                os.close(fd)
            stdin, stdout, stderr = self._open_streams(launch, opened)
            try:
                popen = subprocess.Popen(launch.argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                         cwd=directory, env=env, close_fds=True, **_NEW_GROUP)
            except FileNotFoundError as ex:
                raise LaunchError(f"executable {launch.argv[0]!r} was not found (no such file, "
                                  "or not on PATH)") from ex
            except PermissionError as ex:
                raise LaunchError(f"executable {launch.argv[0]!r} cannot be executed "
                                  f"({ex.strerror})") from ex
            except OSError as ex:
                raise LaunchError(f"could not start {launch.argv[0]!r}: {ex}") from ex
        except BaseException:
            _remove(tmpdir, nodefile)
            raise
        finally:
            for fd in opened:
                os.close(fd)
        stderr_path = None
        if launch.stderr is not None:
            stderr_path = os.path.join(directory, launch.stderr)
        process = _Process(popen, tmpdir, nodefile, stderr_path)
        self._running[launch.task_id] = process
        task_id = launch.task_id
        WATCH.watch(popen.pid, lambda pid, status: self._exited(task_id, process, status))
        return popen.pid

    def _exited(self, task_id: str, process: _Process, status: Optional[int]) -> None:
        code = exit_code_of(status)
        # The watch reaped it: tell the Popen object, which would otherwise think it runs.
        process.popen.returncode = code if code is not None else -1
        self._on_exit(task_id, code)

    def finish(self, task_id: str, code: Optional[int]) -> Optional[str]:
        """Clean up after an exit reported through ``on_exit``; returns the failure message
        (None when the exit code is 0)."""
        process = self._running.pop(task_id, None)
        if process is not None:
            _remove(process.tmpdir, process.nodefile)
        if code == 0:
            return None
        return _failure_message(code, None if process is None or process.stderr is None
                                else Path(process.stderr))

    def signal(self, task_id: str, grace: float) -> bool:
        """TERM the task's process group now and KILL it after ``grace`` seconds."""
        process = self._running.get(task_id)
        if process is None:
            return False
        if WATCH.signal_group(process.pid, _SIGTERM):
            WATCH.signal_later(process.pid, _SIGKILL, grace)
            return True
        return False

    def signal_all(self, grace: float) -> None:
        for task_id in list(self._running):
            self.signal(task_id, grace)

    def remove_tmp_root(self) -> None:
        """Remove the folder of the TMPDIRs (after the last task ended)."""
        shutil.rmtree(self._tmp_root, ignore_errors=True)

    @staticmethod
    def _make_directories(launch: Launch) -> None:
        try:
            os.makedirs(launch.directory, exist_ok=True)
            for path in (launch.stdout, launch.stderr):
                if path is not None:
                    parent = os.path.dirname(os.path.join(launch.directory, path))
                    os.makedirs(parent, exist_ok=True)
        except OSError as ex:
            raise LaunchError(f"cannot create the task's directories: {ex}") from ex

    @staticmethod
    def _open_streams(launch: Launch, opened: List[int]) -> Tuple[Any, Any, Any]:
        def open_one(path: str, flags: int, what: str) -> int:
            try:
                fd = os.open(os.path.join(launch.directory, path), flags, 0o666)
            except OSError as ex:
                raise LaunchError(f"cannot open {what} {path!r}: {ex.strerror}") from ex
            opened.append(fd)
            return fd

        stdin: Any = subprocess.DEVNULL
        if launch.stdin is not None:
            stdin = open_one(launch.stdin, os.O_RDONLY | os.O_CLOEXEC, "stdin")
        stdout: Any = subprocess.DEVNULL
        if launch.stdout is not None:
            stdout = open_one(launch.stdout, _WRITE, "stdout")
        stderr: Any = subprocess.DEVNULL
        if launch.stderr is not None:
            stderr = stdout if launch.stderr == launch.stdout \
                else open_one(launch.stderr, _WRITE, "stderr")
        return stdin, stdout, stderr


def _remove(tmpdir: str, nodefile: str) -> None:
    try:
        os.rmdir(tmpdir)  # the common case, an empty TMPDIR, in one call
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(tmpdir, ignore_errors=True)
    try:
        os.unlink(nodefile)
    except OSError:
        pass
