"""The NEC NQSV executor: ``qsub``, ``qstat -F rid,stt -n -l`` and ``qdel`` (NQSV's own
commands, which share their names with PBS's but not their options or output).

What the commands print, as this module reads it:

- ``qsub`` answers ``Request <number>.<batch server> submitted to queue: <queue>.``; the native
  id is the request number, as psij-python's NQSV executor has it;
- ``qstat -F rid,stt -n -l [ids]`` prints one line per request still in the system, its
  request id and its state (``-n``: no header), e.g. ``1234.bsv0 RUN``; a request that ended
  is no longer shown, and its final state comes from the ``<native id>.ec`` file its script
  wrote (and, without one, is FAILED saying so);
- states: ``QUE`` queued, ``WAT`` waiting for its start time, ``HLD`` held, ``ARI`` arriving,
  ``TRS`` transferring, ``MIG`` migrating, ``STG`` staging files, ``PRR`` pre-running (all
  QUEUED; ``HLD`` held), ``RUN`` running, ``SUS`` suspended, ``POR`` post-running and ``EXT``
  exiting (ACTIVE until the request leaves the queue);
- inside the request, ``PBS_JOBID`` is ``<job number>:<request id>`` and ``PBS_NODEFILE`` lists
  the request's hosts; an NQSV request of ``-b N`` jobs runs its script in each job, and the
  script runs the launch command only in job 0 (the launcher reaches the other hosts through
  ``PSIJ_NODEFILE``).

Custom attributes ``nqsv.<option>`` become ``#PBS -<option> <value>`` lines (``nqsv.l`` gives
``-l``; True gives a bare ``-<option>``); their values must not need quoting.
"""

import getpass
import re
from typing import Dict, List, Optional, Tuple

from psij.executors.batch._script_context import v1_resources
from psij.executors.batch._site_directives import PLAIN
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from psij.job import LARGE_TIMEOUT as LARGE_TIMEOUT
from psij.job import Job
from psij.job_executor_config import JobExecutorConfig
from psij.job_spec import JobSpec
from psij.job_state import JobState

__all__ = ["LARGE_TIMEOUT", "STATE_MAP", "NQSVExecutorConfig", "NQSVJobExecutor"]


class NQSVExecutorConfig(BatchSchedulerExecutorConfig):
    """Configuration of the NQSV executor (no settings beyond the batch ones)."""


STATE_MAP: Dict[str, JobState] = {
    "QUE": JobState.QUEUED, "WAT": JobState.QUEUED, "HLD": JobState.QUEUED,
    "ARI": JobState.QUEUED, "TRS": JobState.QUEUED, "MIG": JobState.QUEUED,
    "STG": JobState.QUEUED, "PRR": JobState.QUEUED,
    "RUN": JobState.ACTIVE, "SUS": JobState.ACTIVE, "POR": JobState.ACTIVE,
    "EXT": JobState.ACTIVE,
}

# A request id as qstat prints it: the request number, then the batch server's name.
_REQUEST_ID = r"(\d+)(?:\.[A-Za-z0-9_.-]+)?"


class NQSVJobExecutor(BatchSchedulerExecutor):
    """Runs jobs on NEC NQSV (name ``nqsv``).

    Resources become ``-b <node_count>`` (NQSV jobs, one per host) and
    ``--cpunum-lhost=<cores per host>`` (``--gpunum-lhost`` for GPUs, ``--memsz-lhost`` for
    memory); the duration ``-l elapstim_req``; the queue ``-q``; the account ``-A``; a
    reservation ``-y``; exclusive use ``--exclusive``.
    """

    _NAME_ = "nqsv"
    CONFIG_CLASS = NQSVExecutorConfig
    CUSTOM_ATTRIBUTE_PREFIXES: Tuple[str, ...] = ("nqsv",)
    TEMPLATE = "nqsv.mustache"
    SUBMIT_COMMAND = ("qsub",)
    JOB_ID_PATTERN = re.compile(r"Request\s+" + _REQUEST_ID + r"\s+submitted")
    CANCEL_COMMAND = ("qdel",)
    CANCEL_GONE_PATTERN = re.compile(r"does not exist|not found|already (?:exited|finished)",
                                     re.IGNORECASE)
    STATUS_COMMAND = ("qstat", "-F", "rid,stt", "-n", "-l")
    STATUS_LINE_PATTERN = re.compile(r"\s*" + _REQUEST_ID + r"\s+([A-Z]{3})\s*")
    STATE_MAP = STATE_MAP
    HELD_STATES = ("HLD",)
    LIST_COMMAND = ("qstat", "-F", "rid", "-n", "-l")
    DIRECTIVES = PLAIN
    TRANSIENT_SUBMIT_ERRORS = ("Connection refused", "temporarily unavailable", "try again")

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=config)

    def _template_values(self, job: Job, spec: JobSpec) -> Dict[str, object]:
        resources = v1_resources(spec)
        per_node = resources.computed_processes_per_node
        cores = per_node * (resources.cpu_cores_per_process or 1)
        gpus = per_node * resources.gpu_cores_per_process \
            if resources.gpu_cores_per_process else None
        memory_kb = resources.memory_kb
        return {"nqsv": {
            "hosts": resources.computed_node_count,
            "per_host": per_node,
            "cpus": cores,
            "gpus": gpus,
            # NQSV's memory size per host, in whole MiB (rounded up).
            "memory": None if memory_kb is None else f"{-(-memory_kb // 1024)}M",
            "exclusive": resources.exclusive_node_use,
            "seconds": int(spec.attributes.duration.total_seconds()),
        }}

    def parse_list_output(self, out: str) -> List[str]:
        found = []
        for line in out.splitlines():
            match = re.fullmatch(r"\s*" + _REQUEST_ID + r"\s*", line)
            if match:
                found.append(match.group(1))
        return found

    def get_list_command(self) -> List[str]:
        return [*self.LIST_COMMAND, "-u", getpass.getuser()]
