"""Re-attaching recorded jobs from a fresh process after the submitting one was killed with
SIGKILL: the jobs come back live, with their ids, their callbacks fire from then on, and each
ends with the state its executor reports (local and the real Slurm)."""

import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import psij.registry
from psij import Job, JobState, JobStatus
from real.test_batch_real import _scheduler_problem

WAIT = timedelta(seconds=240)

SUBMIT_AND_HANG = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from psij import Job, JobExecutor, JobSpec
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
    from psij.job_executor_config import JobExecutorConfig
    import psij.registry
    name, wd, tag = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    config = (JobExecutorConfig(work_directory=wd) if name == "local" else
              BatchSchedulerExecutorConfig(work_directory=wd, queue_polling_interval=1,
                                           initial_queue_polling_delay=0.5))
    ex = JobExecutor.get_instance(name, config=config)
    jobs = {}
    for key, script in [(k, v) for k, v in (a.split("=", 1) for a in sys.argv[4:])]:
        job = Job(JobSpec("/bin/sh", ["-c", script]))
        psij.registry.set_tag(job, tag)
        ex.submit(job)
        jobs[key] = job
    jobs["quick"].wait()
    psij.registry.flush()
    print(" ".join(f"{k}={j.id}={j.native_id}" for k, j in jobs.items()), flush=True)
    time.sleep(3600)
""")


class Seen:
    """Every status each job's callback received, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: Dict[str, List[JobState]] = {}

    def __call__(self, job: Job, status: JobStatus) -> None:
        with self.lock:
            self.states.setdefault(job.id, []).append(status.state)


def submit_then_kill(name: str, wd: Path, tag: str, scripts: Dict[str, str]
                     ) -> Dict[str, Tuple[str, str]]:
    proc = subprocess.Popen([sys.executable, "-c", SUBMIT_AND_HANG, name, str(wd), tag,
                             *(f"{k}={v}" for k, v in scripts.items())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert line, err
    return {k: (jid, nid) for k, jid, nid in (w.split("=") for w in line.split())}


def test_local_jobs_are_reattached_after_the_submitter_was_killed(tmp_path: Path) -> None:
    wd = tmp_path / "work"
    marker = tmp_path / "go"
    late = tmp_path / "late"
    jobs = submit_then_kill("local", wd, "lot", {
        "quick": "exit 7",
        "running": f"while [ ! -e {marker} ]; do sleep 0.1; done; exit 3",
        # Ends while no process of the test's own is alive: only the keeper sees it end.
        "late": f"while [ ! -e {late} ]; do sleep 0.1; done; exit 5",
    })
    late.touch()
    late_id = jobs["late"][0]
    deadline = time.monotonic() + 60
    while psij.registry.find(late_id, work_directory=wd)[0].state is not JobState.FAILED:
        assert time.monotonic() < deadline, "the keeper did not record the late job's end"
        time.sleep(0.05)
    seen = Seen()
    attached = psij.registry.reattach(tag="lot", work_directory=wd, callback=seen)
    by_key = {k: next(j for j in attached if j.id == jid) for k, (jid, _) in jobs.items()}
    assert len(attached) == 3
    for key, (jid, nid) in jobs.items():
        assert (by_key[key].id, by_key[key].native_id) == (jid, nid)
    quick = by_key["quick"].status
    assert (quick.state, quick.exit_code) == (JobState.FAILED, 7)  # ended while watched
    assert (by_key["late"].status.state, by_key["late"].status.exit_code) == (JobState.FAILED, 5)
    assert by_key["running"].status.state is JobState.ACTIVE
    marker.touch()
    final = by_key["running"].wait(WAIT)
    # Its submitter died before it ended; the keeper that started it recorded its exit code.
    assert final is not None and (final.state, final.exit_code) == (JobState.FAILED, 3)
    assert seen.states[jobs["running"][0]][-1] is JobState.FAILED
    psij.registry.flush()
    recorded = {r.id: (r.state, r.exit_code)
                for r in psij.registry.find(tag="lot", work_directory=wd)}
    assert recorded == {jobs["quick"][0]: (JobState.FAILED, 7),
                        jobs["running"][0]: (JobState.FAILED, 3),
                        late_id: (JobState.FAILED, 5)}


@pytest.mark.slurm  # with the other scheduler tests, after the campaigns of tests/real
def test_slurm_jobs_are_reattached_with_their_true_final_states(tmp_path: Path) -> None:
    problem = _scheduler_problem("slurm")
    if problem:
        pytest.skip(problem)
    wd = tmp_path / "work"
    marker = tmp_path / "go"
    jobs = submit_then_kill("slurm", wd, "cluster", {
        "quick": "exit 0",
        "fails": "sleep 1; exit 3",
        "cancelled-unwatched": "sleep 600",
        "running": f"while [ ! -e {marker} ]; do sleep 0.2; done; exit 5",
    })
    # Cancelled while no process of ours watches it.
    subprocess.run(["scancel", jobs["cancelled-unwatched"][1]], check=True, timeout=60)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the scheduler has let go of the two
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-j",
                              f"{jobs['fails'][1]},{jobs['cancelled-unwatched'][1]}"],
                             capture_output=True, text=True).stdout
        if not out.strip():
            break
        time.sleep(0.5)
    seen = Seen()
    attached = {j.id: j for j in psij.registry.reattach(tag="cluster", work_directory=wd,
                                                        callback=seen)}
    by_key = {k: attached[jid] for k, (jid, _) in jobs.items()}
    finals = {k: by_key[k].wait(WAIT) for k in ("quick", "fails", "cancelled-unwatched")}
    assert (finals["quick"].state, finals["quick"].exit_code) == (JobState.COMPLETED, 0)
    assert (finals["fails"].state, finals["fails"].exit_code) == (JobState.FAILED, 3)
    assert finals["cancelled-unwatched"].state is JobState.CANCELED
    marker.touch()
    running = by_key["running"].wait(WAIT)
    assert (running.state, running.exit_code) == (JobState.FAILED, 5)
    assert seen.states[jobs["running"][0]][-1] is JobState.FAILED
    for key in ("fails", "cancelled-unwatched"):
        assert seen.states[jobs[key][0]][-1] is finals[key].state
    psij.registry.flush()
    recorded = {r.id: (r.state, r.exit_code)
                for r in psij.registry.find(tag="cluster", work_directory=wd)}
    assert recorded[jobs["fails"][0]] == (JobState.FAILED, 3)
    assert recorded[jobs["cancelled-unwatched"][0]][0] is JobState.CANCELED
    assert recorded[jobs["running"][0]] == (JobState.FAILED, 5)
    for job in attached.values():
        ex = job.executor
        if ex is not None and hasattr(ex, "close"):
            ex.close()
