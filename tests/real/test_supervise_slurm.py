"""``psij supervise`` on the real Slurm (run under the schedulers' lock, see COMMON notes in
tests/setup): the example study to the end, a server killed with SIGKILL, a server that stops
answering, fault tolerance off, and Ctrl+C at several moments (one while a slow sbatch runs);
nothing is ever left in the queue."""

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Set

import pytest

from real.test_batch_real import _need
from support.supervise_study import Study, sleeping, squeue_ids, squeue_in, stop_process, wait_for

pytestmark = pytest.mark.slurm

T = 1.0  # timer_delay: the ping period


@pytest.fixture(autouse=True)
def slurm() -> None:
    _need("slurm")


def nothing_left(study: Study, seconds: float = 10.0) -> None:
    """Every job of the study leaves the queue within ``seconds``."""
    ours = study.native_ids()
    try:
        wait_for(lambda: not squeue_in(study.results) and not (ours & squeue_ids()), seconds,
                 "the study's jobs leaving the queue")
    except AssertionError:
        raise AssertionError(f"left in the queue: {squeue_in(study.results)} "
                             f"{ours & squeue_ids()}\n{study.log()}") from None


def test_example_study_runs_to_completion_on_slurm(tmp_path: Path) -> None:
    study = Study(tmp_path / "r", executor="slurm", clients=50, wave=10,
                  timer_delay=T).start()
    assert study.wait(240) == 0, study.errors()
    study.check_finished()
    nothing_left(study)


def _slow_study(tmp_path: Path, **options: object) -> Study:
    """A Slurm study whose first clients sleep for a minute, started, with four clients
    submitted (as many as fit on the node run, the others wait)."""
    results = tmp_path / "r"
    study = Study(results, executor="slurm", clients=8, wave=4, timer_delay=T, **options)
    (results / "sleep").write_text("60")
    study.start()
    wait_for(lambda: len(study.native_ids(generation=1, kind="client")) == 4, 60,
             "four clients submitted")
    return study


def _recovers(study: Study, stopped_at: float, words: str) -> None:
    """The death is seen within 2T + one tick, the first generation's jobs are cancelled,
    a new server runs the study to its end."""
    (study.results / "sleep").write_text("0")
    seen = wait_for(lambda: study.log_time(words), 30, f"the log saying {words!r}")
    print(f"{words!r}: seen {seen - stopped_at:.2f} s after the server was stopped")
    assert seen - stopped_at <= 3 * T + 0.5, (seen - stopped_at, study.log())
    first = study.native_ids(generation=1)
    assert len(first) == 5  # the server and four clients, each sleeping for a minute
    wait_for(lambda: not (first & squeue_ids()), 15, "generation 1 leaving the queue")
    assert "generation 1 is dead" in study.log()
    study.server_pid(2)
    assert study.wait(90) == 0, study.errors()
    study.check_finished()
    nothing_left(study)


def test_server_killed_is_replaced_after_every_job_is_cancelled(tmp_path: Path) -> None:
    study = _slow_study(tmp_path)
    stopped_at = stop_process(study.server_pid(1), signal.SIGKILL)
    _recovers(study, stopped_at, "server generation 1 is dead: connection shut down")


def test_server_not_answering_pings_is_replaced_the_same_way(tmp_path: Path) -> None:
    study = _slow_study(tmp_path)
    pid = study.server_pid(1)
    stopped_at = stop_process(pid, signal.SIGSTOP)
    _recovers(study, stopped_at, "server generation 1 is dead: no message for")


def test_fault_tolerance_off_exits_non_zero_with_the_reason_and_empties_the_queue(
        tmp_path: Path) -> None:
    study = _slow_study(tmp_path, fault_tolerance=False)
    stop_process(study.server_pid(1), signal.SIGKILL)
    assert study.wait(60) == 1, study.errors()
    assert study.unsettled() == set(), study.log()
    assert "fault_tolerance is off" in study.errors()
    assert "connection shut down" in study.errors()
    nothing_left(study)
    assert "submitting server generation 2" not in study.log()


@pytest.mark.parametrize("moment", ["server submitting", "server connected",
                                    "clients running"])
def test_ctrl_c_at_any_moment_leaves_nothing_in_the_queue(tmp_path: Path,
                                                          moment: str) -> None:
    results = tmp_path / "r"
    study = Study(results, executor="slurm", clients=8, wave=4, timer_delay=T)
    (results / "sleep").write_text("60")
    study.start()
    if moment == "server submitting":
        wait_for(lambda: "submitting server generation 1" in study.log(), 30, moment)
    elif moment == "server connected":
        wait_for(lambda: "server generation 1 connected" in study.log(), 60, moment)
    else:
        wait_for(lambda: len(study.native_ids(kind="client")) >= 2, 60, moment)
    started = time.monotonic()
    study.signal(signal.SIGINT)
    assert study.wait(40) == 130, study.errors()
    assert time.monotonic() - started < 35
    nothing_left(study)
    # Each job's end is journaled before the supervisor exits: the next run has nothing to do.
    assert study.unsettled() == set(), study.log()


def test_jobs_of_a_killed_supervisor_are_cancelled_by_the_next_one(tmp_path: Path) -> None:
    first = _slow_study(tmp_path)
    wait_for(lambda: len(sleeping(first.results)) >= 2, 60, "clients sleeping")
    assert first.process is not None
    first.process.kill()
    first.process.wait()
    orphans = first.native_ids()
    assert len(orphans) == 5 and orphans <= squeue_ids()  # the server and four clients
    (first.results / "sleep").write_text("0")
    second = Study(first.results, executor="slurm", clients=8, wave=4, timer_delay=T).start()
    wait_for(lambda: not (orphans & squeue_ids()), 20, "the orphans leaving the queue")
    assert second.wait(90) == 0, second.errors()
    second.check_finished()
    assert "job(s) an earlier supervisor left" in second.log()
    nothing_left(second)


SLOW_SBATCH = """#!/bin/sh
# sbatch, 8 s slow when {flag} says so: "before" (the controller has not taken the job yet)
# or "after" (it took it and has not answered yet).
when=$(cat {flag} 2>/dev/null)
[ -n "$when" ] && touch {started}
if [ "$when" = before ]; then sleep 8; exec {sbatch} "$@"; fi
if [ "$when" = after ]; then out=$({sbatch} "$@"); rc=$?; sleep 8; echo "$out"; exit $rc; fi
exec {sbatch} "$@"
"""


def squeue_named(name: str) -> Set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i", f"--name={name}"], capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("when", ["before", "after"])
def test_ctrl_c_while_a_slow_sbatch_runs_leaves_no_orphan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """An sbatch that takes 8 s, stop_grace 2: Ctrl+C ends the supervisor after 2 s, its
    sbatch with it; a job that sbatch had queued all the same is named in the journal, and the
    next run cancels it before it starts the study again."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    flag, started = tmp_path / "slow", tmp_path / "sbatch.started"
    wrapper = bin_dir / "sbatch"
    wrapper.write_text(SLOW_SBATCH.format(flag=flag, started=started,
                                          sbatch=shutil.which("sbatch")))
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    flag.write_text(when)
    # A server that would stay in the queue for five minutes if nobody cancelled it.
    first = Study(tmp_path / "r", executor="slurm", clients=2, wave=2, timer_delay=T,
                  stop_grace=2)
    first.config["server"] = {"executable": "/bin/sleep", "arguments": ["300"],
                              "name": "study-server", "directory": str(first.results)}
    first.path.write_text(json.dumps(first.config))
    first.start()
    wait_for(started.exists, 30, "the server's sbatch started")
    sent = time.monotonic()
    first.signal(signal.SIGINT)
    assert first.wait(30) == 130, first.errors()
    took = time.monotonic() - sent
    print(f"{when}: the supervisor exited {took:.2f} s after Ctrl+C")
    assert 1.9 <= took < 5, first.log()
    alive = subprocess.run(["pgrep", "-f", str(wrapper)], capture_output=True, text=True)
    assert alive.stdout == "", "the submit command outlived the supervisor"
    entry = json.loads((first.output / "supervise.journal").read_text().splitlines()[0])
    name = entry["name"]
    assert "final" not in (first.output / "supervise.journal").read_text()
    time.sleep(9)  # when sbatch would have answered
    orphans = squeue_named(name)
    assert len(orphans) == (1 if when == "after" else 0), orphans
    flag.unlink()
    (first.results / "sleep").write_text("0")
    second = Study(first.results, executor="slurm", clients=2, wave=2, timer_delay=T).start()
    assert second.wait(120) == 0, second.errors()
    assert second.results_done() == [0, 1]
    assert f"looking for 1 job(s) whose submission an earlier supervisor did not see " \
           f"return, to cancel them: {name}" in second.log()
    if orphans:
        assert f"cancelled job {orphans.pop()} named {name}" in second.log()
    else:
        assert f"no job named {name} (uid 0) is in the queue" in second.log()
    assert not squeue_named(name)
    nothing_left(second)
