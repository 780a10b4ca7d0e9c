"""The check step of a batch submission: values refused before anything is written.

:func:`check_script_values` refuses, naming the field, values that no script or directive can
hold safely (environment names that are not identifiers, line breaks in directive values, ...),
by the executor's directive rules, strings that no process can receive (a lone surrogate,
:mod:`psij.executors._os_texts`) and staging entries the script cannot stage. Every batch
executor runs it, with its :class:`~psij.executors.batch._script_context.ScriptInputs`, before
a job is held, written or submitted (and ``submit_script`` too); the context step
(:mod:`psij.executors.batch._script_context`) comes after it.

This module never receives the executor and imports nothing of
``batch_scheduler_executor``; it writes no files and runs no commands.
"""

import re
from pathlib import Path
from typing import List, Tuple, Union

from psij._declared_attributes import check_declared
from psij.exceptions import InvalidJobException
from psij.executors._os_texts import check_texts, spec_texts
from psij.executors._staging import check_staging
from psij.executors.batch._script_context import (
    ScriptInputs,
    custom_items,
    job_directory,
    job_end_signal,
    script_job_name,
)
from psij.job import Job
from psij.job_spec import JobSpec

__all__ = ["check_script_values"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_script_values(job: Job, spec: JobSpec, inputs: ScriptInputs) -> None:
    """Refuse, before anything is written, values the submit script cannot hold safely."""
    if spec.executable is None:
        raise InvalidJobException(f"job {job.id}: JobSpec.executable is not set")
    attrs = spec.attributes
    check_declared(attrs.custom_attributes)  # as submit does (submit_script too)
    job_end_signal(spec)  # its lead must fit in the duration
    try:
        custom = custom_items(spec, inputs)
    except (ValueError, TypeError) as e:
        raise InvalidJobException(str(e)) from e
    texts: List[Tuple[str, Union[str, Path, None]]] = spec_texts(spec)
    texts += [("JobSpec.name", spec.name)]
    texts += [(f"JobAttributes.{field}", getattr(attrs, field))
              for field in ("queue_name", "account", "reservation_id")]
    texts += [(f"JobAttributes.custom_attributes[{prefix + '.' + item['key']!r}]", item["value"])
              for prefix, items in custom.items() for item in items]
    check_texts(texts)
    check_staging(spec, job_directory(spec), inputs.name)
    for name in (spec.environment or {}):
        if not _ENV_NAME.fullmatch(name):
            raise InvalidJobException(
                f"JobSpec.environment: {name!r} cannot be exported by a submit script; "
                "accepted names: letters, digits and '_', not starting with a digit")
    directive = inputs.directives.value
    try:
        job_name = script_job_name(job, inputs)
        if job_name is not None:
            directive("JobSpec.name", job_name)
        for field in ("queue_name", "account", "reservation_id"):
            value = getattr(attrs, field)
            if value is not None:
                directive(f"JobAttributes.{field}", value)
        for prefix, items in custom.items():
            for item in items:
                if item["value"] is not None:
                    directive(f"JobAttributes.custom_attributes[{prefix + '.' + item['key']!r}]",
                              str(item["value"]))
    except (ValueError, TypeError) as e:
        raise InvalidJobException(str(e)) from e
    if inputs.directory_directive:
        try:  # it is written in a directive (--chdir) too
            directive("JobSpec.directory", job_directory(spec))
        except ValueError as e:
            raise InvalidJobException(str(e)) from e
