"""``psij supervise`` stopped (Ctrl+C) while a slow submit command runs, on a fake Slurm whose
``sbatch`` takes seconds (support/fake_slurm.py): the supervisor exits after ``stop_grace``, the
submit command does not outlive it, and a job it may have queued is journaled by name, so that
``psij supervise --cleanup`` (or the next run) cancels it. On the real Slurm:
tests/real/test_supervise_slurm.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from support import fake_slurm
from support.supervise_study import ROOT, wait_for

GRACE = 1.0
SLOW = 5.0


def journal(output: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in (output / "supervise.journal").read_text().splitlines()]


def sbatch_alive(spool: Path) -> bool:
    found = subprocess.run(["pgrep", "-f", f"fake_slurm.py {spool} sbatch"],
                           capture_output=True, text=True).stdout
    return bool(found.strip())


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, Any]:
    spool = tmp_path / "spool"
    fake_slurm.install(tmp_path / "bin", spool)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PSIJ_WORK_DIR", str(tmp_path / "work"))
    config = {"executor": "slurm", "server": {"executable": "/bin/sleep", "arguments": ["600"],
                                              "name": "study-server"},
              "output_dir": str(tmp_path / "out"), "timer_delay": 1, "stop_grace": GRACE,
              "job_update_interval": 1}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    return {"spool": spool, "config": path, "output": tmp_path / "out", "tmp": tmp_path}


def interrupt_while_sbatch_runs(study: Dict[str, Any], when: str) -> float:
    """Start the study with a slow sbatch, Ctrl+C while it runs; how long the supervisor
    took to exit after the signal."""
    spool = study["spool"]
    (spool / "slow").write_text(f"{when} {SLOW}")
    with open(study["tmp"] / "stderr.txt", "wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "psij", "supervise",
                                    str(study["config"])], stderr=stderr, cwd=ROOT)
    try:
        wait_for((spool / "sbatch.started").exists, 30, "sbatch started")
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 130, (study["tmp"] / "stderr.txt").read_text()
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # The submit command did not outlive the supervisor.
    assert not sbatch_alive(spool)
    return took


def cleanup(study: Dict[str, Any]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "psij", "supervise", "--cleanup",
                           str(study["config"])], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


def test_ctrl_c_while_sbatch_hangs_kills_it_and_nothing_is_queued_after(
        study: Dict[str, Any]) -> None:
    took = interrupt_while_sbatch_runs(study, "before")
    assert GRACE - 0.1 <= took < GRACE + 3
    time.sleep(SLOW + 1)  # when sbatch would have queued the job
    assert fake_slurm.jobs(study["spool"]) == []
    entries = journal(study["output"])
    assert entries[0]["uid"] == 0 and entries[0]["name"].startswith("study-server.u0.")
    assert not any("final" in e for e in entries)  # its outcome is not known yet
    log = (study["output"] / "supervise.log").read_text()
    assert "not seen ending: uid 0" in log and "--cleanup" in log
    done = cleanup(study)
    assert done.returncode == 0, done.stderr
    assert f"no job named {entries[0]['name']} (uid 0) is in the queue" in done.stderr
    assert journal(study["output"])[-1] == {"uid": 0, "final": "NOT_SUBMITTED"}
    again = cleanup(study)  # settled: nothing is looked up any more
    assert again.returncode == 0 and "names no job left to cancel" in again.stderr


def test_a_job_queued_by_an_interrupted_sbatch_is_cancelled_by_cleanup(
        study: Dict[str, Any]) -> None:
    interrupt_while_sbatch_runs(study, "after")
    queued = fake_slurm.jobs(study["spool"])
    assert [j["state"] for j in queued] == ["PENDING"]  # the controller took it: an orphan
    name = journal(study["output"])[0]["name"]
    assert queued[0]["name"] == name
    (study["spool"] / "slow").unlink()
    done = cleanup(study)
    assert done.returncode == 0, done.stderr
    assert f"cancelled job {queued[0]['id']} named {name}" in done.stderr
    assert [j["state"] for j in fake_slurm.jobs(study["spool"])] == ["CANCELLED"]
    assert journal(study["output"])[-1] == {"uid": 0, "final": "CANCELED",
                                            "native_ids": [queued[0]["id"]]}


def test_cleanup_of_a_folder_that_does_not_exist_or_without_output_dir_is_refused(
        study: Dict[str, Any]) -> None:
    done = cleanup(study)
    assert done.returncode == 2 and "does not exist" in done.stderr
    config = json.loads(study["config"].read_text())
    del config["output_dir"]
    study["config"].write_text(json.dumps(config))
    done = cleanup(study)
    assert done.returncode == 2 and "--cleanup needs the output_dir" in done.stderr
