"""The Cobalt executor (Argonne's Cobalt): ``qsub --mode script``, ``qstat -l --header
JobID:State`` (one call for all jobs), qdel.

Declarations only: commands, the state map and the template (``templates/cobalt.mustache``);
the behaviour lives in
:class:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutor`.

Facts this module relies on (Cobalt's client sources and user guides):

- a script job is submitted with ``qsub --mode script SCRIPT``; the script must be executable
  and may carry ``#COBALT`` option lines; qsub prints the new job's numeric id;
- ``qstat -l --header JobID:State ID...`` prints one block per job: ``JobID: <id>`` then
  ``    State : <state>`` lines (the names padded to the longest), blocks separated by a blank
  line; states are ``queued``, ``dep_hold``, ``dep_fail``, ``maxrun_hold``, ``user_hold``,
  ``admin_hold``, ``starting``, ``running``, ``killing``, ``preempting``, ``preempted``,
  ``exiting`` and ``done``;
- a job leaves qstat as soon as it has ended, and qstat exits 1 without output when none of the
  ids it was given is known; the exit code comes from the job's exit-code file;
- Cobalt gives whole nodes: cores, GPUs and memory per node are whatever the nodes have.
"""

import getpass
import os
import re
import stat
from pathlib import Path
from typing import IO, Collection, Dict, List, Optional

from psij._data import data_dir
from psij.exceptions import SubmitException
from psij.executors.batch._site_directives import option_items, plain_job_name
from psij.executors.batch.batch_scheduler_executor import (
    UNKNOWN_ERROR,
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    InvalidJobStateError,
    check_status_exit_code,
    v1_resources,
)
from psij.executors.batch.escape_functions import plain_directive_value
from psij.executors.batch.script_generator import TemplatedScriptGenerator
from psij.job import Job
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = ["STATE_MAP", "CobaltExecutorConfig", "CobaltJobExecutor", "cobalt_status"]


class CobaltExecutorConfig(BatchSchedulerExecutorConfig):
    """Configuration of the Cobalt executor (no settings beyond the batch ones)."""


# Cobalt job states (qstat State) -> PSI/J state.
STATE_MAP: Dict[str, JobState] = {
    "queued": JobState.QUEUED,
    "dep_hold": JobState.QUEUED,      # waiting for the jobs it depends on
    "maxrun_hold": JobState.QUEUED,   # the user's running-job limit is reached
    "user_hold": JobState.QUEUED,
    "admin_hold": JobState.QUEUED,
    "hold": JobState.QUEUED,
    "starting": JobState.ACTIVE,      # prologue running
    "running": JobState.ACTIVE,
    "killing": JobState.ACTIVE,       # being killed; how it ends is learned when it is gone
    "preempting": JobState.ACTIVE,
    "preempted": JobState.QUEUED,     # stopped to make room, waiting to run again
    "exiting": JobState.ACTIVE,       # epilogue running
    "done": JobState.ACTIVE,          # ended; its exit code file says how
    # A dependency ended badly: the job will never run and stays until it is deleted.
    "dep_fail": JobState.FAILED,
}
_DEP_FAIL_MESSAGE = ("a job this job depends on did not complete successfully, so Cobalt will "
                     "not run it (it stays in the queue, state dep_fail, until it is deleted)")
_FIELD = re.compile(r"^\s*([A-Za-z_]+)\s*:\s*(.*?)\s*$")


def cobalt_status(native_state: str) -> JobStatus:
    """The JobStatus for a Cobalt state name; ValueError for an unknown one."""
    try:
        state = STATE_MAP[native_state]
    except KeyError:
        raise ValueError(f"unknown Cobalt job state {native_state!r}") from None
    metadata: Dict[str, object] = {"native_state": native_state}
    if state is JobState.FAILED:
        return JobStatus(state, message=_DEP_FAIL_MESSAGE, metadata=metadata)
    return JobStatus(state, metadata=metadata)


class CobaltJobExecutor(BatchSchedulerExecutor):
    """Runs jobs on Cobalt (name ``cobalt``).

    Resources become ``-n <node_count>`` and ``--proccount <process_count>``; a reservation is
    the queue the job is sent to. Custom attributes ``cobalt.<option>`` become ``#COBALT
    -<o> <value>`` (one letter) or ``#COBALT --<option>=<value>``; values must not need
    quoting.
    """

    _NAME_ = "cobalt"
    CONFIG_CLASS = CobaltExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES = ("cobalt",)
    TRANSIENT_SUBMIT_ERRORS = ("Failed to connect", "component error", "XMLRPC failure",
                               "try again")

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=config)
        self.generator = TemplatedScriptGenerator(self.config,
                                                  data_dir("templates") / "cobalt.mustache")

    def _directive_value(self, field: str, value: str) -> str:
        return plain_directive_value(field, value)

    def _job_name(self, spec: JobSpec) -> Optional[str]:
        return plain_job_name(spec.name)

    def _create_script_context(self, job: Job) -> Dict[str, object]:
        context = super()._create_script_context(job)
        assert job.spec is not None
        resources = v1_resources(job.spec)
        attrs = job.spec.attributes
        duration = attrs.duration
        context["cobalt"] = {
            "nodes": resources.computed_node_count,
            "processes": resources.computed_process_count,
            "processes_per_node": resources.computed_processes_per_node,
            # qsub -t takes minutes; a started minute counts.
            "minutes": None if duration is None
            else max(1, -(-int(duration.total_seconds() * 1000) // 60000)),
            # Cobalt reservations are queues named after them.
            "queue": attrs.reservation_id or attrs.queue_name,
            "whole_node_note": _whole_node_note(resources),
            "options": option_items(
                self._custom_attribute_items(job).get("cobalt", [])),
        }
        return context

    def generate_submit_script(self, job: Job, context: Dict[str, object],
                               submit_file: IO[str]) -> None:
        self.generator.generate_submit_script(job, context, submit_file)

    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        path = submit_file_path.absolute()
        # Cobalt runs script jobs only from executable files.
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return ["qsub", "--mode", "script", str(path)]

    def job_id_from_submit_output(self, out: str) -> str:
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if not lines or not lines[-1].isdigit():
            raise ValueError(f"no Cobalt job id in {out.strip()!r}")
        return lines[-1]

    def get_cancel_command(self, native_id: str) -> List[str]:
        return ["qdel", native_id]

    def process_cancel_command_output(self, exit_code: int, out: str) -> None:
        lowered = out.lower()
        if "not found" in lowered or "has already completed" in lowered:
            raise InvalidJobStateError(out.strip())
        raise SubmitException(f"qdel exited with {exit_code}: {out.strip()}")

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        return ["qstat", "-l", "--header", "JobID:State", *native_ids]

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        if exit_code != 0 and out.strip() in ("", UNKNOWN_ERROR):
            return {}  # none of the jobs is in the queue any more
        check_status_exit_code("qstat", exit_code, out)
        found: Dict[str, JobStatus] = {}
        native_id: Optional[str] = None
        for line in out.splitlines():
            if not line.strip():
                continue
            field = _FIELD.match(line)
            if field is None:
                raise ValueError(f"unexpected qstat line {line!r}")
            name, value = field.group(1).lower(), field.group(2)
            if name == "jobid":
                if not value.isdigit():
                    raise ValueError(f"qstat: job id {value!r} is not a number")
                native_id = value
            elif name == "state":
                if native_id is None:
                    raise ValueError(f"qstat: a state without a job id: {line!r}")
                found[native_id] = cobalt_status(value)
        return found

    def get_list_command(self) -> List[str]:
        return ["qstat", "-u", getpass.getuser(), "--header", "JobID"]

    def parse_list_output(self, out: str) -> List[str]:
        return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def _whole_node_note(resources: ResourceSpecV1) -> Optional[str]:
    """What was asked for that Cobalt cannot ask for (it gives whole nodes), for the record."""
    asked = [f"{name}={getattr(resources, name)}" for name in
             ("cpu_cores_per_process", "gpu_cores_per_process", "memory")
             if getattr(resources, name) is not None]
    if resources.exclusive_node_use:
        asked.append("exclusive_node_use=True")
    return ", ".join(asked) if asked else None
