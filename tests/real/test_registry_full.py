"""The registry's acceptance at full size: a script submits 200 jobs to the real Slurm and 200
to ``local``, then is killed with SIGKILL; meanwhile some Slurm jobs are cancelled, some local
ones are cancelled by another process through the registry and some killed from outside, and
some local ones end, with no process of the script alive (their keeper records them). A new
process re-attaches all 400 through :mod:`psij.registry`, and every job ends with its true
state and exit code."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import psij.registry
from psij import JobState
from real.test_batch_real import _scheduler_problem

SIZE = 200
WAIT = timedelta(seconds=300)

SUBMIT_ALL = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from psij import Job, JobExecutor, JobSpec
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
    from psij.job_executor_config import JobExecutorConfig
    import psij.registry
    wd, plan = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    executors = {
        "local": JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=wd)),
        "slurm": JobExecutor.get_instance("slurm", config=BatchSchedulerExecutorConfig(
            work_directory=wd, queue_polling_interval=1, initial_queue_polling_delay=0.5)),
    }
    jobs = {}
    for key, (executor, script) in plan.items():
        job = Job(JobSpec("/bin/sh", ["-c", script]))
        psij.registry.set_tag(job, "full")
        executors[executor].submit(job)
        jobs[key] = job
    for key, job in jobs.items():
        if key.startswith("local-quick"):
            job.wait()
    psij.registry.flush()
    print(json.dumps({k: [j.id, j.native_id] for k, j in jobs.items()}), flush=True)
    time.sleep(3600)
""")


CANCEL = textwrap.dedent("""
    import sys
    import psij.registry
    jobs = psij.registry.reattach(sys.argv[2:], work_directory=sys.argv[1])
    for job in jobs:
        job.cancel()
    for job in jobs:
        assert job.wait().state.name == "CANCELED", job.status
""")


def _plan(tmp: Path) -> Tuple[Dict[str, Tuple[str, str]], Dict[str, Tuple[JobState, int]]]:
    """Each job's executor and script, and the state and exit code it must end with (the
    code of a cancelled Slurm job is whatever Slurm says: not checked)."""
    late, after = tmp / "late", tmp / "after"
    plan: Dict[str, Tuple[str, str]] = {}
    want: Dict[str, Tuple[JobState, int]] = {}

    def add(key: str, executor: str, script: str, state: JobState, code: int) -> None:
        plan[key], want[key] = (executor, script), (state, code)

    for i in range(SIZE // 5):
        code = i % 4
        state = JobState.COMPLETED if code == 0 else JobState.FAILED
        add(f"local-quick-{i}", "local", f"exit {code}", state, code)
        # These end when no process of the submitting script is alive.
        add(f"local-late-{i}", "local", f"while [ ! -e {late} ]; do sleep 0.1; done; "
            f"exit {code + 10}", JobState.FAILED, code + 10)
        # Killed from outside while nobody watched: SIGTERM, as a shell would report it.
        add(f"local-killed-{i}", "local", "exec sleep 600", JobState.FAILED, 128 + 15)
        # Cancelled through psij by another short-lived process while the script was dead.
        add(f"local-cancelled-{i}", "local", "exec sleep 600", JobState.CANCELED, -1)
        # Still running when re-attached; they end afterwards.
        add(f"local-after-{i}", "local", f"while [ ! -e {after} ]; do sleep 0.1; done; "
            f"exit {code}", state, code)
    for i in range(SIZE // 5):
        add(f"slurm-ok-{i}", "slurm", "exit 0", JobState.COMPLETED, 0)
        add(f"slurm-fails-{i}", "slurm", f"exit {3 + i % 2}", JobState.FAILED, 3 + i % 2)
    for i in range(SIZE - 2 * (SIZE // 5)):
        add(f"slurm-cancelled-{i}", "slurm", "sleep 600", JobState.CANCELED, -1)
    return plan, want


def _submit_then_kill(wd: Path, plan_file: Path) -> Dict[str, Tuple[str, str]]:
    proc = subprocess.Popen([sys.executable, "-c", SUBMIT_ALL, str(wd), str(plan_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert line, err
    return {k: (v[0], v[1]) for k, v in json.loads(line).items()}


def _gone_from_squeue(native_ids: List[str]) -> bool:
    out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(native_ids)],
                         capture_output=True, text=True, timeout=60).stdout
    return not out.strip()


def test_400_jobs_of_a_killed_script_end_with_their_true_states(tmp_path: Path) -> None:
    problem = _scheduler_problem("slurm")
    if problem:
        pytest.skip(problem)
    wd = tmp_path / "work"
    plan, want = _plan(tmp_path)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    jobs = _submit_then_kill(wd, plan_file)
    assert len(jobs) == 2 * SIZE
    try:
        _act_while_nobody_watches(tmp_path, wd, jobs)
        attached = {j.id: j for j in psij.registry.reattach(tag="full", work_directory=wd)}
        assert len(attached) == 2 * SIZE
        for key, (jid, nid) in jobs.items():
            assert attached[jid].native_id == nid, key
        running = [k for k in jobs if k.startswith("local-after")]
        assert all(attached[jobs[k][0]].status.state is JobState.ACTIVE for k in running)
        (tmp_path / "after").touch()
        wrong = {}
        for key, (jid, _) in jobs.items():
            status = attached[jid].wait(WAIT)
            got = (status.state, status.exit_code) if status is not None else None
            state, code = want[key]
            if got is None or got[0] is not state or (code >= 0 and got[1] != code):
                wrong[key] = (got, want[key], status.message if status else None)
        assert not wrong, wrong
        psij.registry.flush()
        recorded = {r.id: (r.state, r.exit_code)
                    for r in psij.registry.find(tag="full", work_directory=wd)}
        assert len(recorded) == 2 * SIZE
        for key, (jid, _) in jobs.items():
            state, code = want[key]
            assert recorded[jid][0] is state and (code < 0 or recorded[jid][1] == code), key
        for job in attached.values():
            close = getattr(job.executor, "close", None)
            if callable(close):
                close()
    finally:
        _clean_up(tmp_path, jobs)


def _act_while_nobody_watches(tmp: Path, wd: Path, jobs: Dict[str, Tuple[str, str]]) -> None:
    cancelled = [nid for k, (_, nid) in jobs.items() if k.startswith("slurm-cancelled")]
    subprocess.run(["scancel", *cancelled], check=True, timeout=120)
    for key, (_, nid) in jobs.items():
        if key.startswith("local-killed"):
            os.killpg(int(nid), signal.SIGTERM)
    ids = [jid for k, (jid, _) in jobs.items() if k.startswith("local-cancelled")]
    done = subprocess.run([sys.executable, "-c", CANCEL, str(wd), *ids], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (tmp / "late").touch()
    late = [jid for k, (jid, _) in jobs.items() if k.startswith("local-late")]
    slurm = [nid for k, (_, nid) in jobs.items() if k.startswith("slurm")]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        records = psij.registry.find(late, work_directory=wd)
        if all(r.state.final for r in records) and _gone_from_squeue(slurm):
            return
        time.sleep(0.5)
    raise AssertionError("the late local jobs were not recorded, or Slurm kept jobs, within "
                         "240 s")


def _clean_up(tmp: Path, jobs: Dict[str, Tuple[str, str]]) -> None:
    (tmp / "late").touch()
    (tmp / "after").touch()
    slurm = [nid for k, (_, nid) in jobs.items() if k.startswith("slurm")]
    subprocess.run(["scancel", *slurm], timeout=120)
