"""Running a job again: requeue (``psij.requeue``) and retries with more resources
(``psij.retry``), both custom attributes of the job.

- ``psij.requeue = N``: the job is run again, with the same resources, at most ``N`` times
  when it was preempted, lost to a node failure (or its nodes failed to boot), or when it asks
  for it by exiting with :data:`REQUEUE_EXIT_CODE` (85: "checkpointed, run me again", for a job
  that saved its work on the signal before its end). Where the scheduler requeues jobs itself
  (Slurm's ``--requeue``) it does; otherwise the executor submits the job again.
- ``psij.retry``: a :class:`RetryPolicy`, given as text ``"attempts=3,on=out_of_memory+
  time_limit,memory=2,duration=1.5,max_memory=17179869184,max_duration=7200"`` (every part but
  ``attempts`` optional; a bare number is ``attempts``), as custom attributes hold text and
  numbers; :func:`parse_retry` also reads a mapping of the same keys.
  ``attempts`` counts every run of the job that the policy allows, the first included;
  ``on`` names the causes retried (:data:`RETRY_CAUSES`; ``failed`` is any other failure, a
  non-zero exit code); each retry multiplies the memory (``ResourceSpecV1.memory``, which the
  job must then set) and the duration (``JobAttributes.duration``) of the run before by the
  factors, up to the caps.

The job stays the same :class:`~psij.Job`: it enters QUEUED again (its callbacks see QUEUED,
ACTIVE, ... once per run), and from its second run on every status's metadata holds
``attempt`` (2, 3, ...); the QUEUED status of a new run also holds ``rerun`` (``requeue`` or
``retry``), ``cause`` (why the run before ended) and ``previous`` (that run's native id, exit
code, message, and the figures its status had: ``started_at``, ``cpu_seconds``...).
The job's ``spec`` becomes a copy with the run's memory and duration (and ``pilot.time_limit``
scaled as the duration is), and :data:`ATTEMPT_VARIABLE` (``PSIJ_ATTEMPT``)
in its environment. Every run of a job that may be run again has ``PSIJ_ATTEMPT`` in the
environment it runs in, its first run too (``1``: :func:`run_environment`, which every executor
applies); a job that may not has no such variable (what psij-python gives). A run that cannot
be started again ends the job with the status of the run before.

This module decides (pure, no I/O); :class:`psij.JobExecutor` acts (``_set_job_status``).
"""

import math
import re
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

from psij._record import Record
from psij.exceptions import InvalidJobException

if TYPE_CHECKING:
    from psij.job import Job
    from psij.job_spec import JobSpec
    from psij.job_status import JobStatus

__all__ = ["ATTEMPT_VARIABLE", "REQUEUE_ATTRIBUTE", "REQUEUE_CAUSES", "REQUEUE_EXIT_CODE",
           "RETRY_ATTRIBUTE", "RETRY_CAUSES", "Rerun", "RetryPolicy", "Runs", "cause_of",
           "check_job", "counted", "next_run", "parse_requeue", "parse_retry", "rerun_status",
           "run_attempt", "run_environment", "scheduler_requeue", "spec_for"]

REQUEUE_ATTRIBUTE = "psij.requeue"
RETRY_ATTRIBUTE = "psij.retry"
REQUEUE_EXIT_CODE = 85
"""The exit code by which a job asks to be run again (it saved its work): with
``psij.requeue`` set, the job is requeued instead of failing."""
MAX_RUNS = 1000
"""The most times a job may be requeued, and the most attempts a retry policy may allow."""
MAX_FACTOR = 1000.0
ATTEMPT_VARIABLE = "PSIJ_ATTEMPT"
"""Set in the environment of every run of a job that may be run again (``psij.requeue`` of 1
or more, or ``psij.retry`` of 2 attempts or more): the run's number, ``1`` in its first run;
never set for other jobs."""
PILOT_TIME_LIMIT = "pilot.time_limit"
# The causes of a failure (status metadata "cause") that a requeue covers; "checkpoint" is the
# job's own exit with REQUEUE_EXIT_CODE, "requeued" a scheduler requeueing the job itself.
REQUEUE_CAUSES = ("preempted", "node_failure", "boot_failure", "checkpoint", "requeued")
RETRY_CAUSES = ("out_of_memory", "time_limit", "failed")
_KEYS = ("attempts", "on", "memory", "duration", "max_memory", "max_duration")
_TEXT_FORM = ("attempts=N,on=CAUSE+CAUSE,memory=FACTOR,duration=FACTOR,max_memory=BYTES,"
              "max_duration=SECONDS (every part but attempts optional), or a mapping of the "
              "same keys")
_INTEGER = re.compile(r"[+-]?[0-9]{1,30}")
_UNCHECKED = object()


class RetryPolicy(Record):
    """How a job is retried: ``attempts`` runs at most (the first included), on the causes
    ``on``, each retry's memory and duration the run before's times ``memory`` and
    ``duration`` (at least 1), capped at ``max_memory`` bytes and ``max_duration`` seconds."""

    attempts: int
    on: Tuple[str, ...] = RETRY_CAUSES
    memory: float = 1.0
    duration: float = 1.0
    max_memory: Optional[int] = None
    max_duration: Optional[float] = None


class Rerun(Record):
    """The next run of a job: ``kind`` (``requeue`` or ``retry``), its ``cause``, its
    ``attempt`` number (2 for the second run), and its ``memory`` (bytes, None when the job sets
    none) and ``duration`` (seconds)."""

    kind: str
    cause: str
    attempt: int
    memory: Optional[int]
    duration: float


class Runs:
    """A job's runs so far (kept on the job while an executor follows it)."""

    __slots__ = ("attempt", "requeue", "requeues", "retries", "retry")

    def __init__(self, requeue: int, retry: Optional[RetryPolicy], attempt: int = 1) -> None:
        self.requeue = requeue
        self.retry = retry
        self.attempt = attempt
        self.requeues = 0
        self.retries = 0


def _fail(name: str, what: str, value: Any) -> InvalidJobException:
    return InvalidJobException(f"custom attribute {name}: {what}, got {value!r}")


def _whole(name: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        value = int(value.strip())
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(name, f"{key} must be a whole number from {low} to {high}", value)
    return value


def _number(name: str, key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _fail(name, f"{key} must be a number from {low:g} to {high:g}",
                        value) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not low <= value <= high:  # NaN fails both comparisons
        raise _fail(name, f"{key} must be a number from {low:g} to {high:g}", value)
    return float(value)


def parse_requeue(name: str, value: Any) -> int:
    """``psij.requeue``: how many times the job may be requeued (0 to :data:`MAX_RUNS`)."""
    return _whole(name, "the number of requeues", value, 0, MAX_RUNS)


def _causes(name: str, value: Any) -> Tuple[str, ...]:
    if isinstance(value, str):
        items: Any = [part for part in re.split(r"[+,\s]+", value) if part]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise _fail(name, f"on must name causes among {', '.join(RETRY_CAUSES)}", value)
    causes = []
    for item in items:
        if not isinstance(item, str) or item.strip().lower() not in RETRY_CAUSES:
            hint = " (preemption and node failures are psij.requeue's)" \
                if isinstance(item, str) and item.strip().lower() in REQUEUE_CAUSES else ""
            raise _fail(name, f"on: {item!r} is not a cause retried; accepted: "
                        f"{', '.join(RETRY_CAUSES)}{hint}", value)
        if item.strip().lower() not in causes:
            causes.append(item.strip().lower())
    if not causes:
        raise _fail(name, f"on must name at least one cause among {', '.join(RETRY_CAUSES)}",
                    value)
    return tuple(causes)


def _fields_of_text(name: str, text: str) -> Dict[str, Any]:
    if _INTEGER.fullmatch(text.strip()):
        return {"attempts": text}
    fields: Dict[str, Any] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, eq, val = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in _KEYS:
            raise _fail(name, f"expected {_TEXT_FORM}", text)
        if key in fields:
            raise _fail(name, f"{key} is given twice", text)
        fields[key] = val.strip()
    return fields


def parse_retry(name: str, value: Any) -> RetryPolicy:
    """``psij.retry`` as a :class:`RetryPolicy`; InvalidJobException naming the attribute (and
    the key) for anything else."""
    if isinstance(value, RetryPolicy):
        fields: Mapping[str, Any] = {k: getattr(value, k) for k in _KEYS}
    elif isinstance(value, str):
        fields = _fields_of_text(name, value)
    elif isinstance(value, Mapping):
        fields = value
        for key in fields:
            if key not in _KEYS:
                raise _fail(name, f"{key!r} is not a key of the retry policy; accepted: "
                            f"{', '.join(_KEYS)}", value)
    elif isinstance(value, int) and not isinstance(value, bool):
        fields = {"attempts": value}
    else:
        raise _fail(name, f"expected {_TEXT_FORM}", value)
    if fields.get("attempts") is None:
        raise _fail(name, "attempts is required (the most runs, the first included)", value)
    attempts = _whole(name, "attempts", fields["attempts"], 1, MAX_RUNS)
    on = RETRY_CAUSES if fields.get("on") is None else _causes(name, fields["on"])
    memory = 1.0 if fields.get("memory") is None else \
        _number(name, "memory (a factor)", fields["memory"], 1.0, MAX_FACTOR)
    duration = 1.0 if fields.get("duration") is None else \
        _number(name, "duration (a factor)", fields["duration"], 1.0, MAX_FACTOR)
    max_memory = None if fields.get("max_memory") is None else \
        _whole(name, "max_memory (bytes)", fields["max_memory"], 1, 2 ** 62)
    max_duration = None if fields.get("max_duration") is None else \
        _number(name, "max_duration (seconds)", fields["max_duration"], 1.0, 1e12)
    return RetryPolicy(attempts, on, memory, duration, max_memory, max_duration)


def _policies(spec: "JobSpec") -> Tuple[int, Optional[RetryPolicy]]:
    attributes = spec.__dict__.get("_attributes")
    custom = attributes.custom_attributes if attributes is not None else None
    if not custom:
        return 0, None
    requeue = custom.get(REQUEUE_ATTRIBUTE)
    retry = custom.get(RETRY_ATTRIBUTE)
    return (0 if requeue is None else parse_requeue(REQUEUE_ATTRIBUTE, requeue),
            None if retry is None else parse_retry(RETRY_ATTRIBUTE, retry))


def check_job(spec: "JobSpec") -> Optional[Runs]:
    """The runs of a job about to be submitted with ``spec``: None when it asks for neither
    requeue nor retry; InvalidJobException when its policy does not fit the spec (a memory
    factor for a job that sets no memory)."""
    requeue, retry = _policies(spec)
    if retry is not None and retry.memory != 1.0 \
            and getattr(spec.resources, "memory", None) is None:
        raise InvalidJobException(
            f"custom attribute {RETRY_ATTRIBUTE}: memory={retry.memory:g} scales the job's "
            "memory, which it does not set (ResourceSpecV1.memory)")
    if requeue == 0 and (retry is None or retry.attempts == 1):
        return None
    return Runs(requeue, retry)


def run_attempt(job: "Job") -> Optional[int]:
    """The number of the run of ``job`` being started (1 for its first) when the job may be
    run again (:func:`check_job` gave it runs), else None: its run has no
    :data:`ATTEMPT_VARIABLE`. A job not submitted yet (a script shown, not submitted) is read
    from its spec, as its submission would be."""
    runs = job.__dict__.get("_runs", _UNCHECKED)
    if runs is _UNCHECKED:
        return None if job.spec is None or check_job(job.spec) is None else 1
    if not isinstance(runs, Runs) \
            or (runs.requeue == 0 and (runs.retry is None or runs.retry.attempts < 2)):
        return None  # none, or the counts of a job followed for its scheduler's requeues
    return runs.attempt


def run_environment(job: "Job", environment: Optional[Mapping[str, str]]
                    ) -> Mapping[str, str]:
    """The variables a run of ``job`` gets from psij: ``environment`` (its spec's), with
    :data:`ATTEMPT_VARIABLE` set to the run's number when the job may be run again (then a new
    mapping; ``environment`` itself, or an empty one, otherwise)."""
    attempt = run_attempt(job)
    if attempt is None:
        return environment if environment is not None else {}
    made = dict(environment or {})
    made[ATTEMPT_VARIABLE] = str(attempt)
    return made


def cause_of(status: "JobStatus") -> str:
    """Why a FAILED run ended, as a requeue or retry cause (or the scheduler's own cause)."""
    meta = status.metadata or {}
    cause = meta.get("cause")
    if status.exit_code == REQUEUE_EXIT_CODE and cause in (None, "time_limit"):
        return "checkpoint"
    if isinstance(cause, str) and cause:
        return cause
    return "failed"


def _scaled(value: float, factor: float, cap: Optional[float]) -> float:
    out = value * factor
    return out if cap is None else min(out, max(cap, value))


def next_run(job: "Job", runs: Runs, status: "JobStatus") -> Optional[Rerun]:
    """The run to start after ``job``'s run ended with the FAILED ``status``, or None when the
    job ends with it (no policy covers the cause, or none has a run left)."""
    from psij.job_state import JobState

    if status.state is not JobState.FAILED or job.spec is None:
        return None
    cause = cause_of(status)
    spec = job.spec
    duration = spec.attributes.duration.total_seconds()
    memory = getattr(spec.resources, "memory", None)
    if cause in REQUEUE_CAUSES:
        if runs.requeues < runs.requeue:
            return Rerun("requeue", cause, runs.attempt + 1, memory, duration)
        return None
    retry = runs.retry
    if retry is None or cause not in retry.on or runs.retries + 1 >= retry.attempts:
        return None
    if memory is not None:
        memory = math.ceil(_scaled(memory, retry.memory, retry.max_memory))
    return Rerun("retry", cause, runs.attempt + 1, memory,
                 _scaled(duration, retry.duration, retry.max_duration))


def scheduler_requeue(runs: Runs, status: "JobStatus") -> Optional[Rerun]:
    """The run the scheduler started by requeueing the job itself (it is QUEUED again after
    it ran), or None when the job may not be requeued any more."""
    if runs.requeues >= runs.requeue:
        return None
    cause = (status.metadata or {}).get("cause")
    return Rerun("requeue", cause if isinstance(cause, str) and cause else "requeued",
                 runs.attempt + 1, None, 0.0)


def spec_for(spec: "JobSpec", rerun: Rerun) -> "JobSpec":
    """A copy of ``spec`` with the memory and duration of ``rerun``."""
    import copy
    from datetime import timedelta

    made = copy.deepcopy(spec)
    if rerun.kind == "retry":
        before = made.attributes.duration.total_seconds()
        made.attributes.duration = timedelta(seconds=rerun.duration)
        if rerun.memory is not None and hasattr(made.resources, "memory"):
            made.resources.memory = rerun.memory  # type: ignore[union-attr]
        custom = made.attributes.custom_attributes
        limit = custom.get(PILOT_TIME_LIMIT) if custom else None
        if custom is not None and isinstance(limit, (int, float)) and before > 0:
            # The pilot's own limit grows as the duration does.
            custom[PILOT_TIME_LIMIT] = limit * rerun.duration / before
    environment = dict(made.environment or {})
    environment[ATTEMPT_VARIABLE] = str(rerun.attempt)
    made.environment = environment
    return made


_FIGURES = ("started_at", "ended_at", "cpu_seconds", "max_rss_bytes", "queued_at", "nodes",
            "cores", "requested_memory_bytes", "requested_seconds")


def rerun_status(rerun: Rerun, runs: Runs, previous: "JobStatus",
                 native_id: Optional[str], spec: "Optional[JobSpec]" = None) -> "JobStatus":
    """The QUEUED status that starts ``rerun`` after the run that ended with ``previous``
    (``spec``, the run's, names the pilot's limit in the message when it sets one)."""
    from psij.job_state import JobState
    from psij.job_status import JobStatus

    if rerun.kind == "requeue":
        most = runs.requeue + 1 + runs.retries
        why = {"checkpoint": f"it exited with {REQUEUE_EXIT_CODE} to be run again",
               "requeued": "the scheduler requeued it"}.get(rerun.cause, rerun.cause)
        message = f"requeued ({why}): run {rerun.attempt}, at most {most}"
    else:
        assert runs.retry is not None
        message = (f"retried after {rerun.cause}: attempt {runs.retries + 2} of "
                   f"{runs.retry.attempts}")
        if rerun.memory is not None:
            message += f", memory {rerun.memory} bytes"
        message += f", duration {rerun.duration:g} s"
        custom = spec.attributes.custom_attributes if spec is not None else None
        limit = custom.get(PILOT_TIME_LIMIT) if custom else None
        if isinstance(limit, (int, float)) and not isinstance(limit, bool):
            message += f", {PILOT_TIME_LIMIT} {limit:g} s"
    # The run's figures its end told (psij._registry.accounting.USE_KEYS), for its record.
    told = previous.metadata or {}
    figures = {key: told[key] for key in _FIGURES if key in told}
    meta: Dict[str, Any] = {
        "attempt": rerun.attempt, "rerun": rerun.kind, "cause": rerun.cause,
        "previous": {"native_id": native_id, "exit_code": previous.exit_code,
                     "message": previous.message, **figures},
    }
    return JobStatus(JobState.QUEUED, message=message, metadata=meta)


def counted(runs: Runs, rerun: Rerun) -> None:
    """Count ``rerun`` as started."""
    runs.attempt = rerun.attempt
    if rerun.kind == "requeue":
        runs.requeues += 1
    else:
        runs.retries += 1
