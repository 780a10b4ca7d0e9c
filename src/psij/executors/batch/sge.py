"""The Grid Engine executor (Son of Grid Engine, Univa/Altair GE): qsub, qstat, qdel, qacct.

Declarations (commands, the job-id pattern, the template ``templates/sge.mustache``, plain
values in ``#$`` lines, which Grid Engine reads without any escape mechanism), the state map and
the parsers of qstat's and qacct's output. A job of more than one slot asks for the parallel
environment of the configuration (``smp`` by default).
"""

import re
import signal
import xml.etree.ElementTree as ET
from typing import Any, Collection, Dict, List, Optional, Sequence, Tuple

from psij._scripts.quoting import plain_directive_value
from psij.executors.batch._arrays import SGE_ARRAYS, expand_index_list
from psij.executors.batch._figures_sge import qacct_figures
from psij.executors.batch._nice import SGE_NICE
from psij.executors.batch._script_context import v1_resources
from psij.executors.batch._signals import FORWARDABLE, KEEP, REQUEST, write_signal_request
from psij.executors.batch._site_directives import PLAIN
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

__all__ = ["SgeExecutorConfig", "SgeJobExecutor"]

# qstat state codes -> (PSI/J state, cause). Finished jobs are not in qstat; qacct has them.
_QUEUED, _ACTIVE = (JobState.QUEUED, None), (JobState.ACTIVE, None)
STATE_MAP: Dict[str, Tuple[JobState, Optional[str]]] = {
    **dict.fromkeys(("qw", "hqw", "hRwq", "Rq"), _QUEUED),
    **dict.fromkeys(("r", "t", "Rr", "Rt", "s", "ts", "S", "tS", "T", "tT", "Rs", "Rts", "RS",
                     "RtS", "RT", "RtT"), _ACTIVE),
    # Being deleted: the job is still there until it has gone; its end is learned then.
    **dict.fromkeys(("dqw", "dhqw"), _QUEUED),
    **dict.fromkeys(("dr", "dt", "dRr", "dRt", "ds", "dS", "dT", "dRs", "dRS", "dRT"), _ACTIVE),
    # Error states: the job will not run unless an administrator clears the error.
    **dict.fromkeys(("Eqw", "Ehqw", "EhRqw"), (JobState.FAILED, "held_error")),
}
# qacct "failed" codes with a known cause (the rest are reported with qacct's own words).
_FAILED_CAUSES = {37: "time_limit"}
_QACCT_FIELD = re.compile(r"(\w+)\s+(.*?)\s*$")


class SgeExecutorConfig(BatchSchedulerExecutorConfig):
    """Grid Engine settings: ``parallel_environment`` names the PE asked for by jobs of more
    than one slot (``smp``); the other parameters are those of
    :class:`~psij.executors.batch.batch_scheduler_executor.BatchSchedulerExecutorConfig`."""

    def __init__(self, *args: Any, parallel_environment: str = "smp", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(parallel_environment, str):
            raise TypeError(f"SgeExecutorConfig.parallel_environment: expected str, got "
                            f"{parallel_environment!r}")
        self.parallel_environment = plain_directive_value(
            "SgeExecutorConfig.parallel_environment", parallel_environment)


def sge_status(native_state: str) -> JobStatus:
    """The JobStatus for a qstat state code; ValueError for an unknown code."""
    try:
        state, cause = STATE_MAP[native_state]
    except KeyError:
        raise ValueError(f"unknown Grid Engine job state {native_state!r}") from None
    metadata: Dict[str, object] = {"native_state": native_state}
    if "R" in native_state:  # restarted (qmod -rj, a requeue): tells a restart between polls
        metadata["restarts"] = 1
    if state is JobState.QUEUED and "h" in native_state:  # hqw, hRwq: on hold (qhold, -h)
        return held_status(metadata, native_state)
    message = None
    if cause is not None:
        metadata["cause"] = cause
        message = ("Grid Engine put the job in its error state; `qstat -j <id>` says why, "
                   "and the job stays in the queue until it is deleted")
    return JobStatus(state, message=message, metadata=metadata)


def qacct_status(fields: Dict[str, str]) -> JobStatus:
    """The final JobStatus from one ``qacct -j`` record (its fields by name)."""
    failed_text = fields.get("failed", "0").strip()
    failed = int(failed_text.split()[0]) if failed_text.split() else 0
    exit_text = fields.get("exit_status", "").split()
    exit_code = int(exit_text[0]) if exit_text else None
    metadata: Dict[str, object] = {"native_state": "finished", "failed": failed_text,
                                   "exit_status": fields.get("exit_status")}
    if failed == 0:
        state = JobState.COMPLETED if exit_code in (0, None) else JobState.FAILED
        return JobStatus(state, exit_code=exit_code, metadata=metadata)
    cause = _FAILED_CAUSES.get(failed)
    message = None
    if cause is not None:
        metadata["cause"] = cause
    elif failed != 100:
        # 100 means "ended by a signal": the exit code says which. Others are set-up failures.
        message = f"Grid Engine could not run the job (failed {failed_text})"
    return JobStatus(JobState.FAILED, message=message, exit_code=exit_code, metadata=metadata)


class SgeJobExecutor(BatchSchedulerExecutor):
    """Runs jobs on Grid Engine. Custom attributes ``sge.<option>`` (or ``gridengine.``) become
    ``#$ -<option> <value>`` lines (``sge.l`` gives ``-l``); values must not need quoting.

    Grid Engine has no command that signals a job: its only signals before a kill are the
    warnings of ``-notify`` (every script asks for it), sent to the whole process group. So a
    job starts with USR1 and USR2 ignored; ``qdel`` (a cancel, or ``signal``) makes Grid
    Engine send USR2, on which the script passes TERM, or the signal ``signal`` asked for, on
    to the job, and Grid Engine kills what is left after the queue's ``notify`` time.
    """

    _NAME_ = "sge"
    CONFIG_CLASS = SgeExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES = ("sge", "gridengine")
    TRANSIENT_SUBMIT_ERRORS = ("unable to contact qmaster", "failed receiving gdi request",
                               "commlib error", "got no connection", "try again")
    TEMPLATE = "sge.mustache"
    NICE = SGE_NICE  # use_nice (see psij.executors.batch._nice)
    SUBMIT_COMMAND = ("qsub", "-terse")
    JOB_ID_PATTERN = re.compile(r"(\d+)(?:\.[\d:-]+)?\s*$")
    ARRAYS = SGE_ARRAYS
    FIGURES_FROM = "accounting"  # qacct (see psij.executors.batch._figures_sge)
    CANCEL_COMMAND = ("qdel",)
    CANCEL_GONE_PATTERN = re.compile("does not exist")
    # qstat cannot select jobs by id in its list view; it lists this user's jobs.
    STATUS_COMMAND = LIST_COMMAND = NAMED_LIST_COMMAND = ("qstat", "-xml")
    DIRECTIVES = PLAIN
    SCRIPT_SIGNALS = {**dict.fromkeys(FORWARDABLE, KEEP), "USR2": REQUEST}
    JOB_IGNORED_SIGNALS = ("USR1", "USR2")

    def _template_values(self, job: Job, spec: JobSpec) -> Dict[str, object]:
        resources = v1_resources(spec)
        cores = resources.cpu_cores_per_process or 1
        slots = resources.computed_process_count * cores
        config = self.config
        assert isinstance(config, SgeExecutorConfig)
        # A script exiting with 99 is requeued, with 100 left in an error state: a job's own
        # 99 or 100 must only fail it (its code is read from the .ec file).
        # fail_unstartable: "-w e", qsub's check against an empty cluster, refuses a job no
        # queue could ever run ("no suitable queues"), which would otherwise wait in qw.
        return {"sge": {"slots": slots if slots > 1 else None,
                        "parallel_environment": config.parallel_environment,
                        "cores_per_process": cores,
                        "verify": bool(getattr(config, "fail_unstartable", False))},
                "script_exit_reserved": "99|100"}

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        return list(self.STATUS_COMMAND)

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        check_status_exit_code("qstat", exit_code, out)
        try:
            root = ET.fromstring(out)
        except ET.ParseError as e:
            raise ValueError(f"qstat -xml printed something that is not XML: {e}") from None
        if root.tag != "job_info":
            raise ValueError(f"qstat -xml: unexpected document element <{root.tag}>")
        found: Dict[str, JobStatus] = {}
        for entry in root.iter("job_list"):
            number = entry.findtext("JB_job_number")
            state = entry.findtext("state")
            if number is None or state is None or not number.strip().isdigit():
                raise ValueError("qstat -xml: a job entry without a job number or state")
            # An array's task: its index, or its pending tasks together ("7-500:1").
            tasks = (entry.findtext("tasks") or "").strip()
            status = sge_status(state.strip())
            if not tasks:
                found[number.strip()] = status
            for index in expand_index_list(tasks) if tasks else ():
                found[f"{number.strip()}.{index}"] = status
        return found

    def get_cancel_command(self, native_id: str) -> List[str]:
        element = SGE_ARRAYS.split(native_id)
        if element is None:
            return ["qdel", native_id]
        return ["qdel", element[0], "-t", str(element[1])]

    def get_signal_command(self, native_id: str, signum: int) -> List[str]:
        """``qdel``, after writing the signal the script is to pass on (see the class): the
        job ends, at the latest after the queue's ``notify`` time."""
        write_signal_request(self, native_id, signum)
        return self.get_cancel_command(native_id)

    def kill(self, job: Job) -> None:
        """Cancel ``job``, its processes killed at once: the script passes KILL on (instead of
        TERM) when ``qdel`` warns it, without waiting for the queue's ``notify`` time."""
        native_id = job.native_id if isinstance(job, Job) else None
        if (native_id is not None and not job.status.final
                and getattr(self, "_fallback", None) is None):
            write_signal_request(self, native_id, signal.SIGKILL)
        super().kill(job)

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        commands = []
        for nid in native_ids:
            element = SGE_ARRAYS.split(nid)
            commands.append(["qacct", "-j", nid] if element is None
                            else ["qacct", "-j", element[0], "-t", str(element[1])])
        return commands

    def parse_accounting_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        if exit_code != 0 and "not found" in out:
            return {}  # no record (yet): the job is looked for again later
        check_status_exit_code("qacct", exit_code, out)
        found: Dict[str, JobStatus] = {}
        for record in re.split(r"^=+\s*$", out, flags=re.MULTILINE):
            fields: Dict[str, str] = {}
            for line in record.splitlines():
                match = _QACCT_FIELD.match(line)
                if match is not None:
                    fields.setdefault(match.group(1), match.group(2))
            number = fields.get("jobnumber", "").strip()
            task = fields.get("taskid", "").strip()  # "undefined" unless an array's task
            if number.isdigit():
                status = qacct_status(fields)
                if status.metadata is not None:
                    status.metadata.update(qacct_figures(fields))
                found[f"{number}.{task}" if task.isdigit() else number] = status
        return found

    def parse_list_output(self, out: str) -> List[str]:
        return list(self.parse_status_output(0, out))

    def parse_named_list_output(self, out: str, name: str) -> List[str]:
        # qstat -xml lists every job of this user: those whose JB_name is ``name``.
        found = self.parse_status_output(0, out)
        root = ET.fromstring(out)
        named = {(entry.findtext("JB_job_number") or "").strip()
                 for entry in root.iter("job_list") if entry.findtext("JB_name") == name}
        return [nid for nid in found if nid.split(".")[0] in named]
