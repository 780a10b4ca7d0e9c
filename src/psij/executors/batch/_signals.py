"""Signals to running batch jobs: :meth:`SignalHooks.signal` (a psij extension: PSI/J has no
verb for it) and what the submit script does with the signals it receives.

Every submit script runs the job in the background, in the script's own process group, and
waits for it through any signal: the script writes the job's exit code and exits with the job's
status, so a signal never ends the script (and with it the scheduler's job) before the job.
How a signal reaches the job's processes depends on the scheduler, so each backend declares it
in class attributes:

``SIGNAL_COMMAND``
    The command that sends signal N to a job: its words, ``{signal}`` replaced by N's number,
    then the native id (``scancel --batch --signal={signal}``). Empty: the scheduler has no
    way to signal a job and :meth:`~SignalHooks.signal` raises NotImplementedError.
``SCRIPT_SIGNALS``
    What the script does with each signal it receives, by name: :data:`PASS` (the scheduler
    signals the script alone, as Slurm does for ``scancel --batch`` and for a cancel: the
    script passes the signal on to the job's processes, leaving itself out), :data:`KEEP` (the
    scheduler signals every process of the job, as PBS and LSF do: the script only survives
    it) or :data:`REQUEST` (Grid Engine's USR2 warning before a kill: the script passes on the
    signal that ``signal`` asked for, written to ``<native id>.signal`` in the work directory,
    or TERM for a plain cancel). A signal not listed keeps its default action on the script.
``JOB_IGNORED_SIGNALS``
    Signals the job starts with ignored: Grid Engine sends its warnings (USR1 before a
    suspension, USR2 before a kill) to the whole process group, where they would end the job
    at once. A job that asks for one of them before its end starts with it handled instead.
``END_SIGNAL_DIRECTIVE``
    True where the template asks the scheduler for ``psij.signal_before_end``'s signal in a
    directive (Slurm's ``--signal=B:``, LSF's ``-wa``/``-wt``); elsewhere a timer started by
    the script sends ALRM to the script when the signal is due, and the script passes the
    signal on to the job's processes, leaving itself out (``docs/keeping-work.rst``).

Shell launchers between the script and the job (``launcher_lib.sh``'s ``launch_job``) survive
the signals too and wait for the job, which received them itself. The script assumes that the
scheduler starts it as the leader of its own process group, as every supported one does.
"""

import os
import signal as _signal
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from psij import _check
from psij._end_signal import SIGNALS as END_SIGNALS
from psij._end_signal import EndSignal
from psij.exceptions import InvalidJobException, SubmitException
from psij.job import Job
from psij.job_state import JobState

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = ["FORWARDABLE", "KEEP", "PASS", "REQUEST", "SIGNAL_SUFFIX", "SignalHooks",
           "check_signal", "signals_context", "write_signal_request"]

PASS = "pass"
KEEP = "keep"
REQUEST = "request"
SIGNAL_SUFFIX = ".signal"
# The signals the scripts handle (those a job may also ask for before its end).
FORWARDABLE = END_SIGNALS
_VALID = {int(s) for s in _signal.valid_signals()} - {0}


def check_signal(signum: object) -> int:
    """``signum`` as a signal number, or TypeError/ValueError naming it."""
    if isinstance(signum, bool) or not isinstance(signum, int):
        raise _check.fail_type("signal signum", signum, "a signal number (int or signal.Signals)")
    if int(signum) not in _VALID:
        raise ValueError(f"signal signum: {signum!r} is not a signal of this system")
    return int(signum)


def signals_context(owner: str, script_signals: Sequence[Tuple[str, str]],
                    ignored_signals: Sequence[str], end: Optional[EndSignal] = None,
                    timer: Optional[float] = None) -> Dict[str, Any]:
    """The template context ``psij.signals`` from the declarations of the class ``owner``
    (``SCRIPT_SIGNALS`` as pairs, ``JOB_IGNORED_SIGNALS``): ``traps`` (``signal``, ``send``:
    the signal passed on, ``request`` or ``-`` for none), ``handled`` (whether there are traps)
    and ``job_ignores`` (names, or None; never the signal the job asked for before its end).

    ``before_end`` (None unless the job asked for ``psij.signal_before_end``, ``end``):
    ``signal``, ``seconds`` and ``lsf_time`` (the lead in whole minutes, rounded up, as
    ``[hours:]minutes``) for a directive, and ``timer``: the whole seconds (as text, so that
    ``"0"`` still renders) after the script's start at which the script itself sends the
    signal (None where a directive asks the scheduler: ``timer`` None)."""
    traps: List[Dict[str, str]] = []
    for name, action in script_signals:
        send = {PASS: name, KEEP: "-", REQUEST: REQUEST}.get(action)
        if send is None or name not in FORWARDABLE:
            raise ValueError(f"{owner}.SCRIPT_SIGNALS: {name!r}: {action!r} "
                             f"(signals: {', '.join(FORWARDABLE)}; actions: {PASS}, {KEEP}, "
                             f"{REQUEST})")
        traps.append({"signal": name, "send": send})
    for name in ignored_signals:
        if name not in FORWARDABLE:
            raise ValueError(f"{owner}.JOB_IGNORED_SIGNALS: {name!r} "
                             f"(signals: {', '.join(FORWARDABLE)})")
    ignored = " ".join(n for n in ignored_signals if end is None or n != end.signal)
    before_end = None
    if end is not None:
        minutes = -(-end.seconds // 60)
        before_end = {"signal": end.signal, "seconds": end.seconds,
                      "lsf_time": f"{minutes // 60}:{minutes % 60:02d}" if minutes >= 60
                      else str(minutes),
                      "timer": None if timer is None else str(max(0, int(timer)))}
    return {"traps": traps, "handled": bool(traps), "job_ignores": ignored or None,
            "before_end": before_end}


def write_signal_request(executor: "BatchSchedulerExecutor", native_id: str,
                         signum: int) -> None:
    """Write ``<native id>.signal``, the signal a script with a :data:`REQUEST` trap passes on."""
    path = executor._aux_path(native_id, SIGNAL_SUFFIX)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{signum}\n")


class SignalHooks:
    """The signal part of :class:`~psij.executors.batch.batch_scheduler_executor.
    BatchSchedulerExecutor` (see this module's docstring for the declarations)."""

    SIGNAL_COMMAND: Tuple[str, ...] = ()
    SCRIPT_SIGNALS: Mapping[str, str] = {}
    JOB_IGNORED_SIGNALS: Tuple[str, ...] = ()
    # The template asks the scheduler for psij.signal_before_end's signal in a directive
    # (Slurm's --signal, LSF's -wa/-wt); otherwise the script's own timer sends it.
    END_SIGNAL_DIRECTIVE = False

    def get_signal_command(self, native_id: str, signum: int) -> List[str]:
        """The command that sends signal ``signum`` to the job ``native_id`` (from
        ``SIGNAL_COMMAND``); NotImplementedError where the scheduler cannot signal a job."""
        words = self.SIGNAL_COMMAND
        if not words:
            raise NotImplementedError(f"the {getattr(self, 'name', type(self).__name__)} "
                                      f"executor cannot send a signal to a job")
        return [w.replace("{signal}", str(signum)) for w in words] + [native_id]

    def signal(self, job: Job, signum: int) -> None:
        """Send signal ``signum`` (a number or a :class:`signal.Signals`) to the processes of
        the running ``job``; the job keeps running unless the signal ends it.

        Nothing happens for a job that has ended. Raises InvalidJobException for a job of
        another executor or one that is not running (ACTIVE) yet, NotImplementedError where the
        scheduler cannot signal a job, and SubmitException when the scheduler's command fails.
        On Grid Engine the signal ends the job: see ``docs/batch.rst``.
        """
        executor: BatchSchedulerExecutor = self  # type: ignore[assignment]
        if not isinstance(job, Job):
            raise _check.fail_type("signal job", job, "psij.Job")
        signum = check_signal(signum)
        if job.executor is not executor:
            raise InvalidJobException(f"job {job.id} was not submitted to {executor}")
        state = job.status.state
        if state.final:
            return
        if executor._fallback is not None:
            raise NotImplementedError(f"{executor.name}: jobs run on this machine "
                                      f"({executor._fallback.why}); they cannot be signalled "
                                      "through this executor")
        native_id = job.native_id
        if state is not JobState.ACTIVE or native_id is None:
            raise InvalidJobException(f"job {job.id} is {state}; only a running (ACTIVE) job "
                                      "can be sent a signal")
        result = executor._run(self.get_signal_command(native_id, signum))
        if result.ok:
            return
        if result.exit_code is None:
            raise SubmitException(f"job {job.id}: sending signal {signum} failed: "
                                  f"{result.describe()}", transient=True)
        gone = executor.CANCEL_GONE_PATTERN
        if gone is not None and gone.search(result.output):
            return  # it ended first; the poller learns how
        raise SubmitException(f"job {job.id}: sending signal {signum} failed: "
                              f"{result.describe()}")

