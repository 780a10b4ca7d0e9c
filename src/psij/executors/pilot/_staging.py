"""Staging for pilot tasks: a job with stage-in, stage-out or cleanup entries runs as a task
that starts a small bash script (``templates/pilot_task.mustache``), which stages in, runs the
job, stages out and cleans up with the same shell library as batch jobs
(:mod:`psij.executors._staging`). So staging happens where the task runs, the job's dependents
start only once its stage-out is done, and a cancelled task stages out its ``ON_CANCEL``
entries within the pilot's grace period.

The script and its report live in ``<work_directory>/pilot/`` (private: 0700, checked as every
work folder; files 0600) as
``<task id>.task`` and ``<task id>.staging``; :func:`final_status` reads the report and removes
both. Nothing here starts processes.
"""

import os
from pathlib import Path
from typing import Dict

from psij._private_dirs import ensure_private_dir
from psij._record import replace
from psij._scripts.quoting import ShellWord
from psij.executors._staging import (
    REPORT_SUFFIX,
    needs_staging,
    read_report,
    script_context,
    staged_status,
    valid_text,
)
from psij.executors.pilot.tasks import TaskSpec
from psij.job_spec import JobSpec
from psij.job_status import JobStatus

__all__ = ["final_status", "with_staging"]

_SCRIPT_SUFFIX = ".task"
_BASH = "/bin/bash"


def _folder(work_directory: Path) -> Path:
    return Path(os.path.abspath(work_directory)) / "pilot"


def with_staging(task: TaskSpec, spec: JobSpec, work_directory: Path) -> TaskSpec:
    """``task`` itself without staging entries; else a task running the staging script of
    ``spec`` (written now). Raises InvalidJobException naming the field for paths that cannot
    be staged."""
    if not needs_staging(spec):
        return task
    from psij._data import data_dir
    from psij._scripts.generator import TemplatedScriptGenerator
    from psij.job_executor_config import JobExecutorConfig

    folder = _folder(work_directory)
    assert task.directory is not None
    staging = script_context(spec, task.directory, work_directory, "pilot")
    valid_text("JobSpec.executable", task.executable)
    for i, arg in enumerate(task.arguments):
        valid_text(f"JobSpec.arguments[{i}]", arg)
    if task.stdin is not None:
        valid_text("JobSpec.stdin_path", task.stdin)
    context: Dict[str, object] = {"psij": {
        "task_id": ShellWord(task.name), "script_dir": ShellWord(str(folder)),
        "command": [ShellWord(w) for w in (task.executable, *task.arguments)],
        "stdin": None if task.stdin is None else ShellWord(task.stdin),
        "staging": staging}}
    generator = TemplatedScriptGenerator(JobExecutorConfig(work_directory=work_directory),
                                         data_dir("templates") / "pilot_task.mustache")
    text = generator.render(context)
    ensure_private_dir(folder, "pilot task scripts folder", within=work_directory)
    script = folder / f"{task.name}{_SCRIPT_SUFFIX}"
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return replace(task, executable=_BASH, arguments=(str(script),), stdin=None)


def final_status(status: JobStatus, task_id: str, work_directory: Path) -> JobStatus:
    """The final ``status`` of task ``task_id`` corrected by its staging report, if it has one
    (then the report and the script are removed)."""
    folder = _folder(work_directory)
    report_path = folder / f"{task_id}{REPORT_SUFFIX}"
    report = read_report(report_path)
    # The script stays when the task never started (cancelled while waiting).
    for path in (folder / f"{task_id}{_SCRIPT_SUFFIX}", report_path):
        try:
            path.unlink()
        except FileNotFoundError:
            break
        except OSError:
            pass
    return staged_status(status, report, f"pilot task {task_id}")
