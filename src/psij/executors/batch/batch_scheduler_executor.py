"""The base class of batch scheduler executors (Slurm, Grid Engine, PBS, LSF, ...).

A backend is small and declarative: it names its submit, status, cancel, list and accounting
commands, parses their output, maps the scheduler's states, and renders a template. Everything
else lives here, once:

- ``submit``: check the job (values that cannot be written safely into the script are refused
  before anything is written), render the submit script into ``<work_directory>/<executor>/``
  (folder 0700, script 0600, named ``<job.id>.job``), run the submit command, parse the native
  id, report QUEUED and hand the job to the executor's status poller. A failing submit raises
  SubmitException with the scheduler's message and the path of the kept script, and leaves the
  job NEW and unbound.
- One :class:`_StatusPoller` per executor, started on first use, runs one status command per
  interval for all the executor's jobs. Its decisions come from the pure state machine in
  :mod:`~psij.executors.batch._tracking`; it holds the executor only weakly, and its thread ends
  when the executor is closed or garbage collected (or after a while without jobs).
- A job that leaves the queue is resolved from its exit-code file (``<native_id>.ec``, written
  by the submit script), then from the scheduler's accounting, and otherwise ends FAILED with a
  message saying so; it is never assumed to have completed.
- Final messages say why a job failed in words a user can act on (time limit, memory, node
  failure, preemption, cancelled by someone else, launcher failure, exit code, the end of the
  job's stderr); the scheduler's own state and reason stay in ``status.metadata``.

Scheduler commands run only through the executor's :class:`~._runner.CommandRunner`.
"""

import io
import logging
import os
import re
import threading
import weakref
from abc import abstractmethod
from collections import deque
from datetime import timedelta
from pathlib import Path
from typing import (
    IO,
    Any,
    Collection,
    Deque,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

from psij import _check
from psij._clock import Clock, MonotonicClock
from psij._private_dirs import ensure_private_dir
from psij.exceptions import InvalidJobException, SubmitException
from psij.executors._staging import REPORT_SUFFIX, read_report, script_context, staged_status
from psij.executors.batch._job_output import (
    _describe_duration,
    _describe_exit,
    _read_text,
    _stderr_tail,
)
from psij.executors.batch._runner import CommandResult, CommandRunner, SubprocessRunner
from psij.executors.batch._site_directives import custom_attribute_items
from psij.executors.batch._tracking import (
    Action,
    CancelAsked,
    CancelFailed,
    Event,
    Finish,
    JobAdded,
    JobTracker,
    MissingResolved,
    Observation,
    PollFailed,
    PollSucceeded,
    ReportState,
    ResolveMissing,
    RunStatusCommand,
    Settings,
    Tick,
)
from psij.executors.batch.escape_functions import ShellWord, directive_value
from psij.executors.batch.template_function_library import ALL as FUNCTION_LIBRARY
from psij.job import Job
from psij.job_executor import JobExecutor
from psij.job_executor_config import JobExecutorConfig
from psij.job_launcher import Launcher
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = [
    "BatchSchedulerExecutor",
    "BatchSchedulerExecutorConfig",
    "InvalidJobStateError",
    "StatusCommandError",
    "check_status_exit_code",
]

logger = logging.getLogger(__name__)

UNKNOWN_ERROR = "PSIJ: Unknown error"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OUTPUT_LIMIT = 64 * 1024
_IDLE_LINGER = 30.0

# Why a job failed, in words; {time_limit} is the job's requested duration.
CAUSE_MESSAGES: Dict[str, str] = {
    "time_limit": "the job reached its time limit ({time_limit}) and was stopped by the "
                  "scheduler; ask for a longer duration (JobAttributes.duration)",
    "out_of_memory": "the job ran out of memory and was killed; ask for more memory "
                     "(ResourceSpecV1.memory) or use less",
    "node_failure": "a node allocated to the job failed; the job may be resubmitted",
    "preempted": "the job was preempted by the scheduler (to make room for other work); it "
                 "may be resubmitted",
    "boot_failure": "the job's nodes could not be booted; the job may be resubmitted",
    "deadline": "the job reached its deadline before it could finish",
    "launch_failure": "the scheduler could not launch the job (a file system problem, a "
                      "missing directory or program, ...)",
    "held_error": "the scheduler put the job in an error state",
}


class StatusCommandError(RuntimeError):
    """A status command failed; raised by :func:`check_status_exit_code`."""


def check_status_exit_code(command: str, exit_code: int, out: str) -> None:
    """Raise :class:`StatusCommandError` (a RuntimeError) quoting ``command`` and ``out`` when
    ``exit_code`` is not 0."""
    if exit_code != 0:
        raise StatusCommandError(f"status command {command!r} exited with {exit_code} and "
                                 f"output {out!r}")


class InvalidJobStateError(Exception):
    """The job cannot be cancelled because the scheduler no longer has it running or queued."""


class BatchSchedulerExecutorConfig(JobExecutorConfig):
    """Configuration of batch executors.

    Parameters beyond :class:`~psij.JobExecutorConfig`:

    queue_polling_interval
        Seconds between two status commands.
    initial_queue_polling_delay
        Seconds from a submit to the first status command (short jobs are seen finishing fast).
    queue_polling_error_threshold
        How many status commands in a row must fail before the jobs are failed (it also takes
        ``queue_polling_outage_tolerance`` seconds of failures).
    keep_files
        Keep submit scripts, exit-code and output files after jobs end (for debugging).
    queue_polling_outage_tolerance
        Seconds of failing status commands tolerated before the jobs are failed (5 minutes).
    command_timeout
        Seconds after which a scheduler command is killed and counted as failed.
    """

    def __init__(self, launcher_log_file: Union[str, Path, None] = None,
                 work_directory: Union[str, Path, None] = None,
                 queue_polling_interval: float = 30, initial_queue_polling_delay: float = 2,
                 queue_polling_error_threshold: int = 2, keep_files: bool = False,
                 queue_polling_outage_tolerance: float = 300,
                 command_timeout: float = 60) -> None:
        super().__init__(launcher_log_file, work_directory)
        name = type(self).__name__
        self.queue_polling_interval = _positive(f"{name}.queue_polling_interval",
                                                queue_polling_interval)
        self.initial_queue_polling_delay = _non_negative(
            f"{name}.initial_queue_polling_delay", initial_queue_polling_delay)
        threshold = _check.opt_int(f"{name}.queue_polling_error_threshold",
                                   queue_polling_error_threshold, minimum=0)
        if threshold is None:
            raise TypeError(f"{name}.queue_polling_error_threshold: expected int, got None")
        self.queue_polling_error_threshold: int = threshold
        self.keep_files = _check.opt_bool(f"{name}.keep_files", keep_files)
        self.queue_polling_outage_tolerance = _non_negative(
            f"{name}.queue_polling_outage_tolerance", queue_polling_outage_tolerance)
        self.command_timeout = _positive(f"{name}.command_timeout", command_timeout)

    @classmethod
    def _from_config(cls, config: JobExecutorConfig) -> "BatchSchedulerExecutorConfig":
        """This kind of configuration with the settings ``config`` has (the general ones, and
        the batch ones when it is another kind of batch configuration)."""
        made = cls(launcher_log_file=config.launcher_log_file,
                   work_directory=config.work_directory)
        if isinstance(config, BatchSchedulerExecutorConfig):
            for name in _BATCH_SETTINGS:
                setattr(made, name, getattr(config, name))
        return made

    def _settings(self) -> Settings:
        interval = float(self.queue_polling_interval)
        return Settings(interval=interval, initial_delay=float(self.initial_queue_polling_delay),
                        error_threshold=self.queue_polling_error_threshold,
                        outage_tolerance=float(self.queue_polling_outage_tolerance),
                        max_backoff=max(interval, min(4 * interval, 120.0)),
                        cancel_poll_delay=min(1.0, interval))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(work_directory={self.work_directory!r}, "
                f"queue_polling_interval={self.queue_polling_interval!r}, "
                f"keep_files={self.keep_files!r})")


_BATCH_SETTINGS = ("queue_polling_interval", "initial_queue_polling_delay",
                   "queue_polling_error_threshold", "keep_files",
                   "queue_polling_outage_tolerance", "command_timeout")


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _check.fail_type(field, value, "a number of seconds")
    return float(value)


def _positive(field: str, value: Any) -> float:
    v = _number(field, value)
    if not v > 0:
        raise ValueError(f"{field}: must be more than 0 seconds, got {value!r}")
    return v


def _non_negative(field: str, value: Any) -> float:
    v = _number(field, value)
    if not v >= 0:
        raise ValueError(f"{field}: must not be negative, got {value!r}")
    return v


class BatchSchedulerExecutor(JobExecutor):
    """Base class of executors that submit jobs to a batch scheduler.

    Subclasses implement the hooks :meth:`generate_submit_script`, :meth:`get_submit_command`,
    :meth:`job_id_from_submit_output`, :meth:`get_cancel_command`,
    :meth:`process_cancel_command_output`, :meth:`get_status_command`,
    :meth:`parse_status_output` and :meth:`get_list_command`; optionally
    :meth:`parse_list_output`, :meth:`get_accounting_commands` and
    :meth:`parse_accounting_output`. Custom attributes named ``<prefix>.<option>`` with a prefix
    in ``CUSTOM_ATTRIBUTE_PREFIXES`` reach the template as ``custom_attributes.<prefix>``.
    """

    CONFIG_CLASS: Type[BatchSchedulerExecutorConfig] = BatchSchedulerExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES: Tuple[str, ...] = ()
    # Substrings of a failed submit command's output that mean "try again later".
    TRANSIENT_SUBMIT_ERRORS: Tuple[str, ...] = ()

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=self._batch_config(config))
        assert isinstance(self.config, BatchSchedulerExecutorConfig)
        self.work_directory: Path = self.config.work_directory / self._work_name()
        self._runner: CommandRunner = SubprocessRunner()
        self._clock: Clock = MonotonicClock()
        self._poller_lock = threading.Lock()
        self._poller: Optional[_StatusPoller] = None
        self._closed = False

    def _batch_config(self, config: Optional[JobExecutorConfig]
                      ) -> BatchSchedulerExecutorConfig:
        cls = self.CONFIG_CLASS
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, JobExecutorConfig):
            return cls._from_config(config)
        raise _check.fail_type(f"{type(self).__name__} config", config,
                               "psij.JobExecutorConfig or None")

    def _work_name(self) -> str:
        fixed = getattr(type(self), "_NAME_", None)
        return fixed if isinstance(fixed, str) else self.name

    @property
    def batch_config(self) -> BatchSchedulerExecutorConfig:
        """The configuration, typed as a batch configuration."""
        assert isinstance(self.config, BatchSchedulerExecutorConfig)
        return self.config

    # ------------------------------------------------------------------------ hooks

    @abstractmethod
    def generate_submit_script(self, job: Job, context: Dict[str, object],
                               submit_file: IO[str]) -> None:
        """Write the submit script of ``job`` to ``submit_file`` (see
        :meth:`_create_script_context` for ``context``)."""
        raise NotImplementedError

    @abstractmethod
    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        """The command that submits the script at ``submit_file_path``."""
        raise NotImplementedError

    @abstractmethod
    def job_id_from_submit_output(self, out: str) -> str:
        """The native id in the (successful) submit command's stdout."""
        raise NotImplementedError

    @abstractmethod
    def get_cancel_command(self, native_id: str) -> List[str]:
        """The command that cancels the job ``native_id``."""
        raise NotImplementedError

    @abstractmethod
    def process_cancel_command_output(self, exit_code: int, out: str) -> None:
        """Called when the cancel command failed: raise :class:`InvalidJobStateError` if the job
        had already left the queue, SubmitException otherwise."""
        raise NotImplementedError

    @abstractmethod
    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        """One command giving the state of all ``native_ids``."""
        raise NotImplementedError

    @abstractmethod
    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        """The state of each job shown in the status command's output. Must raise on output it
        does not understand (a job left out is looked up, never assumed done)."""
        raise NotImplementedError

    @abstractmethod
    def get_list_command(self) -> List[str]:
        """The command listing this user's jobs."""
        raise NotImplementedError

    def parse_list_output(self, out: str) -> List[str]:
        """Native ids in the list command's output; by default one per non-blank line."""
        return [s.strip() for s in out.splitlines() if s.strip()]

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        """Commands asking the scheduler's accounting about jobs that left the queue (none by
        default). Each output goes to :meth:`parse_accounting_output`."""
        return []

    def parse_accounting_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        """States of the jobs found in an accounting command's output; raise when accounting
        is not available."""
        return {}

    # ------------------------------------------------------------------------ submit

    def submit(self, job: Job) -> None:
        """Submit ``job``; on return it is QUEUED with a native id, or an exception was raised
        and the job is still NEW and unbound."""
        self._ensure_open()
        spec = self._check_job(job)
        try:
            self._check_script_values(job, spec)
            context = self._create_script_context(job)
            script = self._write_submit_script(job, context)
        except BaseException:
            job.executor = None
            raise
        result = self._run(self.get_submit_command(job, script))
        if not result.ok:
            job.executor = None
            raise SubmitException(
                f"job {job.id}: submitting failed: {result.describe()}; the submit script "
                f"is kept at {script}", transient=self._is_transient(result))
        try:
            native_id = self.job_id_from_submit_output(result.stdout).strip()
            if not native_id:
                raise ValueError("no job id found")
        except Exception as e:
            job.executor = None
            raise SubmitException(
                f"job {job.id}: the submit command seemed to succeed but its output has no job "
                f"id ({e}): {result.stdout.strip()!r}; the submit script is kept at {script}",
                e) from e
        job._native_id = native_id
        logger.debug("job %s: submitted as %s", job.id, native_id)
        self._set_job_status(job, JobStatus(JobState.QUEUED, metadata={"native_id": native_id}))
        self._status_poller().add(job, native_id, attach=False)

    def _is_transient(self, result: CommandResult) -> bool:
        if result.exit_code is None and result.failure is not None \
                and "could not be started" not in result.failure:
            return True
        text = result.output
        return any(marker in text for marker in self.TRANSIENT_SUBMIT_ERRORS)

    def _check_script_values(self, job: Job, spec: JobSpec) -> None:
        """Refuse, before anything is written, values the submit script cannot hold safely."""
        if spec.executable is None:
            raise InvalidJobException(f"job {job.id}: JobSpec.executable is not set")
        for name in (spec.environment or {}):
            if not _ENV_NAME.fullmatch(name):
                raise InvalidJobException(
                    f"JobSpec.environment: {name!r} cannot be exported by a submit script; "
                    "accepted names: letters, digits and '_', not starting with a digit")
        attrs = spec.attributes
        try:
            job_name = self._job_name(spec)
            if job_name is not None:
                self._directive_value("JobSpec.name", job_name)
            for field in ("queue_name", "account", "reservation_id"):
                value = getattr(attrs, field)
                if value is not None:
                    self._directive_value(f"JobAttributes.{field}", value)
            for prefix, items in self._custom_attribute_items(job).items():
                for item in items:
                    if item["value"] is not None:
                        self._directive_value(
                            f"JobAttributes.custom_attributes[{prefix + '.' + item['key']!r}]",
                            str(item["value"]))
        except (ValueError, TypeError) as e:
            raise InvalidJobException(str(e)) from e

    def _directive_value(self, field: str, value: str) -> str:
        """``value`` as written inside a directive, or ValueError naming ``field``."""
        return directive_value(field, value)

    def _write_submit_script(self, job: Job, context: Dict[str, object]) -> Path:
        self._ensure_work_dir()
        path = self.work_directory / f"{job.id}.job"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            self.generate_submit_script(job, context, f)
        return path

    def _ensure_work_dir(self) -> None:
        ensure_private_dir(self.work_directory, "batch work directory", self.config.work_directory)

    def submit_script(self, job: Job) -> str:
        """The submit script ``job`` would get, without submitting it or binding the job.

        Raises the same errors as :meth:`submit` for values the script cannot hold.
        """
        if not isinstance(job, Job):
            raise _check.fail_type("submit_script job", job, "psij.Job")
        spec = job.spec
        if spec is None:
            raise InvalidJobException(f"job {job.id} has no JobSpec")
        _check.env_dict("JobSpec.environment", spec.environment)
        self._check_script_values(job, spec)
        out = io.StringIO()
        self.generate_submit_script(job, self._create_script_context(job), out)
        return out.getvalue()

    # ------------------------------------------------------------------------ script context

    def _get_launcher_from_job(self, job: Job) -> Launcher:
        assert job.spec is not None
        return self._get_launcher(job.spec.launcher or Launcher.DEFAULT_LAUNCHER_NAME)

    def _create_script_context(self, job: Job) -> Dict[str, object]:
        """The values templates see: ``job``, ``env``, ``custom_attributes``,
        ``formatted_job_duration`` and ``psij`` (``lib``, ``launch_command``, ``script_dir``)."""
        spec = job.spec
        assert spec is not None
        launcher = self._get_launcher_from_job(job)
        words = launcher.get_launch_command(job)
        # Always absolute: schedulers start scripts in different folders.
        directory = os.path.abspath(spec.directory if spec.directory is not None else os.getcwd())
        context: Dict[str, object] = {
            "job": job,
            "env": [{"name": k, "value": v} for k, v in (spec.environment or {}).items()],
            "custom_attributes": self._custom_attribute_items(job),
            "psij": {
                "lib": FUNCTION_LIBRARY,
                "launch_command": [ShellWord(w) for w in words],
                "script_dir": str(self.work_directory.absolute()),
                "job_name": self._job_name(spec),
                "directory": directory,
                "process_count": v1_resources(spec).computed_process_count,
                "node_count": v1_resources(spec).computed_node_count,
                "staging": script_context(spec, directory, self.config.work_directory,
                                          self.name),
            },
        }
        duration = spec.attributes.duration
        if duration is not None:
            context["formatted_job_duration"] = self._format_duration(duration)
        return context

    def _job_name(self, spec: JobSpec) -> Optional[str]:
        """The job name written in the script (schedulers with stricter names override)."""
        return spec.name

    def _custom_attribute_items(self, job: Job) -> Dict[str, List[Dict[str, Any]]]:
        """This executor's custom attributes by prefix (see :func:`custom_attribute_items`)."""
        assert job.spec is not None
        return custom_attribute_items(job.spec.attributes.custom_attributes,
                                      self.CUSTOM_ATTRIBUTE_PREFIXES)

    def _format_duration(self, d: timedelta) -> str:
        """``hours:mm:ss`` (hours not limited to 24), rounding seconds up."""
        total = -(-int(d.total_seconds() * 1000) // 1000)
        return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"

    # ---------------------------------------------------------------- cancel / attach / list

    def cancel(self, job: Job) -> None:
        """Cancel ``job``; it ends CANCELED, or in the state it reached first."""
        if not isinstance(job, Job):
            raise _check.fail_type("cancel job", job, "psij.Job")
        if job.status.state.final:
            return
        native_id = job.native_id
        if native_id is None:
            raise SubmitException(f"job {job.id} has not been submitted, so it cannot be "
                                  "cancelled")
        poller = self._status_poller()
        poller.cancel_asked(native_id)
        result = self._run(self.get_cancel_command(native_id))
        if result.ok:
            return
        if result.exit_code is None:
            poller.cancel_failed(native_id)
            raise SubmitException(f"job {job.id}: cancelling failed: {result.describe()}",
                                  transient=True)
        try:
            self.process_cancel_command_output(result.exit_code, result.output or UNKNOWN_ERROR)
        except InvalidJobStateError:
            return  # it ended first; the poller learns how
        except BaseException:
            poller.cancel_failed(native_id)
            raise

    def attach(self, job: Job, native_id: str) -> None:
        """Follow the scheduler job ``native_id`` through the NEW ``job``.

        The job's state is learned at once from the scheduler (and, for a job that has left the
        queue, from its exit-code file or the accounting)."""
        self._ensure_open()
        if not isinstance(job, Job):
            raise _check.fail_type("attach job", job, "psij.Job")
        native_id = _check.req_str("attach native_id", native_id).strip()
        if not native_id:
            raise ValueError("attach native_id: must not be empty")
        if job.status.state is not JobState.NEW:
            raise InvalidJobException(f"job {job.id} is {job.status.state}; only a NEW job can "
                                      "be attached")
        if job.executor is not None:
            raise InvalidJobException(f"job {job.id} is already bound to executor "
                                      f"{job.executor}")
        self._ensure_work_dir()  # its exit-code files are read there
        job.executor = self
        job._native_id = native_id
        self._status_poller().add(job, native_id, attach=True)

    def list(self) -> List[str]:
        """Native ids of this user's jobs known to the scheduler."""
        result = self._run(self.get_list_command())
        if not result.ok:
            raise SubmitException(f"listing jobs failed: {result.describe()}",
                                  transient=result.exit_code is None)
        return self.parse_list_output(result.stdout)

    # ------------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop following jobs and end the status poller's thread (waits for it to end)."""
        self._closed = True
        with self._poller_lock:
            poller, self._poller = self._poller, None
        if poller is not None:
            poller.stop(wait=True)

    def __enter__(self) -> "BatchSchedulerExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_open(self) -> None:
        if self._closed:
            raise SubmitException(f"{self} is closed")

    def _status_poller(self) -> "_StatusPoller":
        with self._poller_lock:
            if self._poller is None:
                self._poller = _StatusPoller(self, self.batch_config._settings(), self._clock)
            return self._poller

    def _run(self, argv: Sequence[str]) -> CommandResult:
        return self._runner.run(argv, timeout=self.batch_config.command_timeout)

    # ------------------------------------------------------------------------ polling I/O

    def _poll_status(self, native_ids: Sequence[str]) -> Event:
        """Run the status command for ``native_ids``; the outcome as a tracker event."""
        try:
            result = self._run(self.get_status_command(native_ids))
        except Exception as e:
            return PollFailed(f"the status command could not be built: {e!r}")
        if result.exit_code is None:
            return PollFailed(result.describe())
        out = result.stdout if result.exit_code == 0 else (result.output or UNKNOWN_ERROR)
        try:
            statuses = self.parse_status_output(result.exit_code, out)
        except Exception as e:
            return PollFailed(f"{result.describe()} -- not understood: {e}")
        wanted = set(native_ids)
        return PollSucceeded({nid: _observation(st) for nid, st in statuses.items()
                              if nid in wanted})

    def _resolve_missing(self, native_ids: Sequence[str]) -> MissingResolved:
        """Look up jobs that left the queue: exit-code file first, then accounting."""
        found: Dict[str, Observation] = {}
        for nid in native_ids:
            code = self._exit_code_from_file(nid)
            if code is not None:
                state = JobState.COMPLETED if code == 0 else JobState.FAILED
                found[nid] = Observation(state, exit_code=code,
                                         metadata={"native_state": None,
                                                   "source": "exit code file"})
        rest = [nid for nid in native_ids if nid not in found]
        if rest:
            for nid, obs in self._accounting_lookup(rest).items():
                found.setdefault(nid, obs)
        return MissingResolved(found)

    def _accounting_lookup(self, native_ids: Sequence[str]) -> Dict[str, Observation]:
        """What the scheduler's accounting says about these jobs (nothing if it has none)."""
        found: Dict[str, Observation] = {}
        for argv in self.get_accounting_commands(native_ids):
            result = self._run(argv)
            if result.exit_code is None:
                logger.info("accounting command failed: %s", result.describe())
                continue
            out = result.stdout if result.exit_code == 0 else result.output
            try:
                statuses = self.parse_accounting_output(result.exit_code, out)
            except Exception as e:
                logger.info("accounting not available: %s (%s)", result.describe(), e)
                continue
            for nid, st in statuses.items():
                if nid in native_ids:
                    found.setdefault(nid, _observation(st, source="accounting"))
        return found

    def _aux_path(self, native_id: str, suffix: str) -> Path:
        return self.work_directory / f"{native_id}{suffix}"

    def _exit_code_from_file(self, native_id: str) -> Optional[int]:
        text = _read_text(self._aux_path(native_id, ".ec"), 100)
        if text is None:
            return None
        try:
            return int(text.strip())
        except ValueError:
            return None  # written only partly so far; the next look will see all of it

    def _final_status(self, jobs: Sequence[Job], native_id: str, obs: Observation,
                      cancel_requested: bool) -> JobStatus:
        """The final status from what the scheduler said and what the job left behind."""
        job = jobs[0] if jobs else None
        spec = job.spec if job is not None else None
        code = self._exit_code_from_file(native_id)
        exit_code = code if code is not None else obs.exit_code
        if exit_code is None and obs.state is not JobState.CANCELED:
            # The queue gave the state but not the exit code, and the exit-code file is gone
            # (another process following the same job may have removed it).
            known = self._accounting_lookup([native_id]).get(native_id)
            if known is not None and known.exit_code is not None:
                exit_code = known.exit_code
        metadata: Dict[str, Any] = dict(obs.metadata)
        metadata["native_id"] = native_id
        state = obs.state
        message = obs.message
        cause = metadata.get("cause")
        if state is JobState.CANCELED or (cancel_requested and state is JobState.FAILED
                                          and cause is None):
            state = JobState.CANCELED
            if not cancel_requested and message is None:
                message = ("the job was cancelled outside this executor (by its owner through "
                           "another tool, an administrator or the scheduler)")
            return JobStatus(state, message=message, exit_code=exit_code, metadata=metadata)
        if state is JobState.COMPLETED and exit_code not in (None, 0):
            state = JobState.FAILED
        if state is JobState.COMPLETED:
            return JobStatus(state, message=message,
                             exit_code=0 if exit_code is None else exit_code, metadata=metadata)
        parts: List[str] = []
        if isinstance(cause, str) and cause in CAUSE_MESSAGES:
            limit = spec.attributes.duration if spec is not None else None
            parts.append(CAUSE_MESSAGES[cause].format(
                time_limit=_describe_duration(limit) if limit is not None else "unknown"))
        elif message:
            parts.append(message)
        script_output = _read_text(self._aux_path(native_id, ".out"), _OUTPUT_LIMIT, tail=True)
        launcher_said = None
        if script_output and spec is not None and exit_code != 0:
            assert job is not None
            try:
                launcher = self._get_launcher_from_job(job)
                if launcher.is_launcher_failure(script_output):
                    launcher_said = launcher.get_launcher_failure_message(script_output)
            except Exception as e:
                logger.debug("job %s: could not check the launcher output: %s", native_id, e)
        if launcher_said:
            parts.append(f"the launcher failed: {launcher_said}")
        if exit_code not in (None, 0):
            assert exit_code is not None
            parts.append(_describe_exit(exit_code))
        tail = _stderr_tail(spec)
        if tail:
            parts.append(f"last lines of the job's stderr:\n{tail}")
        if not parts:
            parts.append("the scheduler reported the job as failed without giving a reason")
        return JobStatus(JobState.FAILED, message="; ".join(parts), exit_code=exit_code,
                         metadata=metadata)

    def _job_ended(self, jobs: Sequence[Job], native_id: str) -> None:
        """Remove the files of a job that ended (unless ``keep_files``)."""
        for job in jobs:
            self._clean_submit_script(job)
        if jobs:
            for suffix in (".ec", ".out", ".nodefile", REPORT_SUFFIX):
                self._delete_aux_file(jobs[0], suffix)

    # ------------------------------------------------------------------------ protected helpers

    def _clean_submit_script(self, job: Job) -> None:
        """Delete the job's submit script, unless ``keep_files``."""
        if self.batch_config.keep_files:
            return
        try:
            (self.work_directory / f"{job.id}.job").unlink()
        except FileNotFoundError:
            pass  # attached jobs have no script here, or another process removed it
        except OSError as e:
            logger.warning("job %s: could not delete its submit script: %s", job.id, e)

    def _delete_aux_file(self, job: Job, suffix: str) -> None:
        """Delete ``<native_id><suffix>`` in the work directory, unless ``keep_files``."""
        if self.batch_config.keep_files or job.native_id is None:
            return
        try:
            self._aux_path(job.native_id, suffix).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("job %s: could not delete %s file: %s", job.id, suffix, e)

    def _read_aux_file(self, job: Job, suffix: str) -> Optional[str]:
        """The content of ``<native_id><suffix>`` (then deleted unless ``keep_files``), or None
        if there is no such file."""
        if job.native_id is None:
            return None
        text = _read_text(self._aux_path(job.native_id, suffix), _OUTPUT_LIMIT, tail=True)
        if text is not None:
            self._delete_aux_file(job, suffix)
        return text

    def __str__(self) -> str:
        return f"{type(self).__name__}(work_directory={self.work_directory})"

    __repr__ = __str__


def v1_resources(spec: JobSpec) -> ResourceSpecV1:
    """The spec's resources (a default ``ResourceSpecV1`` when unset); refuses other versions."""
    resources = spec.resources
    if resources is None:
        return ResourceSpecV1()
    if not isinstance(resources, ResourceSpecV1):
        raise InvalidJobException(f"JobSpec.resources: only ResourceSpecV1 is understood by "
                                  f"batch executors, got {type(resources).__name__}")
    return resources


def _observation(status: JobStatus, source: Optional[str] = None) -> Observation:
    meta = dict(status.metadata or {})
    if source is not None:
        meta.setdefault("source", source)
    return Observation(status.state, status.message, status.exit_code, meta)


class _StatusPoller:
    """Follows the jobs of one executor: one thread, one status command per interval.

    The executor is held weakly: when it is collected the thread ends. Jobs being followed hold
    their executor, so an executor lives at least as long as it has unfinished jobs. The thread
    also ends after a while without jobs, and starts again with the next job.
    """

    def __init__(self, executor: BatchSchedulerExecutor, settings: Settings,
                 clock: Clock) -> None:
        self._executor = weakref.ref(executor)
        self._label = f"psij-{executor._work_name()}-status"
        self._clock = clock
        self._cond = threading.Condition()
        self._tracker = JobTracker(settings, clock)
        self._jobs: Dict[str, List[Job]] = {}
        self._last: Dict[str, JobStatus] = {}
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        weakref.finalize(executor, self.stop)

    # called from user threads

    def add(self, job: Job, native_id: str, attach: bool) -> None:
        with self._cond:
            if self._stopped:
                raise SubmitException("the executor is closed")
            known = self._jobs.get(native_id)
            if known is not None:
                known.append(job)
                last = self._last.get(native_id)
            else:
                self._tracker.feed(JobAdded(native_id, JobState.NEW if attach
                                            else JobState.QUEUED, poll_soon=attach))
                self._jobs[native_id] = [job]
                last = None
            self._ensure_thread()
            self._cond.notify_all()
        if last is not None:
            self._deliver(job, last)

    def cancel_asked(self, native_id: str) -> None:
        with self._cond:
            if self._tracker.is_tracked(native_id):
                self._tracker.feed(CancelAsked(native_id))
                self._cond.notify_all()

    def cancel_failed(self, native_id: str) -> None:
        with self._cond:
            if self._tracker.is_tracked(native_id):
                self._tracker.feed(CancelFailed(native_id))

    def stop(self, wait: bool = False) -> None:
        with self._cond:
            self._stopped = True
            thread = self._thread
            self._cond.notify_all()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._label, daemon=True)
            self._thread.start()

    # the poller's thread

    def _run(self) -> None:
        try:
            while True:
                actions = self._next_actions()
                if actions is None:
                    return
                self._perform(actions)
        except Exception:
            logger.exception("%s: internal error; status polling stopped", self._label)
            with self._cond:
                self._thread = None

    def _next_actions(self) -> Optional[List[Action]]:
        """Wait until something is due; None when the thread should end."""
        with self._cond:
            idle_since: Optional[float] = None
            while True:
                if self._stopped:
                    self._thread = None
                    return None
                actions = self._tracker.feed(Tick())
                if actions:
                    return actions
                now = self._clock.now()
                if not self._tracker.tracked():
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= _IDLE_LINGER:
                        self._thread = None
                        return None
                    self._cond.wait(_IDLE_LINGER)
                    continue
                idle_since = None
                deadline = self._tracker.next_deadline()
                self._cond.wait(None if deadline is None else max(0.0, deadline - now))

    def _perform(self, first: List[Action]) -> None:
        queue: Deque[Action] = deque(first)
        while queue:
            action = queue.popleft()
            executor = self._executor()
            if executor is None:
                self.stop()
                return
            try:
                if isinstance(action, RunStatusCommand):
                    try:
                        event: Event = executor._poll_status(action.native_ids)
                    except Exception as e:
                        logger.exception("%s: status poll failed", self._label)
                        event = PollFailed(f"internal error while polling: {e!r}")
                    queue.extend(self._feed(event))
                elif isinstance(action, ResolveMissing):
                    try:
                        event = executor._resolve_missing(action.native_ids)
                    except Exception:
                        logger.exception("%s: looking up jobs that left the queue failed",
                                         self._label)
                        event = MissingResolved({})
                    queue.extend(self._feed(event))
                elif isinstance(action, ReportState):
                    self._report(action)
                elif isinstance(action, Finish):
                    self._finish(executor, action)
            finally:
                del executor

    def _feed(self, event: Event) -> List[Action]:
        with self._cond:
            return self._tracker.feed(event)

    def _report(self, action: ReportState) -> None:
        obs = action.observation
        meta = dict(obs.metadata)
        meta["native_id"] = action.native_id
        status = JobStatus(obs.state, message=obs.message, exit_code=obs.exit_code,
                           metadata=meta)
        with self._cond:
            jobs = list(self._jobs.get(action.native_id, ()))
            self._last[action.native_id] = status
        for job in jobs:
            self._deliver(job, status)

    def _finish(self, executor: BatchSchedulerExecutor, action: Finish) -> None:
        with self._cond:
            jobs = self._jobs.pop(action.native_id, [])
            self._last.pop(action.native_id, None)
        try:
            status = staged_status(executor._final_status(
                jobs, action.native_id, action.observation, action.cancel_requested),
                read_report(executor._aux_path(action.native_id, REPORT_SUFFIX)),
                f"job {action.native_id}")
        except Exception as e:
            logger.exception("job %s: could not work out its final status", action.native_id)
            status = JobStatus(action.observation.state if action.observation.state.final
                               else JobState.FAILED,
                               message=f"{action.observation.message or ''} (internal error "
                                       f"while reading the job's files: {e!r})".strip(),
                               metadata={"native_id": action.native_id})
        try:
            executor._job_ended(jobs, action.native_id)
        except Exception:
            logger.exception("job %s: could not clean up its files", action.native_id)
        for job in jobs:
            self._deliver(job, status)

    @staticmethod
    def _deliver(job: Job, status: JobStatus) -> None:
        executor = job.executor
        if executor is not None:
            executor._set_job_status(job, status)
        else:
            job._set_status(status)
