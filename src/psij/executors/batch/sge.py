"""The Grid Engine executor (Son of Grid Engine, Univa/Altair GE): qsub, qstat, qdel, qacct.

Declarations only: commands, the state map, the template (``templates/sge.mustache``) and the
rules for values in ``#$`` lines, which Grid Engine reads without any escape mechanism. A job of
more than one slot asks for the parallel environment of the configuration (``smp`` by default).
"""

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import IO, Collection, Dict, List, Optional, Sequence, Tuple, Union

from psij._data import data_dir
from psij.exceptions import SubmitException
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
    InvalidJobStateError,
    check_status_exit_code,
)
from psij.executors.batch.escape_functions import plain_directive_value, plain_job_name
from psij.executors.batch.script_generator import TemplatedScriptGenerator
from psij.job import Job
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.resource_spec import ResourceSpecV1

__all__ = ["SgeExecutorConfig", "SgeJobExecutor"]

# qstat state codes -> (PSI/J state, cause). Finished jobs are not in qstat; qacct has them.
STATE_MAP: Dict[str, Tuple[JobState, Optional[str]]] = {
    "qw": (JobState.QUEUED, None),
    "hqw": (JobState.QUEUED, None),
    "hRwq": (JobState.QUEUED, None),
    "Rq": (JobState.QUEUED, None),
    "r": (JobState.ACTIVE, None),
    "t": (JobState.ACTIVE, None),
    "Rr": (JobState.ACTIVE, None),
    "Rt": (JobState.ACTIVE, None),
    "s": (JobState.ACTIVE, None),
    "ts": (JobState.ACTIVE, None),
    "S": (JobState.ACTIVE, None),
    "tS": (JobState.ACTIVE, None),
    "T": (JobState.ACTIVE, None),
    "tT": (JobState.ACTIVE, None),
    "Rs": (JobState.ACTIVE, None),
    "Rts": (JobState.ACTIVE, None),
    "RS": (JobState.ACTIVE, None),
    "RtS": (JobState.ACTIVE, None),
    "RT": (JobState.ACTIVE, None),
    "RtT": (JobState.ACTIVE, None),
    # Being deleted: the job is still there until it has gone; its end is learned then.
    "dqw": (JobState.QUEUED, None),
    "dhqw": (JobState.QUEUED, None),
    "dr": (JobState.ACTIVE, None),
    "dt": (JobState.ACTIVE, None),
    "dRr": (JobState.ACTIVE, None),
    "dRt": (JobState.ACTIVE, None),
    "ds": (JobState.ACTIVE, None),
    "dS": (JobState.ACTIVE, None),
    "dT": (JobState.ACTIVE, None),
    "dRs": (JobState.ACTIVE, None),
    "dRS": (JobState.ACTIVE, None),
    "dRT": (JobState.ACTIVE, None),
    # Error states: the job will not run unless an administrator clears the error.
    "Eqw": (JobState.FAILED, "held_error"),
    "Ehqw": (JobState.FAILED, "held_error"),
    "EhRqw": (JobState.FAILED, "held_error"),
}
# qacct "failed" codes with a known cause (the rest are reported with qacct's own words).
_FAILED_CAUSES = {37: "time_limit"}
_JOB_ID = re.compile(r"(\d+)(?:\.[\d:-]+)?\s*$")
_QACCT_FIELD = re.compile(r"(\w+)\s+(.*?)\s*$")


class SgeExecutorConfig(BatchSchedulerExecutorConfig):
    """Grid Engine settings: ``parallel_environment`` names the PE asked for by jobs of more
    than one slot (``smp``)."""

    def __init__(self, launcher_log_file: Union[str, Path, None] = None,
                 work_directory: Union[str, Path, None] = None,
                 queue_polling_interval: float = 30, initial_queue_polling_delay: float = 2,
                 queue_polling_error_threshold: int = 2, keep_files: bool = False,
                 queue_polling_outage_tolerance: float = 300, command_timeout: float = 60,
                 parallel_environment: str = "smp") -> None:
        super().__init__(launcher_log_file, work_directory, queue_polling_interval,
                         initial_queue_polling_delay, queue_polling_error_threshold, keep_files,
                         queue_polling_outage_tolerance, command_timeout)
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
    """Runs jobs on Grid Engine. Custom attributes ``sge.<option>`` become ``#$ -<option>
    <value>`` lines (``sge.l`` gives ``-l``); values must not need quoting."""

    _NAME_ = "sge"
    CONFIG_CLASS = SgeExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES = ("sge", "gridengine")
    TRANSIENT_SUBMIT_ERRORS = ("unable to contact qmaster", "failed receiving gdi request",
                               "commlib error", "got no connection", "try again")

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=config)
        self.generator = TemplatedScriptGenerator(self.config,
                                                  data_dir("templates") / "sge.mustache")

    @property
    def _cfg(self) -> SgeExecutorConfig:
        assert isinstance(self.config, SgeExecutorConfig)
        return self.config

    def _directive_value(self, field: str, value: str) -> str:
        return plain_directive_value(field, value)

    def _job_name(self, spec: JobSpec) -> Optional[str]:
        # Grid Engine refuses names with blanks, '/', ':', '@', '*', '?', non-ASCII, ... and a
        # name is only a label, so it is made plain instead of refused.
        return plain_job_name(spec.name)

    def _create_script_context(self, job: Job) -> Dict[str, object]:
        context = super()._create_script_context(job)
        assert job.spec is not None
        resources = job.spec.resources
        if not isinstance(resources, ResourceSpecV1):
            resources = ResourceSpecV1()
        cores = resources.cpu_cores_per_process or 1
        slots = resources.computed_process_count * cores
        context["sge"] = {"slots": slots if slots > 1 else None,
                          "parallel_environment": self._cfg.parallel_environment,
                          "cores_per_process": cores}
        return context

    def generate_submit_script(self, job: Job, context: Dict[str, object],
                               submit_file: IO[str]) -> None:
        self.generator.generate_submit_script(job, context, submit_file)

    def get_submit_command(self, job: Job, submit_file_path: Path) -> List[str]:
        return ["qsub", "-terse", str(submit_file_path.absolute())]

    def job_id_from_submit_output(self, out: str) -> str:
        match = _JOB_ID.search(out.strip())
        if match is None:
            raise ValueError(f"no Grid Engine job id in {out.strip()!r}")
        return match.group(1)

    def get_cancel_command(self, native_id: str) -> List[str]:
        return ["qdel", native_id]

    def process_cancel_command_output(self, exit_code: int, out: str) -> None:
        if "does not exist" in out:
            raise InvalidJobStateError(out.strip())
        raise SubmitException(f"qdel exited with {exit_code}: {out.strip()}")

    def get_status_command(self, native_ids: Collection[str]) -> List[str]:
        # qstat cannot select jobs by id in its list view; it lists this user's jobs.
        return ["qstat", "-xml"]

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
            found[number.strip()] = sge_status(state.strip())
        return found

    def get_accounting_commands(self, native_ids: Sequence[str]) -> List[List[str]]:
        return [["qacct", "-j", nid] for nid in native_ids]

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
            if number.isdigit():
                found[number] = qacct_status(fields)
        return found

    def get_list_command(self) -> List[str]:
        return ["qstat", "-xml"]

    def parse_list_output(self, out: str) -> List[str]:
        return list(self.parse_status_output(0, out))
