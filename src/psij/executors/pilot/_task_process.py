"""Starting one task's process on this node, and cleaning up after it.

Shared by the pilot's workers (tasks on the engine's own node, :mod:`._worker`; on a small
node the engine itself, :mod:`._inline_tasks`) and agents
(tasks on the other nodes), so that a task is started the same way wherever it runs: its own
process group, its directory, redirections and environment given to the spawn call (through
the process layer that the local executor uses too, ``psij.executors._process``), a fresh
``TMPDIR`` and a node file created before and removed after.

The process that starts a task reaps it (``wait4``), and keeps what the system says of the
leader's resource use (:data:`ProcessUse`: its CPU seconds, user and system, and its peak
resident memory, each counting the descendants it waited for) until :meth:`TaskProcesses.finish_run`
hands it over with the task's end.

Exits are reported by an exit watch: the shared ``ProcessWatch`` thread (the agent), or a
:class:`LoopWatch` whose process ids sit in the owner's own event loop (the engine watches its
workers so; a worker uses a variant that reaps all its children on SIGCHLD), so that an exit
reaches the owner's thread without a hop through another thread. Either way the owner
then calls :meth:`TaskProcesses.finish` on its own thread. An ended task's empty ``TMPDIR`` is
renamed and given to a later task rather than removed and made again, which would cost ten
times more on the owner's thread. The
timers (the KILL after a TERM) run on the watch's clock, a ``ManualClock`` in tests.

It does not decide what runs, when, or where, and it never blocks on a task.
"""

import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from psij._clock import Clock
from psij._lazylog import LazyLogger
from psij._private_dirs import ensure_private_dir
from psij._wakeup import Timers
from psij.executors._process import (
    NOT_TEXT,
    SIGKILL,
    SIGTERM,
    WRITE,
    LaunchError,
    Spawner,
    StreamError,
    exit_code_of,
    failure_message,
    group_has_live_members,
    killpg,
    open_streams,
    reap_later,
    reap_use,
    reap_within,
    signal_reaped_group,
    terminate_group,
)
from psij.executors._process_watch import ExitHandler

__all__ = ["HAS_PIDFD", "Launch", "LaunchError", "LoopWatch", "ProcessUse", "TaskProcesses",
           "use_of_rusage"]

logger = LazyLogger(__name__)

_GROUP_CHECK_INTERVAL = 0.05  # while what a task's leader left behind is being ended
_KILL_REAP_WAIT = 1.0  # seconds, for the tasks killed at the owner's end to be reaped
_SPARE_TMPDIRS = 64  # empty TMPDIRs of ended tasks kept for later tasks, at most
# The selectors module's EVENT_READ, without importing it for a constant.
_EVENT_READ = 1
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is in KiB but on macOS

ProcessUse = Tuple[float, int]
"""A reaped process's CPU seconds (user + system) and peak resident memory in bytes, each
with those of the descendants it waited for."""


def use_of_rusage(rusage: Any) -> ProcessUse:
    """The :data:`ProcessUse` of a reaped child's ``resource.struct_rusage``."""
    return rusage.ru_utime + rusage.ru_stime, rusage.ru_maxrss * _RSS_UNIT


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
    reaped it, so it cannot have been reused. Timed actions are due on ``clock`` (the monotonic
    clock by default).
    """

    def __init__(self, selector: Any, clock: Optional[Clock] = None) -> None:
        self._selector = selector
        self._children: Dict[int, int] = {}  # pid -> pidfd, until reaped
        self._timers = Timers(clock)
        self._usage: Dict[int, ProcessUse] = {}  # while the exit handler of the pid runs

    def watch(self, pid: int, on_exit: ExitHandler) -> bool:
        """Watch our child ``pid`` (not yet reaped: a pidfd opens on a zombie too)."""
        fd = os.pidfd_open(pid)
        self._children[pid] = fd

        def ready(mask: int) -> None:
            self._ready(pid, fd, on_exit)

        self._selector.register(fd, _EVENT_READ, ready)
        return True

    def _ready(self, pid: int, fd: int, on_exit: ExitHandler) -> None:
        ended, status, use = reap_use(pid)
        if not ended:
            return
        if self._children.pop(pid, None) is not None:
            self._selector.unregister(fd)
            os.close(fd)
        self._exited(pid, status, use, on_exit)

    def _exited(self, pid: int, status: Optional[int], use: Optional[ProcessUse],
                on_exit: ExitHandler) -> None:
        """Call the exit handler of ``pid`` with its use kept for :meth:`take_usage`."""
        if use is not None:
            self._usage[pid] = use
        try:
            on_exit(pid, status)
        finally:
            self._usage.pop(pid, None)

    def take_usage(self, pid: int) -> Optional[Tuple[float, float, int]]:
        """From the exit handler of child ``pid``: (0.0, its CPU seconds, its peak memory in
        bytes), as ``ProcessWatch.take_usage`` gives them; None when not known."""
        use = self._usage.pop(pid, None)
        return None if use is None else (0.0, *use)

    def signal_group(self, pid: int, signum: int) -> bool:
        """Signal the process group led by ``pid`` if that process has not been reaped."""
        return pid in self._children and killpg(pid, signum)

    def call_later(self, delay: float, action: Callable[[], object]) -> None:
        """Run ``action`` on the loop's thread after ``delay`` seconds."""
        self._timers.call_later(delay, action)

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
        return self._timers.next_timeout()

    def run_due(self) -> None:
        """Run the timed actions that are due (when one raises, the others stay due)."""
        due = self._timers.pop_due()
        for i, action in enumerate(due):
            try:
                action()
            except BaseException:
                for rest in due[i + 1:]:
                    self._timers.call_later(0.0, rest)
                raise

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
    __slots__ = ("nodefile", "pid", "signalled", "stderr", "tmpdir", "use")

    def __init__(self, pid: int, tmpdir: str, nodefile: str, stderr: Optional[str]) -> None:
        self.pid = pid
        self.tmpdir = tmpdir
        self.nodefile = nodefile
        self.stderr = stderr
        self.signalled = False  # TERM was sent to its group
        self.use: Optional[ProcessUse] = None  # once its leader was reaped


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
        # ``watch`` is a ProcessWatch or a LoopWatch: its timers (so its clock) time the KILL
        # after a TERM.
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
        self._uid = os.getuid()
        self._running: Dict[str, _Process] = {}
        self._seq = 0
        # One file per distinct node file text; each task's node file is a hard link to it,
        # which costs far less than writing a new file for every task.
        self._nodefile_sources: Dict[str, str] = {}
        self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self._spawner = Spawner()
        self._spare_tmpdirs: List[str] = []  # empty, private, renamed: for later tasks

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
        spare = self._spare_tmpdirs.pop() if self._spare_tmpdirs else None
        tmpdir = self._tmp_prefix + str(self._seq) if spare is None else spare
        nodefile = tmpdir + ".nodes"
        if launch.inherit_environment:
            env = self._base_environment.copy()
            env.update(launch.environment)
        else:
            env = dict(launch.environment)
        env["TMPDIR"] = tmpdir
        env["PSIJ_NODEFILE"] = nodefile
        # The two values task_environment leaves to be finished here.
        if env.get("SLURM_HOSTFILE") == "":
            env["SLURM_HOSTFILE"] = nodefile
        if env.get("SLURM_NTASKS_PER_NODE") == "":
            del env["SLURM_NTASKS_PER_NODE"]
        opened: List[int] = []
        try:
            if spare is None:
                os.mkdir(tmpdir, 0o700)
            self._link_nodefile(launch.nodefile, nodefile)
            stdin, stdout, stderr = open_streams(directory, launch.stdin, launch.stdout,
                                                 launch.stderr, self._devnull, opened)
            pid = self._spawner.spawn(launch.argv, directory, env, stdin, stdout, stderr)
        except StreamError as ex:
            _remove(tmpdir, nodefile)
            raise LaunchError(str(ex)) from ex
        except BaseException:
            _remove(tmpdir, nodefile)
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
        # On the watch's thread, from its exit handler (where the use of the reaped leader
        # can be taken).
        code = exit_code_of(status)
        process = self._running.get(task_id)
        take = getattr(self._watch, "take_usage", None)
        if process is not None and take is not None:
            taken = take(pid)
            if taken is not None:
                process.use = (taken[1], taken[2])
        if not group_has_live_members(pid):
            self._on_exit(task_id, code)
            return
        if process is not None and not process.signalled:
            process.signalled = True
            signal_reaped_group(pid, SIGTERM)
            self._watch.call_later(self._grace, lambda: signal_reaped_group(pid, SIGKILL))

        def check() -> None:
            if group_has_live_members(pid):
                self._watch.call_later(_GROUP_CHECK_INTERVAL, check)
            else:
                self._on_exit(task_id, code)

        self._watch.call_later(_GROUP_CHECK_INTERVAL, check)

    def finish(self, task_id: str, code: Optional[int]) -> Optional[str]:
        """Clean up after an exit reported through ``on_exit``; returns the failure message
        (None when the exit code is 0). The task's node file and ``TMPDIR`` are removed (an
        empty ``TMPDIR`` is renamed and kept for a later task, see :meth:`_recycle`)."""
        return self.finish_run(task_id, code)[0]

    def finish_run(self, task_id: str, code: Optional[int]
                   ) -> Tuple[Optional[str], Optional[ProcessUse]]:
        """:meth:`finish`, with the use of the task's leader process (None when the watch
        did not reap it)."""
        process = self._running.pop(task_id, None)
        if process is not None:
            _unlink(process.nodefile)
            self._recycle(process.tmpdir)
        use = None if process is None else process.use
        if code == 0:
            return None, use
        return failure_message(code, None if process is None or process.stderr is None
                               else Path(process.stderr)), use

    def signal(self, task_id: str, grace: float) -> bool:
        """TERM the task's process group now and KILL it after ``grace`` seconds."""
        process = self._running.get(task_id)
        if process is None:
            return False
        process.signalled = True
        # After its leader exited, the group is signalled without it (see the class notes).
        return terminate_group(self._watch, process.pid, grace, leftovers=True)

    def send(self, task_id: str, signum: int) -> bool:
        """Send ``signum`` to the running task's process group (the signal it asked for before
        its time limit); nothing once it is being stopped."""
        process = self._running.get(task_id)
        if process is None or process.signalled:
            return False
        return bool(self._watch.signal_group(process.pid, signum))

    def signal_all(self, grace: float) -> None:
        for task_id in list(self._running):
            self.signal(task_id, grace)

    def running_ids(self) -> List[str]:
        return list(self._running)

    def kill_all(self) -> None:
        """KILL what is left of every task's group now, at the owner's end (its loop no
        longer runs the timers a :meth:`signal` would need)."""
        for process in self._running.values():
            if not self._watch.signal_group(process.pid, SIGKILL):
                signal_reaped_group(process.pid, SIGKILL)
        # Reaped here (briefly, then by a thread), so that no zombie is left to a process
        # that goes on.
        reap_later(reap_within([p.pid for p in self._running.values()], _KILL_REAP_WAIT,
                               0.002))

    def remove_tmp_root(self) -> None:
        """Remove the folder of the TMPDIRs (after the last task ended)."""
        import shutil

        shutil.rmtree(self._tmp_root, ignore_errors=True)
        if self._devnull >= 0:
            os.close(self._devnull)
            self._devnull = -1

    def _recycle(self, tmpdir: str) -> None:
        """Remove an ended task's ``TMPDIR``, or, when it is still an empty private directory,
        rename it and keep it for a later task.

        Removing a directory and making a new one cost about ten times what looking into it
        and renaming it cost (a rename is one change of its parent; ``rmdir`` and ``mkdir`` are
        journaled changes of the directory itself too), and both would be on the owner's
        thread, between two task starts. Once renamed, the ended task's ``TMPDIR`` path no
        longer exists, and the next task receives an empty directory only it can use.
        """
        if len(self._spare_tmpdirs) < _SPARE_TMPDIRS:
            try:
                st = os.lstat(tmpdir)
                if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o777 == 0o700 \
                        and st.st_uid == self._uid and not os.listdir(tmpdir):
                    self._seq += 1
                    fresh = self._tmp_prefix + str(self._seq)
                    os.rename(tmpdir, fresh)
                    self._spare_tmpdirs.append(fresh)
                    return
            except OSError:
                pass  # removed below, as any other
        _remove_tmpdir(tmpdir)

    def _link_nodefile(self, text: str, path: str) -> None:
        source = self._nodefile_sources.get(text)
        if source is not None:
            try:
                os.link(source, path)
                return
            except FileNotFoundError:
                pass  # its source was removed: write a new one
        source = f"{self._tmp_root}/nodes{len(self._nodefile_sources)}-{self._seq}"
        fd = os.open(source, WRITE | os.O_EXCL, 0o444)
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
            raise LaunchError(f"cannot create the task's directories: {NOT_TEXT}") from ex


def _remove(tmpdir: str, nodefile: str) -> None:
    _remove_tmpdir(tmpdir)
    _unlink(nodefile)


def _remove_tmpdir(tmpdir: str) -> None:
    try:
        os.rmdir(tmpdir)  # the common case, an empty TMPDIR, in one call
    except FileNotFoundError:
        pass
    except OSError:
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
