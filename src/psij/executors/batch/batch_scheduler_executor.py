"""The base class of batch scheduler executors (Slurm, Grid Engine, PBS, LSF, ...).

A backend is a few declarations: its template (``TEMPLATE``), commands (``SUBMIT_COMMAND``,
``CANCEL_COMMAND``, ``STATUS_COMMAND``, ``LIST_COMMAND``), the job-id pattern, what a failed
cancel or status command says when the job is already gone, its directive rules, and the
parsers of its status (and accounting) output, which map the scheduler's states. The hooks of
the PSI/J Python API (``get_submit_command``, ``job_id_from_submit_output``, ...) have defaults
built from those declarations, so a backend written for psij-python that overrides the hooks
works unchanged. Everything else lives here, once:

- ``submit``: the entry of the submission pipeline, which calls each step once, in order,
  passing what the previous one returned: check the job (values that cannot be written safely
  into the script are refused before anything is written), build its script context, render
  the submit script, submit it (``psij.executors.batch._submit_io``: written into
  ``<work_directory>/<executor>/``, folder 0700, script ``SCRIPT_MODE``, 0600 unless the
  scheduler needs it executable, named ``<job.id>.job``, or sent on the submit command's
  standard input when ``SCRIPT_ON_STDIN``; the native id read from its output), report
  QUEUED and hand the job to the executor's status poller (``psij.executors.batch._poller``).
  The steps take immutable inputs made once per executor (``ScriptInputs``,
  ``SubmitInputs``, the poller's ``TrackInputs``) and never call back into the executor but
  through the hooks resolved into them. A failing submit raises SubmitException with the
  scheduler's message and the path of the kept script, and leaves the job NEW and unbound.
- A job that leaves the queue is resolved from its exit-code file (``<native_id>.ec``, written
  by the submit script), then from the scheduler's accounting, and otherwise ends FAILED with a
  message saying so; it is never assumed to have completed. The final status is decided by the
  pure rules of ``psij.executors.batch._final_state`` from what this module read.

Scheduler commands run only through the executor's ``CommandRunner``
(``psij.executors.batch._runner``).
"""

import logging
import threading
import weakref
from pathlib import Path
from typing import (
    IO,
    TYPE_CHECKING,
    AbstractSet,
    Any,
    Collection,
    Dict,
    Hashable,
    Iterable,
    List,
    Optional,
    Pattern,
    Sequence,
    Tuple,
    Type,
    Union,
)

from psij import _check, _site_config
from psij._clock import Clock, MonotonicClock
from psij._data import data_dir
from psij._reexports import lazy_names
from psij._registry import held as _held_record
from psij._registry.durable import commit_rows
from psij._scripts.generator import TemplatedScriptGenerator
from psij.exceptions import InvalidJobException, SubmitException, SubmitManyException
from psij.executors._staging import REPORT_SUFFIX
from psij.executors.batch import _arrays
from psij.executors.batch._arrays import ArrayStyle
from psij.executors.batch._aux_files import OUTPUT_LIMIT, AuxFiles
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from psij.executors.batch._cancel_output import UNKNOWN_ERROR
from psij.executors.batch._cancel_output import InvalidJobStateError as InvalidJobStateError
from psij.executors.batch._fallback import SchedulerFallbackWarning as SchedulerFallbackWarning
from psij.executors.batch._fallback import local_fallback
from psij.executors.batch._figures_wait import ended_figures
from psij.executors.batch._final_state import (
    Seen,
    final_state,
    final_status,
    needs_accounting,
    with_accounting_cause,
)
from psij.executors.batch._held_jobs import HeldJobs, HoldInputs
from psij.executors.batch._job_output import _read_text, _stderr_tail
from psij.executors.batch._kill import KillFirst
from psij.executors.batch._named_jobs import NamedJobs
from psij.executors.batch._poller import StatusPoller, TrackInputs, weakly
from psij.executors.batch._priority_change import PriorityChange
from psij.executors.batch._reruns import RUN_FILE_SUFFIXES, Reruns
from psij.executors.batch._runner import CommandResult, CommandRunner, SubprocessRunner
from psij.executors.batch._script_context import (
    ScriptInputs,
)
from psij.executors.batch._script_steps import ScriptSteps
from psij.executors.batch._signals import SIGNAL_SUFFIX, SignalHooks
from psij.executors.batch._status_table import StateMap, check_status_exit_code, parse_status_lines
from psij.executors.batch._status_table import StatusCommandError as StatusCommandError
from psij.executors.batch._submit_io import (
    declared_job_id,
    missing,
    submit_argv,
    submit_text,
)
from psij.executors.batch._tracking import (
    Event,
    MissingResolved,
    Observation,
    PollFailed,
    PollSucceeded,
    observed,
)
from psij.job import Job
from psij.job_executor import JobExecutor, job_list
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = [
    "BatchSchedulerExecutor",
    "BatchSchedulerExecutorConfig",
    "InvalidJobStateError",
    "SchedulerFallbackWarning",
    "StatusCommandError",
    "check_status_exit_code",
]

logger = logging.getLogger(__name__)




class BatchSchedulerExecutor(ScriptSteps, KillFirst, PriorityChange, NamedJobs, SignalHooks,
                             Reruns, AuxFiles, JobExecutor):
    """Base class of executors that submit jobs to a batch scheduler.

    A subclass declares its scheduler in class attributes (below); where the scheduler's ways
    do not fit them, it overrides the hooks of the PSI/J Python API
    (:meth:`generate_submit_script`, :meth:`get_submit_command`,
    :meth:`job_id_from_submit_output`, :meth:`get_cancel_command`,
    :meth:`process_cancel_command_output`, :meth:`get_status_command`,
    :meth:`parse_status_output`, :meth:`get_list_command`, :meth:`parse_list_output`), which
    use the declarations by default. A scheduler with accounting also implements
    :meth:`get_accounting_commands` and :meth:`parse_accounting_output`. Custom attributes
    named ``<prefix>.<option>`` with a prefix in ``CUSTOM_ATTRIBUTE_PREFIXES`` reach the
    template as ``custom_attributes.<prefix>``. ``signal`` and its declarations
    (``SIGNAL_COMMAND``, ``SCRIPT_SIGNALS``) are described in ``_signals``.
    """

    CONFIG_CLASS: Type[BatchSchedulerExecutorConfig] = BatchSchedulerExecutorConfig
    # Each run of a job run again moves the output of the run before to <path>.<run>
    # (templates/psij_run_job.mustache); the registry records where each run's output is.
    _psij_keeps_run_outputs = True
    # Substrings of a failed submit command's output that mean "try again later".
    TRANSIENT_SUBMIT_ERRORS: Tuple[str, ...] = ()
    # The submit-script template: a path, or a file name among the templates shipped with psij.
    TEMPLATE: Union[str, Path, None] = None
    # Permissions of the submit script (0o700 for schedulers that run only executable scripts).
    SCRIPT_MODE: int = 0o600
    # The submit command; the script's path is appended, or given on stdin when SCRIPT_ON_STDIN.
    SUBMIT_COMMAND: Tuple[str, ...] = ()
    SCRIPT_ON_STDIN: bool = False
    # Searched in the submit command's stripped stdout; group 1 (or the match) is the native id.
    JOB_ID_PATTERN: Optional[Pattern[str]] = None
    # The cancel command (the native id is appended), and what its output says when it failed
    # because the job had already ended.
    CANCEL_COMMAND: Tuple[str, ...] = ()
    CANCEL_GONE_PATTERN: Optional[Pattern[str]] = None
    # The status command (the native ids are appended), and, for output of one line per job,
    # the pattern of a line (groups: native id, state[, reason]), the scheduler's states and
    # those of them that mean the scheduler holds the job until someone releases it.
    STATUS_COMMAND: Tuple[str, ...] = ()
    STATUS_LINE_PATTERN: Optional[Pattern[str]] = None
    STATE_MAP: StateMap = {}
    HELD_STATES: Collection[str] = ()
    LIST_COMMAND: Tuple[str, ...] = ()
    # Lines of the list command's output that are native ids (None: every non-blank line).
    LIST_ID_PATTERN: Optional[Pattern[str]] = None
    # Exit codes of the status and list commands that mean "none of these jobs is known" when
    # its output has lines and every one matches NO_JOBS_PATTERN (None: it has no output).
    NO_JOBS_EXIT_CODES: Tuple[int, ...] = ()
    NO_JOBS_PATTERN: Optional[Pattern[str]] = None
    # Where the figures of an ended job's run are read ("accounting", "status": the status
    # command shows ended jobs; None: nowhere), waited for a moment (see _figures_wait).
    FIGURES_FROM: Optional[str] = None
    # How the scheduler writes and names job arrays (None: submit_many submits one by one).
    ARRAYS: Optional[ArrayStyle] = None

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=self._batch_config(config))
        assert isinstance(self.config, BatchSchedulerExecutorConfig)
        self.work_directory: Path = self.config.work_directory / self._work_name()
        self._runner: CommandRunner = SubprocessRunner()
        self._clock: Clock = MonotonicClock()
        self._poller_lock = threading.Lock()
        self._poller: Optional[StatusPoller] = None
        self._closed = False
        cap = self.batch_config.max_queued_per_shape
        self._held: Optional[HeldJobs] = None if cap is None else HeldJobs(cap, HoldInputs(
            name=self._work_name(), owner=str(self), clock=self._clock,
            memory_bucket=self.batch_config.memory_bucket,
            tmp_bucket=self.batch_config.tmp_bucket, submit=self._submit_checked,
            submit_many=self._submit_checked_many, set_status=self._set_job_status,
            restate=self._restate_job_status, cancel=self.cancel, hurry=self._hurry,
            mark=lambda jobs, held, final: _held_record.mark(self, jobs, held, final)))
        if self.TEMPLATE is not None:
            template = Path(self.TEMPLATE)
            if not template.is_absolute():
                template = data_dir("templates") / template
            self.generator = TemplatedScriptGenerator(self.config, template)
        self._fallback = local_fallback(self)  # set when jobs go to this machine instead

    def _batch_config(self, config: Optional[JobExecutorConfig]
                      ) -> BatchSchedulerExecutorConfig:
        cls = self.CONFIG_CLASS
        if config is None:
            return _site_config.config_defaults(self.name, cls())
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

    def _declared(self, name: str) -> Any:
        value = getattr(self, name)
        if value is None or value == ():
            raise missing(type(self).__name__, name)
        return value

    # ------------------------------------------------------------------------ hooks

    def generate_submit_script(self, job: Job, context: Dict[str, object],
                               submit_file: IO[str]) -> None:
        """Write the submit script of ``job`` to ``submit_file`` (see
        ``_create_script_context`` for ``context``); renders ``TEMPLATE`` by default."""
        if getattr(self, "generator", None) is None:
            self._declared("TEMPLATE")
        self.generator.generate_submit_script(job, context, submit_file)

    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        """The command that submits the script at ``submit_file_path``."""
        return submit_argv(self.SUBMIT_COMMAND, self.SCRIPT_ON_STDIN, type(self).__name__,
                           submit_file_path)

    def get_submit_stdin(self, job: Job, submit_file_path: Path) -> Optional[str]:
        """The standard input of the submit command: the script when ``SCRIPT_ON_STDIN``,
        else nothing (None)."""
        if not self.SCRIPT_ON_STDIN:
            return None
        return submit_file_path.read_text(encoding="utf-8", errors="surrogateescape")

    def job_id_from_submit_output(self, out: str) -> str:
        """The native id in the (successful) submit command's stdout."""
        return declared_job_id(self.JOB_ID_PATTERN, type(self).__name__, out)

    def get_cancel_command(self, native_id: str) -> List[str]:
        """The command that cancels the job ``native_id``."""
        return [*self._declared("CANCEL_COMMAND"), native_id]

    def process_cancel_command_output(self, exit_code: int, out: str) -> None:
        """Called when the cancel command failed: raise :class:`InvalidJobStateError` if the job
        had already left the queue, SubmitException otherwise."""
        gone = self.CANCEL_GONE_PATTERN
        if gone is not None and gone.search(out):
            raise InvalidJobStateError(out.strip())
        name = " ".join(self.CANCEL_COMMAND) or f"{self._work_name()} cancel"
        raise SubmitException(f"{name} exited with {exit_code}: {out.strip()}")

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        """One command giving the state of all ``native_ids``."""
        return [*self._declared("STATUS_COMMAND"), *native_ids]

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        """The state of each job shown in the status command's output. Must raise on output it
        does not understand (a job left out is looked up, never assumed done). By default the
        output is one line per job, read with ``STATUS_LINE_PATTERN`` and ``STATE_MAP``."""
        pattern = self._declared("STATUS_LINE_PATTERN")
        name = " ".join(self.STATUS_COMMAND) or f"{self._work_name()} status"
        check_status_exit_code(name, exit_code, out)
        return parse_status_lines(pattern, self.STATE_MAP, out, self.HELD_STATES)

    def get_list_command(self) -> List[str]:
        """The command listing this user's jobs."""
        return list(self._declared("LIST_COMMAND"))

    def parse_list_output(self, out: str) -> List[str]:
        """Native ids in the list command's output: the non-blank lines (those that match
        ``LIST_ID_PATTERN`` when it is set)."""
        lines = [s.strip() for s in out.splitlines() if s.strip()]
        pattern = self.LIST_ID_PATTERN
        return lines if pattern is None else [s for s in lines if pattern.fullmatch(s)]

    def output_means_no_jobs(self, exit_code: int, out: str) -> bool:
        """True when a failed status or list command only said that none of the jobs is
        known (``NO_JOBS_EXIT_CODES``, ``NO_JOBS_PATTERN``)."""
        if exit_code == 0 or exit_code not in self.NO_JOBS_EXIT_CODES:
            return False
        lines = [line for line in out.splitlines() if line.strip()]
        pattern = self.NO_JOBS_PATTERN
        if pattern is None:
            return not lines
        return bool(lines) and all(pattern.search(x) for x in lines)

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        """Commands asking the scheduler's accounting about jobs that left the queue (none by
        default). Each output goes to :meth:`parse_accounting_output`."""
        return []

    def parse_accounting_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        """States of the jobs in an accounting command's output; raise if there is no accounting."""
        return {}

    # ------------------------------------------------------------------------ submit

    def submit(self, job: Job) -> None:
        """Submit ``job``; on return it is QUEUED (with a native id, or held by the client:
        max_queued_per_shape), or an exception was raised and the job is still NEW and unbound."""
        self._ensure_open()
        if self._fallback is not None:
            self._fallback.submit(job)
            return
        spec = self._check_job(job)
        inputs = self._script_inputs()
        try:
            self._check_script_values(job, spec, inputs)
        except BaseException:
            job.executor = None
            raise
        if self._held is not None:
            self._held.submit(job, spec)  # submits now (as below) or holds the job
        else:
            self._submit_checked(job, spec, inputs)
        self._commit_rows([job])

    def _commit_rows(self, jobs: Sequence[Job]) -> None:
        """The registry rows of those of ``jobs`` the scheduler took, committed before submit
        returns (a job held back is recorded as held already)."""
        commit_rows(self, [job for job in jobs if job._native_id is not None])

    def _submit_checked(self, job: Job, spec: JobSpec,
                        inputs: Optional[ScriptInputs] = None) -> None:
        """Submit ``job``, checked and bound to this executor, to the scheduler: context ->
        render -> submit -> track, each step taking what the one before gave; on failure the
        job is unbound and the error raised."""
        try:
            inputs = inputs or self._script_inputs()
            text = self._render(job, self._create_script_context(job, inputs), inputs)
            native_id = submit_text(self._submit_inputs(), job, text)
        except BaseException:
            job.executor = None
            raise
        if isinstance(native_id, SubmitException):
            job.executor = None
            raise native_id
        self._track(job, native_id)

    def _track(self, job: Job, native_id: str, array_id: Optional[str] = None) -> None:
        """The track step: ``job`` is QUEUED as ``native_id`` (an element of ``array_id``)
        and followed by the status poller."""
        job._native_id = native_id
        logger.debug("job %s: submitted as %s", job.id, native_id)
        meta = {"native_id": native_id} if array_id is None \
            else {"native_id": native_id, "array_id": array_id}
        self._set_job_status(job, JobStatus(JobState.QUEUED, metadata=meta))
        held = self._held
        self._status_poller().add(job, native_id, attach=False,
                                  group=None if held is None else held.shape_key(job),
                                  rerunnable=job.__dict__.get("_runs") is not None)

    def submit_many(self, jobs: Iterable[Job]) -> None:
        """Submit ``jobs``, as job arrays where the scheduler has them (``ARRAYS``; see
        :mod:`psij.executors.batch._arrays`), within ``max_queued_per_shape`` if set."""
        jobs = job_list(jobs)
        # One by one: jobs run locally (fallback), or without a cap a backend without arrays or
        # with its own script hooks (with a cap, those held are recorded together).
        inputs = None if self._fallback else self._script_inputs()
        if inputs is None or (self._held is None and not (self.ARRAYS and inputs.generator)):
            self._submit_each(jobs)
            return
        failures: List[Tuple[Job, BaseException]] = []
        checked: List[Tuple[Job, JobSpec]] = []
        for job in jobs:
            try:
                self._ensure_open()
                spec = self._check_job(job)
                try:
                    self._check_script_values(job, spec, inputs)
                    checked.append((job, spec))
                except BaseException:
                    job.executor = None
                    raise
            except Exception as e:
                failures.append((job, e))
        if checked:
            failures += self._held.submit_many(checked) if self._held is not None \
                else self._submit_checked_many(checked, inputs)
            self._commit_rows([job for job, _ in checked])
        if failures:
            raise SubmitManyException(failures, len(jobs))

    def _submit_checked_many(self, checked: List[Tuple[Job, JobSpec]],
                             inputs: Optional[ScriptInputs] = None
                             ) -> List[Tuple[Job, BaseException]]:
        """:meth:`_submit_checked` for several jobs, as arrays if it can; those that failed."""
        inputs, style = inputs or self._script_inputs(), self.ARRAYS
        failures: List[Tuple[Job, BaseException]] = []
        contexts: List[Tuple[Job, Dict[str, object]]] = []
        for job, spec in checked:
            try:
                if style is None or inputs.generator is None:
                    self._submit_checked(job, spec, inputs)
                else:
                    contexts.append((job, self._create_script_context(job, inputs)))
            except Exception as e:
                job.executor = None
                failures.append((job, e))
        if style is not None and inputs.generator is not None and contexts:
            failures += _arrays.submit_arrays(style, inputs.generator, contexts,
                                              self._submit_inputs(), self._track)
        return failures

    def submit_script(self, job: Job) -> str:
        """The submit script ``job`` would get, without submitting it or binding the job;
        raises the same errors as :meth:`submit` for values the script cannot hold."""
        if not isinstance(job, Job):
            raise _check.fail_type("submit_script job", job, "psij.Job")
        spec = job.spec
        if spec is None:
            raise InvalidJobException(f"job {job.id} has no JobSpec")
        # Checked again as submit does (items changed in place since they were set).
        spec.environment = spec.environment
        spec.arguments = spec.arguments
        inputs = self._script_inputs()
        self._check_script_values(job, spec, inputs)
        return self._render(job, self._create_script_context(job, inputs), inputs)

    # ---------------------------------------------------------------- cancel / attach / list

    def cancel(self, job: Job) -> None:
        """Cancel ``job``; it ends CANCELED, or in the state it reached first."""
        if not isinstance(job, Job):
            raise _check.fail_type("cancel job", job, "psij.Job")
        if job.status.state.final:
            return
        if self._fallback is not None:
            self._fallback.cancel(job)
            return
        if (self._held is not None and self._held.cancel(job)) or self._cancel_rerun(job):
            return  # held (max_queued_per_shape), or between two runs (see _reruns)
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
            poller.cancel_failed(native_id)  # it ended first: by itself, as the poller learns
            return
        except BaseException:
            poller.cancel_failed(native_id)
            raise

    def attach(self, job: Job, native_id: str) -> None:
        """Follow the scheduler job ``native_id`` through the NEW ``job``.

        The job's state is learned at once from the scheduler (and, for a job that has left the
        queue, from its exit-code file or the accounting)."""
        self._ensure_open()
        if self._fallback is not None:  # its jobs were recorded as the local executor's
            raise SubmitException(f"cannot attach {native_id!r}: {self._fallback.why}")
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
        if self._fallback is not None:
            return self._fallback.local.list()
        result = self._run(self.get_list_command())
        if result.exit_code is not None and self.output_means_no_jobs(result.exit_code,
                                                                      result.output):
            return []
        if not result.ok:
            raise SubmitException(f"listing jobs failed: {result.describe()}",
                                  transient=result.exit_code is None)
        return self.parse_list_output(result.stdout)

    # ------------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop following jobs and end the status poller's thread (waits for it to end)."""
        self._closed = True
        for part in (self._held, self._fallback, self._runner):
            getattr(part, "close", lambda: None)()  # the runner's spares (spare_submit_commands)
        with self._poller_lock:
            poller, self._poller = self._poller, None
        if poller is not None:
            poller.stop(wait=True)

    def _set_job_status(self, job: Job, status: JobStatus) -> None:
        with self._rerun_window(job, status):  # a FAILED status may start the next run
            super()._set_job_status(job, status)
        if self._held is not None and status.state is not JobState.QUEUED:
            self._held.left_queue(job)  # a queued slot of its shape is free

    def _hurry(self, shapes: AbstractSet[Hashable]) -> None:
        """Have the status poller look at the queued jobs of ``shapes`` at its short
        interval (those shapes hold jobs back)."""
        self._status_poller().hurry(shapes)

    def _ensure_open(self) -> None:
        if self._closed:
            raise SubmitException(f"{self} is closed")

    def _status_poller(self) -> StatusPoller:
        with self._poller_lock:
            if self._poller is None:
                self._poller = StatusPoller(TrackInputs(
                    name=self._work_name(), poll_status=weakly(self._poll_status),
                    resolve_missing=weakly(self._resolve_missing),
                    withdraw=weakly(self._withdraw), final_status=weakly(self._final_status),
                    aux_path=weakly(self._aux_path), job_ended=weakly(self._job_ended),
                    set_status=weakly(self._set_job_status),
                    restate=weakly(self._restate_job_status),
                    job_files=None if getattr(self.batch_config, "watch_files", True) is False
                    else self.work_directory,
                    ended_figures=weakly(self._ended_figures) if self.FIGURES_FROM else None,
                    figures_wait=float(getattr(self.batch_config, "accounting_wait", 8.0))),
                    self.batch_config._settings(), self._clock)
                weakref.finalize(self, self._poller.stop)
            return self._poller

    @classmethod
    def _stock(cls, hook: str) -> bool:
        """Whether the method ``hook`` is this base class's own, not a backend's override."""
        return getattr(cls, hook) is getattr(BatchSchedulerExecutor, hook)

    def _direct_submit(self, argv: Sequence[str], script: str) -> Optional[CommandResult]:
        """What ``argv`` would answer for ``script``, got another way; None: run it."""
        return None

    def _run(self, argv: Sequence[str], stdin: Optional[str] = None) -> CommandResult:
        return self._runner.run(argv, timeout=self.batch_config.command_timeout, stdin=stdin)

    # ------------------------------------------------------------------------ polling I/O

    def _poll_status(self, native_ids: Sequence[str]) -> Event:
        """Run the status command for ``native_ids``; the outcome as a tracker event."""
        try:
            result = self._run(self.get_status_command(native_ids))
        except Exception as e:
            return PollFailed(f"the status command could not be built: {e!r}")
        if result.exit_code is None:
            return PollFailed(result.describe())
        if self.output_means_no_jobs(result.exit_code, result.output):
            return PollSucceeded({})
        out = result.stdout if result.exit_code == 0 else (result.output or UNKNOWN_ERROR)
        try:
            statuses = self.parse_status_output(result.exit_code, out)
        except Exception as e:
            return PollFailed(f"{result.describe()} -- not understood: {e}")
        wanted = set(native_ids)
        return PollSucceeded({nid: observed(st) for nid, st in statuses.items()
                              if nid in wanted})

    def _resolve_missing(self, native_ids: Sequence[str]) -> MissingResolved:
        """Look up jobs that left the queue: exit-code file first, then accounting (also for
        why a job with a non-zero exit code was stopped: a time limit, say)."""
        found: Dict[str, Observation] = {}
        for nid in native_ids:
            code = self._exit_code_from_file(nid)
            if code is not None:
                state = JobState.COMPLETED if code == 0 else JobState.FAILED
                found[nid] = Observation(state, exit_code=code,
                                         metadata={"native_state": None,
                                                   "source": "exit code file"})
        ask = [nid for nid in native_ids if nid not in found or found[nid].exit_code]
        for nid, obs in (self._accounting_lookup(ask) if ask else {}).items():
            found[nid] = with_accounting_cause(found[nid], obs) if nid in found else obs
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
                    found.setdefault(nid, observed(st, source="accounting"))
        return found

    def _ended_figures(self, native_ids: Sequence[str]) -> Optional[Dict[str, Dict[str, Any]]]:
        return ended_figures(self, native_ids)

    def _final_status(self, jobs: Sequence[Job], native_id: str, obs: Observation,
                      cancel_requested: bool) -> JobStatus:
        """The final status from what the scheduler said and what the job left behind."""
        job = jobs[0] if jobs else None
        spec = job.spec if job is not None else None
        exit_code = self._exit_code_from_file(native_id)
        if exit_code is None:
            exit_code = obs.exit_code
        if needs_accounting(obs, exit_code):
            # The queue gave the state but not the exit code, and the exit-code file is gone
            # (another process following the same job may have removed it).
            known = self._accounting_lookup([native_id]).get(native_id)
            if known is not None and known.exit_code is not None:
                exit_code = known.exit_code
        launcher_said = tail = None
        if final_state(obs, cancel_requested, exit_code) is JobState.FAILED:
            tail = _stderr_tail(spec)
            if job is not None and spec is not None and exit_code != 0:
                launcher_said = self._launcher_failure(job, native_id)
        return final_status(Seen(native_id, obs, cancel_requested, exit_code,
                                 spec.attributes.duration if spec is not None else None,
                                 launcher_said, tail))

    def _launcher_failure(self, job: Job, native_id: str) -> Optional[str]:
        """What the launcher said, when the script's output shows that it failed."""
        script_output = _read_text(self._aux_path(native_id, ".out"), OUTPUT_LIMIT, tail=True)
        if not script_output:
            return None
        try:
            launcher = self._get_launcher_from_job(job)
            if launcher.is_launcher_failure(script_output):
                return launcher.get_launcher_failure_message(script_output)
        except Exception as e:
            logger.debug("job %s: could not check the launcher output: %s", native_id, e)
        return None

    def _job_ended(self, jobs: Sequence[Job], native_id: str) -> None:
        """Remove the files of a job that ended (unless ``keep_files``)."""
        for job in jobs:
            self._clean_submit_script(job)
        if jobs:
            for suffix in (*RUN_FILE_SUFFIXES, REPORT_SUFFIX, SIGNAL_SUFFIX):
                self._delete_aux_file(jobs[0], suffix)

    def __str__(self) -> str:
        return f"{type(self).__name__}(work_directory={self.work_directory})"

    __repr__ = __str__


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "Launcher": "psij.job_launcher",
        "ScriptBasedLauncher": "psij.launchers.script_based_launcher",
    })
