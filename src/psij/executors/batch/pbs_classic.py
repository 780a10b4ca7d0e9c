"""The classic PBS executor (Torque, OpenPBS 2.x): qsub, ``qstat -f`` (one call for all jobs),
qdel.

The status command and the template (``templates/pbs_classic.mustache``, ``-l nodes=N:ppn=M``),
the state map, what Torque's exit statuses mean and the parser of the text status format;
everything else is shared with :mod:`~psij.executors.batch.pbs` and the batch base class.

What the status output means (Torque administrator guide, "Job exit status"; ``qstat(1B)``):

- ``qstat -f`` prints one block per job: ``Job Id: <id>`` then indented ``name = value``
  lines; a long value continues on the next lines, which start with a tab;
- ``job_state`` is one of C (completed, kept for ``keep_completed`` seconds), E (exiting),
  H (held), Q (queued), R (running), T (being moved), W (waiting for its start time),
  S (suspended);
- ``exit_status`` below 0 is set by Torque (-10 memory limit, -11 walltime limit, -12 CPU time
  limit, ...); 271 (256 + SIGTERM) is what Torque records for a running job deleted with qdel;
  otherwise it is the job script's exit code.
"""

import re
from typing import TYPE_CHECKING, Dict, Optional

from psij._reexports import lazy_names
from psij.executors.batch._figures_sites import pbs_figures, with_figures
from psij.executors.batch.pbs import (
    ExecCodes,
    GenericPBSJobExecutor,
    pbs_status,
    refuse_unknown_job_lines,
    start_exec_codes,
)
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = ["EXEC_CODES", "STATE_MAP", "PBSClassicJobExecutor"]

# Torque job states -> PSI/J state; None: the job has ended and its exit status says how.
STATE_MAP: Dict[str, Optional[JobState]] = {
    "C": None,              # completed (successfully or not)
    "E": JobState.ACTIVE,   # exiting after having run
    "H": JobState.QUEUED,   # held
    "Q": JobState.QUEUED,   # queued
    "R": JobState.ACTIVE,   # running
    "T": JobState.QUEUED,   # being moved to a new location
    "W": JobState.QUEUED,   # waiting for its start time
    "S": JobState.ACTIVE,   # suspended
}

# Exit statuses Torque sets itself: code -> (name, cause, what happened).
EXEC_CODES: ExecCodes = {
    **start_exec_codes("Torque", "MOM"),
    -8: ("JOB_EXEC_CMDFAIL", "launch_failure", "the job's command could not be executed"),
    -9: ("JOB_EXEC_STDOUTFAIL", "launch_failure", "the job's output files could not be "
                                                  "created"),
    -10: ("JOB_EXEC_OVERLIMIT_MEM", "out_of_memory", "the job exceeded its memory limit"),
    -11: ("JOB_EXEC_OVERLIMIT_WT", "time_limit", "the job exceeded its walltime"),
    -12: ("JOB_EXEC_OVERLIMIT_CPUT", None, "the job exceeded its CPU time limit"),
    -13: ("JOB_EXEC_CGROUP", "launch_failure", "the job's cgroups could not be created"),
    -14: ("JOB_EXEC_PROLOGUE", "launch_failure", "the site's prologue failed"),
}
# The exit status Torque gives a running job deleted with qdel (256 + SIGTERM).
_DELETED_EXIT_STATUS = 271
_JOB_HEADER = re.compile(r"^Job Id:\s*(\S+)\s*$")
_ATTRIBUTE = re.compile(r"^\s+([A-Za-z_][\w.]*)\s=\s?(.*)$")
_UNKNOWN_JOB = re.compile(r"^qstat: Unknown Job Id", re.IGNORECASE)


def parse_qstat_full(text: str) -> Dict[str, Dict[str, str]]:
    """The attributes of each job in ``qstat -f`` text output, by job id.

    Raises ValueError on a line that is neither a job header, an attribute, a continuation nor
    blank.
    """
    jobs: Dict[str, Dict[str, str]] = {}
    current: Optional[Dict[str, str]] = None
    last: Optional[str] = None
    for line in text.splitlines():
        header = _JOB_HEADER.match(line)
        if header is not None:
            current = jobs.setdefault(header.group(1), {})
            last = None
            continue
        if not line.strip():
            continue
        if current is None:
            raise ValueError(f"qstat -f: unexpected line before any job: {line!r}")
        if line.startswith("\t") and last is not None:
            current[last] += line.strip()
            continue
        attribute = _ATTRIBUTE.match(line)
        if attribute is None:
            raise ValueError(f"qstat -f: unexpected line {line!r}")
        last = attribute.group(1)
        current[last] = attribute.group(2).strip()
    return jobs


class PBSClassicJobExecutor(GenericPBSJobExecutor):
    """Runs jobs on Torque / classic PBS (names ``pbs_classic``, ``torque``).

    Resources become ``-l nodes=<node_count>:ppn=<cores per node>[:gpus=<n>]``, ``-l mem``
    (memory per node times nodes) and ``-n`` for exclusive use; a reservation becomes Moab's
    ``-W x=ADVRES:<id>``.
    """

    _NAME_ = "pbs_classic"
    CUSTOM_ATTRIBUTE_PREFIXES = ("pbs", "pbs_classic", "torque")
    TEMPLATE = "pbs_classic.mustache"
    STATUS_COMMAND = ("qstat", "-f")

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(None, url=url, config=config)

    def _resource_context(self, resources: ResourceSpecV1, spec: JobSpec) -> Dict[str, object]:
        per_node = resources.computed_processes_per_node
        cores = resources.cpu_cores_per_process or 1
        nodes = [str(resources.computed_node_count), f"ppn={per_node * cores}"]
        if resources.gpu_cores_per_process:
            nodes.append(f"gpus={per_node * resources.gpu_cores_per_process}")
        memory_kb = resources.memory_kb
        return {
            "nodes": ":".join(nodes),
            # Torque's mem is for the whole job; ResourceSpecV1.memory is per node.
            "memory_kb": None if memory_kb is None
            else memory_kb * resources.computed_node_count,
            "queue": spec.attributes.queue_name,
            # PBS_NODEFILE names a host once per ppn slot; a process takes this many of them.
            "cores_per_process": cores,
        }

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        lines = out.splitlines()
        # When qstat failed, its error lines are among the job blocks (stdout, then stderr).
        in_blocks = ("Job Id:",) if exit_code == 0 else (" ", "\t", "Job Id:")
        errors = [line for line in lines if line.startswith("qstat:")
                  or (line.strip() and not line.startswith(in_blocks))]
        refuse_unknown_job_lines("qstat", exit_code, errors, _UNKNOWN_JOB)
        body = "\n".join(line for line in lines if not line.startswith("qstat:"))
        found: Dict[str, JobStatus] = {}
        for native_id, fields in parse_qstat_full(body).items():
            state = fields.get("job_state")
            if state is None:
                raise ValueError(f"qstat -f: job {native_id} has no job_state")
            found[native_id] = with_figures(pbs_status(
                state.strip(), fields, STATE_MAP, EXEC_CODES, deleted_substates=(),
                deleted_exit_statuses=(_DELETED_EXIT_STATUS,)), pbs_figures(fields))
        return found


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "PBSExecutorConfig": "psij.executors.batch.pbs",
        "TemplatedScriptGenerator": "psij._scripts.generator",
    })
