"""The LSF executor (IBM Spectrum LSF): ``bsub < script``, ``bjobs -o ... -json`` (one call for
all jobs), bkill.

Declarations (commands, the script on bsub's standard input, the job-id pattern, bjobs' "no
job" answers, the template ``templates/lsf.mustache``), the state map, LSF's exit reasons and
the parser of bjobs' JSON; the behaviour lives in
:class:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutor`.

Facts this module relies on (IBM Spectrum LSF 10.1 command reference):

- ``bsub`` reads ``#BSUB`` lines only from a script given on its standard input (``bsub
  script`` parses them only where ``LSB_BSUB_PARSE_SCRIPT=Y``), and answers ``Job <ID> is
  submitted to [default] queue <QUEUE>.``;
- ``bjobs -a -o "jobid stat exit_code exit_reason" -json ID...`` prints ``{"COMMAND": "bjobs",
  "JOBS": n, "RECORDS": [{"JOBID": "1", "STAT": "RUN", "EXIT_CODE": "", "EXIT_REASON": ""},
  ...]}`` (every value a string), with ``{"ERROR": "Job <ID> is not found"}`` records for ids it
  does not know; ``-a`` keeps recently finished jobs (DONE, EXIT) in the output; where
  ``LSB_BJOBS_CONSISTENT_EXIT_CODE=Y``, bjobs exits 255 when none of the jobs asked for (or, for
  a list, no job at all) is found, saying so on stderr; the fields ``submit_time``,
  ``start_time``, ``finish_time`` (``Dec  8 00:38``), ``cpu_used`` (``2.3 second(s)``),
  ``max_mem`` (``300 Mbytes``), ``nalloc_slot``, ``exec_host`` (``2*hostA:2*hostB``) and
  ``runtimelimit`` (``60.0 min``) give the run's figures;
- ``#BSUB`` lines are split like a shell command line, so values go between double quotes and
  may not hold ``"``, ``\\``, ``$`` or a backquote.
"""

import json
import math
import re
from typing import TYPE_CHECKING, Any, Collection, Dict, List, Mapping, Optional, Tuple

from psij._reexports import lazy_names
from psij.executors.batch._arrays import LSF_ARRAYS
from psij.executors.batch._figures_sites import LSF_FIELDS, lsf_figures, with_figures
from psij.executors.batch._nice import LSF_NICE
from psij.executors.batch._script_context import v1_resources
from psij.executors.batch._signals import FORWARDABLE, KEEP
from psij.executors.batch._site_directives import PLAIN_QUOTED
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

__all__ = ["EXIT_REASONS", "STATE_MAP", "LsfExecutorConfig", "LsfJobExecutor", "lsf_status"]


class LsfExecutorConfig(BatchSchedulerExecutorConfig):
    """Configuration of the LSF executor (no settings beyond the batch ones)."""


# LSF job states (bjobs STAT) -> PSI/J state; None: the job has ended (DONE or EXIT).
STATE_MAP: Dict[str, Optional[JobState]] = {
    "PEND": JobState.QUEUED,    # waiting to be scheduled
    "PROV": JobState.QUEUED,    # dispatched, its hosts are being provisioned
    "PSUSP": JobState.QUEUED,   # suspended by its owner or an administrator while pending
    "WAIT": JobState.QUEUED,    # member of a chunk job, waiting to run
    "RUN": JobState.ACTIVE,     # running
    "USUSP": JobState.ACTIVE,   # suspended by its owner or an administrator while running
    "SSUSP": JobState.ACTIVE,   # suspended by LSF (load, run window) while running
    "UNKWN": JobState.ACTIVE,   # mbatchd lost contact with the job's host; it may still run
    "ZOMBI": JobState.ACTIVE,   # killed, the kill is not yet confirmed by the host
    "DONE": None,               # exited with 0
    "EXIT": None,               # exited with non-zero, or was killed
}

# Exit reasons (the TERM_* keyword of EXIT_REASON) that say more than the exit code:
# keyword -> (PSI/J state, cause or None, message or None).
EXIT_REASONS: Dict[str, Tuple[JobState, Optional[str], Optional[str]]] = {
    "TERM_RUNLIMIT": (JobState.FAILED, "time_limit", None),
    "TERM_RUNTIME": (JobState.FAILED, "time_limit", None),
    "TERM_MEMLIMIT": (JobState.FAILED, "out_of_memory", None),
    "TERM_SWAP": (JobState.FAILED, "out_of_memory", None),
    "TERM_PREEMPT": (JobState.FAILED, "preempted", None),
    "TERM_DEADLINE": (JobState.FAILED, "deadline", None),
    "TERM_WINDOW": (JobState.FAILED, None, "the job was killed when its run window closed"),
    "TERM_CPULIMIT": (JobState.FAILED, None, "the job reached its CPU time limit"),
    "TERM_PROCESSLIMIT": (JobState.FAILED, None, "the job reached its process limit"),
    "TERM_THREADLIMIT": (JobState.FAILED, None, "the job reached its thread limit"),
    "TERM_FORCE_OWNER": (JobState.CANCELED, None, None),
    "TERM_OWNER": (JobState.CANCELED, None, None),
    "TERM_REQUEUE_OWNER": (JobState.CANCELED, None, None),
    "TERM_FORCE_ADMIN": (JobState.CANCELED, None, "the job was killed by root or an LSF "
                                                  "administrator"),
    "TERM_ADMIN": (JobState.CANCELED, None, "the job was killed by root or an LSF "
                                            "administrator"),
    "TERM_REQUEUE_ADMIN": (JobState.CANCELED, None, "the job was killed by root or an LSF "
                                                    "administrator"),
    "TERM_LOAD": (JobState.FAILED, None, "LSF killed the job because of the load on its host"),
    "TERM_CHKPNT": (JobState.FAILED, None, "the job was killed after a checkpoint"),
    "TERM_ZOMBIE": (JobState.FAILED, "node_failure", None),
    "TERM_BUCKET_KILL": (JobState.CANCELED, None, "the job was killed with bkill -b"),
    "TERM_EXTERNAL_SIGNAL": (JobState.FAILED, None, "the job was killed by a signal sent "
                                                    "from outside LSF"),
    "TERM_RC_RECLAIM": (JobState.FAILED, "preempted", None),
}

_TERM_KEYWORD = re.compile(r"\b(TERM_[A-Z_]+)\b")
_NOT_FOUND = re.compile(r"is not found|No matching job found|No (?:unfinished )?job found",
                        re.IGNORECASE)


def lsf_status(record: Mapping[str, Any]) -> JobStatus:
    """The JobStatus of one bjobs JSON record; ValueError for an unknown STAT."""
    native_state = str(record.get("STAT", "")).strip()
    if native_state not in STATE_MAP:
        raise ValueError(f"unknown LSF job state {native_state!r}")
    reason = str(record.get("EXIT_REASON", "") or "").strip() or None
    metadata: Dict[str, object] = {"native_state": native_state, "reason": reason}
    mapped = STATE_MAP[native_state]
    if native_state == "PSUSP":  # bstop of a pending job, or bsub -H: held until bresume
        return held_status(metadata, "PSUSP")
    if mapped is not None:
        return JobStatus(mapped, metadata=metadata)
    code_text = str(record.get("EXIT_CODE", "") or "").strip()
    if code_text and not code_text.lstrip("-").isdigit():
        raise ValueError(f"LSF exit code {code_text!r} is not a number")
    # bjobs leaves EXIT_CODE empty for a job that exited with 0.
    exit_code = int(code_text) if code_text else (0 if native_state == "DONE" else None)
    keyword = _TERM_KEYWORD.search(reason or "")
    if keyword is not None and keyword.group(1) in EXIT_REASONS:
        state, cause, message = EXIT_REASONS[keyword.group(1)]
        if cause is not None:
            metadata["cause"] = cause
        return JobStatus(state, message=message, exit_code=exit_code, metadata=metadata)
    if native_state == "DONE":
        return JobStatus(JobState.COMPLETED, exit_code=exit_code, metadata=metadata)
    return JobStatus(JobState.FAILED, exit_code=exit_code, metadata=metadata,
                     message=None if exit_code else
                     f"LSF reports the job as exited{f' ({reason})' if reason else ''}")


class LsfJobExecutor(BatchSchedulerExecutor):
    """Runs jobs on LSF (name ``lsf``).

    Resources become ``-n <process_count>``, ``-R "span[ptile=<processes per node>]"``,
    ``-R "affinity[core(<cores per process>)]"``, ``-gpu "num=<n>/task"``, ``-M`` and
    ``-R "rusage[mem=...]"`` (memory per process) and ``-x`` for exclusive use. Custom
    attributes ``lsf.<option>`` become ``#BSUB -<option> "<value>"``. ``signal`` runs
    ``bkill -s``, which signals every process of the job.
    """

    _NAME_ = "lsf"
    CONFIG_CLASS = LsfExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES = ("lsf",)
    TRANSIENT_SUBMIT_ERRORS = (
        "LSF is down", "Please wait", "not responding", "try again", "Cannot connect",
        "temporarily unavailable", "Failed in an LSF library call",
    )
    TEMPLATE = "lsf.mustache"
    NICE = LSF_NICE  # use_nice (see psij.executors.batch._nice)
    # bsub reads #BSUB lines only from standard input.
    SUBMIT_COMMAND = ("bsub",)
    SCRIPT_ON_STDIN = True
    JOB_ID_PATTERN = re.compile(r"Job <(\d+)> is submitted")
    ARRAYS = LSF_ARRAYS
    CANCEL_COMMAND = ("bkill",)
    CANCEL_GONE_PATTERN = re.compile(r"already finished|" + _NOT_FOUND.pattern, re.IGNORECASE)
    # The fields after exit_reason give the run's figures (see _figures_sites).
    STATUS_COMMAND = ("bjobs", "-a", "-o", "jobid jobindex stat exit_code exit_reason "
                      + " ".join(LSF_FIELDS), "-json")
    FIGURES_FROM = "status"  # bjobs -a shows recently ended jobs
    LIST_COMMAND = ("bjobs", "-a", "-noheader", "-o", "jobid")
    LIST_ID_PATTERN = re.compile(r"\d+")
    NO_JOBS_EXIT_CODES = (255,)
    NO_JOBS_PATTERN = _NOT_FOUND
    NAMED_LIST_COMMAND = ("bjobs", "-noheader", "-o", "jobid", "-J", "{name}")
    DIRECTIVES = PLAIN_QUOTED
    SIGNAL_COMMAND = ("bkill", "-s", "{signal}")
    SCRIPT_SIGNALS = dict.fromkeys(FORWARDABLE, KEEP)
    END_SIGNAL_DIRECTIVE = True  # -wa <signal> -wt <minutes>

    def _template_values(self, job: Job, spec: JobSpec) -> Dict[str, object]:
        resources = v1_resources(spec)
        per_node = resources.computed_processes_per_node
        memory_kb = resources.memory_kb
        return {"lsf": {
            "slots": resources.computed_process_count,
            "ptile": per_node,
            "cores": resources.cpu_cores_per_process,
            # ResourceSpecV1.memory is per node; LSF's limit and reservation are per process.
            "memory_kb": None if memory_kb is None else -(-memory_kb // per_node),
            # bsub -W takes [hours:]minutes; a started minute counts.
            "walltime": None if spec.attributes.duration is None
            else _hours_minutes(spec.attributes.duration.total_seconds()),
        }}

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        start = out.find("{")
        if start < 0:
            check_status_exit_code("bjobs", exit_code, out)
            raise ValueError(f"bjobs printed no JSON: {out.strip()[:200]!r}")
        try:
            report, _ = json.JSONDecoder(strict=False).raw_decode(out, start)
        except ValueError as e:
            raise ValueError(f"bjobs -json printed something that is not JSON: {e}") from None
        records = report.get("RECORDS") if isinstance(report, dict) else None
        if not isinstance(records, list):
            raise ValueError("bjobs -json: no RECORDS list")
        found: Dict[str, JobStatus] = {}
        for record in records:
            if not isinstance(record, dict):
                raise ValueError(f"bjobs -json: a record is not an object: {record!r}")
            if "ERROR" in record:
                if not _NOT_FOUND.search(str(record["ERROR"])):
                    check_status_exit_code("bjobs", exit_code or 1, str(record["ERROR"]))
                continue  # a job LSF no longer knows: looked up by the base class
            native_id = str(record.get("JOBID", "")).strip()
            index = str(record.get("JOBINDEX", "")).strip()
            if native_id.isdigit() and index not in ("", "0"):
                native_id = f"{native_id}[{index}]"  # an array's element
            if not native_id.isdigit() and LSF_ARRAYS.split(native_id) is None:
                raise ValueError(f"bjobs -json: a record without a job id: {record!r}")
            found[native_id] = with_figures(lsf_status(record), lsf_figures(record))
        return found

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        # An array's id once: bjobs then shows each of its elements.
        asked: Dict[str, None] = {}
        for nid in native_ids:
            element = LSF_ARRAYS.split(nid)
            asked[nid if element is None else element[0]] = None
        return [*self.STATUS_COMMAND, *asked]


def _hours_minutes(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes // 60}:{minutes % 60:02d}"


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "SubmitException": "psij.exceptions",
        "TemplatedScriptGenerator": "psij._scripts.generator",
    })
