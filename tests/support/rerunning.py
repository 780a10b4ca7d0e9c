"""A base for test executors that play each run of a job and run jobs again (psij._retry):
subclasses write ``_start(job)``, which plays one run; submit checks the job and plays its
first run, ``_run_again`` the next. Cancel does nothing, list knows no job, attach binds."""

from typing import Any, List

from psij import Job, JobExecutor


class PlayedRuns(JobExecutor):
    _RERUNS = "submits"

    def submit(self, job: Job) -> None:
        self._check_job(job)
        self._start(job)

    def _start(self, job: Job) -> None:
        raise NotImplementedError

    def _run_again(self, job: Job, rerun: Any) -> None:
        self._start(job)

    def cancel(self, job: Job) -> None:
        pass

    def list(self) -> List[str]:
        return []

    def attach(self, job: Job, native_id: str) -> None:
        job.executor = self
        job._native_id = native_id
