"""The registry's figures of a job's runs: the columns of ``jobs`` a final status fills
(queued_at, nodes, cores, requested memory and duration; hostile values left out, also when
read back), psij's own holding (held_from, held_to; by hand and by a batch executor's cap),
the ``runs`` table (one row per run, the run before a rerun ended with its cause and figures;
a local job's measured runs; a final state only the keeper wrote), each run's output kept
(``<path>.<run>`` on the batch executors: real runs of the fake batch-test scheduler, and every
scheduler's script), a registry made by the version before these columns opened and written,
and ``psij status --runs``. The figures the schedulers' accounting gives are fed as status
metadata here; tests/real checks a real Slurm and Grid Engine requeue."""

import json
import math
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

import pytest

import psij.registry
from psij import Job, JobAttributes, JobExecutor, JobExecutorConfig, JobSpec, JobState, JobStatus
from psij._registry import held as held_marks
from psij._registry.accounting import NO_USE, USE_KEYS, use_of
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from support.rerunning import PlayedRuns

WAIT = timedelta(seconds=60)
PSIJ = str(Path(sys.executable).parent / "psij")
FIGURES = {"queued_at": 1700000000.0, "started_at": 1700000010.5,
           "ended_at": 1700000070.25, "cpu_seconds": 118.5, "max_rss_bytes": 300 << 20,
           "nodes": "n1,n2", "cores": 8, "requested_memory_bytes": 4 << 30,
           "requested_seconds": 3600.0}


class Told(PlayedRuns):
    """Reports the statuses a test gives it (``play``), nothing more."""

    def __init__(self, wd: Path) -> None:
        super().__init__(config=JobExecutorConfig(work_directory=wd))

    def _start(self, job: Job) -> None:
        job._native_id = "77"

    def play(self, job: Job, *statuses: JobStatus) -> None:
        for status in statuses:
            self._set_job_status(job, status)


def _job() -> Job:
    return Job(JobSpec("/bin/true", stdout_path=Path("/tmp/x.out")))


# -- the figures' checks -------------------------------------------------------------------

@pytest.mark.parametrize("key", [k for k in USE_KEYS if k != "nodes"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, -0.5, True, False, "12",
                                 b"12", None, [1], 1 << 70, 1e300, -(1 << 70)])
def test_a_figure_that_is_not_sound_is_left_out(key: str, bad: Any) -> None:
    assert use_of({key: bad}, True) == NO_USE


@pytest.mark.parametrize("bad", [12, 1.5, True, None, b"n1", ["n1"], "\ud800", "n1\nn2",
                                 "n1\x1b[31m", "", "   ", "x" * 100_001])
def test_a_node_list_that_is_not_sound_is_left_out(bad: Any) -> None:
    assert use_of({"nodes": bad}, True) == NO_USE


def test_sound_figures_are_kept_each_as_its_type() -> None:
    kept = dict(zip(USE_KEYS, use_of(FIGURES, True)))
    assert kept == FIGURES
    assert use_of(FIGURES, False) == NO_USE  # a status not final: the job's row has none
    # Numbers of the other kind: a count is never a float, a time may be an int.
    odd = dict(zip(USE_KEYS, use_of({"cores": 2.0, "max_rss_bytes": 1.5e6, "started_at": 5,
                                     "nodes": " n3 "}, True)))
    assert (odd["cores"], odd["max_rss_bytes"], odd["started_at"], odd["nodes"]) == (
        None, None, 5.0, "n3")
    assert use_of({"cores": 0}, True)[USE_KEYS.index("cores")] is None


def test_a_mapping_that_raises_gives_no_figures() -> None:
    class Broken(dict):  # type: ignore[type-arg]
        def get(self, *_: Any) -> Any:
            raise RuntimeError("no")

    assert use_of(Broken(a=1), True) == NO_USE


# -- the jobs table and the runs table -------------------------------------------------------

def _runs(wd: Path, job_id: str) -> List[psij.registry.RunRecord]:
    assert psij.registry.flush(WAIT)
    return psij.registry.runs(job_id, work_directory=wd)


def test_a_final_status_fills_the_columns_and_its_run_keeps_the_start(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    ex.submit(job)
    ex.play(job, JobStatus(JobState.QUEUED, metadata={"native_id": "77"}))
    assert psij.registry.flush(WAIT)  # its own batch: the ACTIVE below is written alone
    ex.play(job, JobStatus(JobState.ACTIVE, metadata={"started_at": FIGURES["started_at"]}))
    assert psij.registry.flush(WAIT)
    final = {k: v for k, v in FIGURES.items() if k != "started_at"}
    ex.play(job, JobStatus(JobState.COMPLETED, exit_code=0,
                           metadata={**final, "cores": float("nan"), "nodes": "n1,n2"}))
    assert psij.registry.flush(WAIT)
    [rec] = psij.registry.find(job.id, work_directory=wd)
    # The job's row holds what its final status told, the NaN left out, and the start its
    # ACTIVE status told.
    assert (rec.queued_at, rec.nodes, rec.cores, rec.requested_memory_bytes,
            rec.requested_seconds, rec.started_at) == (
        FIGURES["queued_at"], "n1,n2", None, 4 << 30, 3600.0, FIGURES["started_at"])
    view = rec.to_json()
    assert view["queued_at"] == "2023-11-14T22:13:20.000+00:00"
    assert (view["nodes"], view["cores"], view["requested_seconds"]) == ("n1,n2", None, 3600.0)
    assert view["held_from"] is None and view["held_to"] is None
    # Its run holds what any status told: the start from ACTIVE too.
    [run] = _runs(wd, job.id)
    assert (run.run, run.native_id, run.state, run.exit_code) == (1, "77", "COMPLETED", 0)
    assert (run.started_at, run.ended_at, run.cpu_seconds, run.queued_at) == (
        FIGURES["started_at"], FIGURES["ended_at"], 118.5, FIGURES["queued_at"])
    assert run.stdout_path == "/tmp/x.out" and run.stderr_path is None
    assert run.to_json()["started_at"] == "2023-11-14T22:13:30.500+00:00"


def test_statuses_written_in_one_batch_keep_each_figure(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    ex.submit(job)
    # No flush between them: the writer keeps the final status, and the start with it.
    ex.play(job, JobStatus(JobState.QUEUED, metadata={"native_id": "77"}),
            JobStatus(JobState.ACTIVE, metadata={"started_at": 10.0}),
            JobStatus(JobState.FAILED, exit_code=3, metadata={"ended_at": 12.0,
                                                              "cause": "oops"}))
    [run] = _runs(wd, job.id)
    assert (run.state, run.exit_code, run.cause, run.started_at, run.ended_at) == (
        "FAILED", 3, "oops", 10.0, 12.0)


def test_the_queued_time_is_psijs_when_the_scheduler_does_not_say(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    before = time.time()
    ex.submit(job)
    ex.play(job, JobStatus(JobState.QUEUED, metadata={"native_id": "77"}))
    [run] = _runs(wd, job.id)
    assert run.queued_at is not None and before <= run.queued_at <= time.time()


class Rerunning(PlayedRuns):
    """Runs a job at once; its first run ends FAILED out of memory with figures, the next
    completes. Runs again itself; keeps each run's output as the batch executors do."""

    _RERUNS = "submits"
    _psij_keeps_run_outputs = True

    def __init__(self, wd: Path) -> None:
        super().__init__(config=JobExecutorConfig(work_directory=wd))
        self.n = 0

    def _start(self, job: Job) -> None:
        self.n += 1
        job._native_id = f"n{self.n}"
        self._set_job_status(job, JobStatus(JobState.QUEUED))
        self._set_job_status(job, JobStatus(JobState.ACTIVE,
                                            metadata={"started_at": 100.0 * self.n}))
        if self.n == 1:
            self._set_job_status(job, JobStatus(JobState.FAILED, exit_code=137, metadata={
                "cause": "out_of_memory", "ended_at": 150.0, "max_rss_bytes": 1000,
                "cpu_seconds": float("inf")}))
        else:
            self._set_job_status(job, JobStatus(JobState.COMPLETED, exit_code=0,
                                                metadata={"ended_at": 250.0}))


def test_each_run_of_a_job_run_again_has_its_row(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Rerunning(wd)
    job = Job(JobSpec("/bin/true", stdout_path=Path("out"), stderr_path=Path("err"),
                      directory=tmp_path, attributes=JobAttributes(custom_attributes={
                          "psij.retry": "attempts=2,on=out_of_memory"})))
    from psij import ResourceSpecV1

    assert job.spec is not None
    job.spec.resources = ResourceSpecV1(memory=1000)
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.COMPLETED  # type: ignore[union-attr]
    first, second = _runs(wd, job.id)
    assert (first.run, first.native_id, first.state, first.exit_code, first.cause) == (
        1, "n1", "FAILED", 137, "out_of_memory")
    assert (first.started_at, first.ended_at, first.max_rss_bytes, first.cpu_seconds) == (
        100.0, 150.0, 1000, None)
    assert (second.run, second.native_id, second.state, second.exit_code) == (
        2, "n2", "COMPLETED", 0)
    assert (second.started_at, second.ended_at) == (200.0, 250.0)
    # The first run's output was moved aside by the second; relative paths are the job's
    # directory's.
    assert (first.stdout_path, first.stderr_path) == (f"{tmp_path}/out.1", f"{tmp_path}/err.1")
    assert (second.stdout_path, second.stderr_path) == (f"{tmp_path}/out", f"{tmp_path}/err")


def test_held_from_and_to_are_recorded_when_psij_holds_a_job(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    job.executor = ex
    before = time.time()
    held_marks.mark(ex, [job], held_marks.HELD)
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert rec.held_from is not None and before <= rec.held_from and rec.held_to is None
    held_marks.mark(ex, [job], held_marks.SUBMITTING)
    [same] = psij.registry.find(job.id, work_directory=wd)
    assert (same.held_from, same.held_to) == (rec.held_from, None)
    job._native_id = "77"
    held_marks.mark(ex, [job], None)
    [done] = psij.registry.find(job.id, work_directory=wd)
    assert done.held_from == rec.held_from
    assert done.held_to is not None and rec.held_from <= done.held_to <= time.time()
    ex.play(job, JobStatus(JobState.QUEUED, metadata={"native_id": "77"}))
    [run] = _runs(wd, job.id)
    assert (run.held_from, run.held_to) == (done.held_from, done.held_to)
    # Not held again by a later mark that only says it is no longer held.
    held_marks.mark(ex, [job], None)
    [again] = psij.registry.find(job.id, work_directory=wd)
    assert again.held_to == done.held_to


def test_a_batch_job_held_by_the_cap_shows_how_long_psij_held_it(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=0.5,
                                  max_queued_per_shape=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    try:
        jobs = [Job(JobSpec("/bin/sleep", ["1"])) for _ in range(2)]
        for job in jobs:
            ex.submit(job)
        for job in jobs:
            st = job.wait(WAIT)
            assert st is not None and st.state is JobState.COMPLETED, st
    finally:
        ex.close()
    assert psij.registry.flush(WAIT)
    first, second = psij.registry.find([j.id for j in jobs], work_directory=cfg.work_directory)
    assert (first.held_from, first.held_to) == (None, None)
    assert second.held_from is not None and second.held_to is not None
    assert second.held_from <= second.held_to
    view = second.to_json()
    assert view["held_from"] is not None and view["held_to"] is not None
    # It was given to the scheduler once the cap let it go, after it was held.
    [run] = psij.registry.runs(second)
    assert (run.held_from, run.held_to) == (second.held_from, second.held_to)
    assert run.queued_at is not None and second.held_from <= run.queued_at


def test_a_job_never_held_has_no_held_times(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    ex.submit(job)
    job.executor = ex
    held_marks.mark(ex, [job], None)
    ex.play(job, JobStatus(JobState.COMPLETED, exit_code=0))
    assert psij.registry.flush(WAIT)
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert (rec.held_from, rec.held_to) == (None, None)


def test_a_final_state_only_the_jobs_row_has_is_its_last_runs(tmp_path: Path) -> None:
    # The local executor's keeper writes the final state of a job whose submitter is gone
    # into the job's row alone.
    from psij.executors.local._keeper_rows import FINAL_SQL

    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    ex.submit(job)
    ex.play(job, JobStatus(JobState.QUEUED, metadata={"native_id": "77"}),
            JobStatus(JobState.ACTIVE))
    assert psij.registry.flush(WAIT)
    conn = sqlite3.connect(wd / "jobs.sqlite")
    try:
        with conn:
            conn.execute(FINAL_SQL, ("FAILED", 6, 3, "exit 3", time.time(), 1.0, 2.0, 0.5, 4096,
                                     job.id))
    finally:
        conn.close()
    [run] = psij.registry.runs(job.id, work_directory=wd)
    assert (run.state, run.exit_code, run.message, run.started_at, run.cpu_seconds,
            run.max_rss_bytes) == ("FAILED", 3, "exit 3", 1.0, 0.5, 4096)


# -- a registry made before ------------------------------------------------------------------

_OLD_COLUMNS = (
    "id TEXT NOT NULL UNIQUE, executor TEXT NOT NULL, executor_version TEXT, url TEXT, "
    "config TEXT, native_id TEXT, spec TEXT, tag TEXT, submitted REAL NOT NULL, state TEXT "
    "NOT NULL, rank INTEGER NOT NULL, exit_code INTEGER, message TEXT, updated REAL NOT NULL, "
    "final INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 1, rerun TEXT, held TEXT, "
    "holder TEXT, cause TEXT, started_at REAL, ended_at REAL, cpu_seconds REAL, "
    "max_rss_bytes INTEGER")


def _old_registry(wd: Path) -> Path:
    wd.mkdir(parents=True, mode=0o700)
    path = wd / "jobs.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        f"PRAGMA journal_mode=WAL; CREATE TABLE jobs ({_OLD_COLUMNS}); "
        "INSERT INTO jobs VALUES ('old-1', 'slurm', '0.1', NULL, '{}', '4242', NULL, NULL, 1e9, "
        "'COMPLETED', 6, 0, NULL, 1e9, 1, 1, NULL, NULL, NULL, NULL, 5.0, 9.0, 1.5, 4096);"
        "CREATE TABLE local_runs (pid INTEGER NOT NULL, start TEXT NOT NULL, job_id TEXT, "
        "exit_code INTEGER, ended INTEGER NOT NULL DEFAULT 0, canceled INTEGER NOT NULL "
        "DEFAULT 0, updated REAL NOT NULL, PRIMARY KEY (pid, start));")
    conn.close()
    path.chmod(0o600)
    return path


def test_a_registry_made_before_gets_the_columns_and_the_runs_table(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    path = _old_registry(wd)
    [old] = psij.registry.find(work_directory=wd)
    assert (old.id, old.started_at, old.cpu_seconds, old.max_rss_bytes, old.queued_at,
            old.nodes, old.held_from) == ("old-1", 5.0, 1.5, 4096, None, None, None)
    assert psij.registry.runs(old) == []  # recorded before runs were
    conn = sqlite3.connect(path)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                             "WHERE type = 'table'")}
    finally:
        conn.close()
    assert columns[-7:] == ["queued_at", "nodes", "cores", "requested_memory_bytes",
                            "requested_seconds", "held_from", "held_to"]
    assert "runs" in tables
    # New jobs are recorded in it as in a new one.
    ex = Told(wd)
    job = _job()
    ex.submit(job)
    ex.play(job, JobStatus(JobState.COMPLETED, exit_code=0, metadata=dict(FIGURES)))
    assert [r.state for r in _runs(wd, job.id)] == ["COMPLETED"]
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert (rec.nodes, rec.cores) == ("n1,n2", 8)


def test_a_registry_made_before_local_runs_gets_both_tables(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    path = _old_registry(wd)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE local_runs")
    conn.commit()
    conn.close()
    [old] = psij.registry.find(work_directory=wd)
    assert old.id == "old-1"
    conn = sqlite3.connect(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                             "WHERE type = 'table'")}
    finally:
        conn.close()
    assert {"jobs", "runs", "local_runs"} <= tables


def test_hostile_values_written_by_another_program_are_not_read_back(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    ex.submit(job)
    ex.play(job, JobStatus(JobState.COMPLETED, exit_code=0))
    assert psij.registry.flush(WAIT)
    conn = sqlite3.connect(wd / "jobs.sqlite")
    try:
        with conn:
            conn.execute("UPDATE jobs SET queued_at = -5, cores = 'many', "
                         "nodes = 'a' || char(10) || 'b', "
                         "held_from = 1e300, requested_seconds = ? WHERE id = ?",
                         (math.inf, job.id))
            conn.execute("UPDATE runs SET started_at = 'x', cores = -2, updated = 'y' "
                         "WHERE job_id = ?", (job.id,))
    finally:
        conn.close()
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert (rec.queued_at, rec.cores, rec.nodes, rec.held_from, rec.requested_seconds) == (
        None, None, None, None, None)
    json.dumps(rec.to_json(), allow_nan=False)
    [run] = psij.registry.runs(job.id, work_directory=wd)
    assert (run.started_at, run.cores) == (None, None)
    json.dumps(run.to_json(), allow_nan=False)


# -- a batch job's output, each run kept ---------------------------------------------------

@pytest.mark.parametrize("name", ["out", "o 'q' \"$(x)\" `y` * é"])
def test_a_requeued_batch_job_keeps_the_output_of_each_run(tmp_path: Path, name: str) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=0.5)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    try:
        job = Job(JobSpec("/bin/bash", ["-c", 'echo "run $PSIJ_ATTEMPT"; echo "e$PSIJ_ATTEMPT" '
                                        '>&2; [ "$PSIJ_ATTEMPT" = 1 ] && exit 85; exit 0'],
                          stdout_path=Path(name), stderr_path=tmp_path / "err",
                          directory=tmp_path,
                          attributes=JobAttributes(custom_attributes={"psij.requeue": 1})))
        ex.submit(job)
        first = job.native_id
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
    finally:
        ex.close()
    assert (tmp_path / f"{name}.1").read_text() == "run 1\n"
    assert (tmp_path / name).read_text() == "run 2\n"
    assert (tmp_path / "err.1").read_text() == "e1\n"
    assert (tmp_path / "err").read_text() == "e2\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(
        [name, f"{name}.1", "err", "err.1"])
    one, two = _runs(cfg.work_directory, job.id)
    assert (one.run, one.native_id, one.state, one.exit_code, one.cause) == (
        1, first, "FAILED", 85, "checkpoint")
    assert (two.run, two.native_id, two.state, two.exit_code) == (
        2, job.native_id, "COMPLETED", 0)
    assert (one.stdout_path, two.stdout_path) == (f"{tmp_path}/{name}.1", f"{tmp_path}/{name}")
    assert one.stderr_path == f"{tmp_path}/err.1" and two.stderr_path == f"{tmp_path}/err"


# -- psij status --runs ---------------------------------------------------------------------

def _psij(home: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    import os

    env = {**os.environ, "HOME": str(home)}
    return subprocess.run([PSIJ, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def _rerun_in(home: Path) -> Job:
    ex = Rerunning(home / ".psij" / "work")
    job = Job(JobSpec("/bin/true", stdout_path=home / "o", attributes=JobAttributes(
        custom_attributes={"psij.retry": "attempts=2,on=out_of_memory"})))
    from psij import ResourceSpecV1

    assert job.spec is not None
    job.spec.resources = ResourceSpecV1(memory=1000)
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.COMPLETED  # type: ignore[union-attr]
    assert psij.registry.flush(WAIT)
    return job


def test_status_runs_lists_each_run_as_a_table_and_as_json(home: Path) -> None:
    job = _rerun_in(home)
    done = _psij(home, "status", "--runs", job.id[:8])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["RUN", "NATIVE_ID", "STATE", "EXIT", "CAUSE", "STARTED",
                                "WAIT_S", "RUN_S", "CPU_S", "MAX_RSS", "NODES", "STDOUT"]
    # (The played runs start at 100 s and 200 s after the epoch, before they were queued:
    # no wait is shown; the infinite CPU time of the first was left out.)
    assert lines[1].split() == ["1", "n1", "FAILED", "137", "out_of_memory",
                                "1970-01-01T00:01:40Z", "-", "50.0", "-", "1000B", "-",
                                f"{home}/o.1"]
    assert lines[2].split() == ["2", "n2", "COMPLETED", "0", "-", "1970-01-01T00:03:20Z", "-",
                                "50.0", "-", "-", "-", f"{home}/o"]
    shown = _psij(home, "status", "--runs", job.id, "--json")
    assert shown.returncode == 0, shown.stderr
    runs: List[Dict[str, Any]] = json.loads(shown.stdout)
    assert [(r["run"], r["native_id"], r["state"], r["exit_code"]) for r in runs] == [
        (1, "n1", "FAILED", 137), (2, "n2", "COMPLETED", 0)]
    assert runs[0]["started_at"] == "1970-01-01T00:01:40.000+00:00"
    assert runs[0]["max_rss_bytes"] == 1000 and runs[0]["stdout_path"] == f"{home}/o.1"
    assert runs[0]["job_id"] == job.id
    # The native id of its first run names it too (its row has the second run's).
    by_first = _psij(home, "status", "--runs", "n1", "--json")
    assert by_first.returncode == 0, by_first.stderr
    assert [r["run"] for r in json.loads(by_first.stdout)] == [1, 2]
    # The job's own view carries the figures of its last run.
    for command in ("list", "status"):
        listed = _psij(home, command, "--json", *([job.id] if command == "status" else []))
        assert listed.returncode == 0, listed.stderr
        [view] = json.loads(listed.stdout)
        assert (view["attempt"], view["started_at"], view["ended_at"]) == (
            2, "1970-01-01T00:03:20.000+00:00", "1970-01-01T00:04:10.000+00:00")
        assert all(key in view for key in (*USE_KEYS, "held_from", "held_to"))


@pytest.mark.parametrize("args, text", [
    (["nosuch"], "no recorded job"),
    (["a\nb"], "contains a space or a control character"),
])
def test_status_runs_of_no_job_says_why(home: Path, args: List[str], text: str) -> None:
    _rerun_in(home)
    done = _psij(home, "status", "--runs", *args)
    assert done.returncode != 0 and text in done.stderr, done.stderr
    assert done.stdout == ""


def test_status_runs_takes_one_job(home: Path) -> None:
    a, b = _rerun_in(home), _rerun_in(home)
    done = _psij(home, "status", "--runs", a.id, b.id)
    assert done.returncode == 2 and "--runs" in done.stderr, done.stderr
    done = _psij(home, "status", "--runs", "--all")
    assert done.returncode == 2 and "--runs" in done.stderr, done.stderr



@pytest.mark.parametrize("name", ["pbs", "pbs_classic", "lsf", "cobalt", "flux", "nqsv"])
def test_each_scheduler_script_moves_an_earlier_runs_output_aside(name: str,
                                                                  tmp_path: Path) -> None:
    from psij import _retry
    from support.batch_sites import full_job, make

    job = full_job(name)
    assert job.spec is not None
    job.spec.attributes.custom_attributes = {
        **(job.spec.attributes.custom_attributes or {}), "psij.requeue": 1}
    job.__dict__["_runs"] = _retry.check_job(job.spec)
    text = make(name, tmp_path / "work").submit_script(job)
    check = subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
    assert "other" not in text and "slurm" not in text
    # Both of the job's paths, each a single word whatever it holds.
    assert "_psij_run=$((1 + _psij_starts))" in text
    loop = next(line for line in text.splitlines() if "for _psij_path in" in line)
    words = loop.strip()[len("for _psij_path in "):-len("; do")]
    shown = subprocess.run(["bash", "-c", f"for p in {words}; do printf '%s\\0' \"$p\"; done"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert shown.stdout.split("\0")[:-1] == [str(job.spec.stdout_path),
                                             str(job.spec.stderr_path)], loop
    # A job that may not run again has nothing to keep.
    plain = full_job(name)
    plain.__dict__["_runs"] = None
    assert "_psij_path" not in make(name, tmp_path / "work2").submit_script(plain)


def test_a_local_job_run_again_has_each_runs_measured_figures(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(
        work_directory=tmp_path / "work"))
    job = Job(JobSpec("/bin/bash", ["-c", '[ "$PSIJ_ATTEMPT" = 1 ] && exit 85; exit 0'],
                      attributes=JobAttributes(custom_attributes={"psij.requeue": 1})))
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    one, two = _runs(tmp_path / "work", job.id)
    assert (one.run, one.state, one.exit_code, one.cause) == (1, "FAILED", 85, "checkpoint")
    assert (two.run, two.state, two.exit_code) == (2, "COMPLETED", 0)
    assert one.native_id != two.native_id
    for run in (one, two):  # measured by the local executor, each run its own
        assert run.started_at is not None and run.ended_at is not None
        assert run.started_at <= run.ended_at
        assert run.cpu_seconds is not None and run.max_rss_bytes is not None
    assert one.ended_at is not None and two.started_at is not None
    assert one.ended_at <= two.started_at


def test_a_local_job_held_for_its_stage_in_has_held_times(tmp_path: Path) -> None:
    from psij.staging import StageIn

    source = tmp_path / "source.txt"
    source.write_text("x")
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(
        work_directory=tmp_path / "work"))
    job = Job(JobSpec("/bin/true", directory=tmp_path, stage_in={StageIn(source, "in.txt")}))
    plain = Job(JobSpec("/bin/true"))
    for j in (job, plain):
        ex.submit(j)
        st = j.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
    assert psij.registry.flush(WAIT)
    staged, other = psij.registry.find([job.id, plain.id], work_directory=tmp_path / "work")
    assert staged.held_from is not None and staged.held_to is not None
    assert staged.held_from <= staged.held_to
    # Held from submit until a keeper had its start (told once it started).
    assert staged.started_at is not None and staged.held_from <= staged.started_at
    assert (other.held_from, other.held_to) == (None, None)


def test_a_status_telling_its_run_is_recorded_in_that_run(tmp_path: Path) -> None:
    # A job that may not run again, which its scheduler ran a second time all the same.
    wd = tmp_path / "work"
    ex = Told(wd)
    job = _job()
    ex.submit(job)
    ex.play(job, JobStatus(JobState.QUEUED, metadata={"native_id": "77"}))
    assert psij.registry.flush(WAIT)
    ex.play(job, JobStatus(JobState.COMPLETED, exit_code=0, metadata={"run": 2}))
    runs = _runs(wd, job.id)
    assert [(r.run, r.state) for r in runs] == [(1, "QUEUED"), (2, "COMPLETED")]
    [rec] = psij.registry.find(job.id, work_directory=wd)
    assert rec.attempt == 2


def test_a_batch_job_retried_with_a_longer_duration_keeps_each_runs_output(
        tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05, keep_finished=0.5)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    try:
        job = Job(JobSpec("/bin/bash", ["-c", 'echo "run $PSIJ_ATTEMPT"; '
                                        '[ "$PSIJ_ATTEMPT" = 1 ] && sleep 30; exit 0'],
                          stdout_path=tmp_path / "out", directory=tmp_path,
                          attributes=JobAttributes(duration=timedelta(seconds=2),
                                                   custom_attributes={
                              "psij.retry": "attempts=2,on=time_limit,duration=3"})))
        ex.submit(job)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
    finally:
        ex.close()
    assert (tmp_path / "out.1").read_text() == "run 1\n"
    assert (tmp_path / "out").read_text() == "run 2\n"
    one, two = _runs(cfg.work_directory, job.id)
    assert (one.state, one.cause, two.state) == ("FAILED", "time_limit", "COMPLETED")
    assert one.native_id != two.native_id
    assert (one.stdout_path, two.stdout_path) == (f"{tmp_path}/out.1", f"{tmp_path}/out")
