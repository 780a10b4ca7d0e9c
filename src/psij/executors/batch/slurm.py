"""The Slurm executor: sbatch, squeue (one call for all jobs), sacct when the site has
accounting, scancel.

Declarations (commands, the job-id pattern, the template ``templates/slurm.mustache``), the
state map, and the parsers of squeue's and sacct's output; the behaviour lives in
:class:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutor`.
"""

import re
import threading
from typing import TYPE_CHECKING, Any, Collection, Dict, List, Optional, Sequence, Set, Tuple

from psij import _check
from psij._reexports import lazy_names
from psij.executors.batch._arrays import SLURM_ARRAYS, expand_index_list
from psij.executors.batch._figures_slurm import FIELDS as SACCT_FIELDS
from psij.executors.batch._figures_slurm import sacct_figures, step_rss
from psij.executors.batch._nice import SLURM_NICE
from psij.executors.batch._runner import CommandResult
from psij.executors.batch._signals import FORWARDABLE, PASS
from psij.executors.batch._status_table import held_status
from psij.executors.batch._unstartable import unstartable_status
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    check_status_exit_code,
)
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.executors.batch._slurm_rest_child import RestSubmitter

__all__ = ["HELD_REASONS", "HELD_STATES", "UNSTARTABLE_REASONS", "SlurmExecutorConfig",
           "SlurmJobExecutor", "unstartable_words"]

_REST_LOCK = threading.Lock()


class SlurmExecutorConfig(BatchSchedulerExecutorConfig):
    """Configuration of the Slurm executor.

    Parameters beyond the batch ones
    (:class:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutorConfig`):

    rest_submit
        Submit through a ``slurmrestd`` started as a child of this process, when the
        installation whose ``sbatch`` is on PATH has one (API v0.0.38), from the second job on:
        ~2 ms a job instead of sbatch's 4-6. The job is the one sbatch would make (same
        directives, environment, working directory); jobs whose script or environment cannot
        be given exactly, and jobs slurmrestd refuses, go to sbatch. True by default.
    """

    def __init__(self, *args: Any, rest_submit: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rest_submit = _check.opt_bool("SlurmExecutorConfig.rest_submit", rest_submit)


# Slurm job states (squeue %T, sacct State) -> (PSI/J state, cause of a failure).
STATE_MAP: Dict[str, Tuple[JobState, Optional[str]]] = {
    "PENDING": (JobState.QUEUED, None),
    "CONFIGURING": (JobState.QUEUED, None),
    "REQUEUED": (JobState.QUEUED, None),
    "REQUEUE_FED": (JobState.QUEUED, None),
    "REQUEUE_HOLD": (JobState.QUEUED, None),
    "RESV_DEL_HOLD": (JobState.QUEUED, None),
    "RUNNING": (JobState.ACTIVE, None),
    "COMPLETING": (JobState.ACTIVE, None),
    "SUSPENDED": (JobState.ACTIVE, None),
    "STOPPED": (JobState.ACTIVE, None),
    "SIGNALING": (JobState.ACTIVE, None),
    "STAGE_OUT": (JobState.ACTIVE, None),
    "RESIZING": (JobState.ACTIVE, None),
    "COMPLETED": (JobState.COMPLETED, None),
    "CANCELLED": (JobState.CANCELED, None),
    "FAILED": (JobState.FAILED, None),
    "TIMEOUT": (JobState.FAILED, "time_limit"),
    "OUT_OF_MEMORY": (JobState.FAILED, "out_of_memory"),
    "NODE_FAIL": (JobState.FAILED, "node_failure"),
    "PREEMPTED": (JobState.FAILED, "preempted"),
    "BOOT_FAIL": (JobState.FAILED, "boot_failure"),
    "DEADLINE": (JobState.FAILED, "deadline"),
    "REVOKED": (JobState.FAILED, None),
    "SPECIAL_EXIT": (JobState.FAILED, None),
}

# A pending job that Slurm holds until it is released (scontrol release): its reason, or a
# state that says so.
HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
HELD_STATES = frozenset({"REQUEUE_HOLD", "RESV_DEL_HOLD"})

# Reasons of a pending job that Slurm will never start as it was submitted (they go away only
# if an administrator changes the cluster): the words said for each. Slurm keeps such a job
# pending when EnforcePartLimits is off; with it on, sbatch refuses the job instead.
UNSTARTABLE_REASONS = {
    "PartitionNodeLimit": "it asks for more (or fewer) nodes than its partition allows or has; "
                          "ask for fewer nodes (ResourceSpecV1.node_count, process counts) or "
                          "another partition (JobAttributes.queue_name)",
    "PartitionTimeLimit": "its time limit is above its partition's maximum; ask for a shorter "
                          "duration (JobAttributes.duration) or another partition",
    "PartitionConfig": "no node of its partition can give what it asks for (cores, memory, "
                       "GPUs per node); ask for less per node or another partition",
    "BadConstraints": "no node has the features or resources it asks for; change its "
                      "constraints or resources",
    "InvalidAccount": "its account does not exist or it may not use it; ask for another "
                      "(JobAttributes.account)",
    "InvalidQOS": "its QOS does not exist or it may not use it; ask for another",
    "AccountNotAllowed": "its account may not use its partition",
    "QOSNotAllowed": "its QOS may not be used in its partition",
    "DependencyNeverSatisfied": "a job it depends on ended in a way that the dependency "
                                "excludes",
}
# A QOS's or an association's limit on one job (or one node of it), or a minimum per job:
# QOSMaxCpuPerJobLimit, AssocMaxMemPerNode, QOSMinMemory, ... (the limits per user or per
# account, and the aggregate ones, Grp*, go away as other jobs end).
_LIMIT_REASON = re.compile(r"(?:QOS|Assoc)Max\w*Per(?:Job|Node)\w*|QOSMin\w+")
_LIMIT_WORDS = ("it asks for more than a limit of its QOS or account allows one job, or less "
                "than its QOS's minimum; ask for less (or more), or another QOS or account")


def unstartable_words(reason: Optional[str]) -> Optional[str]:
    """What a pending job's reason means when Slurm will never start the job; None for a
    reason that goes away by itself (Resources, Priority, Dependency, BeginTime, holds...)."""
    if not reason:
        return None
    words = UNSTARTABLE_REASONS.get(reason)
    if words is None and _LIMIT_REASON.fullmatch(reason):
        words = _LIMIT_WORDS
    return words


# Messages for final states whose cause is not in STATE_MAP's second column.
_STATE_MESSAGES = {
    "REVOKED": "the job was revoked: a sibling job of a federation started on another cluster",
    "SPECIAL_EXIT": "the job ended in Slurm's SPECIAL_EXIT state (held by the site's epilog)",
}
# Reasons Slurm gives for a FAILED job that say more than its exit code.
_REASON_CAUSES = {"JobLaunchFailure": "launch_failure", "TimeLimit": "time_limit",
                  "OutOfMemory": "out_of_memory", "NodeDown": "node_failure"}
# Reasons of a FAILED job without a cause above, in words: what is said when the exit code
# itself is not known (no exit-code file, no accounting).
_REASON_MESSAGES = {
    "NonZeroExitCode": "Slurm reports that the job's batch script exited with a non-zero code "
                       "(reason NonZeroExitCode)",
    "RaisedSignal": "Slurm reports that the job's batch script was killed by a signal "
                    "(reason {reason})",
    "SystemFailure": "Slurm reports a failure of its own system (reason SystemFailure)",
    "InactiveLimit": "the job reached the cluster's InactiveLimit (reason InactiveLimit)",
}

# An array's elements are "<array id>_<index>"; its pending ones may be shown together as
# "<array id>_[<index list>]" (with "%<limit>" at the end of the list).
# squeue's lines: id|state|reason|derived exit code|restart count (lines of the first three
# or four fields alone parse too). The derived exit code is the worst of the job's steps' ends
# as a wait status: Slurm's SIG_OOM (253) there means that a step ran out of memory. The
# restart count tells a job that Slurm requeued (psij.requeue) between two polls.
_STATUS_LINE = re.compile(r"(\d+(?:_\d+|_\[[^]]*\])?)\|([A-Z_]+)\|(.*?)(?:\|(\d+)(?:\|(\d+))?)?")
_SIG_OOM = 253
# JobID is "<id>" (or "<array id>_<index>") for the allocation, "<id>.<step>" for its steps
# (batch, extern, 0, ...).
_ACCT_LINE = re.compile(
    r"(\d+(?:_\d+|_\[[^]]*\])?)(?:\.([^|]+))?\|([A-Z_]+)(?: by \d+)?\|(\d+):(\d+)\|(.*)")


def _element_ids(shown: str) -> List[str]:
    """The native ids a squeue/sacct job id stands for (an array's pending elements are
    shown together as ``123_[4-9]``)."""
    base, bracket, rest = shown.partition("_[")
    if not bracket:
        return [shown]
    return [f"{base}_{index}" for index in expand_index_list(rest.rstrip("]"))]


def _queried_ids(native_ids: Collection[str]) -> List[str]:
    """The ids to ask squeue/sacct about: an array's id once for all its elements."""
    seen: Dict[str, None] = {}
    for nid in native_ids:
        split = SLURM_ARRAYS.split(nid)
        seen[split[0] if split is not None else nid] = None
    return list(seen)


def slurm_status(native_state: str, reason: Optional[str],
                 exit_code: Optional[int] = None, restarts: Optional[int] = None) -> JobStatus:
    """The JobStatus for a Slurm state name and reason (and the times Slurm restarted the
    job, as metadata ``restarts``: not said of a job COMPLETING, which a requeue passes
    through before the job is PENDING again); ValueError for an unknown state."""
    try:
        state, cause = STATE_MAP[native_state]
    except KeyError:
        raise ValueError(f"unknown Slurm job state {native_state!r}") from None
    reason = None if reason in (None, "", "None", "(null)") else reason
    if cause is None and state is JobState.FAILED and reason in _REASON_CAUSES:
        cause = _REASON_CAUSES[reason]
    metadata: Dict[str, object] = {"native_state": native_state, "reason": reason}
    if restarts is not None and native_state != "COMPLETING":
        metadata["restarts"] = restarts
    if state is JobState.QUEUED and (reason in HELD_REASONS or native_state in HELD_STATES):
        return held_status(metadata, reason if reason in HELD_REASONS else native_state)
    never = unstartable_words(reason) if native_state == "PENDING" else None
    if never is not None:
        assert reason is not None
        return unstartable_status(metadata, reason, never, "Slurm")
    if cause is not None:
        metadata["cause"] = cause
    message = _STATE_MESSAGES.get(native_state) if state.final else None
    if message is None and cause is None and state is JobState.FAILED and reason is not None:
        template = _REASON_MESSAGES.get(reason.partition(":")[0])
        message = None if template is None else template.format(reason=reason)
    return JobStatus(state, message=message, exit_code=exit_code, metadata=metadata)


def _step_out_of_memory(status: JobStatus) -> JobStatus:
    """``status``, caused by a job step that ran out of memory when it failed for no other
    known cause (an srun step: the job reads FAILED, only the step OUT_OF_MEMORY)."""
    meta = dict(status.metadata or {})
    if status.state is not JobState.FAILED or "cause" in meta:
        return status
    meta["cause"] = "out_of_memory"
    return JobStatus(status.state, exit_code=status.exit_code, metadata=meta)


def _accounting_exit_code(native_state: str, code: int, sig: int,
                          batch_step: Optional[Tuple[int, int]]) -> Optional[int]:
    """The job's exit code from sacct's ``code:signal`` of the allocation and its batch step.

    A signal gives 128 + its number, as a shell reports it. The allocation's line alone is not
    enough: a job stopped at its time limit reads ``TIMEOUT|0:0`` while its batch step reads
    ``CANCELLED|0:15``, so a zero allocation code of a job that did not complete defers to the
    batch step; with nothing better the code is unknown (None), never a made-up 0. Slurm's
    ``0:125`` of a job or step that ran out of memory names no signal and gives no code.
    """
    for step_code, step_sig in ((code, sig), batch_step or (0, 0)):
        if step_sig == _SIG_OOM - 128:
            continue  # Slurm's mark of an end out of memory (0:125), not a signal received
        if step_sig:
            return 128 + step_sig
        if step_code:
            return step_code
    return 0 if native_state == "COMPLETED" else None


class SlurmJobExecutor(BatchSchedulerExecutor):
    """Runs jobs on a Slurm cluster.

    Custom attributes ``slurm.<option>`` become ``#SBATCH --<option>="<value>"`` (a value of
    True gives a bare ``--<option>``). A job without a name is named ``<job id>.job``, after
    its script as psij-python's are; the job's directory is its ``--chdir``. ``signal`` runs
    ``scancel --batch``: Slurm signals the script alone, which passes the signal on to the job.
    """

    _NAME_ = "slurm"
    CONFIG_CLASS = SlurmExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES = ("slurm",)
    TRANSIENT_SUBMIT_ERRORS = (
        "Socket timed out", "Unable to contact slurm controller", "temporarily unavailable",
        "Zero Bytes were transmitted", "Communication connection failure",
        "QOSMaxSubmitJob", "AssocMaxSubmitJobLimit", "MaxSubmitJobsPerAccount",
        "slurm_persist_conn_open", "try again",
    )
    TEMPLATE = "slurm.mustache"
    NICE = SLURM_NICE  # use_nice (see psij.executors.batch._nice)
    # The script on sbatch's standard input: no file is written for a job submitted well.
    SUBMIT_COMMAND = ("sbatch", "--parsable")
    SCRIPT_ON_STDIN = True
    JOB_ID_PATTERN = re.compile(r"(\d+)(?:;\S*)?\s*$")
    ARRAYS = SLURM_ARRAYS
    FIGURES_FROM = "accounting"  # sacct (see psij.executors.batch._figures_slurm)
    NAME_AFTER_SCRIPT = True  # sbatch names a job after its script
    DIRECTORY_DIRECTIVE = True  # --chdir
    DURATION_DAYS = True  # --time: days-hours:minutes:seconds; seconds round up to a minute
    CANCEL_COMMAND = ("scancel",)
    # Only the batch step: KILL to the whole job is a cancel with KillWait for Slurm.
    KILL_COMMAND = ("scancel", "--batch", "--signal=KILL")
    CANCEL_GONE_PATTERN = re.compile("Invalid job id|already completing or completed")
    # Slurm signals a batch job's script alone (a cancel's TERM too): the script passes it on.
    SIGNAL_COMMAND = ("scancel", "--batch", "--signal={signal}")
    SCRIPT_SIGNALS = dict.fromkeys(FORWARDABLE, PASS)
    END_SIGNAL_DIRECTIVE = True  # --signal=B:<signal>@<seconds>
    LIST_COMMAND = ("squeue", "--me", "--noheader", "--states=all", "--array", "--format=%i")
    NAMED_LIST_COMMAND = ("squeue", "--me", "--noheader", "--format=%i", "--name={name}")
    # squeue fails this way when the only job asked for has been purged: no rows.
    NO_JOBS_EXIT_CODES = (1,)
    NO_JOBS_PATTERN = re.compile("Invalid job id specified")

    _rest: "Optional[RestSubmitter]" = None

    def _direct_submit(self, argv: Sequence[str], script: str) -> Optional[CommandResult]:
        # rest_submit (psij.executors.batch._slurm_rest_child); off unless the config says on
        if not getattr(self.config, "rest_submit", False) or self._closed:
            return None
        rest = self._rest
        if rest is None:
            with _REST_LOCK:
                rest = self._rest
                if rest is None:
                    from psij.executors.batch._slurm_rest_child import RestSubmitter

                    rest = self._rest = RestSubmitter(self._run, getattr(self._runner, "_env",
                                                                         None))
        return rest.submit(argv, script, self.batch_config.command_timeout)

    def close(self) -> None:
        super().close()
        if self._rest is not None:
            self._rest.close()

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        # --array: one line per array element (pending ones too).
        return ["squeue", "--noheader", "--states=all", "--array",
                "--jobs=" + ",".join(_queried_ids(native_ids)),
                "--Format=JobArrayID:|,State:|,Reason:|,DerivedEC:|,RestartCnt:"]

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        check_status_exit_code("squeue", exit_code, out)
        found: Dict[str, JobStatus] = {}
        for line in out.splitlines():
            line = line.strip()
            if not line:
                continue
            match = _STATUS_LINE.fullmatch(line)
            if match is None:
                raise ValueError(f"unexpected squeue output line {line!r}")
            shown, native_state, reason, derived, restarts = match.groups()
            step_oom = derived is not None and int(derived) & 0xFF == _SIG_OOM
            for native_id in _element_ids(shown):
                status = slurm_status(native_state, reason, None,
                                      None if restarts is None else int(restarts))
                found[native_id] = _step_out_of_memory(status) if step_oom else status
        return found

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        # Not --allocations: the batch step's line is needed too (see _accounting_exit_code).
        # sacct shows an array's elements as <array id>_<index> (its JobID) by itself.
        # The fields between ExitCode and Reason give the run's figures (_figures_slurm).
        return [["sacct", "--noheader", "--parsable2",
                 "--jobs=" + ",".join(_queried_ids(native_ids)),
                 "--format=JobID,State,ExitCode," + ",".join(SACCT_FIELDS) + ",Reason"]]

    def parse_accounting_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        # Without slurmdbd sacct exits 1: "Slurm accounting storage is disabled".
        check_status_exit_code("sacct", exit_code, out)
        allocations: Dict[str, Tuple[str, int, int, str]] = {}
        figures: Dict[str, Dict[str, str]] = {}
        max_rss: Dict[str, int] = {}
        batch_steps: Dict[str, Tuple[int, int]] = {}
        # A step that ran out of memory (an srun step: the job then reads FAILED, with the
        # script's exit code, and only the step says OUT_OF_MEMORY) is why the job failed.
        oom_steps: Set[str] = set()
        for line in out.splitlines():
            line = line.strip()
            if not line:
                continue
            match = _ACCT_LINE.fullmatch(line)
            if match is None:
                raise ValueError(f"unexpected sacct output line {line!r}")
            native_id, step, native_state, code, sig, reason = match.groups()
            if "[" in native_id:
                continue  # an array's elements that have not started: nothing final yet
            fields: Dict[str, str] = {}
            if reason.count("|") >= len(SACCT_FIELDS):  # (not without the figures' fields)
                *values, reason = reason.split("|", len(SACCT_FIELDS))
                fields = dict(zip(SACCT_FIELDS, values))
            if step is None:
                allocations[native_id] = (native_state, int(code), int(sig), reason)
                figures[native_id] = fields
                continue
            rss = step_rss(fields.get("MaxRSS", ""))
            if rss is not None:
                max_rss[native_id] = max(rss, max_rss.get(native_id, 0))
            if step == "batch":
                batch_steps[native_id] = (int(code), int(sig))
            if native_state == "OUT_OF_MEMORY":
                oom_steps.add(native_id)
        found: Dict[str, JobStatus] = {}
        for native_id, (native_state, code, sig, reason) in allocations.items():
            status = slurm_status(native_state, reason, _accounting_exit_code(
                native_state, code, sig, batch_steps.get(native_id)))
            if status.state.final and figures[native_id] and status.metadata is not None:
                status.metadata.update(sacct_figures(figures[native_id],
                                                     max_rss.get(native_id)))
            found[native_id] = (_step_out_of_memory(status) if native_id in oom_steps
                                else status)
        return found


# Names that psij-python's module of the same path also offers (imported there).
if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, {
        "Job": "psij.job",
        "SubmitException": "psij.exceptions",
        "TemplatedScriptGenerator": "psij._scripts.generator",
    })
