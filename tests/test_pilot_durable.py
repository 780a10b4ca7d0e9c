"""Submitted means durable on a served pilot: once ``submit()`` returned, the served pilot has
journaled the task (it runs) and the job's row is in the job registry, even when the
submitting process is killed (``kill -9``) the next instant; ``psij status --all --json``
then shows each job's true final state, asked of the pilot.

A real ``psij pilot serve`` runs the tasks; each round's child submits jobs writing their
number to a file and SIGKILLs itself, on the registry of a private HOME.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from psij.executors.pilot.service import answering

PSIJ = str(Path(sys.executable).parent / "psij")
WAIT_SECONDS = 300.0

CHILD = r"""
import os, signal, sys
import psij

url, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ex = psij.JobExecutor.get_instance("pilot", url=url)
jobs = [psij.Job(psij.JobSpec("/bin/sh", ["-c", f"echo {i} >> {out}"])) for i in range(n)]
for job in jobs:
    ex.submit(job)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def served() -> Iterator[Path]:
    """A served pilot's socket (in a short folder: Unix socket paths are short)."""
    folder = Path(tempfile.mkdtemp(prefix="pjd"))
    sock = folder / "pilot.sock"
    with open(folder / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "psij", "pilot", "serve", "--socket",
                                 str(sock), "--cores", "2", "--wd", str(folder / "wd")],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not answering(str(sock), timeout=1):
            assert proc.poll() is None, (folder / "serve.log").read_text()
            assert time.monotonic() < deadline, "the pilot did not start"
            time.sleep(0.05)
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(folder, ignore_errors=True)


def _status(home: Path) -> List[Dict[str, Any]]:
    done = subprocess.run([PSIJ, "status", "--all", "--json"], capture_output=True, text=True,
                          env=dict(os.environ, HOME=str(home)), timeout=WAIT_SECONDS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_jobs_submitted_to_a_served_pilot_run_once_and_are_recorded_after_a_kill(
        served: Path, tmp_path: Path) -> None:
    n = 200
    for r in range(3):
        home, out = tmp_path / str(r) / "home", tmp_path / str(r) / "ran"
        home.mkdir(parents=True)
        done = subprocess.run([sys.executable, "-c", CHILD, f"unix://{served}", str(out),
                               str(n)], env=dict(os.environ, HOME=str(home)),
                              timeout=WAIT_SECONDS)
        assert done.returncode == -signal.SIGKILL
        # Every job is recorded at once; its state is the pilot's, asked again until the
        # last task ended.
        deadline = time.monotonic() + WAIT_SECONDS
        recorded = _status(home)
        assert len(recorded) == n
        while not all(job["final"] for job in recorded):
            assert time.monotonic() < deadline, [j for j in recorded if not j["final"]][:3]
            time.sleep(0.2)
            recorded = _status(home)
        assert {(j["executor"], j["state"], j["exit_code"]) for j in recorded} == {
            ("pilot", "COMPLETED", 0)}
        assert sorted(int(line) for line in out.read_text().split()) == list(range(n))
