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
starts them through the package's process layer, :func:`psij._spawn.popen`). The result, and
the wait for a started command to end, are in :mod:`psij.executors.batch._command` (shared with
the spares); their names can be imported from here too.
"""

import subprocess
import threading
from typing import TYPE_CHECKING, Callable, List, Mapping, Optional, Protocol, Sequence, Tuple

from psij._spawn import popen
from psij.executors.batch._command import (
    MAY_HAVE_BEEN_SUBMITTED,
    SUBMITS_STOPPED,
    CommandResult,
    InFlight,
    finish,
    outcome_unknown,
    script_bytes,
    start_failure,
)

if TYPE_CHECKING:
    from psij.executors.batch._spares import SpareCommands

__all__ = ["MAY_HAVE_BEEN_SUBMITTED", "SUBMITS_STOPPED", "CommandResult", "CommandRunner",
           "FakeCommandRunner", "InFlight", "SubprocessRunner", "finish", "outcome_unknown",
           "script_bytes", "start_failure"]


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
