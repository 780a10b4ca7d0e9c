"""Batch jobs in the job registry before ``submit``/``submit_many`` returns: a client killed
(-9) the instant its last submit returned leaves every job it submitted recorded with its
native id, followed to its end by ``psij wait`` from another process, each run once (on the
batch-test scheduler)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict

import pytest

PSIJ = str(Path(sys.executable).parent / "psij")

# Submits N jobs (each appends its number to OUT), one by one or with submit_many, then kills
# itself the instant the last submit returned.
CHILD = textwrap.dedent("""
    import os, signal, sys
    import psij.registry
    from psij import Job, JobAttributes, JobExecutor, JobSpec
    from psij.executors.batch.batch_test import BatchTestExecutorConfig
    out, n, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ex = JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
        keep_finished=600, queue_polling_interval=1))
    jobs = []
    for i in range(n):
        job = Job(JobSpec("/bin/sh", ["-c", f"echo {i} >> {out}"], directory=os.path.dirname(out),
                          attributes=JobAttributes(duration=60)))
        psij.registry.set_tag(job, "durable")
        jobs.append(job)
    if how == "many":
        ex.submit_many(jobs)
    else:
        for job in jobs:
            ex.submit(job)
    print(" ".join(job.id for job in jobs), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def psij_cmd(home: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PSIJ, *args], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=600)


@pytest.mark.parametrize("how", ["one", "many"])
def test_batch_jobs_are_recorded_when_submit_returns_even_if_the_client_is_killed(
        tmp_path: Path, how: str) -> None:
    n = 30
    home, out = tmp_path / "home", tmp_path / "ran"
    home.mkdir()
    child = subprocess.run([sys.executable, "-c", CHILD, str(out), str(n), how],
                           env=dict(os.environ, HOME=str(home)), capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == -signal.SIGKILL, child.stderr
    ids = child.stdout.split()
    assert len(ids) == n
    listed = psij_cmd(home, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows: Dict[str, Any] = {row["id"]: row for row in json.loads(listed.stdout)}
    assert sorted(rows) == sorted(ids)  # every job, however soon the client was killed
    for row in rows.values():
        assert row["native_id"], row  # given to the scheduler, which has it
        assert row["tag"] == "durable" and row["state"] in ("QUEUED", "ACTIVE", "COMPLETED")
    waited = psij_cmd(home, "wait", *ids, "--json")
    assert waited.returncode == 0, waited.stderr
    assert {job["state"] for job in json.loads(waited.stdout)} == {"COMPLETED"}
    assert sorted(int(line) for line in out.read_text().split()) == list(range(n))
