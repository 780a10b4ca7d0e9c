"""psij.registry (and its store and recorder) for jobs run again (``psij.requeue``,
``psij.retry``): the row keeps the job's attempt and its last rerun, goes back to QUEUED for a
later run (never for an earlier one), gets the new native id of a job submitted again, a
registry made before the attempt existed gets the column, and a job attached again keeps its
attempt without being run again by the process that follows it.

The executor is a small one that runs jobs again itself (``_RERUNS = "submits"``), written in
the test; everything else is the real registry on real files.
"""

import json
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest

import psij.registry
from psij import (
    Job,
    JobAttributes,
    JobExecutor,
    JobExecutorConfig,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
)
from support.rerunning import PlayedRuns

WAIT = timedelta(seconds=60)
OOM = {"cause": "out_of_memory"}


class Rerunning(PlayedRuns):
    """Runs a job at once: its run ``n`` ends with ``ends[n - 1]`` (a status, or None to stay
    ACTIVE; COMPLETED past the list). Runs again itself (``_run_again``)."""

    _RERUNS = "submits"

    def __init__(self, wd: Path, ends: List[Optional[JobStatus]], hold_rerun: bool = False
                 ) -> None:
        super().__init__(config=JobExecutorConfig(work_directory=wd))
        self.ends = ends
        self.hold_rerun = hold_rerun  # a rerun stays QUEUED (only its native id is told)
        self.started: List[Tuple[Optional[int], float]] = []
        self.attached: List[str] = []

    def _start(self, job: Job) -> None:
        assert job.spec is not None
        self.started.append((getattr(job.spec.resources, "memory", None),
                             job.spec.attributes.duration.total_seconds()))
        n = len(self.started)
        job._native_id = f"n{n}"
        if n > 1 and self.hold_rerun:
            return
        self._set_job_status(job, JobStatus(JobState.QUEUED))
        self._set_job_status(job, JobStatus(JobState.ACTIVE))
        end = self.ends[n - 1] if n <= len(self.ends) else JobStatus(JobState.COMPLETED,
                                                                     exit_code=0)
        if end is not None:
            self._set_job_status(job, end)

    def attach(self, job: Job, native_id: str) -> None:
        super().attach(job, native_id)
        self.attached.append(native_id)


def retried(attempts: int = 3) -> Job:
    return Job(JobSpec("/bin/true", resources=ResourceSpecV1(memory=1000),
                       attributes=JobAttributes(duration=timedelta(seconds=60), custom_attributes={
                           "psij.retry": f"attempts={attempts},on=out_of_memory,memory=2"})))


def failed_oom() -> JobStatus:
    return JobStatus(JobState.FAILED, exit_code=137, metadata=dict(OOM))


def row(wd: Path, job_id: str) -> Tuple[Any, ...]:
    conn = sqlite3.connect(wd / "jobs.sqlite")
    try:
        found = conn.execute("SELECT state, native_id, attempt, rerun, exit_code FROM jobs "
                             "WHERE id = ?", (job_id,)).fetchone()
    finally:
        conn.close()
    assert found is not None
    return tuple(found)


def test_a_job_run_again_is_recorded_with_its_attempt_and_last_rerun(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Rerunning(wd, [failed_oom(), failed_oom()])
    job = retried()
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.COMPLETED
    assert ex.started == [(1000, 60.0), (2000, 60.0), (4000, 60.0)]
    assert psij.registry.flush(WAIT)
    state, native_id, attempt, rerun, code = row(wd, job.id)
    assert (state, native_id, attempt, code) == ("COMPLETED", "n3", 3, 0)
    assert json.loads(rerun) == {"rerun": "retry", "cause": "out_of_memory", "requeues": 0,
                                 "retries": 2}
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert (rec.attempt, rec.rerun, rec.rerun_cause, rec.requeues, rec.retries) == (
        3, "retry", "out_of_memory", 0, 2)
    view = rec.to_json()
    assert view["attempt"] == 3 and view["rerun"] == {
        "rerun": "retry", "cause": "out_of_memory", "requeues": 0, "retries": 2}


def test_a_job_run_once_is_attempt_1_without_a_rerun(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Rerunning(wd, [])
    job = retried()
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.COMPLETED
    assert psij.registry.flush(WAIT)
    assert row(wd, job.id) == ("COMPLETED", "n1", 1, None, 0)
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert (rec.attempt, rec.rerun, rec.rerun_cause) == (1, None, None)
    assert rec.to_json()["attempt"] == 1 and rec.to_json()["rerun"] is None


def test_a_rerun_goes_back_to_queued_with_the_new_native_id(tmp_path: Path) -> None:
    # The row was ACTIVE (then the run failed): the next run's QUEUED is written although its
    # state is an earlier one, and the native id the executor gave it on submitting it again
    # is written before the run changes state.
    wd = tmp_path / "work"
    ex = Rerunning(wd, [None], hold_rerun=True)
    job = retried()
    ex.submit(job)
    assert psij.registry.flush(WAIT)
    assert row(wd, job.id)[:3] == ("ACTIVE", "n1", 1)
    ex._set_job_status(job, failed_oom())
    assert job.status.state is JobState.QUEUED and job.native_id == "n2"
    assert psij.registry.flush(WAIT)
    state, native_id, attempt, rerun, _ = row(wd, job.id)
    assert (state, native_id, attempt) == ("QUEUED", "n2", 2)
    assert json.loads(rerun)["cause"] == "out_of_memory"
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert rec.message is not None and "retried after out_of_memory" in rec.message


def test_changes_of_an_earlier_run_never_overwrite_a_later_one(tmp_path: Path,
                                                               monkeypatch: Any) -> None:
    # Changes queued out of order across runs: the first run's ACTIVE after the second run's
    # QUEUED, in one batch (a new row) and across batches (an update).
    from psij._registry import recorder

    wd = tmp_path / "work"
    puts: List[Any] = []
    writer = recorder._Writer()
    monkeypatch.setattr(recorder, "_WRITER", writer)
    monkeypatch.setattr(writer, "put", puts.append)
    fresh, known = retried(), retried()
    for job in (fresh, known):
        ex = Rerunning(wd, [failed_oom(), None])
        ex.submit(job)
        assert job.status.state is JobState.ACTIVE
    for job in (fresh, known):
        mine = [c for c in puts if c[1] is job]
        # QUEUED, ACTIVE (run 1), QUEUED (run 2, the rerun), the new native id, QUEUED,
        # ACTIVE (run 2)
        assert [c[3][7] for c in mine] == [1, 1, 2, 2, 2]
        queued_again = mine[2]
        first_active = mine[1]
        if job is known:
            writer._write(recorder._resolved([mine[0]]))  # the row exists
            writer._write(recorder._resolved([queued_again]))
            writer._write(recorder._resolved([first_active]))
        else:
            writer._write(recorder._resolved([mine[0], queued_again, first_active]))
        assert row(wd, job.id)[:3] == ("QUEUED", "n1", 2)
        writer._write(recorder._resolved([mine[-1]]))
        assert row(wd, job.id)[:3] == ("ACTIVE", "n2", 2)


# The jobs table as versions before the attempt made it.
OLD_SCHEMA = """
CREATE TABLE jobs (
    id TEXT NOT NULL UNIQUE, executor TEXT NOT NULL, executor_version TEXT, url TEXT,
    config TEXT, native_id TEXT, spec TEXT, tag TEXT, submitted REAL NOT NULL,
    state TEXT NOT NULL, rank INTEGER NOT NULL, exit_code INTEGER, message TEXT,
    updated REAL NOT NULL, final INTEGER NOT NULL
);
CREATE INDEX jobs_by_tag ON jobs(tag) WHERE tag IS NOT NULL;
CREATE TABLE local_runs (
    pid INTEGER NOT NULL, start TEXT NOT NULL, job_id TEXT, exit_code INTEGER,
    ended INTEGER NOT NULL DEFAULT 0, canceled INTEGER NOT NULL DEFAULT 0,
    updated REAL NOT NULL, PRIMARY KEY (pid, start)
);
INSERT INTO jobs VALUES ('old-1', 'local', '0.1', NULL, '{}', '4242', NULL, 'before',
                         CAST(strftime('%s', 'now') AS REAL), 'COMPLETED', 6, 0, NULL,
                         CAST(strftime('%s', 'now') AS REAL), 1);
"""


def test_a_registry_made_before_the_attempt_gets_the_column(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    wd.mkdir(mode=0o700)
    path = wd / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("PRAGMA journal_mode=WAL;" + OLD_SCHEMA)
    conn.close()
    path.chmod(0o600)
    [old] = psij.registry.find(work_directory=wd)
    assert (old.id, old.state, old.native_id, old.attempt, old.rerun) == (
        "old-1", JobState.COMPLETED, "4242", 1, None)
    conn = sqlite3.connect(path)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    finally:
        conn.close()
    assert columns[15:] == ["attempt", "rerun", "held", "holder", "cause", "started_at",
                            "ended_at", "cpu_seconds", "max_rss_bytes", "queued_at", "nodes",
                            "cores", "requested_memory_bytes", "requested_seconds",
                            "held_from", "held_to"]
    # Jobs are recorded in it as in a new one.
    ex = Rerunning(wd, [failed_oom()])
    job = retried()
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.COMPLETED
    assert psij.registry.flush(WAIT)
    assert row(wd, job.id)[:3] == ("COMPLETED", "n2", 2)
    assert row(wd, "old-1") == ("COMPLETED", "4242", 1, None, 0)


def test_a_registry_missing_other_columns_is_still_refused(tmp_path: Path) -> None:
    # Only a table of ours made before the added columns is changed; another is an error and
    # is left as it is.
    wd = tmp_path / "work"
    wd.mkdir(mode=0o700)
    path = wd / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript("PRAGMA journal_mode=WAL; CREATE TABLE jobs (id TEXT, state TEXT, "
                       "attempt INTEGER);")
    conn.close()
    path.chmod(0o600)
    with pytest.raises(psij.registry.RegistryError, match="columns"):
        psij.registry.find(work_directory=wd)
    conn = sqlite3.connect(path)
    try:
        assert [r[1] for r in conn.execute("PRAGMA table_info(jobs)")] == [
            "id", "state", "attempt"]
    finally:
        conn.close()


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"rerun": 5, "cause": ["x"], '
                                  '"requeues": -3, "retries": true}', ""])
def test_a_rerun_column_that_cannot_be_read_is_left_out(text: str) -> None:
    from psij.registry import _rerun_of

    assert _rerun_of(text) == (None, None, 0, 0)


def _recorded(tmp_path: Path, ends: List[Optional[JobStatus]]) -> Tuple[Path, Job]:
    wd = tmp_path / "work"
    job = retried()
    Rerunning(wd, ends).submit(job)
    assert psij.registry.flush(WAIT)
    return wd, job


def test_a_job_attached_again_keeps_its_attempt(tmp_path: Path, monkeypatch: Any) -> None:
    # Run 2 is ACTIVE when another process attaches the job: its statuses from then on hold
    # attempt 2, and its row goes on being written (an attempt 1 would be an earlier run's,
    # which the registry does not write over a later one).
    wd, job = _recorded(tmp_path, [failed_oom(), None])
    follower = Rerunning(wd, [])
    monkeypatch.setattr(psij.registry, "_executor_for", lambda record, cache: follower)
    [again] = psij.registry.reattach(job.id, work_directory=wd)
    assert again is not job and again.id == job.id and follower.attached == ["n2"]
    follower._set_job_status(again, JobStatus(JobState.ACTIVE))
    follower._set_job_status(again, JobStatus(JobState.COMPLETED, exit_code=0))
    status = again.wait(WAIT)
    assert status.state is JobState.COMPLETED and (status.metadata or {})["attempt"] == 2
    assert psij.registry.flush(WAIT)
    assert row(wd, job.id)[:3] == ("COMPLETED", "n2", 2)


def test_a_followed_job_is_not_run_again_by_its_follower(tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    # The process that submitted it (or its scheduler) runs it again; a second one doing so
    # would run it twice.
    wd, job = _recorded(tmp_path, [failed_oom(), None])
    follower = Rerunning(wd, [])
    monkeypatch.setattr(psij.registry, "_executor_for", lambda record, cache: follower)
    [again] = psij.registry.reattach(job.id, work_directory=wd)
    follower._set_job_status(again, failed_oom())
    status = again.wait(WAIT)
    assert status.state is JobState.FAILED and (status.metadata or {})["attempt"] == 2
    assert follower.started == []


def test_a_final_job_attached_again_has_its_attempt_in_its_status(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    wd, job = _recorded(tmp_path, [failed_oom()])
    monkeypatch.setattr(psij.registry, "_executor_for",
                        lambda record, cache: Rerunning(wd, []))
    [again] = psij.registry.reattach(job.id, work_directory=wd)
    status = again.status
    assert status.state is JobState.COMPLETED
    assert status.metadata == {"attempt": 2, "rerun": "retry", "cause": "out_of_memory"}


@pytest.mark.parametrize("attempt", [True, 0, -1, "3", 2.0, 2 ** 70, None, [2]])
def test_a_hostile_attempt_in_a_status_is_recorded_as_none(tmp_path: Path,
                                                           attempt: Any) -> None:
    # A status from another host or a plugin says what it likes; the row gets attempt 1,
    # and the other jobs of the same write are recorded all the same.
    wd = tmp_path / "work"
    ex = Says(wd)
    odd, plain = Job(JobSpec("/bin/true")), Job(JobSpec("/bin/true"))
    for job in (odd, plain):
        ex.submit(job)
    ex._set_job_status(odd, JobStatus(JobState.FAILED, exit_code=1, metadata={
        "attempt": attempt, "rerun": "x" * 10000, "cause": 7}))
    ex._set_job_status(plain, JobStatus(JobState.COMPLETED, exit_code=0))
    assert psij.registry.flush(WAIT)
    assert row(wd, odd.id) == ("FAILED", "s-1", 1, None, 1)
    assert row(wd, plain.id) == ("COMPLETED", "s-1", 1, None, 0)
    [rec] = psij.registry.find(odd.id, work_directory=wd)
    assert rec.attempt == 1 and rec.to_json()["rerun"] is None


def test_the_attempt_a_status_gives_is_recorded_for_a_job_without_runs(tmp_path: Path
                                                                        ) -> None:
    # A job this process does not run again (a side-loaded executor that reports runs
    # itself): its status's attempt and rerun are recorded, a long cause cut to 200.
    wd = tmp_path / "work"
    ex = Says(wd)
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    ex._set_job_status(job, JobStatus(JobState.ACTIVE, metadata={
        "attempt": 3, "rerun": "requeue", "cause": "c" * 1000}))
    assert psij.registry.flush(WAIT)
    state, _, attempt, rerun, _ = row(wd, job.id)
    assert (state, attempt) == ("ACTIVE", 3)
    assert json.loads(rerun) == {"rerun": "requeue", "cause": "c" * 200, "requeues": None,
                                 "retries": None}
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert (rec.rerun, rec.requeues, rec.retries) == ("requeue", 0, 0)


class Says(JobExecutor):
    """A side-loaded executor whose statuses carry the metadata it is given."""

    def __init__(self, wd: Path) -> None:
        super().__init__(config=JobExecutorConfig(work_directory=wd))

    def submit(self, job: Job) -> None:
        job.executor = self
        job._native_id = "s-1"
        self._set_job_status(job, JobStatus(JobState.QUEUED))

    def cancel(self, job: Job) -> None:
        pass

    def list(self) -> List[str]:
        return []

    def attach(self, job: Job, native_id: str) -> None:
        pass
