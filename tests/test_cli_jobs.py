"""``psij submit/status/wait/cancel/list/attach`` over the job registry, run as users run them:
the console script in real shells, on the registry of a private HOME."""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List

import pytest

import psij.registry
from psij import Job, JobExecutor, JobExecutorConfig, JobSpec, JobState
from psij._registry.accounting import NO_USE
from real.test_batch_real import _scheduler_problem

PSIJ = str(Path(sys.executable).parent / "psij")
WAIT = timedelta(seconds=120)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


def env(home: Path) -> Dict[str, str]:
    return dict(os.environ, HOME=str(home))


def psij_cmd(home: Path, *args: Any, timeout: float = 300) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([PSIJ, *args], capture_output=True, text=True, env=env(home),
                          timeout=timeout)


def listed(home: Path, *args: str) -> List[Dict[str, Any]]:
    done = psij_cmd(home, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_parallel_submits_are_all_recorded_once_and_wait_gives_the_worst(home: Path) -> None:
    def submit(i: int) -> str:
        code = 3 if i % 5 == 0 else 0
        done = subprocess.run(["/bin/sh", "-c", f'"{PSIJ}" submit --tag par -- /bin/sh -c '
                                                f'"sleep 0.5; exit {code}"'],
                              capture_output=True, text=True, env=env(home), timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    with ThreadPoolExecutor(20) as pool:  # 100 shells, 20 at a time
        ids = list(pool.map(submit, range(100)))
    assert len(set(ids)) == 100
    waited = psij_cmd(home, "wait", "--tag", "par")
    assert waited.returncode == 3, waited.stderr
    jobs = listed(home, "list")
    assert sorted(j["id"] for j in jobs) == sorted(ids)
    for i, jid in enumerate(ids):
        [job] = [j for j in jobs if j["id"] == jid]
        expected = ("FAILED", 3) if i % 5 == 0 else ("COMPLETED", 0)
        assert (job["state"], job["exit_code"]) == expected
        assert job["tag"] == "par" and job["executor"] == "local" and job["final"] is True
    # The table lists every job once, under a header.
    table = psij_cmd(home, "status", "--tag", "par").stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "EXECUTOR", "NATIVE_ID", "TAG", "STATE"]
    assert sorted(line.split()[0] for line in table[1:]) == sorted(ids)


def test_submit_returns_at_once_and_cancel_and_wait_work_on_a_local_job(home: Path) -> None:
    done = psij_cmd(home, "submit", "--", "/bin/sleep", "600")
    assert done.returncode == 0, done.stderr
    jid = done.stdout.strip()
    [job] = listed(home, "status", jid)
    assert set(job) >= {"id", "executor", "native_id", "tag", "state", "exit_code", "message"}
    assert (job["id"], job["state"], job["final"]) == (jid, "ACTIVE", False)
    cancel = psij_cmd(home, "cancel", jid)
    assert cancel.returncode == 0, cancel.stderr
    waited = psij_cmd(home, "wait", jid, "--json")
    assert waited.returncode == 130
    assert json.loads(waited.stdout)[0]["state"] == "CANCELED"


def test_status_all_shows_what_executors_report_now(home: Path) -> None:
    marker = home / "go"
    jid = psij_cmd(home, "submit", "--tag", "s", "--", "/bin/sh", "-c",
                   f"while [ ! -e {marker} ]; do sleep 0.1; done; exit 6").stdout.strip()
    assert [j["state"] for j in listed(home, "status", "--all")] == ["ACTIVE"]
    marker.touch()
    assert psij_cmd(home, "wait", jid).returncode == 6
    [job] = listed(home, "status", "--all")
    assert (job["state"], job["exit_code"]) == ("FAILED", 6)
    assert "6" in (job["message"] or "")


def test_status_without_ids_tag_or_all_is_a_usage_error_as_its_help_says(home: Path) -> None:
    # Re-attaching every job ever recorded asks every executor (and remote host) it used:
    # status does it for --all only, as its help says; list shows them all without asking.
    jid = psij_cmd(home, "submit", "--", "/bin/sleep", "600").stdout.strip()
    try:
        helped = psij_cmd(home, "status", "--help")
        assert "--all" in helped.stdout and "no job named" in " ".join(helped.stdout.split())
        for args in ([], ["--json"]):
            bare = psij_cmd(home, "status", *args)
            assert bare.returncode == 2, bare.stderr
            assert bare.stdout == ""
            assert "--all" in bare.stderr and "psij list" in bare.stderr, bare.stderr
        assert [j["id"] for j in listed(home, "status", "--all")] == [jid]
        assert [j["id"] for j in listed(home, "list")] == [jid]
    finally:
        assert psij_cmd(home, "cancel", jid).returncode == 0


def test_attach_adopts_a_job_submitted_elsewhere(home: Path) -> None:
    wd = home / ".psij" / "work"
    psij.registry.set_recording(False)
    try:
        ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=wd))
        job = Job(JobSpec("/bin/sleep", ["600"]))
        ex.submit(job)
    finally:
        psij.registry.set_recording(True)
    assert psij.registry.find(work_directory=wd) == []
    done = psij_cmd(home, "attach", "--executor", "local", "--tag", "adopted", str(job.native_id))
    assert done.returncode == 0, done.stderr
    new_id = done.stdout.strip()
    [rec] = listed(home, "list", "--tag", "adopted")
    assert (rec["id"], rec["native_id"], rec["state"]) == (new_id, job.native_id, "ACTIVE")
    job.cancel()
    assert job.wait(WAIT).state is JobState.CANCELED
    unknown = psij_cmd(home, "attach", "--executor", "local", "999999999")
    assert unknown.returncode == 1 and "999999999" in unknown.stderr


def test_list_filters_by_executor_and_state(home: Path) -> None:
    ids = [psij_cmd(home, "submit", "--", "/bin/sh", "-c", f"exit {c}").stdout.strip()
           for c in (0, 1)]
    assert psij_cmd(home, "wait", *ids).returncode == 1
    assert [j["id"] for j in listed(home, "list", "--state", "failed")] == [ids[1]]
    assert [j["id"] for j in listed(home, "list", "--state", "COMPLETED")] == [ids[0]]
    assert listed(home, "list", "--executor", "slurm") == []
    bad = psij_cmd(home, "list", "--state", "DONE")
    assert bad.returncode == 2 and "state" in bad.stderr and "COMPLETED" in bad.stderr


def test_piping_into_head_ends_quietly(home: Path) -> None:
    from psij._registry.store import open_store

    wd = home / ".psij" / "work"
    store = open_store(wd)
    store.write([(f"job-{i:05}", "local", "0", None, "{}", str(i), None, "t", float(i),
                  "COMPLETED", 6, 0, None, float(i), 1, 1, None, None, *NO_USE)
                 for i in range(5000)],
                [])
    for command in ("list", "status --all", "list --json"):
        done = subprocess.run(f'"{PSIJ}" {command} | head -1', shell=True, capture_output=True,
                              text=True, env=env(home), timeout=120)
        assert done.stdout.count("\n") == 1
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_bad_usage_is_a_clear_error(home: Path) -> None:
    nothing = psij_cmd(home, "wait")
    assert nothing.returncode == 2 and "--tag" in nothing.stderr
    unknown = psij_cmd(home, "status", "no-such-id")
    assert unknown.returncode == 2 and "no-such-id" in unknown.stderr
    no_tag = psij_cmd(home, "cancel", "--tag", "nobody")
    assert no_tag.returncode == 2 and "nobody" in no_tag.stderr
    bad_tag = subprocess.run([PSIJ.encode(), b"submit", b"--tag", b"\xff", b"--", b"/bin/true"],
                             capture_output=True, env=env(home), timeout=60)
    assert bad_tag.returncode == 2 and b"tag" in bad_tag.stderr
    assert listed(home, "list") == []  # nothing was submitted


def test_a_damaged_registry_is_reported_naming_the_file(home: Path) -> None:
    wd = home / ".psij" / "work"
    wd.mkdir(parents=True, mode=0o700)
    path = wd / "jobs.sqlite"
    path.write_bytes(b"garbage" * 1000)
    path.chmod(0o600)
    for args in (["status", "--all"], ["list"], ["submit", "--", "/bin/true"]):
        done = psij_cmd(home, *args)
        assert done.returncode == 1, args
        assert str(path) in done.stderr and "Traceback" not in done.stderr
    assert path.read_bytes() == b"garbage" * 1000


# A custom attribute that keeps a job queued: a start time an hour (a few years) away.
_LATER = {"slurm": "slurm.begin=now+1hour", "sge": "sge.a=203001010000"}


@pytest.mark.parametrize("scheduler", [pytest.param("slurm", marks=pytest.mark.slurm),
                                       pytest.param("sge", marks=pytest.mark.sge)])
def test_submit_status_cancel_and_wait_on_a_real_scheduler(home: Path, scheduler: str) -> None:
    problem = _scheduler_problem(scheduler)
    if problem:
        pytest.skip(problem)
    out = home / "out"
    marker = home / "running"

    def submit(*args: str) -> str:
        done = psij_cmd(home, "submit", "--executor", scheduler, "--tag", "real", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    fails = submit("--stdout", str(out), "--", "/bin/sh", "-c", "echo hi; exit 4")
    running = submit("--", "/bin/sh", "-c", f"touch {marker}; sleep 600")
    queued = submit("--attr", _LATER[scheduler], "--", "/bin/sleep", "600")
    [view] = listed(home, "status", queued)
    assert view["state"] == "QUEUED"
    native = view["native_id"]  # the scheduler's job id names it too
    assert [j["id"] for j in listed(home, "status", native)] == [queued]
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert listed(home, "status", running)[0]["state"] == "ACTIVE"
    cancel = psij_cmd(home, "cancel", running[:8], native)
    assert cancel.returncode == 0, cancel.stderr
    waited = psij_cmd(home, "wait", "--tag", "real", "--json")
    assert waited.returncode == 130, waited.stderr  # the worst: a canceled job
    states = {j["id"]: (j["state"], j["exit_code"]) for j in json.loads(waited.stdout)}
    assert states[fails] == ("FAILED", 4)
    assert states[running][0] == "CANCELED" and states[queued][0] == "CANCELED"
    assert out.read_text() == "hi\n"


def test_status_shows_the_attempt_and_last_rerun_of_a_job_run_again(home: Path) -> None:
    from psij._registry.store import open_store

    wd = home / ".psij" / "work"
    rerun = json.dumps({"rerun": "retry", "cause": "out_of_memory", "requeues": 0,
                        "retries": 2})
    now = time.time()
    open_store(wd).write([
        ("job-again", "local", "0", None, "{}", "77", None, None, now, "COMPLETED", 6, 0, None,
         now, 1, 3, rerun, None, *NO_USE),
        ("job-once", "local", "0", None, "{}", "78", None, None, now, "FAILED", 6, 2,
         "exit 2", now, 1, 1, None, None, *NO_USE)], [])
    for command in (["status", "job-again", "job-once"], ["list"]):
        done = psij_cmd(home, *command)
        assert done.returncode == 0, done.stderr
        lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
        assert lines["job-again"].rstrip().endswith("attempt 3 (retry after out_of_memory)")
        assert "attempt" not in lines["job-once"] and lines["job-once"].endswith("exit 2")
    for command in (["status", "job-again", "job-once"], ["list"]):
        views = {v["id"]: v for v in listed(home, *command)}
        assert views["job-again"]["attempt"] == 3
        assert views["job-again"]["rerun"] == {"rerun": "retry", "cause": "out_of_memory",
                                               "requeues": 0, "retries": 2}
        assert views["job-once"]["attempt"] == 1 and views["job-once"]["rerun"] is None


def test_status_shows_the_run_a_live_job_is_in_now() -> None:
    # A job re-attached by status that ran again since it was recorded: its run now.
    from psij import JobStatus
    from psij._retry import Runs
    from psij.cli._jobs import _live, _message

    job = Job(JobSpec("/bin/true"))
    runs = Runs(2, None, attempt=3)
    job.__dict__["_runs"] = runs
    job._set_status(JobStatus(JobState.QUEUED, message="requeued (preempted): run 3, at most 3",
                              metadata={"attempt": 3, "rerun": "requeue", "cause": "preempted"}))
    recorded = ("j", "slurm", "5", None, "ACTIVE", None, None, False, 2,
                json.dumps({"rerun": "requeue", "cause": "node_failure"}), None, None, None)
    now = _live(recorded, job)
    assert now[4] == "QUEUED" and now[8:] == (3, ("requeue", "preempted"), None, None, None)
    assert _message(now).startswith("attempt 3 (requeue after preempted): requeued")
    assert _message(recorded) == "attempt 2 (requeue after node_failure)"
