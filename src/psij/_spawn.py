"""How this package starts a process: the one place that does it.

Two ways, for two kinds of children:

- :func:`start` starts a *job* (a local job, a pilot's task, a keeper's job): a program as the
  leader of a new process group (or of a new session when asked), its three standard streams
  dup'ed from given descriptors, the signals Python ignores (SIGPIPE, SIGXFSZ), those this
  process was started with ignored and those the caller names back to their default action, no
  other descriptor of this process. It uses
  ``os.posix_spawn``, which costs markedly less than ``subprocess.Popen``, when it can: the
  program runs in this process's working directory, or the caller is single-threaded and lets
  it change directory (the keeper), and this process holds no inheritable descriptor above 2
  (see :func:`posix_spawn_is_safe`); ``Popen`` does everything else. :func:`on_path` finds a
  program on the program's own PATH (cached), :func:`launch_error` turns a start failure into
  a :class:`LaunchError` with the shell's code (127 not found, 126 not executable) and words
  that name the argument or variable that cannot be passed.
- :func:`popen` starts a *helper* this process talks to through pipes (scheduler commands,
  spare submit commands, the slurmrestd child, the keeper, the pilot's agents, GPU tools),
  with the same defaults everywhere: descriptors closed but those passed, signals restored, a
  new session (or a new group), standard input from ``/dev/null`` unless given, the
  environment given explicitly. It returns a ``subprocess.Popen`` (whose waits with a timeout
  sleep on a pidfd rather than poll), so callers keep ``communicate``, ``poll`` and ``kill``.

Standard library only, and no import of ``psij``: the keeper (``executors/local/_keeper.py``,
run as ``python -I -S``) loads this file by its path. ``subprocess`` is imported only when
needed (a pilot starts faster without it).

It decides how a process is started, never what runs, when, or what its end means; it does
not wait for or reap what :func:`start` started (the exit watches do).

No process is started elsewhere: the GPU probes (``executors/_gpu_detect.py``) start through
:class:`psij.executors._process.Spawner`, and ``executors/batch/batch_test_tool.py``, a
stand-alone fake scheduler run with ``python -S``, loads this file by path as the keeper does.
"""

import errno
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import subprocess

__all__ = [
    "MAX_ARG_STRING",
    "NOT_TEXT",
    "RESTORED_SIGNALS",
    "LaunchError",
    "fits_exec",
    "launch_error",
    "on_path",
    "popen",
    "posix_spawn_is_safe",
    "spawn",
    "start",
    "start_error_words",
]

NOT_TEXT = "it holds a lone surrogate, which no file name or program can receive"
# Python ignores these, and ignored signals stay ignored across exec: a program gets their
# default actions back, as Popen gives them.
RESTORED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ")
                         if hasattr(signal, name))


def _ignored_at_start() -> Tuple[int, ...]:
    """The signals this process was started with ignored, beyond Python's own: a background
    command of a non-interactive shell ignores SIGINT and SIGQUIT, ``nohup`` SIGHUP, and an
    ignored signal stays ignored across exec. A job is started as a scheduler starts one, with
    every signal at its default action, so these are restored for jobs too."""
    found = []
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP) or sig in RESTORED_SIGNALS:
            continue
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:
                found.append(int(sig))
        except (ValueError, OSError):
            continue
    return tuple(found)


IGNORED_AT_START = _ignored_at_start()

# exec's limit on one argument or "NAME=value" string on Linux (MAX_ARG_STRLEN: 32 pages).
MAX_ARG_STRING = 32 * 4096

# A program leads a process group of its own either way it is started (before Python 3.11,
# Popen can only make a new session, which is also a new group: both ways then make one).
_NEW_GROUP = sys.version_info >= (3, 11)
_HAS_POSIX_SPAWN = hasattr(os, "posix_spawn")
_NOT_FOUND = (errno.ENOENT, errno.ENOTDIR)
_NOT_EXECUTABLE = (errno.EACCES, errno.EPERM, errno.EISDIR)
_MAX_FOUND = 1024  # programs found on PATH kept at most (then the cache starts afresh)
# Program names found on a PATH: (name, PATH) -> path, checked again (one access) at each use.
_found: Dict[Tuple[str, str], str] = {}


# -- errors -------------------------------------------------------------------------------------


class LaunchError(Exception):
    """A program could not be started; the message says why in words a user can act on.

    ``exit_code`` is the shell's code for the cause when there is one: 127 for a program that
    was not found, 126 for one that cannot be executed.
    """

    def __init__(self, message: str, exit_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _arg_max() -> Optional[int]:
    """exec's limit on all arguments and variables together (None when unknown)."""
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        return None
    return limit if limit > 0 else None


def fits_exec(env: Mapping[str, str]) -> bool:
    """Whether a program could be started with ``env`` (Linux's limits on exec: each string
    within MAX_ARG_STRING, all of them with their pointers within ARG_MAX)."""
    total = 0
    for key, value in env.items():
        size = len(os.fsencode(key)) + len(os.fsencode(value)) + 2  # "=" and the NUL
        if size > MAX_ARG_STRING:
            return False
        total += size + 8
    limit = _arg_max()
    return limit is None or total <= limit


def start_error_words(error: OSError) -> str:
    """The system's words for why a program could not be started, with what they mean when
    they do not say it themselves (E2BIG names arguments, but is mostly the environment)."""
    words = error.strerror or str(error)
    if error.errno == errno.E2BIG:
        limit = _arg_max()
        words += (" (the environment and arguments are more than the system lets a new "
                  f"process have: on Linux at most {MAX_ARG_STRING // 1024} KiB for each "
                  "variable or argument, and at most "
                  f"{'ARG_MAX' if limit is None else f'{limit} bytes'} for all of them "
                  "together)")
    return words


def launch_error(error: BaseException, argv: Sequence[str],
                 env: Mapping[str, str]) -> LaunchError:
    """The :class:`LaunchError` for ``error``, raised by :func:`start` (or reported by a
    keeper as an ``OSError`` with its errno): not found (ENOENT, ENOTDIR) is 127, not
    executable (EACCES, EPERM, EISDIR) 126; an argument or variable that cannot be encoded is
    named. Its cause is ``error``."""
    if isinstance(error, OSError):
        if error.errno in _NOT_FOUND:
            result = LaunchError(f"executable {argv[0]!r} was not found (no such file, or "
                                 "not on PATH)", 127)
        elif error.errno in _NOT_EXECUTABLE:
            result = LaunchError(f"executable {argv[0]!r} cannot be executed "
                                 f"({error.strerror})", 126)
        else:
            result = LaunchError(f"could not start {argv[0]!r}: {start_error_words(error)}")
    elif isinstance(error, UnicodeEncodeError):
        result = LaunchError(_unencodable(argv, env))
    else:
        result = LaunchError(f"could not start {argv[0]!r}: {error}")
    result.__cause__ = error
    return result


def _unencodable(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """Which argument or variable cannot be passed to a program, and why."""
    def bad(text: str) -> bool:
        try:
            os.fsencode(text)
        except UnicodeEncodeError:
            return True
        return False

    for i, arg in enumerate(argv):
        if bad(arg):
            return (f"executable {arg!r}: {NOT_TEXT}" if i == 0
                    else f"argument {i} ({arg!r}): {NOT_TEXT}")
    for key, value in env.items():
        if bad(key) or bad(value):
            return f"environment variable {key!r} ({value!r}): {NOT_TEXT}"
    return f"the directory, an argument or a variable: {NOT_TEXT}"


# -- jobs: the fast path ------------------------------------------------------------------------


def on_path(name: str, env: Mapping[str, str]) -> str:
    """The first executable ``name`` on the program's own PATH (``env``'s, else the default
    one), as Popen would find it; FileNotFoundError when there is none. Found names are kept
    and checked again (one access call) at each use."""
    path = env.get("PATH", os.defpath)
    key = (name, path)
    found = _found.get(key)
    if found is not None and os.access(found, os.X_OK):
        return found
    for folder in os.get_exec_path(env):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            if len(_found) >= _MAX_FOUND:
                _found.clear()
            _found[key] = candidate
            return candidate
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def posix_spawn_is_safe() -> bool:
    """Whether :func:`start` may use ``os.posix_spawn`` in this process: it cannot close
    descriptors, so only while this process holds no inheritable one above 2 (Python opens
    none; one could come from whoever started this process). Unknown counts as no."""
    if not _HAS_POSIX_SPAWN:
        return False
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
                        return False
                except OSError:
                    pass  # the descriptor listdir itself used, closed since
        return True
    return False


def start(argv: Sequence[str], directory: str, env: Mapping[str, str],
          streams: Tuple[int, int, int], *, program: Optional[str] = None,
          session: bool = False, posix_spawn: bool = True, may_chdir: bool = False,
          restore: Sequence[int] = ()) -> int:
    """Start ``argv`` in ``directory`` with exactly ``env``, its standard streams dup'ed from
    ``streams``, as the leader of a new process group (a new session with ``session``); the
    new process's pid. ``program`` is the file to run (else ``argv[0]``, looked up on the
    PATH of ``env`` when it holds no ``/``); ``restore``: signals this process ignores beyond
    Python's own, given back their default action too.

    ``posix_spawn`` says the caller knows that this process holds no inheritable descriptor
    above 2 (:func:`posix_spawn_is_safe`); with it, ``os.posix_spawn`` is used when the
    program runs in this process's directory, or anywhere with ``may_chdir``: then this
    process changes its working directory to ``directory`` (only a single-threaded caller may
    allow it). ``subprocess.Popen`` does the rest.

    Raises what the system said: ``OSError`` (see :func:`launch_error`), or
    ``UnicodeEncodeError`` for an argument or variable that cannot be encoded."""
    if posix_spawn and _HAS_POSIX_SPAWN:
        if directory != _cwd():
            if not may_chdir:
                return _popen_start(argv, directory, env, streams, program, session, restore)
            os.chdir(directory)
        if program is None:
            program = argv[0] if "/" in argv[0] else on_path(argv[0], env)
        leader: Dict[str, Any] = ({"setsid": True} if session or not _NEW_GROUP
                                  else {"setpgroup": 0})
        return os.posix_spawn(program, list(argv), env,
                              setsigdef=RESTORED_SIGNALS + IGNORED_AT_START + tuple(restore),
                              file_actions=[(os.POSIX_SPAWN_DUP2, streams[0], 0),
                                            (os.POSIX_SPAWN_DUP2, streams[1], 1),
                                            (os.POSIX_SPAWN_DUP2, streams[2], 2)],
                              **leader)
    return _popen_start(argv, directory, env, streams, program, session, restore)


def spawn(argv: Sequence[str], directory: str, env: Mapping[str, str],
          streams: Tuple[int, int, int], **options: Any) -> int:
    """:func:`start`, with a failure to start raised as a :class:`LaunchError` (whose cause
    is what the system said)."""
    try:
        return start(argv, directory, env, streams, **options)
    except (OSError, UnicodeEncodeError) as ex:
        raise launch_error(ex, argv, env) from ex


def _cwd() -> Optional[str]:
    """This process's working directory; None when it was removed (or cannot be read)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _popen_start(argv: Sequence[str], directory: str, env: Mapping[str, str],
                 streams: Tuple[int, int, int], program: Optional[str], session: bool,
                 restore: Sequence[int]) -> int:
    import subprocess

    leader: Dict[str, Any] = ({"start_new_session": True} if session or not _NEW_GROUP
                              else {"process_group": 0})
    extra = IGNORED_AT_START + tuple(restore)  # beyond what Popen restores itself
    if extra:
        leader["preexec_fn"] = lambda: [signal.signal(s, signal.SIG_DFL) for s in extra]
    child = subprocess.Popen(list(argv), executable=program, stdin=streams[0],
                             stdout=streams[1], stderr=streams[2], cwd=directory, env=env,
                             close_fds=True, **leader)
    # The caller's exit watch reaps the process; the Popen object must not think it still
    # runs (it would reap it itself when collected).
    child.returncode = 0
    return child.pid


# -- helpers talked to through pipes ------------------------------------------------------------


def popen(argv: Sequence[str], *, env: Optional[Mapping[Any, Any]],
          stdin: Any = None, stdout: Any = None, stderr: Any = None,
          cwd: Optional[str] = None, session: bool = True, pass_fds: Sequence[int] = (),
          bufsize: int = -1) -> "subprocess.Popen[bytes]":
    """Start a helper program this process talks to through pipes, with the package's
    defaults: descriptors closed but ``pass_fds``, the signals Python ignores restored, a new
    session (a new process group with ``session=False``, where Popen can make one: Python
    3.11 and later), each standard stream from ``/dev/null`` unless given (``PIPE``, a
    descriptor, a file, ``STDOUT``). ``env`` must be given: the helper's whole environment,
    or None for exactly what this process's would inherit. Raises ``OSError`` when it cannot
    be started."""
    import subprocess

    leader: Dict[str, Any] = ({"start_new_session": True} if session or not _NEW_GROUP
                              else {"process_group": 0})
    devnull = subprocess.DEVNULL
    child: subprocess.Popen[bytes] = _child_class()(
        list(argv), stdin=devnull if stdin is None else stdin,
        stdout=devnull if stdout is None else stdout,
        stderr=devnull if stderr is None else stderr, env=env, cwd=cwd, close_fds=True,
        restore_signals=True, pass_fds=tuple(pass_fds), bufsize=bufsize, **leader)
    return child


_CHILD: List[Any] = []


def _child_class() -> Any:
    """A Popen whose wait with a timeout sleeps until the child exits (on its pidfd) rather
    than polling it every 0.5 to 50 ms, which cost each short command about half a
    millisecond. Made at first use: ``subprocess`` is not imported before."""
    if _CHILD:
        return _CHILD[0]
    import select
    import subprocess

    class Child(subprocess.Popen):  # type: ignore[type-arg]
        def _wait(self, timeout: Optional[float]) -> Optional[int]:
            if self.returncode is not None or timeout is None \
                    or not hasattr(os, "pidfd_open"):
                return super()._wait(timeout)  # type: ignore[misc, no-any-return]
            try:
                fd = os.pidfd_open(self.pid)
            except OSError:  # a kernel without pidfds
                return super()._wait(timeout)  # type: ignore[misc, no-any-return]
            try:
                waiter = select.poll()
                waiter.register(fd, select.POLLIN)
                if not waiter.poll(max(0.0, timeout) * 1000):
                    raise subprocess.TimeoutExpired(self.args, timeout)
            finally:
                os.close(fd)
            return super()._wait(None)  # type: ignore[misc, no-any-return]

    _CHILD.append(Child)
    return Child
