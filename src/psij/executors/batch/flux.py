"""The Flux executor, through Flux's command-line tools: ``flux batch``, ``flux jobs`` (one call
for all jobs), ``flux cancel``.

Declarations (commands, the template ``templates/flux.mustache``), the state and result maps,
job-id conversion (which cannot be a pattern: ids come in F58) and the parser of ``flux jobs``
lines; the behaviour lives in
:class:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutor`.

Facts this module relies on (flux-core manual pages, RFC 19, RFC 21, RFC 36):

- ``flux batch SCRIPT`` reads ``# flux:`` directive lines (split like a shell command line) and
  prints the new job's id in F58: base58 digits (alphabet ``1-9A-HJ-NP-Za-km-z``) after the
  prefix ``ƒ`` (U+0192), or ``f`` where the locale is not UTF-8. Native ids here are the same
  ids in decimal, which every Flux command accepts;
- ``flux jobs -a -n -o FORMAT ID...`` prints one line per job; the fields used are ``id.f58``,
  ``state`` (DEPEND, PRIORITY, SCHED, RUN, CLEANUP, INACTIVE), ``result`` (COMPLETED, FAILED,
  CANCELED, TIMEOUT, empty while active), ``returncode`` (highest exit code, minus the signal
  number when killed by one, -128 when canceled before it started), ``urgency`` (0 for a job
  held until ``flux job urgency ID default`` releases it), ``exception.type`` and
  ``exception.note``, and for the run's figures ``t_submit``, ``t_run``, ``t_cleanup``,
  ``t_inactive`` (epoch seconds), ``ncores``, ``nodelist`` and ``duration`` (the time limit in
  seconds, 0 for none); it complains on stderr about ids it does not know;
- inside a batch job the script runs as the first program of a new Flux instance, whose
  attribute ``jobid`` is the job's id in the enclosing instance (``flux job id --to=dec``
  converts it);
- Flux schedules cores, GPUs and nodes, not memory, and has no reservations.
"""

import re
import warnings
from typing import Dict, List, Optional, Tuple

from psij.exceptions import InvalidJobException
from psij.executors.batch._figures_sites import flux_figures, with_figures
from psij.executors.batch._script_context import v1_resources
from psij.executors.batch._site_directives import PLAIN_QUOTED, option_items
from psij.executors.batch._status_table import held_status
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    check_status_exit_code,
)
from psij.job import Job
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["EXCEPTION_CAUSES", "RESULT_MAP", "STATE_MAP", "FluxExecutorConfig",
           "FluxJobExecutor", "flux_status", "jobid_to_decimal"]


class FluxExecutorConfig(BatchSchedulerExecutorConfig):
    """Configuration of the Flux executor (no settings beyond the batch ones)."""


# Flux job states -> PSI/J state; None: INACTIVE, where the result says how the job ended.
STATE_MAP: Dict[str, Optional[JobState]] = {
    "DEPEND": JobState.QUEUED,
    "PRIORITY": JobState.QUEUED,
    "SCHED": JobState.QUEUED,
    "RUN": JobState.ACTIVE,
    "CLEANUP": JobState.ACTIVE,
    "INACTIVE": None,
}
# Results of INACTIVE jobs -> (PSI/J state, cause).
RESULT_MAP: Dict[str, Tuple[JobState, Optional[str]]] = {
    "COMPLETED": (JobState.COMPLETED, None),
    "FAILED": (JobState.FAILED, None),
    "CANCELED": (JobState.CANCELED, None),
    "TIMEOUT": (JobState.FAILED, "time_limit"),
}
# Exception types of failed jobs that say why.
EXCEPTION_CAUSES: Dict[str, str] = {
    "exec": "launch_failure",
    "alloc": "launch_failure",
    "node-failure": "node_failure",
    "lost-node": "node_failure",
    "timeout": "time_limit",
    "oom": "out_of_memory",
}

F58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_F58_DIGIT = {c: i for i, c in enumerate(F58_ALPHABET)}
# The note may hold "|", so it comes last.
# Between urgency and exception.type, the fields of the run's figures (see _figures_sites);
# the note, which may hold "|", comes last.
_FIGURE_FIELDS = ("t_submit", "t_run", "t_cleanup", "t_inactive", "ncores", "nodelist",
                  "duration")
_STATUS_FIELDS = ("{id.f58}|{state}|{result}|{returncode}|{urgency}|"
                  + "".join(f"{{{name}}}|" for name in _FIGURE_FIELDS)
                  + "{exception.type}|{exception.note}")
_HELD_URGENCY = "0"
_UNKNOWN_JOB = re.compile(r"not found|unknown job|invalid jobid", re.IGNORECASE)


def jobid_to_decimal(text: str) -> str:
    """A Flux job id given in decimal or F58 (``ƒ...`` / ``f...``) as a decimal string.

    Raises ValueError for anything else.
    """
    token = text.strip()
    if token.isdigit():
        return str(int(token))
    if token[:1] in ("\u0192", "f") and len(token) > 1:
        number = 0
        for char in token[1:]:
            digit = _F58_DIGIT.get(char)
            if digit is None:
                raise ValueError(f"{text!r} is not a Flux job id (bad F58 digit {char!r})")
            number = number * 58 + digit
        return str(number)
    raise ValueError(f"{text!r} is not a Flux job id")


def flux_status(state: str, result: str, returncode: str, exception_type: str,
                exception_note: str, urgency: str = "") -> JobStatus:
    """The JobStatus of a job from its ``flux jobs`` fields; ValueError for unknown ones."""
    if state not in STATE_MAP:
        raise ValueError(f"unknown Flux job state {state!r}")
    note = exception_note.strip() or None
    metadata: Dict[str, object] = {"native_state": state, "result": result or None,
                                   "exception": exception_type or None, "reason": note}
    mapped = STATE_MAP[state]
    if mapped is JobState.QUEUED and urgency.strip() == _HELD_URGENCY:
        return held_status(metadata, "urgency 0")
    if mapped is not None:
        return JobStatus(mapped, metadata=metadata)
    if result not in RESULT_MAP:
        raise ValueError(f"unknown Flux job result {result!r}")
    final, cause = RESULT_MAP[result]
    exit_code: Optional[int] = None
    code_text = returncode.strip()
    if code_text:
        if not code_text.lstrip("-").isdigit():
            raise ValueError(f"Flux return code {code_text!r} is not a number")
        code = int(code_text)
        # Negative: killed by that signal; -128: canceled before it started.
        exit_code = code if code >= 0 else (None if code == -128 else 128 - code)
    if cause is None and final is JobState.FAILED:
        cause = EXCEPTION_CAUSES.get(exception_type)
    if cause is not None:
        metadata["cause"] = cause
    message = None
    if final is JobState.FAILED and cause is None and exception_type and note:
        message = f"Flux raised a {exception_type} exception: {note}"
    return JobStatus(final, message=message, exit_code=exit_code, metadata=metadata)


class FluxJobExecutor(BatchSchedulerExecutor):
    """Runs jobs on Flux through its command-line tools (name ``flux``).

    Resources become ``-N <node_count>``, ``-n <process_count>`` (slots), ``-c <cores per
    process>``, ``-g <GPUs per process>`` and ``--exclusive``; the account becomes
    ``--setattr=system.bank=<account>``. Custom attributes ``flux.<option>`` become ``# flux:
    -<o> "<value>"`` (one letter) or ``# flux: --<option>="<value>"``. Memory cannot be asked
    of Flux and is refused. Flux has no reservations: a ``reservation_id`` is not passed on
    (as psij-python's flux executor ignores it), with a warning and a comment in the script.
    """

    _NAME_ = "flux"
    CONFIG_CLASS = FluxExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES = ("flux",)
    TRANSIENT_SUBMIT_ERRORS = ("Connection refused", "Resource temporarily unavailable",
                               "broker", "try again")

    TEMPLATE = "flux.mustache"
    SUBMIT_COMMAND = ("flux", "batch")
    CANCEL_COMMAND = ("flux", "cancel")
    CANCEL_GONE_PATTERN = re.compile("inactive|" + _UNKNOWN_JOB.pattern, re.IGNORECASE)
    STATUS_COMMAND = ("flux", "jobs", "-a", "-n", "--color=never", "-o", _STATUS_FIELDS)
    FIGURES_FROM = "status"  # flux jobs -a shows inactive jobs
    LIST_COMMAND = ("flux", "jobs", "-n", "--color=never", "-o", "{id.f58}")
    NAMED_LIST_COMMAND = (*LIST_COMMAND, "--name={name}")
    DIRECTIVES = PLAIN_QUOTED

    def _template_values(self, job: Job, spec: JobSpec) -> Dict[str, object]:
        resources = v1_resources(spec)
        if resources.memory is not None:
            raise InvalidJobException(
                f"ResourceSpecV1.memory: Flux cannot reserve memory (asked for "
                f"{resources.memory} bytes); leave it unset, and use exclusive_node_use=True "
                "to get whole nodes with all their memory")
        attrs = spec.attributes
        if attrs.reservation_id is not None:
            # psij-python's flux executor ignores it; the script says so in a comment.
            warnings.warn(f"JobAttributes.reservation_id: Flux has no reservations; "
                          f"{attrs.reservation_id!r} is not passed on to Flux", UserWarning,
                          stacklevel=2)
        duration = attrs.duration
        return {"flux": {
            # Without a node count or a per-node count Flux places the slots where it likes.
            "nodes": resources.computed_node_count
            if resources.node_count or resources.processes_per_node else None,
            "slots": resources.computed_process_count,
            "processes_per_node": resources.computed_processes_per_node,
            # Flux Standard Duration; a started second counts.
            "duration": None if duration is None
            else f"{max(1, -(-int(duration.total_seconds() * 1000) // 1000))}s",
            "options": option_items(self._custom_attribute_items(job).get("flux", [])),
        }}

    def job_id_from_submit_output(self, out: str) -> str:
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if not lines:
            raise ValueError("flux batch printed no job id")
        return jobid_to_decimal(lines[-1])

    def attach(self, job: Job, native_id: str) -> None:
        """Follow the Flux job ``native_id`` (decimal or F58) through the NEW ``job``."""
        try:
            decimal = jobid_to_decimal(native_id) if isinstance(native_id, str) else native_id
        except ValueError as e:
            raise ValueError(f"attach native_id: {e}") from None
        super().attach(job, decimal)

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        found: Dict[str, JobStatus] = {}
        errors: List[str] = []
        for line in out.splitlines():
            if not line.strip():
                continue
            fields = line.split("|", 6 + len(_FIGURE_FIELDS))
            if len(fields) != 7 + len(_FIGURE_FIELDS):
                errors.append(line)
                continue
            native_id = jobid_to_decimal(fields[0])
            figures = dict(zip(_FIGURE_FIELDS, fields[5:-2]))
            found[native_id] = with_figures(flux_status(
                fields[1].strip(), fields[2].strip(), fields[3], fields[-2].strip(), fields[-1],
                fields[4]), flux_figures(figures))
        # Lines that are not job lines may only say that a job is unknown (it was purged).
        others = [line for line in errors if not _UNKNOWN_JOB.search(line)]
        if others:
            if exit_code == 0:
                raise ValueError(f"unexpected flux jobs output {others[0]!r}")
            check_status_exit_code("flux jobs", exit_code, "\n".join(others))
        return found

    def parse_list_output(self, out: str) -> List[str]:
        return [jobid_to_decimal(line) for line in out.splitlines() if line.strip()]
