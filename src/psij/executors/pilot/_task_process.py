"""Starting one task's process on this node, and cleaning up after it.

Shared by the pilot engine (tasks on its own node) and the agent (tasks on the other nodes), so
that a task is started the same way wherever it runs: its own process group, its directory,
redirections and environment given to the spawn call, a fresh ``TMPDIR`` and a node file
created before and removed after.

Exits are reported by an exit watch: the shared ``ProcessWatch`` thread (the agent), or a
:class:`LoopWatch` whose process ids sit in the owner's own event loop (the engine), so that an
exit reaches the owner's thread without a hop through another thread. Either way the owner
then calls :meth:`TaskProcesses.finish` on its own thread, so that removing a large ``TMPDIR``
never delays reaping.

It does not decide what runs, when, or where, and it never blocks on a task.
"""

import os
import signal
import sys
import time
from heapq import heappop, heappush
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from psij._private_dirs import ensure_private_dir
from psij.executors._process_watch import (
    ExitHandler,
    exit_code_of,
    group_has_live_members,
    killpg,
    signal_reaped_group,
    timer_delay,
)

__all__ = ["HAS_PIDFD", "Launch", "LaunchError", "LoopWatch", "TaskProcesses"]

_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
_RESTORED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ")
                          if hasattr(signal, name))
# A task leads a process group of its own either way it is started (before Python 3.11,
# Popen can only make a new session, which is also a new group).
_NEW_GROUP = sys.version_info >= (3, 11)
_POPEN_GROUP: Dict[str, Any] = {"process_group": 0} if _NEW_GROUP else {"start_new_session": True}
_POSIX_GROUP: Dict[str, Any] = {"setpgroup": 0} if _NEW_GROUP else {"setsid": True}
_SIGTERM = 15
_SIGKILL = 9
_GROUP_CHECK_INTERVAL = 0.05  # while what a task's leader left behind is being ended
# The selectors module's EVENT_READ, without importing it for a constant.
_EVENT_READ = 1


def _pidfds_work() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel older than 5.3
        return False
    return True


HAS_PIDFD = _pidfds_work()
"""Whether this system can watch a process through a file descriptor (Linux 5.3 and later),
which :class:`LoopWatch` needs."""


class LaunchError(Exception):
    """A task could not be started; the message says why in words a user can act on.

    ``exit_code`` is the shell's code for the cause when there is one: 127 for a program that
    was not found, 126 for one that cannot be executed.
    """

    def __init__(self, message: str, exit_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Launch:
    """Everything needed to start one task's process on a node (sent to agents as JSON).

    ``environment`` holds what is added to the base environment (this process's own, unless
    ``inherit_environment`` is false). Relative ``stdin``/``stdout``/``stderr`` paths are taken
    from ``directory``. ``nodefile`` is the text of the task's node file.
    """

    _fields = ("task_id", "argv", "directory", "environment", "inherit_environment", "stdin",
               "stdout", "stderr", "nodefile", "create_directories")
    __slots__ = _fields

    def __init__(self, task_id: str, argv: List[str], directory: str,
                 environment: Optional[Dict[str, str]] = None,
                 inherit_environment: bool = True, stdin: Optional[str] = None,
                 stdout: Optional[str] = None, stderr: Optional[str] = None,
                 nodefile: str = "", create_directories: bool = False) -> None:
        self.task_id = task_id
        self.argv = argv
        self.directory = directory
        self.environment: Dict[str, str] = {} if environment is None else environment
        self.inherit_environment = inherit_environment
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.nodefile = nodefile
        self.create_directories = create_directories

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Launch:
            return NotImplemented
        return self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Launch({', '.join(f'{k}={v!r}' for k, v in self.to_json().items())})"

    def to_json(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Launch":
        return cls(**{k: data[k] for k in cls._fields if k in data})


class LoopWatch:
    """Exits and timed actions for an owner that runs its own event loop on one thread.

    Each watched process is a pidfd registered in the owner's selector with a callable as its
    data; the loop calls ``key.data(mask)`` when it is readable, which reaps the process and
    calls its exit handler right there, on the loop's thread. Timed actions (the KILL after a
    cancel's TERM, time limits) are kept here and run by :meth:`run_due`; the loop sleeps at
    most :meth:`next_timeout`. Every method must be called on the loop's thread, which is also
    what makes signalling safe: a process id is signalled only while this watch has not
    reaped it, so it cannot have been reused.
    """

    def __init__(self, selector: Any) -> None:
        self._selector = selector
        self._children: Dict[int, int] = {}  # pid -> pidfd, until reaped
        self._deadlines: List[Tuple[float, int, Callable[[], object]]] = []
        self._seq = 0

    def watch(self, pid: int, on_exit: ExitHandler) -> bool:
        """Watch our child ``pid`` (not yet reaped: a pidfd opens on a zombie too)."""
        fd = os.pidfd_open(pid)
        self._children[pid] = fd

        def ready(mask: int) -> None:
            self._ready(pid, fd, on_exit)

        self._selector.register(fd, _EVENT_READ, ready)
        return True

    def _ready(self, pid: int, fd: int, on_exit: ExitHandler) -> None:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
            if reaped == 0:
                return  # not ended yet
        except ChildProcessError:
            status = None  # reaped by someone else: its status is lost
        if self._children.pop(pid, None) is not None:
            self._selector.unregister(fd)
            os.close(fd)
        on_exit(pid, status)

    def signal_group(self, pid: int, signum: int) -> bool:
        """Signal the process group led by ``pid`` if that process has not been reaped."""
        return pid in self._children and killpg(pid, signum)

    def call_later(self, delay: float, action: Callable[[], object]) -> None:
        """Run ``action`` on the loop's thread after ``delay`` seconds."""
        self._seq += 1
        heappush(self._deadlines, (time.monotonic() + timer_delay(delay), self._seq, action))

    def signal_later(self, pgid: int, signum: int, delay: float) -> None:
        """Send ``signum`` to process group ``pgid`` after ``delay`` seconds: through its leader
        if it has not been reaped, else to what is left of its group."""
        def send() -> None:
            if pgid in self._children:
                self.signal_group(pgid, signum)
            else:
                signal_reaped_group(pgid, signum)

        self.call_later(delay, send)

    def next_timeout(self) -> Optional[float]:
        """Seconds until the next timed action is due; None when there is none."""
        if not self._deadlines:
            return None
        return timer_delay(self._deadlines[0][0] - time.monotonic())

    def run_due(self) -> None:
        """Run the timed actions that are due."""
        deadlines = self._deadlines
        if not deadlines:
            return
        now = time.monotonic()
        while deadlines and deadlines[0][0] <= now:
            heappop(deadlines)[2]()

    def close(self) -> None:
        """Stop watching (the processes left are not reaped here)."""
        for fd in self._children.values():
            try:
                self._selector.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        self._children.clear()


class _Process:
    __slots__ = ("nodefile", "pid", "signalled", "stderr", "tmpdir")

    def __init__(self, pid: int, tmpdir: str, nodefile: str, stderr: Optional[str]) -> None:
        self.pid = pid
        self.tmpdir = tmpdir
        self.nodefile = nodefile
        self.stderr = stderr
        self.signalled = False  # TERM was sent to its group


class TaskProcesses:
    """The task processes of one owner on this node, by task id.

    ``on_exit(task_id, exit_code)`` is called on the watch's thread (the ``ProcessWatch``
    thread by default, the loop's own thread with a :class:`LoopWatch`); with the shared
    thread it must only hand the exit over to the owner's thread. The owner then calls
    :meth:`finish`.

    A task has ended when its process group is empty, not when its leader exits: what the
    leader left running still uses the task's share. So when the leader exits before the rest
    of its group, the group gets TERM (unless a cancel sent it already) and KILL ``grace``
    seconds later, as a batch system ends what a job step left behind, and ``on_exit`` is
    called (with the leader's exit code) once no live process is left in the group.
    """

    def __init__(self, tmp_root: Path, on_exit: Callable[[str, Optional[int]], None],
                 watch: Any = None, grace: float = 5.0) -> None:
        if watch is None:
            from psij.executors._process_watch import WATCH

            watch = WATCH
        self._watch = watch
        self._tmp_root = Path(tmp_root)
        ensure_private_dir(self._tmp_root, "pilot tasks' TMPDIR root")
        self._tmp_prefix = os.path.join(str(self._tmp_root), "t")
        self._on_exit = on_exit
        self._grace = grace
        self._base_environment = dict(os.environ)
        self._running: Dict[str, _Process] = {}
        self._seq = 0
        # One file per distinct node file text; each task's node file is a hard link to it,
        # which costs far less than writing a new file for every task.
        self._nodefile_sources: Dict[str, str] = {}
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self._spawner = _Spawner()

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
        task_id = launch.task_id
        if task_id in self._running:
            raise LaunchError(f"task {task_id!r} is already running on this node")
        directory = launch.directory
        if launch.create_directories:
            self._make_directories(launch)
        elif not os.path.isdir(directory):
            raise LaunchError(f"directory {directory!r} does not exist")
        self._seq += 1
        tmpdir = self._tmp_prefix + str(self._seq)
        nodefile = tmpdir + ".nodes"
        if launch.inherit_environment:
            env = self._base_environment.copy()
            env.update(launch.environment)
        else:
            env = dict(launch.environment)
        env["TMPDIR"] = tmpdir
        env["PSIJ_NODEFILE"] = nodefile
        opened: List[int] = []
        try:
            os.mkdir(tmpdir, 0o700)
            self._link_nodefile(launch.nodefile, nodefile)
            stdin, stdout, stderr = self._open_streams(launch, opened)
            pid = self._spawner.spawn(launch.argv, directory, env, stdin, stdout, stderr)
        except BaseException:
            self._remove(tmpdir, nodefile)
            raise
        finally:
            for fd in opened:
                os.close(fd)
        stderr_path = None
        if launch.stderr is not None:
            stderr_path = os.path.join(directory, launch.stderr)
        self._running[task_id] = _Process(pid, tmpdir, nodefile, stderr_path)
        leader_exited = self._leader_exited
        self._watch.watch(pid, lambda pid, status: leader_exited(task_id, pid, status))
        return pid

    def _leader_exited(self, task_id: str, pid: int, status: Optional[int]) -> None:
        # On the watch's thread.
        code = exit_code_of(status)
        if not group_has_live_members(pid):
            self._on_exit(task_id, code)
            return
        process = self._running.get(task_id)
        if process is not None and not process.signalled:
            process.signalled = True
            signal_reaped_group(pid, _SIGTERM)
            self._watch.call_later(self._grace, lambda: signal_reaped_group(pid, _SIGKILL))

        def check() -> None:
            if group_has_live_members(pid):
                self._watch.call_later(_GROUP_CHECK_INTERVAL, check)
            else:
                self._on_exit(task_id, code)

        self._watch.call_later(_GROUP_CHECK_INTERVAL, check)

    def finish(self, task_id: str, code: Optional[int]) -> Optional[str]:
        """Clean up after an exit reported through ``on_exit``; returns the failure message
        (None when the exit code is 0)."""
        process = self._running.pop(task_id, None)
        if process is not None:
            self._remove(process.tmpdir, process.nodefile)
        if code == 0:
            return None
        from psij.executors.local import _failure_message

        return _failure_message(code, None if process is None or process.stderr is None
                                else Path(process.stderr))

    def signal(self, task_id: str, grace: float) -> bool:
        """TERM the task's process group now and KILL it after ``grace`` seconds."""
        process = self._running.get(task_id)
        if process is None:
            return False
        process.signalled = True
        pid = process.pid
        # After its leader exited, the group is signalled without it (see the class notes).
        if self._watch.signal_group(pid, _SIGTERM) or signal_reaped_group(pid, _SIGTERM):
            self._watch.signal_later(pid, _SIGKILL, grace)
            return True
        return False

    def signal_all(self, grace: float) -> None:
        for task_id in list(self._running):
            self.signal(task_id, grace)

    def remove_tmp_root(self) -> None:
        """Remove the folder of the TMPDIRs (after the last task ended)."""
        import shutil

        shutil.rmtree(self._tmp_root, ignore_errors=True)
        if self._devnull >= 0:
            os.close(self._devnull)
            self._devnull = -1

    @staticmethod
    def _remove(tmpdir: str, nodefile: str) -> None:
        try:
            os.rmdir(tmpdir)  # the common case, an empty TMPDIR, in one call
        except FileNotFoundError:
            pass
        except OSError:
            import shutil

            shutil.rmtree(tmpdir, ignore_errors=True)
        try:
            os.unlink(nodefile)
        except OSError:
            pass

    def _link_nodefile(self, text: str, path: str) -> None:
        source = self._nodefile_sources.get(text)
        if source is not None:
            try:
                os.link(source, path)
                return
            except FileNotFoundError:
                pass  # its source was removed: write a new one
        source = f"{self._tmp_root}/nodes{len(self._nodefile_sources)}-{self._seq}"
        fd = os.open(source, _WRITE | os.O_EXCL, 0o444)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        self._nodefile_sources[text] = source
        os.link(source, path)

    @staticmethod
    def _make_directories(launch: Launch) -> None:
        directory = launch.directory
        isdir = os.path.isdir
        try:
            # Checked first: the directories almost always exist already, and a check costs
            # less than a failing mkdir.
            if not isdir(directory):
                os.makedirs(directory, exist_ok=True)
            for path in (launch.stdout, launch.stderr):
                if path is not None:
                    parent = os.path.dirname(os.path.join(directory, path))
                    if not isdir(parent):
                        os.makedirs(parent, exist_ok=True)
        except OSError as ex:
            raise LaunchError(f"cannot create the task's directories: {ex}") from ex
        except UnicodeEncodeError as ex:
            raise LaunchError(f"cannot create the task's directories: {_NOT_TEXT}") from ex

    def _open_streams(self, launch: Launch, opened: List[int]) -> Tuple[int, int, int]:
        def open_one(path: str, flags: int, what: str) -> int:
            try:
                fd = os.open(os.path.join(launch.directory, path), flags, 0o666)
            except OSError as ex:
                raise LaunchError(f"cannot open {what} {path!r}: {ex.strerror}") from ex
            except UnicodeEncodeError as ex:
                raise LaunchError(f"cannot open {what} {path!r}: {_NOT_TEXT}") from ex
            opened.append(fd)
            return fd

        stdin = stdout = stderr = self._devnull
        if launch.stdin is not None:
            stdin = open_one(launch.stdin, os.O_RDONLY | os.O_CLOEXEC, "stdin")
        if launch.stdout is not None:
            stdout = open_one(launch.stdout, _WRITE, "stdout")
        if launch.stderr is not None:
            stderr = stdout if launch.stderr == launch.stdout \
                else open_one(launch.stderr, _WRITE, "stderr")
        return stdin, stdout, stderr


class _Spawner:
    """Starts a task's process as the leader of a new process group, in its directory, with
    its environment and standard streams, and no other descriptor of this process.

    ``os.posix_spawn`` costs markedly less than ``subprocess.Popen`` for each task, but it can
    neither change directory nor close descriptors that are not close-on-exec. So it is used
    when the task runs in this process's own working directory and this process held no
    inheritable descriptor above 2 when the spawner was made (Python opens none; one could
    come from whoever started this process); ``Popen`` does everything else.
    """

    def __init__(self) -> None:
        self._posix = hasattr(os, "posix_spawn") and not _inheritable_descriptors()
        # Program names found on a PATH, checked again (one access call) at each use.
        self._found: Dict[Tuple[str, str], str] = {}

    def spawn(self, argv: List[str], directory: str, env: Dict[str, str], stdin: int,
              stdout: int, stderr: int) -> int:
        """The new process's pid; raises LaunchError saying why it could not start."""
        try:
            if self._posix and directory == os.getcwd():
                return self._posix_spawn(argv, env, stdin, stdout, stderr)
            return _popen(argv, directory, env, stdin, stdout, stderr)
        except FileNotFoundError as ex:
            raise LaunchError(f"executable {argv[0]!r} was not found (no such file, or not on "
                              "PATH)", 127) from ex
        except PermissionError as ex:
            raise LaunchError(f"executable {argv[0]!r} cannot be executed "
                              f"({ex.strerror})", 126) from ex
        except OSError as ex:
            raise LaunchError(f"could not start {argv[0]!r}: {ex}") from ex
        except UnicodeEncodeError as ex:
            raise LaunchError(_unencodable(argv, env)) from ex

    def _posix_spawn(self, argv: List[str], env: Dict[str, str], stdin: int, stdout: int,
                     stderr: int) -> int:
        program = argv[0]
        if "/" not in program:
            program = self._on_path(program, env)
        # Python ignores SIGPIPE and SIGXFSZ, and ignored signals stay ignored across exec:
        # the task gets their default actions back, as Popen gives them.
        return os.posix_spawn(program, argv, env, setsigdef=_RESTORED_SIGNALS,
                              file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0),
                                            (os.POSIX_SPAWN_DUP2, stdout, 1),
                                            (os.POSIX_SPAWN_DUP2, stderr, 2)],
                              **_POSIX_GROUP)

    def _on_path(self, name: str, env: Mapping[str, str]) -> str:
        """The first executable ``name`` on the task's own PATH, as Popen would find it."""
        path = env.get("PATH", os.defpath)
        key = (name, path)
        found = self._found.get(key)
        if found is not None and os.access(found, os.X_OK):
            return found
        for folder in os.get_exec_path(env):
            candidate = os.path.join(folder, name)
            if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
                self._found[key] = candidate
                return candidate
        raise FileNotFoundError(2, "No such file or directory", name)


_NOT_TEXT = "it holds a lone surrogate, which no file name or program can receive"


def _unencodable(argv: List[str], env: Mapping[str, str]) -> str:
    """Which argument or variable of a launch cannot be passed to a program, and why."""
    def bad(text: str) -> bool:
        try:
            os.fsencode(text)
        except UnicodeEncodeError:
            return True
        return False

    for i, arg in enumerate(argv):
        if bad(arg):
            return (f"executable {arg!r}: {_NOT_TEXT}" if i == 0
                    else f"argument {i} ({arg!r}): {_NOT_TEXT}")
    for key, value in env.items():
        if bad(key) or bad(value):
            return f"environment variable {key!r} ({value!r}): {_NOT_TEXT}"
    return f"the directory, an argument or a variable: {_NOT_TEXT}"


def _inheritable_descriptors() -> bool:
    """Whether this process has an inheritable descriptor above 2 (unknown counts as yes)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            fd = int(name)
            if fd > 2:
                try:
                    if os.get_inheritable(fd):
                        return True
                except OSError:
                    pass  # the descriptor listdir itself used, closed since
        return False
    return True


def _popen(argv: List[str], directory: str, env: Dict[str, str], stdin: int, stdout: int,
           stderr: int) -> int:
    import subprocess

    popen = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, cwd=directory,
                             env=env, close_fds=True, **_POPEN_GROUP)
    # The exit watch reaps the process; the Popen object must not think it still runs.
    popen.returncode = 0
    return popen.pid

