"""The Cobalt executor (Argonne's Cobalt): ``qsub --mode script``, ``qstat -l --header
JobID:State`` (one call for all jobs), qdel.

Declarations (commands, an executable script, the job-id pattern, qstat's "no job" answer,
the template ``templates/cobalt.mustache``), the state map and the parser of qstat's output;
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
import re
from typing import TYPE_CHECKING, Dict, List, Optional

from psij._reexports import lazy_names
from psij.executors.batch._script_context import v1_resources
from psij.executors.batch._site_directives import PLAIN, option_items
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
from psij.resource_spec import ResourceSpecV1

__all__ = ["HELD_STATES", "STATE_MAP", "CobaltExecutorConfig", "CobaltJobExecutor", "cobalt_status"]


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
# Holds someone must release (qrls); dep_hold and maxrun_hold end by themselves.
HELD_STATES = frozenset({"user_hold", "admin_hold", "hold"})
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
    if native_state in HELD_STATES:
        return held_status(metadata, native_state)
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
    TEMPLATE = "cobalt.mustache"
    # Cobalt runs script jobs only from executable files.
    SCRIPT_MODE = 0o700
    SUBMIT_COMMAND = ("qsub", "--mode", "script")
    JOB_ID_PATTERN = re.compile(r"(?:\A|\n)\s*(\d+)\Z")
    CANCEL_COMMAND = ("qdel",)
    CANCEL_GONE_PATTERN = re.compile("not found|has already completed", re.IGNORECASE)
    STATUS_COMMAND = ("qstat", "-l", "--header", "JobID:State")
    LIST_ID_PATTERN = re.compile(r"\d+")
    # qstat exits 1 without output when none of the jobs is in the queue any more.
    NO_JOBS_EXIT_CODES = (1,)
    DIRECTIVES = PLAIN

    def _template_values(self, job: Job, spec: JobSpec) -> Dict[str, object]:
        resources = v1_resources(spec)
        attrs = spec.attributes
        duration = attrs.duration
        return {"cobalt": {
            "nodes": resources.computed_node_count,
            "processes": resources.computed_process_count,
            "processes_per_node": resources.computed_processes_per_node,
            # qsub -t takes minutes; a started minute counts.
            "minutes": None if duration is None
            else max(1, -(-int(duration.total_seconds() * 1000) // 60000)),
            # Cobalt reservations are queues named after them.
            "queue": attrs.reservation_id or attrs.queue_name,
            "whole_node_note": _whole_node_note(resources),
            "options": option_items(self._custom_attribute_items(job).get("cobalt", [])),
        }}

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
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



def _whole_node_note(resources: ResourceSpecV1) -> Optional[str]:
    """What was asked for that Cobalt cannot ask for (it gives whole nodes), for the record."""
    asked = [f"{name}={getattr(resources, name)}" for name in
             ("cpu_cores_per_process", "gpu_cores_per_process", "memory")
             if getattr(resources, name) is not None]
    if resources.exclusive_node_use:
        asked.append("exclusive_node_use=True")
    return ", ".join(asked) if asked else None


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "SubmitException": "psij.exceptions",
        "TemplatedScriptGenerator": "psij._scripts.generator",
    })
