"""Starts and ends seen from the job's own files on the real Slurm and Grid Engine, with the
status poll set to 300 s so that only the files can tell them within seconds: an end is seen
within 3 s of the job's own end time (when final statuses do not wait for the scheduler's
record of the run, ``accounting_wait=0``); a job the scheduler ends (time limit, a cancel from
outside psij) still gets the scheduler's cause, as with status polls alone; a job whose files
are garbled or removed while it runs is not given a wrong state. All jobs of one scheduler are
submitted together (the time limit takes a minute on Slurm)."""

import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, JobStatus
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from real.test_batch_real import SCHEDULERS, _need, _scheduler_problem
from support.campaigns import Campaigns

WAIT = timedelta(seconds=240)
SEEN_WITHIN = 3.0
# The job writes its own end time (seconds since the epoch) to $1 as its last act.
END_STAMP = 'sleep 1; date +%s.%N > "$1"; exit "$2"'


class Campaign:
    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        # accounting_wait=0: the end as soon as it is seen, without waiting for the
        # scheduler's record of the run (test_batch_figures_real checks those figures).
        self.config = BatchSchedulerExecutorConfig(work_directory=work / "psij",
                                                   queue_polling_interval=300,
                                                   initial_queue_polling_delay=300,
                                                   accounting_wait=0)
        self.ex = JobExecutor.get_instance(name, config=self.config)
        self.jobs: Dict[str, Job] = {}
        self.seen: Dict[str, List[Tuple[float, JobStatus]]] = {}

    def submit(self, key: str, spec: JobSpec) -> Job:
        job = Job(spec)
        seen = self.seen[key] = []
        job.set_job_status_callback(lambda j, status: seen.append((time.time(), status)))
        self.ex.submit(job)
        self.jobs[key] = job
        return job

    def final(self, key: str) -> JobStatus:
        status = self.jobs[key].wait(WAIT)
        assert status is not None, f"{self.name} job {key} not done"
        return status


def _start(name: str, work: Path) -> Campaign:
    c = Campaign(name, work)
    for key, code in (("ok", 0), ("exit3", 3)):
        c.submit(key, JobSpec("/bin/sh", ["-c", END_STAMP, "sh", str(work / key), str(code)]))
    c.submit("outside", JobSpec("/bin/sleep", ["600"]))
    limit = timedelta(minutes=1) if name == "slurm" else timedelta(seconds=5)
    c.submit("timeout", JobSpec("/bin/sleep", ["600"], attributes=JobAttributes(duration=limit)))
    native = "$SLURM_JOB_ID" if name == "slurm" else "$JOB_ID"
    files = c.ex.work_directory  # type: ignore[attr-defined]
    # Garbles its end file and removes its start file, then waits for the test's word.
    garble = (f'echo not a status > "{files}/{native}.ec"; rm -f "{files}/{native}.starts"; '
              f'touch "{work}/garbled"; i=0; while [ ! -e "{work}/go" ] && [ $i -lt 1200 ]; '
              f'do sleep 0.2; i=$((i + 1)); done; exit 0')
    c.submit("garbled", JobSpec("/bin/sh", ["-c", garble]))
    return c


_campaigns = Campaigns(_start, lambda name: _scheduler_problem(name) is None)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("file-ends")

    def close(c: Campaign) -> None:
        for job in c.jobs.values():
            if not job.status.state.final:
                try:
                    job.cancel()
                except Exception:
                    pass
        c.ex.close()

    _campaigns.close_all(close)


def campaign(name: str, root: Path) -> Campaign:
    _need(name)
    return _campaigns.get(name, root)


def _when(c: Campaign, key: str, state: JobState) -> float:
    [at] = [t for t, status in c.seen[key] if status.state is state]
    return at


@pytest.mark.parametrize("name", SCHEDULERS)
def test_an_end_is_seen_within_3_s_of_the_jobs_own_end_with_a_300_s_poll(
        name: str, root: Path) -> None:
    c = campaign(name, root)
    status = c.final("ok")
    assert status.state is JobState.COMPLETED and status.exit_code == 0, status
    assert status.metadata is not None and status.metadata["source"] == "job file"
    ended = float((c.work / "ok").read_text())
    assert _when(c, "ok", JobState.COMPLETED) - ended < SEEN_WITHIN
    assert _when(c, "ok", JobState.ACTIVE) <= _when(c, "ok", JobState.COMPLETED)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_failed_end_is_seen_with_the_schedulers_word_in_seconds(name: str,
                                                                  root: Path) -> None:
    c = campaign(name, root)
    status = c.final("exit3")
    assert status.state is JobState.FAILED and status.exit_code == 3, status
    assert "code 3" in str(status.message)
    ended = float((c.work / "exit3").read_text())
    # Confirmed by a status command a second after the file told the end (not 300 s later).
    assert _when(c, "exit3", JobState.FAILED) - ended < 20


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_time_limit_keeps_the_schedulers_cause(name: str, root: Path) -> None:
    status = campaign(name, root).final("timeout")
    assert status.state is JobState.FAILED, status
    assert "time limit" in str(status.message), status


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_cancel_from_outside_psij_gets_the_same_end_as_with_polls_alone(
        name: str, root: Path) -> None:
    c = campaign(name, root)
    job = c.jobs["outside"]
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    time.sleep(1)
    assert job.native_id is not None
    subprocess.run(["scancel" if name == "slurm" else "qdel", job.native_id],
                   capture_output=True, timeout=60, check=True)
    status = c.final("outside")
    # What the same cancel gave with status polls only (the scheduler's word, as before).
    if name == "slurm":
        assert status.state is JobState.CANCELED, status
        assert "cancelled outside" in str(status.message), status
    else:  # Grid Engine's accounting does not tell a qdel apart: the job's TERM is what is known
        assert status.state is JobState.FAILED and status.exit_code == 143, status


@pytest.mark.parametrize("name", SCHEDULERS)
def test_files_garbled_or_removed_while_the_job_runs_give_no_wrong_state(
        name: str, root: Path) -> None:
    c = campaign(name, root)
    deadline = time.monotonic() + WAIT.total_seconds()
    while not (c.work / "garbled").exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.5)  # several looks at the garbled files
    job = c.jobs["garbled"]
    assert job.status.state is JobState.ACTIVE, job.status
    (c.work / "go").touch()
    status = c.final("garbled")
    assert status.state is JobState.COMPLETED and status.exit_code == 0, status
    assert [s.state for _, s in c.seen["garbled"]].count(JobState.COMPLETED) == 1
