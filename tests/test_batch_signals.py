"""Signals to batch jobs (issue 21, item 4): the job's processes get a signal once and the whole
time they take to leave, because the submit script lives through it and waits for the job.

Each template's script is run here by bash, in a process group of its own as a scheduler starts
it, and sent the signal the way its scheduler sends it: to the script alone (Slurm, batch-test),
to the whole group (PBS, LSF), or as Grid Engine's USR2 warning after ``qdel`` (with the signal
asked for in ``<native id>.signal``). Then ``signal`` and a graceful cancel run end to end on the
batch-test scheduler; ``tests/real/test_batch_signals_real.py`` does the same on the real Slurm and
Grid Engine.
"""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch._signals import FORWARDABLE, check_signal
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from psij.executors.batch.batch_test import BatchTestExecutorConfig, BatchTestJobExecutor

WAIT = timedelta(seconds=60)
# The variable each template reads its native id from.
ID_VARIABLE = {"slurm": "SLURM_JOB_ID", "batch-test": "BATCH_TEST_JOB_ID", "sge": "JOB_ID",
               "pbs": "PBS_JOBID", "pbs_classic": "PBS_JOBID", "lsf": "LSB_JOBID"}
NATIVE_ID = "4242"


def trapping_payload(folder: Path, signame: str = "TERM", linger: float = 0.6) -> List[str]:
    """A job that counts the ``signame`` signals it gets, takes ``linger`` seconds to leave
    after the first and then exits 0 by itself; it writes ``ready`` once its trap is set."""
    script = f"""
        n=0
        trap 'n=$((n+1)); echo "$n" > "{folder}/count"' {signame}
        echo ready > "{folder}/ready"
        while [ "$n" = 0 ]; do sleep 0.05; done
        sleep {linger}
        echo "$n" > "{folder}/count"
        date +%s.%N > "{folder}/left"
        exit 0
    """
    return ["-c", script]


def wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def run_script(name: str, tmp_path: Path, spec: JobSpec,
               deliver: Callable[[int, Path], None]) -> Tuple[int, float, Path]:
    """Render ``name``'s script for ``spec``, run it as its scheduler would (a new session),
    call ``deliver(pid, work)`` once the job is ready; its exit status, the seconds from the
    delivery to its end, and the executor's work folder."""
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work"))
    assert isinstance(ex, BatchSchedulerExecutor)
    text = ex.submit_script(Job(spec))
    ex.work_directory.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{ID_VARIABLE[name]: NATIVE_ID})
    # A scheduler starts a job with every signal at its default action; a test run under
    # nohup ignores HUP, one run in the background of a script INT and QUIT, and a shell
    # started with a signal ignored can never trap it.
    was = {sig: signal.signal(sig, signal.SIG_DFL)
           for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(["/bin/bash", "-c", text], env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL)
    finally:
        for sig, action in was.items():
            signal.signal(sig, action)
    try:
        wait_for(tmp_path / "ready")
        start = time.monotonic()
        deliver(proc.pid, ex.work_directory)
        rc = proc.wait(timeout=30)
        return rc, time.monotonic() - start, ex.work_directory
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def to_script(signum: int) -> Callable[[int, Path], None]:
    return lambda pid, work: os.kill(pid, signum)


def to_group(signum: int) -> Callable[[int, Path], None]:
    return lambda pid, work: os.killpg(pid, signum)


def grid_engine_delete(requested: int = 0) -> Callable[[int, Path], None]:
    """What ``qdel`` of a ``-notify`` job does: USR2 to the whole group, after ``signal``
    wrote the signal asked for (0: none, a plain cancel)."""
    def deliver(pid: int, work: Path) -> None:
        if requested:
            (work / f"{NATIVE_ID}.signal").write_text(f"{requested}\n")
        os.killpg(pid, signal.SIGUSR2)
    return deliver


# How each scheduler delivers a signal to a running job (signal or cancel).
DELIVERY = {"slurm": to_script, "batch-test": to_script, "pbs": to_group,
            "pbs_classic": to_group, "lsf": to_group}


@pytest.mark.parametrize("name", [*sorted(DELIVERY), "sge"])
@pytest.mark.parametrize("launcher", ["single", "post-launch", "multiple"])
def test_the_job_gets_the_signal_once_and_leaves_by_itself(name: str, launcher: str,
                                                           tmp_path: Path) -> None:
    spec = JobSpec("/bin/bash", trapping_payload(tmp_path), directory=tmp_path,
                   stdout_path=tmp_path / "out", stderr_path=tmp_path / "err")
    if launcher == "post-launch":  # a launcher shell stays between the script and the job
        (tmp_path / "post.sh").write_text(f'echo "post $_PSI_J_EC" > "{tmp_path}/post"\n')
        spec.post_launch = str(tmp_path / "post.sh")
    elif launcher == "multiple":
        spec.launcher = "multiple"
    deliver = grid_engine_delete() if name == "sge" else DELIVERY[name](signal.SIGTERM)
    rc, elapsed, work = run_script(name, tmp_path, spec, deliver)
    assert rc == 0, (tmp_path / "err").read_text() if (tmp_path / "err").exists() else rc
    # The exit status, when the script wrote it, and the signal the script got.
    code, _, got, run = (work / f"{NATIVE_ID}.ec").read_text().split()
    assert code == "0" and got != "-" and run == "1"
    # Once; the multiple launcher also passes a TERM it gets on to its copies (it is written
    # for a launcher signalled alone), so there they may get it twice.
    assert (tmp_path / "count").read_text() in (("1\n", "2\n") if launcher == "multiple"
                                                else ("1\n",))
    assert elapsed >= 0.6, "the script ended before the job had left"
    if launcher == "post-launch":
        assert (tmp_path / "post").read_text() == "post 0\n"


@pytest.mark.parametrize("requested,signame", [(signal.SIGTERM, "TERM"), (signal.SIGINT, "INT"),
                                               (signal.SIGHUP, "HUP")])
def test_grid_engine_passes_on_the_signal_asked_for(requested: int, signame: str,
                                                    tmp_path: Path) -> None:
    spec = JobSpec("/bin/bash", trapping_payload(tmp_path, signame), directory=tmp_path)
    rc, elapsed, _work = run_script("sge", tmp_path, spec, grid_engine_delete(requested))
    assert rc == 0 and (tmp_path / "count").read_text() == "1\n" and elapsed >= 0.6


def test_grid_engine_jobs_start_with_its_warnings_ignored(tmp_path: Path) -> None:
    # Grid Engine sends USR1 (before a suspension) and USR2 (before a kill) to the whole job.
    spec = JobSpec("/bin/bash", ["-c", f"grep SigIgn /proc/$$/status > {tmp_path}/ign; "
                                       f"echo ready > {tmp_path}/ready"], directory=tmp_path)
    rc, _, _ = run_script("sge", tmp_path, spec, lambda pid, work: None)
    mask = int((tmp_path / "ign").read_text().split()[1], 16)
    assert rc == 0 and mask & (1 << (signal.SIGUSR1 - 1)) and mask & (1 << (signal.SIGUSR2 - 1))
    assert not mask & (1 << (signal.SIGINT - 1)) and not mask & (1 << (signal.SIGTERM - 1))


def test_a_job_killed_by_the_signal_reports_it(tmp_path: Path) -> None:
    spec = JobSpec("/bin/bash", ["-c", f"echo ready > {tmp_path}/ready; exec sleep 30"],
                   directory=tmp_path)
    rc, elapsed, work = run_script("slurm", tmp_path, spec, to_script(signal.SIGTERM))
    assert rc == 143 and elapsed < 10
    code, _, got, run = (work / f"{NATIVE_ID}.ec").read_text().split()
    assert (code, got, run) == ("143", "TERM", "1")


# ------------------------------------------------------------ end to end on batch-test


@pytest.fixture
def ex(tmp_path: Path) -> Iterator[BatchTestJobExecutor]:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=0.2,
                                  initial_queue_polling_delay=0.1, keep_finished=1)
    executor = JobExecutor.get_instance("batch-test", config=cfg)
    assert isinstance(executor, BatchTestJobExecutor)
    yield executor
    executor.close()


def running(ex: BatchSchedulerExecutor, spec: JobSpec, ready: Path) -> Job:
    job = Job(spec)
    ex.submit(job)
    assert job.wait(WAIT, target_states=[JobState.ACTIVE]) is not None
    wait_for(ready)
    return job


def test_signal_reaches_the_job_which_ends_by_itself(ex: BatchTestJobExecutor,
                                                     tmp_path: Path) -> None:
    job = running(ex, JobSpec("/bin/bash", trapping_payload(tmp_path, linger=2)),
                  tmp_path / "ready")
    sent = time.time()
    ex.signal(job, signal.SIGTERM)
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED and st.exit_code == 0, st
    assert (tmp_path / "count").read_text() == "1\n"
    assert float((tmp_path / "left").read_text()) - sent >= 2.0  # the whole time it needed


def test_a_signal_that_does_not_end_the_job_leaves_it_running(ex: BatchTestJobExecutor,
                                                              tmp_path: Path) -> None:
    script = (f"trap 'echo usr1 >> {tmp_path}/got' USR1; echo ready > {tmp_path}/ready; "
              f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done; exit 5")
    job = running(ex, JobSpec("/bin/bash", ["-c", script]), tmp_path / "ready")
    ex.signal(job, signal.Signals.SIGUSR1)
    ex.signal(job, int(signal.SIGUSR1))
    wait_for(tmp_path / "got")
    deadline = time.monotonic() + 10
    while (tmp_path / "got").read_text() != "usr1\nusr1\n":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert job.status.state is JobState.ACTIVE
    (tmp_path / "go").write_text("")
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.FAILED and st.exit_code == 5, st


def test_cancel_lets_the_job_leave_by_itself(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    # The scheduler's TERM is passed on and the job has the grace period (5 s) to leave.
    job = running(ex, JobSpec("/bin/bash", trapping_payload(tmp_path, linger=1)),
                  tmp_path / "ready")
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st
    assert (tmp_path / "count").read_text() == "1\n" and (tmp_path / "left").exists()


def test_signal_refusals(ex: BatchTestJobExecutor, tmp_path: Path) -> None:
    queued = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"batch-test.queue-delay": 30})))
    ex.submit(queued)
    with pytest.raises(InvalidJobException, match="only a running .ACTIVE. job"):
        ex.signal(queued, signal.SIGTERM)
    with pytest.raises(InvalidJobException, match="was not submitted to"):
        ex.signal(Job(JobSpec("/bin/true")), signal.SIGTERM)
    for bad in (True, "TERM", 1.5, None):
        with pytest.raises(TypeError, match="signal signum"):
            ex.signal(queued, bad)  # type: ignore[arg-type]
    for bad_number in (0, -1, 4096, 2**70):
        with pytest.raises(ValueError, match="signal signum"):
            ex.signal(queued, bad_number)
    with pytest.raises(TypeError, match="signal job"):
        ex.signal("job", signal.SIGTERM)  # type: ignore[arg-type]
    queued.cancel()
    assert queued.wait(WAIT) is not None
    ex.signal(queued, signal.SIGTERM)  # ended: nothing to do


def test_check_signal_takes_numbers_and_signal_members() -> None:
    assert check_signal(signal.SIGUSR2) == int(signal.SIGUSR2) and check_signal(1) == 1


def _executor(name: str, tmp_path: Path) -> BatchSchedulerExecutor:
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path))
    assert isinstance(ex, BatchSchedulerExecutor)
    return ex


@pytest.mark.parametrize("name,argv", [
    ("slurm", ["scancel", "--batch", "--signal=10", "77_3"]),
    ("pbs", ["qsig", "-s", "10", "77_3"]),
    ("pbs_classic", ["qsig", "-s", "10", "77_3"]),
    ("lsf", ["bkill", "-s", "10", "77_3"]),
])
def test_signal_commands(name: str, argv: List[str], tmp_path: Path) -> None:
    assert _executor(name, tmp_path).get_signal_command("77_3", 10) == argv


def test_grid_engine_writes_the_signal_then_deletes_the_job(tmp_path: Path) -> None:
    ex = _executor("sge", tmp_path)
    ex.work_directory.mkdir(parents=True)
    assert ex.get_signal_command("77.3", 12) == ["qdel", "77", "-t", "3"]
    request = ex.work_directory / "77.3.signal"
    assert request.read_text() == "12\n" and request.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("name", ["flux", "cobalt"])
def test_schedulers_without_a_signal_command_say_so(name: str, tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match=f"the {name} executor cannot send a signal"):
        _executor(name, tmp_path).get_signal_command("1", 15)


def test_declarations_are_checked(tmp_path: Path) -> None:
    class Odd(BatchTestJobExecutor):
        SCRIPT_SIGNALS: Dict[str, str] = {"KILL": "pass"}

    with pytest.raises(ValueError, match="SCRIPT_SIGNALS: 'KILL'"):
        Odd(config=BatchTestExecutorConfig(work_directory=tmp_path)).submit_script(
            Job(JobSpec("/bin/true")))

    class Odder(BatchTestJobExecutor):
        JOB_IGNORED_SIGNALS = ("USR1", "CHLD")

    with pytest.raises(ValueError, match="JOB_IGNORED_SIGNALS: 'CHLD'"):
        Odder(config=BatchTestExecutorConfig(work_directory=tmp_path)).submit_script(
            Job(JobSpec("/bin/true")))
    assert set(FORWARDABLE) == {"TERM", "INT", "HUP", "USR1", "USR2"}


def test_flows_signal_a_batch_job_through_its_executor(ex: BatchTestJobExecutor,
                                                       tmp_path: Path) -> None:
    from psij.flows.service import signal_job

    job = running(ex, JobSpec("/bin/bash", trapping_payload(tmp_path, linger=0.5)),
                  tmp_path / "ready")
    signal_job(job, int(signal.SIGTERM))
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, st
    assert sys.platform != "win32"
