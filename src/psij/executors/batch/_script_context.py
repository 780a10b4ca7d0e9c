"""What a batch executor puts into a submit script: the values checked before anything is
written, and the context a template is rendered with.

:func:`check_script_values` refuses, naming the field, values that no script or directive can
hold safely (environment names that are not identifiers, line breaks in directive values, ...),
using the executor's directive rules, strings that no process can receive (a lone surrogate,
:mod:`psij.executors._os_texts`) and staging entries the script cannot stage; every batch
executor calls it before a job is held, written or submitted (and ``submit_script`` too).
:func:`build_script_context` gives the template context documented in ``docs/batch.rst``
(``job``, ``env``, ``custom_attributes``, ``formatted_job_duration`` and ``psij.*``), to which
the executor adds its scheduler's own values. Nothing here writes files or runs commands.
"""

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Tuple, Union

from psij._declared_attributes import check_declared
from psij._scripts.quoting import ShellWord
from psij._scripts.template_functions import ALL as FUNCTION_LIBRARY
from psij.exceptions import InvalidJobException
from psij.executors._os_texts import check_texts, spec_texts
from psij.executors._staging import check_staging
from psij.executors._staging import script_context as staging_context
from psij.executors.batch._nice import scheduler_priority
from psij.executors.batch._shapes import job_tmp
from psij.executors.batch._signals import script_signals
from psij.job import Job
from psij.job_spec import JobSpec
from psij.resource_spec import ResourceSpecV1

if TYPE_CHECKING:
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor

__all__ = ["build_script_context", "check_script_values", "default_job_name",
           "hours_minutes_seconds", "job_directory", "v1_resources"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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


def hours_minutes_seconds(d: timedelta) -> str:
    """``hours:mm:ss`` (hours not limited to 24), rounding seconds up."""
    total = -(-int(d.total_seconds() * 1000) // 1000)
    return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"


def job_directory(spec: JobSpec) -> str:
    """The folder the job runs in: its ``directory``, else the current one; always absolute,
    since schedulers start scripts in different folders."""
    return os.path.abspath(spec.directory if spec.directory is not None else os.getcwd())


def default_job_name(job: Job) -> str:
    """The name psij-python's jobs get on a scheduler that names a job after its script: the
    script's file name, ``<job id>.job``."""
    return f"{job.id}.job"


def check_script_values(executor: "BatchSchedulerExecutor", job: Job, spec: JobSpec) -> None:
    """Refuse, before anything is written, values the submit script cannot hold safely."""
    if spec.executable is None:
        raise InvalidJobException(f"job {job.id}: JobSpec.executable is not set")
    attrs = spec.attributes
    check_declared(attrs.custom_attributes)  # as submit does (submit_script too)
    try:
        custom = executor._custom_attribute_items(job)
    except (ValueError, TypeError) as e:
        raise InvalidJobException(str(e)) from e
    texts: List[Tuple[str, Union[str, Path, None]]] = spec_texts(spec)
    texts += [("JobSpec.name", spec.name)]
    texts += [(f"JobAttributes.{field}", getattr(attrs, field))
              for field in ("queue_name", "account", "reservation_id")]
    texts += [(f"JobAttributes.custom_attributes[{prefix + '.' + item['key']!r}]", item["value"])
              for prefix, items in custom.items() for item in items]
    check_texts(texts)
    check_staging(spec, job_directory(spec), executor.name)
    for name in (spec.environment or {}):
        if not _ENV_NAME.fullmatch(name):
            raise InvalidJobException(
                f"JobSpec.environment: {name!r} cannot be exported by a submit script; "
                "accepted names: letters, digits and '_', not starting with a digit")
    try:
        job_name = executor._job_name(job)
        if job_name is not None:
            executor._directive_value("JobSpec.name", job_name)
        for field in ("queue_name", "account", "reservation_id"):
            value = getattr(attrs, field)
            if value is not None:
                executor._directive_value(f"JobAttributes.{field}", value)
        for prefix, items in custom.items():
            for item in items:
                if item["value"] is not None:
                    executor._directive_value(
                        f"JobAttributes.custom_attributes[{prefix + '.' + item['key']!r}]",
                        str(item["value"]))
    except (ValueError, TypeError) as e:
        raise InvalidJobException(str(e)) from e


def build_script_context(executor: "BatchSchedulerExecutor", job: Job) -> Dict[str, object]:
    """The values every template sees (see the module's docstring)."""
    spec = job.spec
    assert spec is not None
    launcher = executor._get_launcher_from_job(job)
    words = launcher.get_launch_command(job)
    directory = job_directory(spec)
    tmp = job_tmp(spec)
    # Only read here: a job without resources gets the counts of the default ones.
    resources = _NO_RESOURCES if spec.resources is None else v1_resources(spec)
    context: Dict[str, object] = {
        "job": job,
        "env": [{"name": k, "value": v} for k, v in (spec.environment or {}).items()],
        "custom_attributes": executor._custom_attribute_items(job),
        "psij": {
            "lib": FUNCTION_LIBRARY,
            "launch_command": [ShellWord(w) for w in words],
            "script_dir": str(executor.work_directory.absolute()),
            "job_name": executor._job_name(job),
            "directory": directory,
            "process_count": resources.computed_process_count,
            "node_count": resources.computed_node_count,
            "staging": staging_context(spec, directory, executor.config.work_directory,
                                       executor.name),
            "scheduler_priority": scheduler_priority(executor, spec),
            "tmp_kb": None if tmp is None else -(-tmp // 1024),
            "signals": script_signals(executor),
        },
    }
    duration = spec.attributes.duration
    if duration is not None:
        context["formatted_job_duration"] = executor._format_duration(duration)
    return context
