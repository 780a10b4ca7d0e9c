"""The executor's side of the steps of a batch submission: :class:`ScriptSteps`, a base of
:class:`~psij.executors.batch.BatchSchedulerExecutor`, which makes the inputs of the steps.

A submission runs check -> context -> render -> submit -> track in a straight line. The first
three steps are functions of the job and of one immutable ``ScriptInputs``
(:mod:`psij.executors.batch._script_context`), which :meth:`ScriptSteps._script_inputs` makes
from the executor's declarations and configuration once (again only when the executor's
class, folders, configuration or template change): ``check_script_values``
(:mod:`psij.executors.batch._script_check`), ``build_script_context`` and the template's
``render`` (:mod:`psij._scripts.generator`). The submit step takes one immutable
``SubmitInputs`` (:mod:`psij.executors.batch._submit_io`), made here too by
:meth:`ScriptSteps._submit_inputs` with the backend's submit hooks resolved once. None of the
steps receives the executor. Here stay only the hooks a backend extends
(``_template_values``, the scheduler's own context entries; ``generate_submit_script``, a
backend's own rendering) and the declarations the inputs are made of. It runs no commands;
the only file it makes is the work directory, checked when the submit inputs are made.
"""

import io
from datetime import timedelta
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, Pattern, Tuple

from psij import _site_config
from psij._scripts.generator import TemplatedScriptGenerator
from psij.executors.batch._nice import declared_nice
from psij.executors.batch._runner import CommandRunner
from psij.executors.batch._script_check import check_script_values
from psij.executors.batch._script_context import (
    ScriptInputs,
    build_script_context,
    custom_items,
    days_hours_minutes_seconds,
    hours_minutes_seconds,
    script_job_name,
)
from psij.executors.batch._site_directives import ESCAPED, DirectiveRules
from psij.executors.batch._submit_io import SubmitInputs, ensure_script_dir, job_id_of
from psij.job import Job
from psij.job_launcher import Launcher
from psij.job_spec import JobSpec

__all__ = ["ScriptSteps"]

# The hooks of the submit step a backend may override (resolved in _submit_inputs).
_SUBMIT_HOOKS = ("get_submit_command", "get_submit_stdin", "job_id_from_submit_output",
                 "_direct_submit", "_run")


class ScriptSteps:
    """The script steps of :class:`~psij.executors.batch.BatchSchedulerExecutor` (see the
    module's documentation)."""

    CUSTOM_ATTRIBUTE_PREFIXES: Tuple[str, ...] = ()
    # How values and job names are written in directive lines.
    DIRECTIVES: DirectiveRules = ESCAPED
    # An unnamed job is named after its script (<job id>.job), as sbatch does.
    NAME_AFTER_SCRIPT: bool = False
    # The job's directory is also written in a directive (sbatch --chdir).
    DIRECTORY_DIRECTIVE: bool = False
    # Durations written as [days-]hh:mm:ss (sbatch --time) instead of hours:mm:ss.
    DURATION_DAYS: bool = False

    if TYPE_CHECKING:
        name: str
        config: Any
        work_directory: Any
        SCRIPT_SIGNALS: Any
        JOB_IGNORED_SIGNALS: Any
        END_SIGNAL_DIRECTIVE: bool
        _get_launcher: Callable[..., Launcher]

        SCRIPT_MODE: int
        SCRIPT_ON_STDIN: bool
        SUBMIT_COMMAND: Tuple[str, ...]
        JOB_ID_PATTERN: Optional[Pattern[str]]
        TRANSIENT_SUBMIT_ERRORS: Tuple[str, ...]
        _runner: CommandRunner

        def generate_submit_script(self, job: Job, context: Dict[str, object],
                                   submit_file: IO[str]) -> None: ...

        @classmethod
        def _stock(cls, hook: str) -> bool: ...

    def _check_script_values(self, job: Job, spec: JobSpec,
                             inputs: Optional[ScriptInputs] = None) -> None:
        """Fill in the site defaults the job lacks (``psij._site_config``), then refuse, before
        anything is written, values the submit script cannot hold safely."""
        _site_config.apply_job_defaults(self.name, spec)
        check_script_values(job, spec, inputs or self._script_inputs())

    _inputs: Optional[Tuple[Tuple[object, ...], ScriptInputs]] = None

    def _script_inputs(self) -> ScriptInputs:
        """What the script steps take from this executor, made again only when its class,
        folders, configuration object, ``use_nice`` or template changed. Not seen: other
        values changed inside the configuration object (``launcher_log_file``, ...), or
        declarations and hooks changed on the class, after the first submission."""
        generator = getattr(self, "generator", None)
        key = (type(self), self.work_directory, self.config, self.config.work_directory,
               getattr(self.config, "use_nice", False), generator)
        made = self._inputs
        if made is not None and made[0] == key:
            return made[1]
        cls = type(self)
        prefixes = self.CUSTOM_ATTRIBUTE_PREFIXES
        use_nice, nice = declared_nice(self.config, type(self))
        stock_duration = self._stock("_format_duration")
        inputs = ScriptInputs(
            name=self.name,
            script_dir=str(self.work_directory.absolute()),
            work_root=self.config.work_directory,
            directives=self.DIRECTIVES,
            custom_prefixes=(*prefixes, self.name) if prefixes else None,
            format_duration=(
                (days_hours_minutes_seconds if self.DURATION_DAYS else hours_minutes_seconds)
                if stock_duration else self._format_duration),
            launcher=self._get_launcher,
            generator=generator if self._renders_template(generator) else None,
            name_after_script=self.NAME_AFTER_SCRIPT,
            directory_directive=self.DIRECTORY_DIRECTIVE,
            use_nice=use_nice,
            nice=nice,
            owner=cls.__name__,
            script_signals=tuple(self.SCRIPT_SIGNALS.items()),
            ignored_signals=tuple(self.JOB_IGNORED_SIGNALS),
            end_signal_directive=bool(self.END_SIGNAL_DIRECTIVE))
        self._inputs = (key, inputs)
        return inputs

    _submit_cache: Optional[Tuple[Tuple[object, ...], SubmitInputs]] = None

    def _submit_inputs(self) -> SubmitInputs:
        """What the submit step takes from this executor (``_submit_io.SubmitInputs``),
        made again only when its folders, runner, ``keep_files``, ``command_timeout``,
        ``spare_submit_commands`` or a hook set on the instance changed; the work directory
        is checked when they are made. Not seen: class attributes and methods changed on the
        class after the first submission."""
        config = self.config
        own = vars(self)
        key = (type(self), self.work_directory, config.work_directory, config.keep_files,
               config.command_timeout, config.spare_submit_commands, self._runner,
               *(own.get(hook) for hook in _SUBMIT_HOOKS))
        cached = self._submit_cache  # one tuple: no thread sees a key with other inputs
        if cached is not None and cached[0] == key:
            return cached[1]
        if not self._work_dir_checked:
            self._ensure_work_dir()
        hooks = {hook: getattr(self, hook) if hook in own or not self._stock(hook) else None
                 for hook in _SUBMIT_HOOKS}
        made = SubmitInputs(
            name=self.name, owner=type(self).__name__, script_dir=self.work_directory,
            work_root=config.work_directory, script_mode=self.SCRIPT_MODE,
            script_on_stdin=self.SCRIPT_ON_STDIN,
            in_memory=(self.SCRIPT_ON_STDIN and not config.keep_files
                       and hooks["get_submit_stdin"] is None),
            submit_command=tuple(self.SUBMIT_COMMAND),
            command_hook=hooks["get_submit_command"], stdin_hook=hooks["get_submit_stdin"],
            direct_submit=hooks["_direct_submit"], run_hook=hooks["_run"],
            job_id=hooks["job_id_from_submit_output"]
            or job_id_of(self.JOB_ID_PATTERN, type(self).__name__),
            runner=self._runner, command_timeout=config.command_timeout,
            spares=config.spare_submit_commands,
            transient_markers=tuple(self.TRANSIENT_SUBMIT_ERRORS))
        self._submit_cache = (key, made)
        return made

    _work_dir_checked = False

    def _ensure_work_dir(self) -> None:
        ensure_script_dir(self.work_directory, self.config.work_directory)
        self._work_dir_checked = True

    def _renders_template(self, generator: object) -> bool:
        """Whether scripts are this generator's template rendered, with no hook overridden."""
        return (self._stock("generate_submit_script")
                and isinstance(generator, TemplatedScriptGenerator)
                and type(generator).generate_submit_script
                is TemplatedScriptGenerator.generate_submit_script
                and type(generator).render is TemplatedScriptGenerator.render)

    def _render(self, job: Job, context: Dict[str, object], inputs: ScriptInputs) -> str:
        """The script text: the template rendered with ``context``, or the backend's own
        :meth:`generate_submit_script`."""
        if inputs.generator is not None:
            return inputs.generator.render(context)
        out = io.StringIO()
        self.generate_submit_script(job, context, out)
        return out.getvalue()

    def _directive_value(self, field: str, value: str) -> str:
        """``value`` as written inside a directive, or ValueError naming ``field``."""
        return self.DIRECTIVES.value(field, value)

    def _get_launcher_from_job(self, job: Job) -> Launcher:
        assert job.spec is not None
        return self._get_launcher(job.spec.launcher or Launcher.DEFAULT_LAUNCHER_NAME)

    def _create_script_context(self, job: Job,
                               inputs: Optional[ScriptInputs] = None) -> Dict[str, object]:
        """The values templates see: ``job``, ``env``, ``custom_attributes``,
        ``formatted_job_duration`` and ``psij`` (``lib``, ``launch_command``, ``script_dir``,
        ...), plus the scheduler's own from :meth:`_template_values`."""
        context = build_script_context(job, inputs or self._script_inputs())
        assert job.spec is not None
        context.update(self._template_values(job, job.spec))
        return context

    def _template_values(self, job: Job, spec: JobSpec) -> Dict[str, object]:
        """Entries the scheduler's template needs beyond the common ones (none by default)."""
        return {}

    def _job_name(self, job: Job) -> Optional[str]:
        """The job name written in the script (by the directive rules)."""
        return script_job_name(job, self._script_inputs())

    def _custom_attribute_items(self, job: Job) -> Dict[str, List[Dict[str, Any]]]:
        """This executor's custom attributes (see :func:`custom_attribute_items`): under its
        first prefix those named after any of its prefixes or the name it was asked by; all of
        them, by prefix, for an executor declaring no prefix (as psij-python's do)."""
        assert job.spec is not None
        return custom_items(job.spec, self._script_inputs())

    def _format_duration(self, d: timedelta) -> str:
        """``hours:mm:ss`` (hours not limited to 24; ``[days-]hh:mm:ss`` when
        ``DURATION_DAYS``), rounding seconds up."""
        return (days_hours_minutes_seconds if self.DURATION_DAYS else hours_minutes_seconds)(d)

