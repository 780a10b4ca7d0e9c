"""The batch-test executor end to end: real submit scripts run by the fake scheduler, with the
shared batch machinery (polling, accounting, exit-code files, cancel, attach, faults)."""

import json
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import List, Tuple

import pytest

from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    ResourceSpecV1,
)
from psij.executors.batch.batch_test import BatchTestExecutorConfig, BatchTestJobExecutor

WAIT = timedelta(seconds=60)
HOSTILE = ["plain", "two words", "it's", "say \"hi\"", "back\\slash", "$HOME", "${PATH}",
           "semi; echo INJECTED", "glob * ?", "~", "#hash", "tab\tx", "new\nline", "é ✓ 日本",
           "", "-n"]


@pytest.fixture
def ex(tmp_path: Path) -> BatchTestJobExecutor:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.2,
                                  initial_queue_polling_delay=0.1, keep_finished=1)
    executor = JobExecutor.get_instance("batch-test", config=cfg)
    assert isinstance(executor, BatchTestJobExecutor)
    yield executor
    executor.close()


def run(ex: JobExecutor, spec: JobSpec) -> Tuple[Job, "object"]:
    job = Job(spec)
    ex.submit(job)
    st = job.wait(WAIT)
    assert st is not None, f"job {job.native_id} did not finish"
    return job, st


def test_stdout_is_exact_and_job_completes(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job, st = run(ex, JobSpec("/bin/echo", ["hello", "world"], stdout_path=out))
    assert st.state is JobState.COMPLETED and st.exit_code == 0  # type: ignore[attr-defined]
    assert out.read_text() == "hello world\n"
    assert not list((tmp_path / "work" / "batch-test").glob(f"{job.id}.job"))
    assert job.native_id in ex.list()


def test_exit_code_and_stderr_excerpt(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    err = tmp_path / "err.txt"
    _, st = run(ex, JobSpec("/bin/sh", ["-c", "echo first >&2; echo 'disk full' >&2; exit 3"],
                            stderr_path=err))
    assert st.state is JobState.FAILED and st.exit_code == 3  # type: ignore[attr-defined]
    assert "code 3" in st.message and "disk full" in st.message  # type: ignore[attr-defined]


def test_time_limit_is_named(ex: BatchTestJobExecutor) -> None:
    _, st = run(ex, JobSpec("/bin/sleep", ["30"],
                            attributes=JobAttributes(duration=timedelta(seconds=1))))
    assert st.state is JobState.FAILED  # type: ignore[attr-defined]
    assert "time limit (0:00:01)" in st.message  # type: ignore[attr-defined]
    assert st.metadata["native_state"] == "TIMEOUT"  # type: ignore[attr-defined]


def test_cancel_running_and_pending(ex: BatchTestJobExecutor) -> None:
    running = Job(JobSpec("/bin/sleep", ["30"]))
    pending = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"batch-test.queue-delay": 30})))
    ex.submit(running)
    ex.submit(pending)
    assert running.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    pending.cancel()
    running.cancel()
    for job in (running, pending):
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.CANCELED, st
    running.cancel()  # cancelling a finished job does nothing


def test_launcher_failure_is_reported(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    _, st = run(ex, JobSpec("/bin/true", pre_launch=tmp_path / "missing pre-launch.sh"))
    assert st.state is JobState.FAILED  # type: ignore[attr-defined]
    assert "launcher failed" in st.message  # type: ignore[attr-defined]
    assert "missing pre-launch.sh" in st.message  # type: ignore[attr-defined]


def test_missing_directory_is_a_launch_failure(ex: BatchTestJobExecutor,
                                               tmp_path: Path) -> None:
    _, st = run(ex, JobSpec("/bin/true", directory=tmp_path / "does not exist"))
    assert st.state is JobState.FAILED  # type: ignore[attr-defined]
    assert "does not exist" in st.message  # type: ignore[attr-defined]


@pytest.mark.parametrize("launcher", ["multiple", "mpirun"])
def test_two_processes_see_a_nodefile(ex: BatchTestJobExecutor, tmp_path: Path,
                                      launcher: str) -> None:
    if launcher == "mpirun" and not _have("mpirun"):
        pytest.skip("mpirun (OpenMPI) is not installed")
    out = tmp_path / "out.txt"
    _, st = run(ex, JobSpec("/bin/sh", ["-c", 'wc -l < "$PSIJ_NODEFILE"'], stdout_path=out,
                            launcher=launcher, resources=ResourceSpecV1(process_count=2)))
    assert st.state is JobState.COMPLETED, st  # type: ignore[attr-defined]
    assert out.read_text().split() == ["2", "2"]


def _have(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None


def test_hostile_strings_arrive_byte_exact(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    weird = tmp_path / "dir with 'quote' \"dq\" $(touch PWNED) `touch PWNED` é"
    weird.mkdir()
    out = weird / "out 'x' $(y).json"
    dump = ("import json, os, sys; print(json.dumps({'args': sys.argv[1:], "
            "'env': {k: os.environ[k] for k in ('A', 'B')}, 'cwd': os.getcwd()}))")
    env = {"A": HOSTILE[3] + HOSTILE[5] + "\n" + HOSTILE[7], "B": "`touch PWNED`$(touch PWNED)"}
    name = "job 'n' \"q\" $(touch PWNED) `x` é"
    job, st = run(ex, JobSpec(sys.executable, ["-c", dump, *HOSTILE], directory=weird,
                              stdout_path=out, environment=env, name=name))
    assert st.state is JobState.COMPLETED, st  # type: ignore[attr-defined]
    seen = json.loads(out.read_text())
    assert seen == {"args": HOSTILE, "env": env, "cwd": str(weird)}
    shown = subprocess.run(ex._tool("show", str(job.native_id)), capture_output=True,
                           check=True, text=True).stdout
    assert json.loads(shown)["job-name"] == name
    assert not list(tmp_path.rglob("PWNED")) and not (Path.cwd() / "PWNED").exists()


def test_unsafe_directive_values_are_refused(ex: BatchTestJobExecutor) -> None:
    job = Job(JobSpec("/bin/true", name="line1\n#BATCH_TEST --queue-delay=99"))
    with pytest.raises(InvalidJobException, match="JobSpec.name.*newline"):
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None


ATTACH = textwrap.dedent("""
    import sys
    from datetime import timedelta
    from psij import Job, JobExecutor
    from psij.executors.batch.batch_test import BatchTestExecutorConfig
    cfg = BatchTestExecutorConfig(work_directory=sys.argv[1], queue_polling_interval=0.2,
                                  keep_finished=1)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    job = Job()
    ex.attach(job, sys.argv[2])
    first = job.wait(timedelta(seconds=30), target_states=[job.status.state.QUEUED])
    print(first.state if first else "none", flush=True)
    st = job.wait(timedelta(seconds=60))
    print(st.state, st.exit_code)
""")


def test_attach_from_another_process(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    running = Job(JobSpec("/bin/sh", ["-c", "sleep 2; exit 4"]))
    done = Job(JobSpec("/bin/true"))
    ex.submit(running)
    ex.submit(done)
    assert done.wait(WAIT) is not None
    time.sleep(1.5)  # the finished job has left the fake queue: accounting must answer
    work = str(ex.config.work_directory)
    results = []
    for job in (running, done):
        proc = subprocess.run([sys.executable, "-c", ATTACH, work, str(job.native_id)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        results.append(proc.stdout.split("\n")[1])
    assert results[0] == "FAILED 4"
    assert results[1] == "COMPLETED 0"


def test_fault_injection_200_jobs_end_in_their_true_state(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.3,
                                  initial_queue_polling_delay=0.1, keep_finished=0.5,
                                  command_timeout=3, queue_polling_error_threshold=2)
    ex = BatchTestJobExecutor(config=cfg)
    cfg.spool_directory.mkdir(parents=True)
    # About a third of status calls fail: non-zero exit, hang past the timeout, garbage.
    (cfg.spool_directory / "faults").write_text("ok nonzero ok ok hang ok ok garbage ok")
    kinds = {0: ("exit 0", JobState.COMPLETED), 1: ("exit 5", JobState.FAILED),
             2: ("sleep 30", JobState.CANCELED), 3: ("sleep 30", JobState.FAILED)}

    def submit(i: int) -> Tuple[int, Job]:
        kind = i % 4
        duration = timedelta(seconds=1) if kind == 3 else timedelta(minutes=5)
        job = Job(JobSpec("/bin/sh", ["-c", kinds[kind][0]],
                          attributes=JobAttributes(duration=duration)))
        ex.submit(job)
        return kind, job

    with ThreadPoolExecutor(4) as pool:
        jobs: List[Tuple[int, Job]] = list(pool.map(submit, range(200)))
    for kind, job in jobs:
        if kind == 2:
            job.cancel()
    wrong = []
    for kind, job in jobs:
        st = job.wait(timedelta(seconds=180))
        expected = kinds[kind][1]
        if st is None or st.state is not expected or (kind == 1 and st.exit_code != 5) or (
                kind == 3 and "time limit" not in str(st.message)):
            wrong.append((kind, job.native_id, st))
    ex.close()
    assert wrong == []
    calls = int((cfg.spool_directory / "faults.count").read_text())
    assert calls >= 9, "the faults were not exercised"


def test_no_files_left_behind(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    run(ex, JobSpec("/bin/true"))
    run(ex, JobSpec("/bin/false"))
    left = sorted(p.name for p in (tmp_path / "work" / "batch-test").iterdir())
    assert left == [], left


def test_keep_files_keeps_them(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path, queue_polling_interval=0.2,
                                  keep_files=True)
    ex = BatchTestJobExecutor(config=cfg)
    job, _ = run(ex, JobSpec("/bin/true"))
    names = {p.name for p in (tmp_path / "batch-test").iterdir()}
    assert {f"{job.id}.job", f"{job.native_id}.ec", f"{job.native_id}.out"} <= names
    ex.close()
    assert os.path.exists(tmp_path / "batch-test" / f"{job.native_id}.nodefile")
