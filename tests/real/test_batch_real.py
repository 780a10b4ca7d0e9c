"""Acceptance tests on the real Slurm and Grid Engine started by tests/setup (make schedulers).

All the jobs of one scheduler are submitted together by a module fixture, so that the slow ones
(the time limit needs about a minute on Slurm) run alongside the others; each test then checks
its own job. Without a running scheduler the tests skip, saying why.
"""

import json
import shutil
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, JobStatus, ResourceSpecV1
from psij.executors.batch._runner import CommandResult, SubprocessRunner
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from support.campaigns import Campaigns

WAIT = timedelta(seconds=240)
HOSTILE = ["two words", "it's", "say \"hi\"", "back\\slash", "$HOME", "$(touch PWNED)",
           "`touch PWNED`", "semi; touch PWNED", "glob *", "new\nline", "é ✓", ""]


def _scheduler_problem(name: str) -> Optional[str]:
    """Why the scheduler cannot be used here, or None when it answers."""
    setup = f"tests/setup/start-{name}.sh starts one as root with apt-get"
    if name == "slurm":
        if shutil.which("sbatch") is None:
            return f"Slurm is not installed ({setup})"
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
        if "UP" not in ping.stdout:
            return f"Slurm is not running: scontrol ping says {ping.stdout.strip()!r} ({setup})"
        return None
    if shutil.which("qsub") is None:
        return f"Grid Engine is not installed ({setup})"
    qstat = subprocess.run(["qstat"], capture_output=True, text=True)
    if qstat.returncode != 0:
        return f"Grid Engine is not running: qstat says {qstat.stderr.strip()!r} ({setup})"
    return None


def _need(name: str) -> None:
    problem = _scheduler_problem(name)
    if problem is not None:
        pytest.skip(problem)


class Campaign:
    """The jobs submitted to one scheduler at the start of the module."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        self.config = BatchSchedulerExecutorConfig(work_directory=work / "psij",
                                                   queue_polling_interval=1,
                                                   initial_queue_polling_delay=0.5)
        executor = JobExecutor.get_instance(name, config=self.config)
        assert isinstance(executor, BatchSchedulerExecutor)
        self.ex = executor
        self.jobs: Dict[str, Job] = {}

    def submit(self, key: str, spec: JobSpec) -> Job:
        job = Job(spec)
        self.ex.submit(job)
        self.jobs[key] = job
        return job

    def final(self, key: str) -> JobStatus:
        st = self.jobs[key].wait(WAIT)
        assert st is not None, f"{self.name} job {key} ({self.jobs[key].native_id}) not done"
        return st


def _start(name: str, work: Path) -> Campaign:
    c = Campaign(name, work)
    out = work / "out"
    out.mkdir()
    hold = {"slurm": "slurm.hold", "sge": "sge.h"}[name]
    c.submit("stdout", JobSpec("/bin/echo", ["hello", "batch world"], stdout_path=out / "hello"))
    c.submit("exit3", JobSpec("/bin/sh", ["-c", "echo 'cannot open input.dat' >&2; exit 3"],
                              stderr_path=out / "exit3.err"))
    for code in (99, 100):  # Grid Engine acts on a script's 99 (requeue) and 100 (error)
        c.submit(f"exit{code}", JobSpec("/bin/sh", ["-c", f"exit {code}"]))
    c.submit("running", JobSpec("/bin/sleep", ["600"]))
    c.submit("listed", JobSpec("/bin/sleep", ["600"]))
    c.submit("pending", JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={hold: True})))
    limit = timedelta(minutes=1) if name == "slurm" else timedelta(seconds=5)
    c.submit("timeout", JobSpec("/bin/sleep", ["600"], attributes=JobAttributes(duration=limit)))
    launchers = ["srun", "mpirun"] if name == "slurm" else ["mpirun"]
    for launcher in launchers:
        if launcher == "mpirun" and shutil.which("mpirun") is None:
            continue
        c.submit(f"two-{launcher}", JobSpec(
            "/bin/sh", ["-c", 'echo "rank ${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID} of '
                              '$(wc -l < "$PSIJ_NODEFILE")"'],
            stdout_path=out / f"two-{launcher}", launcher=launcher,
            resources=ResourceSpecV1(process_count=2)))
    if name == "slurm":
        c.submit("no-inherit", JobSpec(
            "/bin/sh", ["-c", 'echo "X=$X HOME=${HOME-unset}"'], environment={"X": "a b"},
            inherit_environment=False, launcher="srun", stdout_path=out / "no-inherit",
            resources=ResourceSpecV1(process_count=2)))
    c.submit("attach-running", JobSpec("/bin/sh", ["-c", "sleep 12; exit 4"]))
    c.submit("attach-done", JobSpec("/bin/true"))
    weird = work / "dir 'q' \"d\" $(touch PWNED) é"
    weird.mkdir()
    dump = ("import json, os, sys; print(json.dumps({'args': sys.argv[1:], "
            "'env': os.environ['HOSTILE'], 'cwd': os.getcwd()}))")
    c.submit("hostile", JobSpec(sys.executable, ["-c", dump, *HOSTILE], directory=weird,
                                stdout_path=weird / "out 'x'.json",
                                environment={"HOSTILE": "$(touch PWNED) `id` \"q\"\nline"},
                                name="job 'n' \"q\" $(touch PWNED) é"))
    return c


_campaigns = Campaigns(lambda name, folder: _start(name, folder),
                       lambda name: _scheduler_problem(name) is None)


def _close(c: Campaign) -> None:
    for job in c.jobs.values():
        if not job.status.state.final:
            try:
                job.cancel()
            except Exception:
                pass
    c.ex.close()


@pytest.fixture(scope="module")
def campaign_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("real")
    _campaigns.close_all(_close)


def campaign(name: str, root: Path) -> Campaign:
    """The scheduler's campaign (the other scheduler's jobs are submitted too, so both run at
    the same time)."""
    _need(name)
    return _campaigns.get(name, root)


SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_stdout_job_completes_with_exact_output(name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    st = c.final("stdout")
    assert st.state is JobState.COMPLETED and st.exit_code == 0, st
    assert (c.work / "out" / "hello").read_text() == "hello batch world\n"


@pytest.mark.parametrize("name", SCHEDULERS)
def test_exit_3_fails_with_code_and_stderr(name: str, campaign_root: Path) -> None:
    st = campaign(name, campaign_root).final("exit3")
    assert st.state is JobState.FAILED and st.exit_code == 3, st
    assert "code 3" in str(st.message) and "cannot open input.dat" in str(st.message)


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("code", [99, 100])
def test_exit_codes_a_scheduler_acts_on_only_fail_the_job(name: str, code: int,
                                                          campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    st = c.final(f"exit{code}")
    assert st.state is JobState.FAILED and st.exit_code == code, st
    native_id = str(c.jobs[f"exit{code}"].native_id)
    if name == "sge":  # ran once, ended, and is not left in the queue (requeued or in error)
        listed = subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True,
                                timeout=60).stdout.split()
        assert native_id not in listed
        records = subprocess.run(["qacct", "-j", native_id], capture_output=True, text=True,
                                 timeout=60).stdout
        assert records.count("jobnumber") <= 1, records


@pytest.mark.parametrize("name", SCHEDULERS)
def test_cancel_running_and_pending(name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    running, pending = c.jobs["running"], c.jobs["pending"]
    assert running.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    assert pending.status.state is JobState.QUEUED
    pending.cancel()
    running.cancel()
    for key in ("running", "pending"):
        st = c.final(key)
        assert st.state is JobState.CANCELED, (key, st)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_time_limit_is_named(name: str, campaign_root: Path) -> None:
    st = campaign(name, campaign_root).final("timeout")
    assert st.state is JobState.FAILED, st
    assert "time limit" in str(st.message), st
    limit = "0:01:00" if name == "slurm" else "0:00:05"
    assert limit in str(st.message)


@pytest.mark.slurm
def test_slurm_time_limit_gives_the_batch_steps_signal(campaign_root: Path) -> None:
    # sacct reads TIMEOUT|0:0 for the allocation; the batch step was CANCELLED by SIGTERM.
    st = campaign("slurm", campaign_root).final("timeout")
    assert st.state is JobState.FAILED and st.exit_code == 143, st
    assert "SIGTERM" in str(st.message), st


@pytest.mark.parametrize("name,launcher", [
    pytest.param("slurm", "srun", marks=pytest.mark.slurm),
    pytest.param("slurm", "mpirun", marks=[pytest.mark.slurm, pytest.mark.mpi]),
    pytest.param("sge", "mpirun", marks=[pytest.mark.sge, pytest.mark.mpi]),
])
def test_two_process_job(name: str, launcher: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    if f"two-{launcher}" not in c.jobs:
        pytest.skip(f"{launcher} is not installed")
    st = c.final(f"two-{launcher}")
    assert st.state is JobState.COMPLETED, st
    lines = sorted((c.work / "out" / f"two-{launcher}").read_text().splitlines())
    assert lines == ["rank 0 of 2", "rank 1 of 2"]


@pytest.mark.slurm
def test_slurm_without_inherited_environment_steps_see_the_job_environment(
        campaign_root: Path) -> None:
    c = campaign("slurm", campaign_root)
    st = c.final("no-inherit")
    assert st.state is JobState.COMPLETED, st
    lines = (c.work / "out" / "no-inherit").read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("X=a b ") for line in lines)


ATTACH = textwrap.dedent("""
    import sys
    from datetime import timedelta
    from psij import Job, JobExecutor
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
    cfg = BatchSchedulerExecutorConfig(work_directory=sys.argv[2], queue_polling_interval=1)
    ex = JobExecutor.get_instance(sys.argv[1], config=cfg)
    job = Job()
    ex.attach(job, sys.argv[3])
    st = job.wait(timedelta(seconds=120))
    print(st.state, st.exit_code)
""")


@pytest.mark.parametrize("name", SCHEDULERS)
def test_attach_from_another_process(name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    assert c.final("attach-done").state is JobState.COMPLETED
    running = c.jobs["attach-running"]
    assert running.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    procs = [subprocess.Popen([sys.executable, "-c", ATTACH, name, str(c.config.work_directory),
                               str(c.jobs[key].native_id)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for key in ("attach-running", "attach-done")]
    outputs = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    assert outputs[0][0].strip() == "FAILED 4"
    assert outputs[1][0].strip() == "COMPLETED 0"
    assert c.final("attach-running").exit_code == 4


@pytest.mark.parametrize("name", SCHEDULERS)
def test_list_shows_our_jobs(name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    job = c.jobs["listed"]
    assert job.native_id in c.ex.list()
    job.cancel()
    assert c.final("listed").state is JobState.CANCELED


@pytest.mark.parametrize("name", SCHEDULERS)
def test_hostile_strings_arrive_byte_exact(name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    st = c.final("hostile")
    assert st.state is JobState.COMPLETED, st
    weird = c.work / "dir 'q' \"d\" $(touch PWNED) é"
    seen = json.loads((weird / "out 'x'.json").read_text())
    assert seen == {"args": HOSTILE, "env": "$(touch PWNED) `id` \"q\"\nline",
                    "cwd": str(weird)}
    assert not list(c.work.rglob("PWNED"))


class FaultyStatusRunner:
    """The real runner, except that about a third of status commands fail: non-zero exit, a
    hang past the timeout, or garbage output, in turn."""

    def __init__(self, status_program: str) -> None:
        self.real = SubprocessRunner()
        self.status_program = status_program
        self.calls = 0
        self.lock = threading.Lock()

    def run(self, argv: Sequence[str], timeout: float,
            stdin: Optional[str] = None) -> CommandResult:
        if argv[0] != self.status_program:
            return self.real.run(argv, timeout, stdin)
        with self.lock:
            self.calls += 1
            n = self.calls
        # The first three calls fail, one of each kind, then a third of the others: on a
        # cluster fast enough to end the jobs in a few polls, every fault still happens.
        if n <= 3:
            fault = ("nonzero", "hang", "garbage")[n - 1]
        else:
            fault = ["ok", "nonzero", "ok", "ok", "hang", "ok", "ok", "garbage", "ok"][n % 9]
        if fault == "nonzero":
            return self.real.run(["sh", "-c", "echo 'error: connection refused' >&2; exit 1"],
                                 timeout)
        if fault == "hang":
            return self.real.run(["sleep", "600"], timeout)
        result = self.real.run(argv, timeout, stdin)
        if fault == "garbage":
            return CommandResult(result.argv, 0, "\x00garbage\n" + result.stdout[:50], "")
        return result


@pytest.mark.slurm
def test_fault_injection_200_jobs_on_slurm(campaign_root: Path) -> None:
    _need("slurm")
    work = campaign_root / "faults"
    work.mkdir()
    cfg = BatchSchedulerExecutorConfig(work_directory=work, queue_polling_interval=1,
                                       initial_queue_polling_delay=0.5, command_timeout=3)
    ex = JobExecutor.get_instance("slurm", config=cfg)
    assert isinstance(ex, BatchSchedulerExecutor)
    runner = FaultyStatusRunner("squeue")
    ex._runner = runner
    kinds = {0: ("exit 0", JobState.COMPLETED), 1: ("exit 7", JobState.FAILED),
             2: ("sleep 300", JobState.CANCELED)}
    jobs: List[Tuple[int, Job]] = []
    for i in range(200):
        job = Job(JobSpec("/bin/sh", ["-c", kinds[i % 3][0]], attributes=JobAttributes(
            duration=timedelta(minutes=10))))
        ex.submit(job)
        jobs.append((i % 3, job))
    for kind, job in jobs:
        if kind == 2:
            job.cancel()
    wrong = []
    for kind, job in jobs:
        st = job.wait(timedelta(seconds=300))
        if st is None or st.state is not kinds[kind][1] or (kind == 1 and st.exit_code != 7):
            wrong.append((kind, job.native_id, st))
    ex.close()
    assert wrong == []
    assert runner.calls >= 4  # each fault injected at least once (calls 1, 2 and 3)
