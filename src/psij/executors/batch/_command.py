"""What one scheduler command gave, and the wait for a started command to end.

:func:`finish` gives a started command its standard input and waits for its end, at most a
timeout, after which the command's whole process group is killed; what it did comes back as a
:class:`CommandResult`, a command that timed out or was stopped included. The failure words of
a result (:data:`MAY_HAVE_BEEN_SUBMITTED`, ...) are read back with :func:`outcome_unknown`.
:class:`InFlight` follows the submit commands running, so that they can be stopped together.
:func:`keep_children` takes an object that keeps child processes from one command to the next
(the spares, a ``slurmrestd`` child): it is closed when the interpreter exits, and in a child
made by ``fork`` it is told to forget its parent's processes (:func:`close_pipes` closes its
copies of their pipes).

Shared by the runner (:mod:`psij.executors.batch._runner`), the submit commands started ahead
of need (:mod:`psij.executors.batch._spares`) and the ``slurmrestd`` child
(:mod:`psij.executors.batch._slurm_rest_child`), which start the processes. This module starts
none, and imports none of them.
"""

import atexit
import os
import signal
import subprocess
import threading
import weakref
from typing import Dict, Optional, Protocol, Set, Tuple

from psij._record import Record
from psij._spawn import start_error_words

__all__ = ["MAY_HAVE_BEEN_SUBMITTED", "SUBMITS_STOPPED", "ChildKeeper", "CommandResult",
           "InFlight", "close_pipes", "finish", "keep_children", "kill_group", "outcome_unknown",
           "script_bytes", "start_failure"]


# In a failure: the command (or what stood for it) may have done its work, so it is not tried
# again (a submission could then be made twice).
MAY_HAVE_BEEN_SUBMITTED = "may have been submitted"
# The failure of a submit command refused because submissions were stopped: it never ran.
SUBMITS_STOPPED = "was not started: submissions were stopped"
_TIMED_OUT = "did not finish within"

_EXCERPT = 2000


def script_bytes(text: str) -> bytes:
    """A script (or any standard input) as bytes: UTF-8, a surrogate that stands for an
    undecodable byte (``"\\udcff"``) written as that byte, as ``os.fsencode`` does for names."""
    return text.encode("utf-8", "surrogateescape")


class CommandResult(Record):
    """What running a command gave.

    ``exit_code`` is None when the command did not run to its end; ``failure`` then says why
    (not found, timed out, ...).
    """

    argv: Tuple[str, ...]
    exit_code: Optional[int]
    stdout: str = ""
    stderr: str = ""
    failure: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when the command ran and exited with 0."""
        return self.exit_code == 0 and self.failure is None

    @property
    def output(self) -> str:
        """stdout followed by stderr, for messages that quote what the command said."""
        if self.stdout and self.stderr:
            return self.stdout.rstrip("\n") + "\n" + self.stderr
        return self.stdout or self.stderr

    def describe(self) -> str:
        """One message naming the command, how it ended and (the end of) what it said."""
        command = " ".join(self.argv)
        if len(command) > 300:
            command = command[:297] + "..."
        if self.failure is not None:
            head = f"`{command}` {self.failure}"
        else:
            head = f"`{command}` exited with {self.exit_code}"
        said = self.output.strip()
        if len(said) > _EXCERPT:
            said = "..." + said[-_EXCERPT:]
        return f"{head}: {said}" if said else f"{head} without output"


def start_failure(e: OSError) -> str:
    """The failure of a command that could not be started."""
    return f"could not be started: {start_error_words(e)}"


def outcome_unknown(text: str) -> bool:
    """Whether the failure ``text`` (a result's :meth:`~CommandResult.describe`, or an error
    message quoting it) is that of a submit command that may have queued its job all the same:
    one killed on its timeout or stopped, or one that says :data:`MAY_HAVE_BEEN_SUBMITTED`."""
    return MAY_HAVE_BEEN_SUBMITTED in text or _TIMED_OUT in text


class InFlight:
    """The submit commands running now, so that :meth:`stop` can kill them; once stopped, no
    other may start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: Dict[int, subprocess.Popen[bytes]] = {}
        self._killed: Set[int] = set()
        self.stopped = False

    def add(self, proc: "subprocess.Popen[bytes]") -> bool:
        """Follow ``proc``; False (and ``proc`` killed) when submissions are stopped."""
        with self._lock:
            if not self.stopped:
                self._procs[proc.pid] = proc
                return True
            self._killed.add(proc.pid)
        kill_group(proc)
        return False

    def done(self, proc: "subprocess.Popen[bytes]") -> bool:
        """Stop following ``proc``; whether :meth:`stop` killed it."""
        with self._lock:
            self._procs.pop(proc.pid, None)
            if proc.pid in self._killed:
                self._killed.discard(proc.pid)
                return True
            return False

    def stop(self) -> int:
        """Kill the process group of every command followed, refuse those to come; how many
        were killed."""
        with self._lock:
            self.stopped = True
            procs = list(self._procs.values())
            self._killed.update(self._procs)
        for proc in procs:
            if proc.returncode is None:  # not reaped yet: its pid is still its own
                kill_group(proc)
        return len(procs)

def finish(proc: "subprocess.Popen[bytes]", args: Tuple[str, ...], data: Optional[bytes],
           timeout: float, in_flight: Optional[InFlight] = None) -> CommandResult:
    """Give ``data`` to the started ``proc`` and wait for its end (at most ``timeout``
    seconds, then its process group is killed); what it gave, as a result. A submit command
    is followed in ``in_flight`` while it runs (and killed at once if submissions are
    stopped)."""
    if in_flight is None:
        return _finish(proc, args, data, timeout)
    if not in_flight.add(proc):
        _finish(proc, args, None, timeout)
        in_flight.done(proc)
        return CommandResult(args, None, failure=f"was stopped as it started (submissions "
                                                 f"were stopped); the job "
                                                 f"{MAY_HAVE_BEEN_SUBMITTED}")
    try:
        result = _finish(proc, args, data, timeout)
    finally:
        stopped = in_flight.done(proc)
    if stopped:
        return CommandResult(args, None, result.stdout, result.stderr,
                             failure=f"was stopped before it finished (submissions were "
                                     f"stopped); the job {MAY_HAVE_BEEN_SUBMITTED}")
    return result


def _finish(proc: "subprocess.Popen[bytes]", args: Tuple[str, ...], data: Optional[bytes],
            timeout: float) -> CommandResult:
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            # A process that left the group still holds the pipes; stop reading them.
            out, err = b"", b""
        proc.wait()
        return CommandResult(args, None, _text(out), _text(err),
                             failure=f"did not finish within {timeout:g} s and was killed")
    except BaseException:
        kill_group(proc)
        proc.wait()
        raise
    return CommandResult(args, proc.returncode, _text(out), _text(err))


def kill_group(proc: "subprocess.Popen[bytes]") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def close_pipes(proc: "subprocess.Popen[bytes]") -> None:
    """Close this process's ends of ``proc``'s pipes; one already closed or failing to close
    is passed over (the child sees the end of its input either way)."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except (OSError, ValueError):
                pass


class ChildKeeper(Protocol):
    """An object that keeps child processes from one command to the next."""

    def close(self) -> None:
        """Stop its children (in a forked child: drop them, they are the parent's)."""

    def forget_after_fork(self) -> None:
        """In a child made by ``fork``: close the copies of the parent's children's pipes
        and never use them."""


_KEEPERS: "weakref.WeakSet[ChildKeeper]" = weakref.WeakSet()


def keep_children(keeper: ChildKeeper) -> None:
    """Close ``keeper`` when the interpreter exits, and have it forget its children in a child
    made by ``fork``; it is held weakly, so this does not keep it alive."""
    _KEEPERS.add(keeper)


def _close_keepers() -> None:
    for keeper in list(_KEEPERS):
        keeper.close()


def _forget_in_forked_child() -> None:
    for keeper in list(_KEEPERS):
        keeper.forget_after_fork()


atexit.register(_close_keepers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_forked_child)


def _text(data: Optional[bytes]) -> str:
    # Schedulers print in the locale's encoding; garbage must reach the parser, not crash here.
    return data.decode("utf-8", errors="replace") if data else ""
