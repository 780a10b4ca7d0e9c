"""psij executor for MySched: submits with ``mysched submit``, polls ``mysched status``."""

import logging
import subprocess
import threading
import time
from typing import Dict, List, Optional

from psij import (InvalidJobException, Job, JobExecutor, JobExecutorConfig, JobSpec, JobState,
                  JobStatus, ResourceSpecV1, SubmitException)

logger = logging.getLogger(__name__)

# MySched's one-letter states, as printed by `mysched status`.
_STATES = {"Q": JobState.QUEUED, "R": JobState.ACTIVE, "C": JobState.COMPLETED,
           "F": JobState.FAILED, "X": JobState.CANCELED}


def _mysched(*args: str) -> str:
    """Run one mysched command and return its output; SubmitException if it fails."""
    p = subprocess.run(["mysched", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SubmitException(f"mysched {args[0]} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


class MySchedExecutor(JobExecutor):
    poll_interval = 5.0  # seconds between two `mysched status` calls

    def __init__(self, url: Optional[str] = None,
                 config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(url=url, config=config)
        self._jobs: Dict[str, Job] = {}  # native id -> job not final yet
        self._lock = threading.Lock()
        self._poller: Optional[threading.Thread] = None

    def submit(self, job: Job) -> None:
        spec = self._check_job(job)  # raises for a bad job; binds it to this executor
        try:
            native_id = _mysched("submit", *self._submit_args(spec)).strip()
        except BaseException:
            job.executor = None  # leave the job as it was: NEW and unbound
            raise
        job._native_id = native_id
        self._set_job_status(job, JobStatus(JobState.QUEUED))
        self._track(job, native_id)

    @staticmethod
    def _submit_args(spec: JobSpec) -> List[str]:
        if spec.executable is None:
            raise InvalidJobException("JobSpec.executable: a job needs an executable")
        processes = (spec.resources.computed_process_count
                     if isinstance(spec.resources, ResourceSpecV1) else 1)
        minutes = max(1, int(spec.attributes.duration.total_seconds() // 60))
        return ["--cores", str(processes), "--time", str(minutes), "--",
                spec.executable, *(spec.arguments or [])]

    def attach(self, job: Job, native_id: str) -> None:
        if job.status.state is not JobState.NEW or job.executor is not None:
            raise InvalidJobException(f"job {job.id}: only a new job can be attached")
        job.executor = self
        job._native_id = native_id
        self._track(job, native_id)  # the next poll reports the job's current state

    def cancel(self, job: Job) -> None:
        if job.native_id is not None and not job.status.final:
            _mysched("cancel", job.native_id)  # the next poll reports CANCELED

    def list(self) -> List[str]:
        return _mysched("list").split()

    def _track(self, job: Job, native_id: str) -> None:
        with self._lock:
            self._jobs[native_id] = job
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll, daemon=True)
                self._poller.start()

    def _poll(self) -> None:
        while True:
            time.sleep(self.poll_interval)
            with self._lock:
                if not self._jobs:
                    self._poller = None
                    return
                ids = list(self._jobs)
            try:
                out = _mysched("status", *ids)  # one command for all jobs
            except SubmitException as ex:
                logger.warning("%s; retrying at the next poll", ex)
                continue
            for line in out.splitlines():  # "<id> <state letter> <exit code or ->"
                native_id, letter, code = line.split()
                status = JobStatus(_STATES[letter],
                                   exit_code=None if code == "-" else int(code))
                with self._lock:
                    job = self._jobs.get(native_id)
                    if job is not None and status.final:
                        del self._jobs[native_id]  # nothing more to poll for
                if job is not None:
                    self._set_job_status(job, status)
