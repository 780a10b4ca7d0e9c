"""The PBS Pro / OpenPBS executor: qsub, ``qstat -f -F json -x`` (one call for all jobs, finished
ones included), qdel. Also :class:`GenericPBSJobExecutor`, the part shared with the classic
(Torque) flavour in :mod:`~psij.executors.batch.pbs_classic`.

Declarations (commands, the job-id pattern, the template ``templates/pbs.mustache``), the state
map, what PBS's exit statuses mean and the parser of qstat's JSON; the behaviour lives in
:class:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutor`. ``#PBS`` lines
are read like qsub's command line, so values written there must be plain (they are refused
otherwise, before anything is submitted) and job names are made plain.

What the status output means (PBS Pro reference guide, ``qstat(1B)``, ``job.h``):

- ``job_state`` is one letter (B E F H M Q R S T U W X); F (finished) and X (finished subjob)
  come with ``Exit_status`` when the job ran, and ``substate`` 91 when it was deleted (92
  finished, 93 failed);
- ``Exit_status`` below 0 is set by PBS itself (``JOB_EXEC_*``: -29 walltime exceeded, -27 memory
  exceeded, ...); from 256 up it is 256 + the signal that killed the job's shell; otherwise it is
  the exit code of the job script;
- ``comment`` carries the scheduler's or the server's last word about the job.
"""

import getpass
import json
import re
from typing import Any, Collection, Dict, List, Mapping, Optional, Tuple

from psij import _check
from psij._scripts.generator import TemplatedScriptGenerator as TemplatedScriptGenerator
from psij.executors.batch._arrays import PBS_ARRAYS
from psij.executors.batch._figures_sites import pbs_figures, with_figures
from psij.executors.batch._nice import PBS_NICE
from psij.executors.batch._script_context import v1_resources
from psij.executors.batch._signals import FORWARDABLE, KEEP
from psij.executors.batch._site_directives import PLAIN
from psij.executors.batch._status_table import held_status
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    check_status_exit_code,
)
from psij.job import Job
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = ["EXEC_CODES", "STATE_MAP", "GenericPBSJobExecutor", "PBSExecutorConfig",
           "PBSJobExecutor", "pbs_status"]


class PBSExecutorConfig(BatchSchedulerExecutorConfig):
    """Configuration of the PBS executors (no settings beyond the batch ones)."""


# PBS Pro job states -> PSI/J state; None: the job has ended and its exit status says how.
STATE_MAP: Dict[str, Optional[JobState]] = {
    "B": JobState.ACTIVE,   # array job: at least one subjob has started
    "E": JobState.ACTIVE,   # exiting after having run
    "F": None,              # finished
    "H": JobState.QUEUED,   # held
    "M": JobState.QUEUED,   # moved to another server, where it goes on
    "Q": JobState.QUEUED,   # queued
    "R": JobState.ACTIVE,   # running
    "S": JobState.ACTIVE,   # suspended while running
    "T": JobState.QUEUED,   # being moved to a new location
    "U": JobState.ACTIVE,   # suspended (cycle-harvesting node in use)
    "W": JobState.QUEUED,   # waiting for its start time
    "X": None,              # finished subjob
}

ExecCodes = Dict[int, Tuple[str, Optional[str], str]]


def start_exec_codes(system: str, mom: str) -> ExecCodes:
    """The exit statuses -1 to -7, which PBS Pro and Torque share (``system`` and ``mom`` are
    how each names itself and its execution daemon)."""
    restarted = f"the job was aborted when its {mom} restarted"
    return {
        -1: ("JOB_EXEC_FAIL1", "launch_failure", "the job could not be started (before its "
                                                 "files were staged)"),
        -2: ("JOB_EXEC_FAIL2", "launch_failure", "the job could not be started (after its "
                                                 "files were staged)"),
        -3: ("JOB_EXEC_RETRY", "launch_failure", f"the job could not be started ({system} "
                                                 "retries it)"),
        -4: ("JOB_EXEC_INITABT", "node_failure", restarted),
        -5: ("JOB_EXEC_INITRST", "node_failure", restarted),
        -6: ("JOB_EXEC_INITRMG", "node_failure", restarted),
        -7: ("JOB_EXEC_BADRESRT", "launch_failure", "restarting the job from its checkpoint "
                                                    "failed"),
    }


# Exit statuses PBS Pro sets itself: code -> (name, cause, what happened).
EXEC_CODES: ExecCodes = {
    **start_exec_codes("PBS", "MoM"),
    -10: ("JOB_EXEC_FAILUID", "launch_failure", "the job's user or group is not valid on the "
                                                "execution host"),
    -11: ("JOB_EXEC_RERUN", None, "the job was requeued to run again"),
    -12: ("JOB_EXEC_CHKP", None, "the job was checkpointed and stopped"),
    -13: ("JOB_EXEC_FAIL_PASSWORD", "launch_failure", "the job's password was refused"),
    -14: ("JOB_EXEC_RERUN_SIS_FAIL", "node_failure", "a sister node of the job failed"),
    -15: ("JOB_EXEC_QUERST", None, "the job was requeued to restart from its checkpoint"),
    -16: ("JOB_EXEC_FAILHOOK_RERUN", "launch_failure", "a site hook refused to start the job"),
    -17: ("JOB_EXEC_FAILHOOK_DELETE", "launch_failure", "a site hook refused to start the job"),
    -18: ("JOB_EXEC_HOOK_RERUN", None, "a site hook asked for the job to be requeued"),
    -19: ("JOB_EXEC_HOOK_DELETE", None, "a site hook asked for the job to be deleted"),
    -20: ("JOB_EXEC_RERUN_MS_FAIL", "node_failure", "the job's first node (mother superior) "
                                                    "could not be reached"),
    -21: ("JOB_EXEC_FAIL_SECURITY", "launch_failure", "PBS found a security problem in its "
                                                      "folders on the execution host"),
    -22: ("JOB_EXEC_HOOKERROR", "launch_failure", "a site hook failed or timed out"),
    -23: ("JOB_EXEC_FAIL_KRB5", "launch_failure", "no Kerberos credentials were supplied"),
    -24: ("JOB_EXEC_KILL_NCPUS_BURST", None, "the job used more CPUs than it asked for (ncpus "
                                             "burst limit)"),
    -25: ("JOB_EXEC_KILL_NCPUS_SUM", None, "the job used more CPUs than it asked for (ncpus "
                                           "sum limit)"),
    -26: ("JOB_EXEC_KILL_VMEM", "out_of_memory", "the job exceeded its virtual memory limit"),
    -27: ("JOB_EXEC_KILL_MEM", "out_of_memory", "the job exceeded its memory limit"),
    -28: ("JOB_EXEC_KILL_CPUT", None, "the job exceeded its CPU time limit"),
    -29: ("JOB_EXEC_KILL_WALLTIME", "time_limit", "the job exceeded its walltime"),
    -30: ("JOB_EXEC_JOINJOB", "node_failure", "the job's nodes could not be joined"),
}
# substate of a finished job that was deleted (JOB_SUBSTATE_TERMINATED).
_SUBSTATE_DELETED = 91
_SIGNAL_BASE = 256
_WALLTIME_IN_TEXT = re.compile(r"walltime\b.*\bexceed", re.IGNORECASE)
_JOB_ID = re.compile(r"\d+(?:\[\d*\])?(?:\.[A-Za-z0-9_.-]+)?")
# qstat's complaint about a job it does not know (any more), as it prints it on stderr.
_UNKNOWN_JOB = re.compile(r"^qstat: (?:Unknown Job Id|.*Job has finished)", re.IGNORECASE)


def _seconds(hms: Optional[str]) -> Optional[int]:
    """Seconds in a PBS duration ``[[hh:]mm:]ss``; None when absent or not understood."""
    if not hms:
        return None
    parts = hms.strip().split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    total = 0
    for p in parts:
        total = total * 60 + int(p)
    return total


def pbs_status(native_state: str, fields: Mapping[str, str],
               state_map: Mapping[str, Optional[JobState]] = STATE_MAP,
               exec_codes: Mapping[int, Tuple[str, Optional[str], str]] = EXEC_CODES,
               deleted_substates: Collection[int] = (_SUBSTATE_DELETED,),
               deleted_exit_statuses: Collection[int] = ()) -> JobStatus:
    """The JobStatus of a PBS job from its state letter and its attributes (by name, values
    as text; nested resources as ``resources_used.walltime``). The exit status is read from
    ``Exit_status`` (PBS Pro) or ``exit_status`` (Torque).

    ``deleted_substates`` and ``deleted_exit_statuses`` are the substates and exit statuses that
    mean "deleted with qdel" in this flavour.
    Raises ValueError for an unknown state letter or an exit status that is not a number.
    """
    if native_state not in state_map:
        raise ValueError(f"unknown PBS job state {native_state!r}")
    mapped = state_map[native_state]
    comment = fields.get("comment") or None
    substate_text = fields.get("substate", "").strip()
    substate = int(substate_text) if substate_text.lstrip("-").isdigit() else None
    metadata: Dict[str, object] = {"native_state": native_state, "substate": substate,
                                   "reason": comment}
    if mapped is JobState.QUEUED and native_state == "H":  # qhold, qsub -h, or a hold type
        return held_status(metadata, "H" + (f", {comment}" if comment else ""))
    if mapped is not None:
        return JobStatus(mapped, metadata=metadata)
    code_text = fields.get("Exit_status", fields.get("exit_status"))
    if code_text is None or not code_text.strip():
        if substate in deleted_substates:
            return JobStatus(JobState.CANCELED, metadata=metadata)
        return JobStatus(JobState.FAILED, metadata=metadata,
                         message="PBS ended the job without running it"
                                 + (f" ({comment})" if comment else ""))
    try:
        code = int(code_text.strip())
    except ValueError:
        raise ValueError(f"PBS exit status {code_text!r} is not a number") from None
    metadata["exit_status"] = code
    if code < 0:
        name, cause, what = exec_codes.get(code, ("a code this executor does not know", None,
                                                  "the batch system stopped the job"))
        metadata["exec_code"] = name
        if cause is not None:
            metadata["cause"] = cause
            return JobStatus(JobState.FAILED, metadata=metadata)
        return JobStatus(JobState.FAILED, metadata=metadata,
                         message=f"PBS ended the job: {what} (exit status {code}, {name})")
    exit_code = code
    if code >= _SIGNAL_BASE:
        exit_code = 128 + code - _SIGNAL_BASE
    if code > 128:
        used = _seconds(fields.get("resources_used.walltime"))
        limit = _seconds(fields.get("Resource_List.walltime"))
        if (used is not None and limit is not None and used >= limit) \
                or (comment is not None and _WALLTIME_IN_TEXT.search(comment)):
            metadata["cause"] = "time_limit"
            return JobStatus(JobState.FAILED, exit_code=exit_code, metadata=metadata)
    if substate in deleted_substates or code in deleted_exit_statuses:
        return JobStatus(JobState.CANCELED, exit_code=exit_code, metadata=metadata)
    state = JobState.COMPLETED if code == 0 else JobState.FAILED
    return JobStatus(state, exit_code=exit_code, metadata=metadata)


def _flatten(attributes: Mapping[str, Any]) -> Dict[str, str]:
    """Job attributes from qstat's JSON as text, nested ones (``Resource_List``) dotted."""
    flat: Dict[str, str] = {}
    for key, value in attributes.items():
        if isinstance(value, Mapping):
            for sub, inner in value.items():
                flat[f"{key}.{sub}"] = str(inner)
        else:
            flat[key] = str(value)
    return flat


def _split_json_and_errors(out: str) -> Tuple[Optional[str], List[str]]:
    """The JSON document in qstat's output and the other (error) lines around it."""
    start = out.find("{")
    if start < 0:
        return None, [line for line in out.splitlines() if line.strip()]
    decoder = json.JSONDecoder(strict=False)
    try:
        _, end = decoder.raw_decode(out, start)
    except ValueError:
        return out[start:], [line for line in out[:start].splitlines() if line.strip()]
    rest = out[:start] + "\n" + out[end:]
    return out[start:end], [line for line in rest.splitlines() if line.strip()]


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, strict=False)
    except ValueError:
        # Some PBS versions leave backslashes in values (Variable_List) unescaped.
        repaired = re.sub(r'\\(?!["\\/bfnrtu])', r"\\\\", text)
        try:
            return json.loads(repaired, strict=False)
        except ValueError as e:
            raise ValueError(f"qstat -F json printed something that is not JSON: {e}") \
                from None


def refuse_unknown_job_lines(command: str, exit_code: int, lines: List[str],
                             unknown_job: "re.Pattern[str]") -> None:
    """Raise (through :func:`check_status_exit_code`) unless every error line of a failed
    status command only says that a job is unknown (it has left the queue, which is fine)."""
    if exit_code == 0:
        return
    others = [line for line in lines if not unknown_job.search(line.strip())]
    if others:
        check_status_exit_code(command, exit_code, "\n".join(others))


class GenericPBSJobExecutor(BatchSchedulerExecutor):
    """The part of the PBS executors that is the same for PBS Pro and Torque.

    Custom attributes ``pbs.<option>`` (or named after the executor: ``pbspro.``,
    ``torque.``) become ``#PBS -<option> <value>`` (``pbs.l`` gives ``-l``; a value of True
    gives a bare ``-<option>``); their values must not need quoting. ``signal`` runs ``qsig``,
    which signals every process of the job's session.
    """

    CONFIG_CLASS = PBSExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES: Tuple[str, ...] = ("pbs", "pbspro")
    TRANSIENT_SUBMIT_ERRORS = (
        "Connection refused", "cannot connect to server", "Cannot connect to",
        "pbs_iff: cannot", "Server initializing", "Maximum number of jobs already in queue",
        "would exceed queue", "temporarily unavailable", "try again",
    )
    TEMPLATE = "pbs.mustache"
    NICE = PBS_NICE  # use_nice (see psij.executors.batch._nice)
    SUBMIT_COMMAND = ("qsub",)
    # The last non-blank line of qsub's output: 1234.server, 12[].server, ...
    JOB_ID_PATTERN = re.compile(r"(?:\A|\n)\s*(" + _JOB_ID.pattern + r")\Z")
    CANCEL_COMMAND = ("qdel",)
    CANCEL_GONE_PATTERN = re.compile("unknown job id|job has finished|request invalid for "
                                     "state of job|invalid state for job", re.IGNORECASE)
    LIST_ID_PATTERN = _JOB_ID
    NAMED_LIST_COMMAND = ("qselect", "-N", "{name}")
    DIRECTIVES = PLAIN
    SIGNAL_COMMAND = ("qsig", "-s", "{signal}")
    SCRIPT_SIGNALS = dict.fromkeys(FORWARDABLE, KEEP)
    STATUS_COMMAND: Tuple[str, ...] = ("qstat", "-f", "-F", "json", "-x")
    FIGURES_FROM = "status"  # qstat -x shows ended jobs (see _figures_sites)

    def __init__(self, generator: Optional[TemplatedScriptGenerator] = None,
                 url: Optional[str] = None, config: Optional[JobExecutorConfig] = None) -> None:
        """``generator`` renders the submit script (psij-python's PBS executors pass a
        :class:`~psij.executors.batch.script_generator.TemplatedScriptGenerator` of their
        template; a site's executor derived from this class passes its own); None renders
        ``TEMPLATE``."""
        if generator is not None and not callable(getattr(generator, "generate_submit_script",
                                                          None)):
            raise _check.fail_type(f"{type(self).__name__} generator", generator,
                                   "a submit script generator (generate_submit_script) or None; "
                                   "the parameters are (generator, url, config)")
        super().__init__(url=url, config=config)
        if generator is not None:
            self.generator = generator

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        style = self.ARRAYS
        if style is None:
            return super().get_status_command(native_ids)
        # An array once (1234[].server) with -t, which adds its subjobs (1234[5].server).
        asked: Dict[str, None] = {}
        extra: List[str] = []
        for nid in native_ids:
            element = style.split(nid)
            asked[nid if element is None else element[0]] = None
            extra = extra if element is None else ["-t"]
        return [*self.STATUS_COMMAND, *extra, *asked]

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        document, errors = _split_json_and_errors(out)
        refuse_unknown_job_lines("qstat", exit_code, errors, _UNKNOWN_JOB)
        if document is None:
            if exit_code == 0 and errors:
                raise ValueError(f"qstat printed no JSON: {out.strip()[:200]!r}")
            return {}
        report = _load_json(document)
        if not isinstance(report, dict):
            raise ValueError("qstat -F json: the document is not an object")
        jobs = report.get("Jobs", {})
        if not isinstance(jobs, dict):
            raise ValueError("qstat -F json: 'Jobs' is not an object")
        found: Dict[str, JobStatus] = {}
        for native_id, attributes in jobs.items():
            if not isinstance(attributes, dict) or "job_state" not in attributes:
                raise ValueError(f"qstat -F json: job {native_id!r} has no job_state")
            fields = _flatten(attributes)
            found[native_id] = with_figures(pbs_status(fields["job_state"].strip(), fields),
                                            pbs_figures(fields))
        return found


    def _template_values(self, job: Job, spec: JobSpec) -> Dict[str, object]:
        return {"pbs": self._resource_context(v1_resources(spec), spec)}

    def _resource_context(self, resources: ResourceSpecV1, spec: JobSpec) -> Dict[str, object]:
        """The ``pbs`` values of the template: PBS Pro chunks (``select``, ``place``)."""
        per_node = resources.computed_processes_per_node
        cores = resources.cpu_cores_per_process or 1
        chunk = [str(resources.computed_node_count), f"ncpus={per_node * cores}",
                 f"mpiprocs={per_node}"]
        if resources.gpu_cores_per_process:
            chunk.append(f"ngpus={per_node * resources.gpu_cores_per_process}")
        if resources.memory_kb is not None:
            chunk.append(f"mem={resources.memory_kb}kb")
        attrs = spec.attributes
        return {
            "select": ":".join(chunk),
            "place": "scatter:exclhost" if resources.exclusive_node_use else "scatter",
            # A PBS reservation is a queue named after it; the job must be sent there.
            "queue": attrs.reservation_id or attrs.queue_name,
            "cores_per_process": 1,
        }

    def get_list_command(self) -> List[str]:
        return ["qselect", "-u", getpass.getuser()]


class PBSJobExecutor(GenericPBSJobExecutor):
    """Runs jobs on PBS Pro / OpenPBS (names ``pbs``, ``pbspro``).

    Resources become one ``select`` statement of ``node_count`` chunks (``ncpus``, ``mpiprocs``,
    ``ngpus``, ``mem`` per node) placed with ``place=scatter`` (``:exclhost`` for exclusive
    use); a reservation is the queue the job is sent to.
    """

    _NAME_ = "pbs"
    ARRAYS = PBS_ARRAYS

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(None, url=url, config=config)
