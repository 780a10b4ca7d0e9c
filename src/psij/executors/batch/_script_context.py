"""The context step of a batch submission: what a template is rendered with.

:class:`ScriptInputs` is everything the script steps need from a batch executor (its name,
folders, directive rules, custom-attribute prefixes, priority mapping, signal declarations,
template and launcher choice), made once per executor and configuration.
:func:`build_script_context` is a function of a checked job and that value: it gives the
template context documented in ``docs/batch.rst`` (``job``, ``env``, ``custom_attributes``,
``formatted_job_duration`` and ``psij.*``), to which the executor adds its scheduler's own
values. The check step before it is :mod:`psij.executors.batch._script_check`; rendering
after it is :mod:`psij._scripts.generator`.

This module never receives the executor and imports nothing of
``batch_scheduler_executor``; it writes no files and runs no commands.
"""

import os
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from psij import _retry
from psij._end_signal import EndSignal, end_signal
from psij._record import Record
from psij._scripts.generator import TemplatedScriptGenerator
from psij._scripts.quoting import ShellWord
from psij._scripts.template_functions import ALL as FUNCTION_LIBRARY
from psij.exceptions import InvalidJobException
from psij.executors._staging import script_context as staging_context
from psij.executors.batch._nice import NiceMapping, priority_value
from psij.executors.batch._shapes import job_tmp
from psij.executors.batch._signals import signals_context
from psij.executors.batch._site_directives import DirectiveRules, custom_attribute_items
from psij.job import Job
from psij.job_launcher import Launcher
from psij.job_spec import JobSpec
from psij.resource_spec import ResourceSpecV1

__all__ = ["ScriptInputs", "build_script_context", "custom_items", "days_hours_minutes_seconds",
           "default_job_name", "hours_minutes_seconds", "job_directory", "job_end_signal",
           "requeue_context", "script_job_name", "v1_resources"]

_NO_RESOURCES = ResourceSpecV1()


def v1_resources(spec: JobSpec) -> ResourceSpecV1:
    """The spec's resources (a default ``ResourceSpecV1`` when unset); refuses other versions."""
    resources = spec.resources
    if resources is None:
        return ResourceSpecV1()
    if not isinstance(resources, ResourceSpecV1):
        raise InvalidJobException(f"JobSpec.resources: only ResourceSpecV1 is understood by "
                                  f"batch executors, got {type(resources).__name__}")
    return resources


def job_end_signal(spec: JobSpec) -> Optional[EndSignal]:
    """The signal ``spec`` asks for before its end (``psij.signal_before_end``), or None;
    InvalidJobException when it is malformed or does not fit in ``JobAttributes.duration``."""
    attrs = spec.attributes
    return end_signal(attrs.custom_attributes, attrs.duration, "JobAttributes.duration")


def requeue_context(job: Job) -> Optional[Dict[str, int]]:
    """The template's ``psij.requeue``: None when the job may not be requeued
    (``psij.requeue``, see :mod:`psij._retry`), else ``{"attempt": n}``, the number of the run
    being submitted (the script adds the times the scheduler restarted it)."""
    spec = job.spec
    custom = spec.attributes.custom_attributes if spec is not None else None
    value = custom.get(_retry.REQUEUE_ATTRIBUTE) if custom else None
    if value is None or _retry.parse_requeue(_retry.REQUEUE_ATTRIBUTE, value) == 0:
        return None
    runs = job.__dict__.get("_runs")
    return {"attempt": runs.attempt if isinstance(runs, _retry.Runs) else 1}


def outputs_context(job: Job) -> Optional[Dict[str, Any]]:
    """The template's ``psij.outputs``: None unless the job may run again (``psij.requeue``,
    ``psij.retry``) and writes its output to files; else ``{"attempt": n, "paths": [...]}``,
    the run being submitted and the job's stdout and stderr paths (once each). A run after
    the first moves the files of the run before to ``<path>.<that run>`` as it starts."""
    spec = job.spec
    runs = job.__dict__.get("_runs")
    if spec is None or not isinstance(runs, _retry.Runs):
        return None
    paths: List[str] = []
    for path in (spec.stdout_path, spec.stderr_path):
        if path is not None and str(path) != "/dev/null" and str(path) not in paths:
            paths.append(str(path))
    if not paths:
        return None
    return {"attempt": runs.attempt, "paths": [ShellWord(p) for p in paths]}


def hours_minutes_seconds(d: timedelta) -> str:
    """``hours:mm:ss`` (hours not limited to 24), rounding seconds up."""
    total = -(-int(d.total_seconds() * 1000) // 1000)
    return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"


def job_directory(spec: JobSpec) -> str:
    """The folder the job runs in: its ``directory``, else the current one; always absolute,
    since schedulers start scripts in different folders."""
    return os.path.abspath(spec.directory if spec.directory is not None else os.getcwd())


def days_hours_minutes_seconds(d: timedelta) -> str:
    """``[days-]hh:mm:ss`` (as ``sbatch --time`` reads it), rounding seconds up."""
    total = -(-int(d.total_seconds() * 1000) // 1000)
    days, rest = divmod(total, 86400)
    clock = f"{rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def default_job_name(job: Job) -> str:
    """The name psij-python's jobs get on a scheduler that names a job after its script: the
    script's file name, ``<job id>.job``."""
    return f"{job.id}.job"


class ScriptInputs(Record):
    """What the script steps take from a batch executor, made once per executor and
    configuration (see the module's documentation).

    ``custom_prefixes``: the prefixes of the custom attributes rendered (None: all, by
    prefix); ``name_after_script``: an unnamed job is named ``<job id>.job``;
    ``directory_directive``: the job's directory is written in a directive too (checked as a
    directive value); ``use_nice`` and ``nice``: the priority option (see
    :mod:`psij.executors.batch._nice`); ``owner``, ``script_signals`` and ``ignored_signals``:
    the signal declarations (see :mod:`psij.executors.batch._signals`);
    ``end_signal_directive``: the template asks the scheduler for ``psij.signal_before_end``
    (else the script's own timer sends it); ``generator``: the
    template's generator (None: the executor renders by its own hooks); ``launcher``: the
    launcher of a name.
    """

    name: str
    script_dir: str
    work_root: Path
    directives: DirectiveRules
    custom_prefixes: Optional[Tuple[str, ...]]
    format_duration: Callable[[timedelta], str]
    launcher: Callable[[str], Launcher]
    generator: Optional[TemplatedScriptGenerator] = None
    name_after_script: bool = False
    directory_directive: bool = False
    use_nice: bool = False
    nice: Optional[NiceMapping] = None
    owner: str = ""
    script_signals: Tuple[Tuple[str, str], ...] = ()
    ignored_signals: Tuple[str, ...] = ()
    end_signal_directive: bool = False


def custom_items(spec: JobSpec, inputs: ScriptInputs) -> Dict[str, List[Dict[str, Any]]]:
    """The executor's custom attributes of ``spec`` (see :func:`custom_attribute_items`): under
    its first prefix those named after any of its prefixes; all of them, by prefix, for an
    executor declaring no prefix (as psij-python's do)."""
    return custom_attribute_items(spec.attributes.custom_attributes, inputs.custom_prefixes)


def script_job_name(job: Job, inputs: ScriptInputs) -> Optional[str]:
    """The job name written in the script (by the directive rules)."""
    spec = job.spec
    assert spec is not None
    if inputs.name_after_script and spec._explicit_name() is None:
        return default_job_name(job)
    return inputs.directives.job_name(spec.name)


def build_script_context(job: Job, inputs: ScriptInputs) -> Dict[str, object]:
    """The values every template sees (see the module's docstring), for a checked job."""
    spec = job.spec
    assert spec is not None
    launcher = inputs.launcher(spec.launcher or Launcher.DEFAULT_LAUNCHER_NAME)
    words = launcher.get_launch_command(job)
    directory = job_directory(spec)
    tmp = job_tmp(spec)
    end = job_end_signal(spec)
    timer = None if end is None or inputs.end_signal_directive else \
        end.after(spec.attributes.duration)
    # Only read here: a job without resources gets the counts of the default ones.
    resources = _NO_RESOURCES if spec.resources is None else v1_resources(spec)
    context: Dict[str, object] = {
        "job": job,
        "env": [{"name": k, "value": v}
                for k, v in _retry.run_environment(job, spec.environment).items()],
        "custom_attributes": custom_items(spec, inputs),
        "psij": {
            "lib": FUNCTION_LIBRARY,
            "launch_command": [ShellWord(w) for w in words],
            "script_dir": inputs.script_dir,
            "job_name": script_job_name(job, inputs),
            "directory": directory,
            "process_count": resources.computed_process_count,
            "node_count": resources.computed_node_count,
            "staging": staging_context(spec, directory, inputs.work_root, inputs.name),
            "scheduler_priority": priority_value(inputs.use_nice, inputs.nice, inputs.name,
                                                 spec),
            "tmp_kb": None if tmp is None else -(-tmp // 1024),
            "signals": signals_context(inputs.owner, inputs.script_signals,
                                       inputs.ignored_signals, end, timer),
            "requeue": requeue_context(job),
            "outputs": outputs_context(job),
        },
    }
    duration = spec.attributes.duration
    if duration is not None:
        context["formatted_job_duration"] = inputs.format_duration(duration)
    return context
