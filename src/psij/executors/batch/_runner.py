"""The one place where the batch layer runs schedulers' commands (sbatch, squeue, qsub, ...).

A command is an argv list, never a shell string. It runs with a timeout, in its own process
group (so that a timeout kills whatever the command started too), and its exit code, stdout and
stderr come back together in a :class:`CommandResult`. A command that cannot be started or that
times out is a result too, never an exception, so that callers handle every outcome in one place.

Submit commands (``run(..., submit=True)`` and :meth:`SubprocessRunner.run_spared`) can be
stopped: :meth:`SubprocessRunner.stop_submits` kills the process group of every submit command
running then (their results say :data:`MAY_HAVE_BEEN_SUBMITTED`: the scheduler may have queued
the job before the kill) and refuses every later one (its result says it was not started), so
that a program that stops (``psij supervise`` on Ctrl+C) leaves no submit command behind to
queue a job nobody follows.

:class:`FakeCommandRunner` stands in for the real runner in tests: it records every call and
answers from a function. Nothing else in the batch layer may start processes (and this one
starts them through the package's process layer, :func:`psij._spawn.popen`).
"""

import os
import signal
import subprocess
import threading
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
)

from psij._record import Record
from psij._spawn import popen, start_error_words

if TYPE_CHECKING:
    from psij.executors.batch._spares import SpareCommands

__all__ = ["MAY_HAVE_BEEN_SUBMITTED", "SUBMITS_STOPPED", "CommandResult", "CommandRunner",
           "FakeCommandRunner", "InFlight", "SubprocessRunner", "finish", "outcome_unknown",
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

    _fields = ("argv", "exit_code", "stdout", "stderr", "failure")
    __slots__ = _fields
    argv: Tuple[str, ...]
    exit_code: Optional[int]
    stdout: str
    stderr: str
    failure: Optional[str]

    def __init__(self, argv: Tuple[str, ...], exit_code: Optional[int], stdout: str = "",
                 stderr: str = "", failure: Optional[str] = None) -> None:
        self._store(argv, exit_code, stdout, stderr, failure)

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
        _kill_group(proc)
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
                _kill_group(proc)
        return len(procs)


class CommandRunner(Protocol):
    """Runs one command and reports how it ended."""

    def run(self, argv: Sequence[str], timeout: float,
            stdin: Optional[str] = None) -> CommandResult:
        """Run ``argv`` with ``stdin`` as its input, giving up after ``timeout`` seconds."""
        ...


class SubprocessRunner:
    """Runs commands as child processes of this process."""

    def __init__(self, env: Optional[Mapping[str, str]] = None) -> None:
        self._env = dict(env) if env is not None else None
        self._spares: Optional[SpareCommands] = None
        self._spares_lock = threading.Lock()
        self._submits = InFlight()

    def run(self, argv: Sequence[str], timeout: float, stdin: Optional[str] = None,
            submit: bool = False) -> CommandResult:
        """Run ``argv``; with ``submit``, as a submit command that :meth:`stop_submits`
        stops."""
        args = tuple(argv)
        if not args:
            raise ValueError("SubprocessRunner.run: argv is empty")
        if submit and self._submits.stopped:
            return CommandResult(args, None, failure=SUBMITS_STOPPED)
        try:
            proc = popen(args, stdin=subprocess.PIPE if stdin is not None else None,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._env)
        except OSError as e:
            return CommandResult(args, None, failure=start_failure(e))
        return finish(proc, args, None if stdin is None else script_bytes(stdin), timeout,
                      self._submits if submit else None)

    def run_spared(self, argv: Sequence[str], timeout: float, stdin: str,
                   count: int) -> CommandResult:
        """Run the submit command ``argv`` as :meth:`run` does, by a process started ahead of
        need when one fits (see :mod:`psij.executors.batch._spares`); ``count`` processes are
        kept waiting."""
        from psij.executors.batch._spares import SpareCommands

        if self._submits.stopped:
            return CommandResult(tuple(argv), None, failure=SUBMITS_STOPPED)
        with self._spares_lock:
            spares = self._spares
            if spares is None or spares.count != count:
                if spares is not None:
                    spares.close()
                spares = self._spares = SpareCommands(count, self._env)
        result = spares.run(tuple(argv), timeout, stdin, self._submits)
        return result if result is not None else self.run(argv, timeout, stdin, submit=True)

    def stop_submits(self) -> int:
        """Kill the process group of every submit command running now (each one's result
        says :data:`MAY_HAVE_BEEN_SUBMITTED`) and refuse every later one; how many were
        running. For good: a program calls it when it stops."""
        return self._submits.stop()

    def close(self) -> None:
        """Stop the processes started ahead of need, if any."""
        with self._spares_lock:
            spares, self._spares = self._spares, None
        if spares is not None:
            spares.close()


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
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            # A process that left the group still holds the pipes; stop reading them.
            out, err = b"", b""
        proc.wait()
        return CommandResult(args, None, _text(out), _text(err),
                             failure=f"did not finish within {timeout:g} s and was killed")
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    return CommandResult(args, proc.returncode, _text(out), _text(err))


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def _text(data: Optional[bytes]) -> str:
    # Schedulers print in the locale's encoding; garbage must reach the parser, not crash here.
    return data.decode("utf-8", errors="replace") if data else ""


class FakeCommandRunner:
    """A runner for tests: ``respond(argv, stdin)`` gives each result; every call is recorded.

    ``respond`` may return a CommandResult, or a tuple ``(exit_code, stdout)`` or
    ``(exit_code, stdout, stderr)`` for brevity.
    """

    def __init__(self, respond: Callable[[Tuple[str, ...], Optional[str]], object]) -> None:
        self._respond = respond
        self._lock = threading.Lock()
        self.calls: List[Tuple[str, ...]] = []

    def run(self, argv: Sequence[str], timeout: float,
            stdin: Optional[str] = None) -> CommandResult:
        args = tuple(argv)
        with self._lock:
            self.calls.append(args)
        answer = self._respond(args, stdin)
        if isinstance(answer, CommandResult):
            return answer
        if isinstance(answer, tuple) and len(answer) in (2, 3):
            return CommandResult(args, *answer)
        raise TypeError(f"FakeCommandRunner: the responder returned {answer!r}; expected a "
                        "CommandResult or (exit_code, stdout[, stderr])")

    def calls_to(self, program: str) -> List[Tuple[str, ...]]:
        """The recorded calls whose argv[0] is ``program``."""
        with self._lock:
            return [c for c in self.calls if c and c[0] == program]
