"""Submitted means durable on ``local``: once ``submit()`` or ``submit_many()`` returned, the job
runs (once) and is in the job registry with its true final state, even when the submitting
process is killed (``kill -9``) the next instant.

Each round runs a child Python that submits jobs writing their number to a file and then
SIGKILLs itself, on the registry of a private HOME; the test waits for that round's keeper to
end (it ends once its last job ended and its records are committed), counts the lines and
reads the registry as a user would, with ``psij status --all --json`` (which re-attaches the
jobs not final there: their keeper recorded their exit).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from support.process_checks import alive, keepers_with

PSIJ = str(Path(sys.executable).parent / "psij")
WAIT_SECONDS = 300.0

CHILD = r"""
import os, signal, sys
import psij

out, ids, n, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ex = psij.JobExecutor.get_instance("local")
jobs = [psij.Job(psij.JobSpec("/bin/sh", ["-c", f"echo {i} >> {out}"])) for i in range(n)]
with open(ids, "w") as f:
    f.write("\n".join(j.id for j in jobs))
if how == "wait":  # killed from outside, at some point of the submits
    print("go", flush=True)
if how == "many":
    ex.submit_many(jobs)
else:
    for job in jobs:
        ex.submit(job)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _env(home: Path) -> Dict[str, str]:
    return dict(os.environ, HOME=str(home))


def _keepers_of(home: Path) -> List[int]:
    """The keepers started by the round of ``home`` (they inherited its HOME)."""
    return keepers_with(f"HOME={home}")

def _wait_for_keepers(home: Path) -> None:
    keepers = _keepers_of(home)
    deadline = time.monotonic() + WAIT_SECONDS
    while any(alive(pid) for pid in keepers):
        assert time.monotonic() < deadline, f"keepers {keepers} still running"
        time.sleep(0.05)


def _status(home: Path) -> List[Dict[str, Any]]:
    done = subprocess.run([PSIJ, "status", "--all", "--json"], capture_output=True, text=True,
                          env=_env(home), timeout=WAIT_SECONDS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _round(base: Path, n: int, how: str, kill_after: float = 0.0
           ) -> Tuple[List[int], List[str], List[Dict[str, Any]]]:
    """One round: (numbers the jobs wrote, the jobs' ids in order, the registry's jobs)."""
    home = base / "home"
    home.mkdir(parents=True)
    out, ids = base / "ran", base / "ids"
    with subprocess.Popen([sys.executable, "-c", CHILD, str(out), str(ids), str(n), how],
                          env=_env(home), stdout=subprocess.PIPE, text=True) as child:
        if how == "wait":
            assert child.stdout is not None and child.stdout.readline() == "go\n"
            time.sleep(kill_after)
            child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=WAIT_SECONDS) == -signal.SIGKILL
    _wait_for_keepers(home)
    ran = [int(line) for line in out.read_text().split()] if out.exists() else []
    return ran, ids.read_text().split("\n"), _status(home)


def _check_every_job_ran_once_and_is_completed(base: Path, n: int, how: str) -> None:
    ran, ids, recorded = _round(base, n, how)
    assert sorted(ran) == list(range(n))
    assert sorted(r["id"] for r in recorded) == sorted(ids)
    assert {(r["state"], r["final"], r["exit_code"]) for r in recorded} == {
        ("COMPLETED", True, 0)}
    assert all(r["executor"] == "local" and r["native_id"].isdigit() for r in recorded)


def test_200_jobs_submitted_one_by_one_all_run_once_and_are_recorded_after_a_kill(
        tmp_path: Path) -> None:
    rounds = 20
    with ThreadPoolExecutor(4) as pool:  # rounds overlap: each waits for its jobs mostly
        for done in [pool.submit(_check_every_job_ran_once_and_is_completed,
                                 tmp_path / str(r), 200, "one") for r in range(rounds)]:
            done.result()


def test_2000_jobs_of_one_submit_many_all_run_once_and_are_recorded_after_a_kill(
        tmp_path: Path) -> None:
    for r in range(2):
        _check_every_job_ran_once_and_is_completed(tmp_path / str(r), 2000, "many")


def test_a_kill_at_any_point_of_the_submits_never_runs_a_job_twice(tmp_path: Path) -> None:
    rng = random.Random(35)
    for r in range(8):
        ran, ids, recorded = _round(tmp_path / str(r), 100, "wait", rng.uniform(0.0, 0.4))
        assert len(ran) == len(set(ran)), f"round {r}: a job ran twice"
        # What ran is what the registry holds, each with its end; nothing else is there.
        assert sorted(r["id"] for r in recorded) == sorted(ids[i] for i in ran)
        assert all((r["state"], r["exit_code"]) == ("COMPLETED", 0) for r in recorded)


# -- the rows the keeper writes ----------------------------------------------------------------

def _rows_module() -> Any:
    from psij.executors.local import _keeper_rows  # the keeper loads the same file

    return _keeper_rows


def _a_row(job_id: str) -> Tuple[Tuple[str, ...], Tuple[Any, ...]]:
    from psij._registry.store import COLUMNS

    values = {"id": job_id, "executor": "local", "submitted": 1.0, "state": "QUEUED",
              "rank": 1, "updated": 1.0, "final": 0, "attempt": 1}
    return tuple(COLUMNS), tuple(values.get(c) for c in COLUMNS)


def test_a_row_the_registry_refuses_leaves_the_others_written(tmp_path: Path) -> None:
    import sqlite3

    from psij._registry.store import open_store

    rows = _rows_module()
    open_store(tmp_path)
    conn = sqlite3.connect(tmp_path / "jobs.sqlite", isolation_level=None)
    good = rows.started_row(_a_row("good"), 4242)
    columns, values = _a_row("bad")
    bad = (columns, tuple([1, 2] if c == "spec" else v for c, v in zip(columns, values)))
    conn.execute("BEGIN IMMEDIATE")
    refused = rows.write(conn, [("J", 4242, "7", good, "", "good"), ("J", 0, "", bad, "", "bad")],
                         [("good", 3, False, (10.0, 12.5, 1.25, 4096))], 99, 2.0)
    conn.execute("COMMIT")
    assert len(refused) == 1 and refused[0].startswith("job bad: its row was refused")
    assert conn.execute("SELECT id, native_id, state, exit_code, final, started_at, ended_at, "
                        "cpu_seconds, max_rss_bytes FROM jobs").fetchall() \
        == [("good", "4242", "FAILED", 3, 1, 10.0, 12.5, 1.25, 4096)]


def test_a_job_the_keeper_could_not_start_is_recorded_failed_saying_why() -> None:
    rows = _rows_module()
    columns, values = rows.failed_row(_a_row("j"), 99, "spawn: No such file or directory")
    got = dict(zip(columns, values))
    assert (got["state"], got["rank"], got["final"]) == ("FAILED", 99, 1)
    assert got["message"] == "could not start the job: spawn: No such file or directory"


def test_a_row_sent_with_a_start_is_checked() -> None:
    rows = _rows_module()
    assert rows.check_row(None) is None
    columns, values = _a_row("j")
    assert rows.check_row((columns, values)) == (columns, values)
    for bad in [(columns, values[:-1]), [columns, values], "row", (columns,),
                (("id; DROP TABLE jobs", *columns[1:]), values),
                (tuple(c for c in columns if c != "native_id"), values[:-1]),
                ((*columns[:-1], "r\u00e9run"), values), ((*columns[:-1], 3), values)]:
        with pytest.raises(ValueError):
            rows.check_row(bad)


def test_a_row_made_at_submit_is_the_recorders_and_commit_rows_commits_it_at_once(
        tmp_path: Path) -> None:
    import sqlite3

    import psij.registry
    from psij import Job, JobExecutor, JobExecutorConfig, JobSpec
    from psij._registry import durable

    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=tmp_path))
    job = Job(JobSpec("/bin/echo", ["durable"]))
    made = durable.submit_row(ex, job)
    assert made is not None
    row = dict(zip(*made))
    assert (row["id"], row["executor"], row["state"], row["final"], row["native_id"]) == (
        job.id, "local", "QUEUED", 0, None)
    assert "/bin/echo" in row["spec"] and "durable" in row["spec"]
    durable.commit_rows(ex, [job])  # in this thread, before it returns: no flush needed
    with sqlite3.connect(tmp_path / "jobs.sqlite") as conn:
        assert conn.execute("SELECT id, state FROM jobs").fetchall() == [(job.id, "QUEUED")]
    psij.registry.set_recording(False)
    try:
        assert durable.submit_row(ex, Job(JobSpec("/bin/true"))) is None
    finally:
        psij.registry.set_recording(True)


def test_jobs_no_keeper_takes_have_their_rows_committed_before_submit_returns(
        tmp_path: Path) -> None:
    import sqlite3

    from psij import Job, JobExecutor, JobSpec, JobState
    from psij.executors.local import LocalJobExecutorConfig
    from psij.staging import StageIn

    (tmp_path / "in.txt").write_text("x")
    here = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", keeper=False))
    staged = Job(JobSpec("/bin/true", directory=tmp_path, stage_in={
        StageIn(tmp_path / "in.txt", "copy.txt")}))
    many = [Job(JobSpec("/bin/true")) for _ in range(3)]
    here.submit(staged)
    with sqlite3.connect(tmp_path / "work" / "jobs.sqlite") as conn:
        assert conn.execute("SELECT id FROM jobs").fetchall() == [(staged.id,)]
    here.submit_many(many)  # started by this process: their rows in one transaction
    with sqlite3.connect(tmp_path / "work" / "jobs.sqlite") as conn:
        found = dict(conn.execute("SELECT id, native_id FROM jobs").fetchall())
    assert set(found) == {staged.id, *(j.id for j in many)}
    assert all(found[j.id] == j.native_id for j in many)
    for job in (staged, *many):
        status = job.wait()
        assert status is not None and status.state is JobState.COMPLETED


def test_a_job_that_could_not_start_is_failed_over_its_queued_row(tmp_path: Path) -> None:
    import sqlite3

    from psij._registry.store import open_store

    rows = _rows_module()
    open_store(tmp_path)
    conn = sqlite3.connect(tmp_path / "jobs.sqlite", isolation_level=None)
    words = "spawn: Resource temporarily unavailable"
    batches = [[("J", 0, "", _a_row(j), "", j) for j in ("waited", "done")],
               [("J", 0, "", rows.failed_row(_a_row("waited"), 99, words), "", "waited")]]
    for batch in batches:
        conn.execute("BEGIN IMMEDIATE")
        assert rows.write(conn, batch, [], 99, 2.0) == []
        conn.execute("COMMIT")
    # A row final already (the submitter recorded the job's end) keeps its state.
    conn.execute("UPDATE jobs SET state = 'COMPLETED', final = 1 WHERE id = 'done'")
    conn.execute("BEGIN IMMEDIATE")
    rows.write(conn, [("J", 0, "", rows.failed_row(_a_row("done"), 99, words), "", "done")],
               [], 99, 3.0)
    conn.execute("COMMIT")
    got = conn.execute("SELECT id, state, rank, final, message FROM jobs ORDER BY id")
    assert got.fetchall() == [
        ("done", "COMPLETED", 1, 1, None),
        ("waited", "FAILED", 99, 1, f"could not start the job: {words}")]
