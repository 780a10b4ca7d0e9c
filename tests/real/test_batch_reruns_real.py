"""Running a job again on the real Slurm and Grid Engine started by tests/setup
(psij.executors.batch._reruns; psij.requeue and psij.retry, see psij._retry): the same Job
QUEUED again, with its attempt in the status metadata.

Slurm (all jobs submitted together by a module fixture, each test checking its own): a job over
its memory retried with 4 times as much; a job stopped at its time limit retried with twice
the duration; a job Slurm requeues in place (``scontrol requeue``), same native id; a job that
checkpoints on the signal before its end and exits 85, submitted again; a job whose node goes
down (``--requeue``), brought back by Slurm. The requeued job keeps the output of each run
(``out.1``, then ``out``) and the registry lists its two runs. Grid Engine: a job rescheduled
by ``qmod -rj`` (``-r y``), and a job exiting 85. Each test prints how long it took and how
long the job took from the end of its run to its QUEUED status of the next. Without a
scheduler the tests skip.
"""

import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, JobStatus, ResourceSpecV1
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from real.test_batch_out_of_memory_real import HOG, _memory_problem
from real.test_batch_real import _need

WAIT = timedelta(seconds=420)
MIB = 1 << 20


class Watched:
    """A job, what its callbacks saw (with the wall-clock time of each), and its folder."""

    def __init__(self, spec: JobSpec, folder: Path) -> None:
        self.job = Job(spec)
        self.folder = folder
        self.seen: List[Tuple[float, JobStatus]] = []
        self.submitted = time.time()
        self.job.set_job_status_callback(lambda j, st: self.seen.append((time.time(), st)))

    def states(self) -> List[str]:
        return [st.state.name for _, st in self.seen]

    def queued_again(self) -> Tuple[float, JobStatus]:
        again = [(t, st) for t, st in self.seen[1:] if st.state is JobState.QUEUED]
        assert again, self.states()
        return again[0]

    def first_native_id(self) -> str:
        nid = (self.seen[0][1].metadata or {}).get("native_id")
        assert isinstance(nid, str)
        return nid


def _bash(folder: Path, script: str, custom: Dict[str, object], minutes: float = 5,
          **kw: object) -> JobSpec:
    folder.mkdir(parents=True, exist_ok=True)
    return JobSpec("/bin/bash", ["-c", script], directory=folder,
                   stdout_path=folder / "out", stderr_path=folder / "err",
                   attributes=JobAttributes(duration=timedelta(minutes=minutes),
                                            custom_attributes=custom), **kw)  # type: ignore


def _slurm_end(native_id: str) -> Optional[float]:
    """When Slurm says the job ended (sacct End, whole seconds), or None."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "End", "-j", native_id],
                         capture_output=True, text=True, timeout=60).stdout.split()
    try:
        return datetime.strptime(out[0], "%Y-%m-%dT%H:%M:%S").timestamp() if out else None
    except ValueError:
        return None


def _report(name: str, began: float, failed_at: Optional[float], w: Watched) -> None:
    queued_at, _ = w.queued_again()
    gap = "unknown" if failed_at is None else f"{queued_at - failed_at:.1f} s"
    print(f"\n[{name}] {w.seen[-1][0] - began:.1f} s from submit to the end; from the end of "
          f"run 1 to QUEUED again: {gap}")


def _sge_state(native_id: str) -> str:
    """The job's state as qstat shows it ("" when it is not listed)."""
    out = subprocess.run(["qstat"], capture_output=True, text=True, timeout=60).stdout
    for line in out.splitlines():
        words = line.split()
        if len(words) > 4 and words[0] == native_id:
            return words[4]
    return ""


def _wait_for(what: str, check: "object", seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


# ------------------------------------------------------------------------------ Slurm


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Watched]]:
    problem = _memory_problem()
    if problem is not None:
        pytest.skip(problem)
    work = tmp_path_factory.mktemp("reruns")
    cfg = BatchSchedulerExecutorConfig(work_directory=work / "psij", queue_polling_interval=1,
                                       initial_queue_polling_delay=0.5)
    ex = JobExecutor.get_instance("slurm", config=cfg)
    made: Dict[str, Watched] = {}
    # (a) 250 MiB used with 100 asked: OUT_OF_MEMORY, then 400 MiB and it completes. It waits
    # 3 s first, so that its run is seen ACTIVE.
    made["oom"] = Watched(JobSpec(
        "/bin/bash", ["-c", f'sleep 3; exec "{sys.executable}" -c "$0" 250', HOG],
        resources=ResourceSpecV1(memory=100 * MIB),
        attributes=JobAttributes(duration=timedelta(minutes=5), custom_attributes={
            "psij.retry": "attempts=2,on=out_of_memory,memory=4"})), work / "oom")
    # (b) 100 s of work in a minute: TIMEOUT, then two minutes and it completes. (Slurm
    # looks at time limits every half minute or so: with less work, a busy controller may let
    # the first run end by itself before it looks.)
    made["time"] = Watched(_bash(work / "time", "echo ${PSIJ_ATTEMPT:-none} >> runs; sleep 100",
                                 {"psij.retry": "attempts=2,on=time_limit,duration=2"},
                                 minutes=1), work / "time")
    # (c) requeued in place by scontrol requeue (the test does it once the job runs).
    made["requeue"] = Watched(_bash(
        work / "requeue", 'echo "run ${PSIJ_ATTEMPT:-none}"; '
        'echo "${PSIJ_ATTEMPT:-none} ${SLURM_RESTART_COUNT:-0}" >> runs; '
        '[ "${SLURM_RESTART_COUNT:-0}" = 0 ] && { sleep 300 & wait; }; exit 0',
        {"psij.requeue": 1}), work / "requeue")
    # (d) a checkpoint at the signal before the end: USR1 45 s before the end of a one-minute
    # job, on which it saves its work and exits 85; run 2 finds the checkpoint and completes.
    made["checkpoint"] = Watched(_bash(
        work / "checkpoint", '[ -f ckpt ] && { echo "resumed ${PSIJ_ATTEMPT}" > done; exit 0; }; '
        "trap 'date +%s.%N > ckpt; exit 85' USR1; sleep 300 & wait",
        {"psij.requeue": 1, "psij.signal_before_end": "USR1@45"}, minutes=1), work / "checkpoint")
    for w in made.values():
        w.submitted = time.time()
        ex.submit(w.job)
    yield made
    for w in made.values():
        if not w.job.status.state.final:
            w.job.cancel()
    ex.close()


@pytest.mark.slurm
def test_slurm_out_of_memory_is_retried_with_more_memory(slurm: Dict[str, Watched]) -> None:
    w = slurm["oom"]
    st = w.job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, (st, w.states())
    assert w.states() == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    _, again = w.queued_again()
    meta = again.metadata or {}
    assert meta["attempt"] == 2 and meta["cause"] == "out_of_memory" and meta["rerun"] == "retry"
    first = w.first_native_id()
    assert meta["previous"]["native_id"] == first and w.job.native_id != first
    assert w.job.spec is not None and w.job.spec.resources.memory == 400 * MIB  # type: ignore
    assert (st.metadata or {})["attempt"] == 2
    _report("out of memory", w.submitted, _slurm_end(first), w)


@pytest.mark.slurm
def test_slurm_time_limit_is_retried_with_a_longer_duration(slurm: Dict[str, Watched]) -> None:
    w = slurm["time"]
    st = w.job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, (st, w.states())
    assert w.states() == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    _, again = w.queued_again()
    meta = again.metadata or {}
    assert meta["attempt"] == 2 and meta["cause"] == "time_limit"
    assert w.job.spec is not None
    assert w.job.spec.attributes.duration == timedelta(minutes=2)
    assert (w.folder / "runs").read_text().split() == ["1", "2"]
    first = w.first_native_id()
    assert w.job.native_id != first
    _report("time limit", w.submitted, _slurm_end(first), w)


def _node_of(native_id: str) -> str:
    """The node a running Slurm job is on."""
    shown = subprocess.run(["squeue", "-h", "-j", native_id, "-o", "%N"], capture_output=True,
                           text=True, timeout=60).stdout.strip()
    assert shown, f"no node for the running job {native_id}"
    return shown


def _start_elsewhere(native_id: str, node: str) -> None:
    """Let a requeued Slurm job start now, on another node than ``node``. Slurm holds a
    requeued job back for a while (BeginTime) because the node it ran on refuses it until its
    revoked credential expires ("Killing non-startable batch job: Job credential revoked",
    exit 1): the test does not wait, so it sends the job elsewhere."""
    subprocess.run(["scontrol", "update", f"jobid={native_id}", f"ExcNodeList={node}",
                    "StartTime=now"], check=True, timeout=60)


@pytest.mark.slurm
def test_slurm_requeues_in_place_and_the_job_is_queued_again(
        slurm: Dict[str, Watched]) -> None:
    w = slurm["requeue"]
    _wait_for("the job to run and be seen ACTIVE", lambda: (w.folder / "runs").exists()
              and w.job.status.state is JobState.ACTIVE)
    nid = w.job.native_id
    assert nid is not None
    node = _node_of(nid)
    requeued = time.time()
    subprocess.run(["scontrol", "requeue", nid], check=True, timeout=60)
    _wait_for("QUEUED again", lambda: len(w.seen) >= 3, 60)
    _start_elsewhere(nid, node)
    st = w.job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, (st, w.states())
    assert w.states() == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    _, again = w.queued_again()
    meta = again.metadata or {}
    assert meta["attempt"] == 2 and meta["rerun"] == "requeue" and meta["cause"] == "requeued"
    assert w.job.native_id == nid and meta["previous"]["native_id"] == nid
    assert (w.folder / "runs").read_text().splitlines() == ["1 0", "2 1"]
    # Each run's output kept: the first moved aside by the second as it started.
    assert (w.folder / "out.1").read_text() == "run 1\n"
    assert (w.folder / "out").read_text() == "run 2\n"
    assert not (w.folder / "out.2").exists()
    import psij.registry

    assert psij.registry.flush(timedelta(seconds=60))
    executor = w.job.executor
    assert executor is not None
    one, two = psij.registry.runs(w.job.id, work_directory=executor.config.work_directory)
    assert (one.run, one.native_id, one.state, one.cause) == (1, nid, "FAILED", "requeued")
    assert (two.run, two.native_id, two.state, two.exit_code) == (2, nid, "COMPLETED", 0)
    assert (one.stdout_path, two.stdout_path) == (f"{w.folder}/out.1", f"{w.folder}/out")
    assert (one.stderr_path, two.stderr_path) == (f"{w.folder}/err.1", f"{w.folder}/err")
    _report("scontrol requeue", w.submitted, requeued, w)


@pytest.mark.slurm
def test_slurm_checkpoint_at_the_signal_before_the_end_runs_the_job_again(
        slurm: Dict[str, Watched]) -> None:
    w = slurm["checkpoint"]
    st = w.job.wait(WAIT)
    assert st is not None and st.state is JobState.COMPLETED, (st, w.states())
    assert w.states() == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    _, again = w.queued_again()
    meta = again.metadata or {}
    assert meta["cause"] == "checkpoint" and meta["previous"]["exit_code"] == 85
    assert (w.folder / "done").read_text().split() == ["resumed", "2"]
    assert w.job.native_id != w.first_native_id()
    saved = float((w.folder / "ckpt").read_text())
    _report("checkpoint, exit 85", w.submitted, saved, w)


@pytest.mark.slurm
def test_slurm_brings_back_a_job_whose_node_went_down(tmp_path: Path) -> None:
    problem = _memory_problem()
    if problem is not None:
        pytest.skip(problem)
    cfg = BatchSchedulerExecutorConfig(work_directory=tmp_path / "psij",
                                       queue_polling_interval=1,
                                       initial_queue_polling_delay=0.5)
    ex = JobExecutor.get_instance("slurm", config=cfg)
    w = Watched(_bash(tmp_path / "node", 'echo "${PSIJ_ATTEMPT} $(hostname) ${SLURMD_NODENAME}" '
                      '>> runs; [ "${SLURM_RESTART_COUNT:-0}" = 0 ] && { sleep 300 & wait; }; '
                      "exit 0", {"psij.requeue": 1}), tmp_path / "node")
    node: Optional[str] = None
    try:
        ex.submit(w.job)
        _wait_for("the job to run", lambda: (w.folder / "runs").exists())
        nid = w.job.native_id
        assert nid is not None
        node = _node_of(nid)
        down = time.time()
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                        "reason=psij-test"], check=True, timeout=60)
        _wait_for("QUEUED again", lambda: len(w.seen) >= 3, 120)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout=60)
        _start_elsewhere(nid, node)
        node = None
        st = w.job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, (st, w.states())
        assert w.states() == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
        _, again = w.queued_again()
        assert (again.metadata or {})["attempt"] == 2 and w.job.native_id == nid
        assert [line.split()[0] for line in (w.folder / "runs").read_text().splitlines()] \
            == ["1", "2"]
        _report("node down", w.submitted, down, w)
    finally:
        if node is not None:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                           timeout=60)
        if not w.job.status.state.final:
            w.job.cancel()
        ex.close()


# ------------------------------------------------------------------------------ Grid Engine


@pytest.fixture
def sge(tmp_path: Path) -> Iterator[JobExecutor]:
    _need("sge")
    cfg = BatchSchedulerExecutorConfig(work_directory=tmp_path / "psij", queue_polling_interval=1,
                                       initial_queue_polling_delay=0.5)
    ex = JobExecutor.get_instance("sge", config=cfg)
    yield ex
    ex.close()


@pytest.mark.sge
def test_sge_a_rescheduled_job_is_queued_again(sge: JobExecutor, tmp_path: Path) -> None:
    w = Watched(_bash(tmp_path / "job", 'echo "run ${PSIJ_ATTEMPT}"; '
                      'echo "${PSIJ_ATTEMPT} ${RESTARTED:-0}" >> runs; '
                      '[ "${RESTARTED:-0}" = 0 ] && { sleep 300 & wait; }; exit 0',
                      {"psij.requeue": 1}), tmp_path / "job")
    try:
        sge.submit(w.job)
        _wait_for("the job to run", lambda: (w.folder / "runs").exists())
        nid = w.job.native_id
        assert nid is not None
        # Rescheduled once Grid Engine itself shows it running: asked while its execution
        # daemon has not yet told the master ("t"), the master requeues a job the daemon goes
        # on running, and no second run comes.
        _wait_for("Grid Engine to show the job running", lambda: _sge_state(nid) == "r")
        rescheduled = time.time()
        subprocess.run(["qmod", "-rj", nid], check=True, timeout=60, capture_output=True)
        st = w.job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, (st, w.states())
        assert w.states() == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
        _, again = w.queued_again()
        assert (again.metadata or {})["attempt"] == 2 and w.job.native_id == nid
        assert (w.folder / "runs").read_text().splitlines() == ["1 0", "2 1"]
        assert (w.folder / "out.1").read_text() == "run 1\n"  # each run's output kept
        assert (w.folder / "out").read_text() == "run 2\n"
        _report("qmod -rj", w.submitted, rescheduled, w)
    finally:
        if not w.job.status.state.final:
            w.job.cancel()


@pytest.mark.sge
def test_sge_a_job_exiting_85_is_submitted_again(sge: JobExecutor, tmp_path: Path) -> None:
    w = Watched(_bash(tmp_path / "job", 'echo "${PSIJ_ATTEMPT:-none}" >> runs; sleep 3; '
                      '[ -f ckpt ] && exit 0; date +%s.%N > ckpt; exit 85',
                      {"psij.requeue": 1}), tmp_path / "job")
    st = None
    try:
        sge.submit(w.job)
        st = w.job.wait(WAIT)
    finally:
        if not w.job.status.state.final:
            w.job.cancel()
    assert st is not None and st.state is JobState.COMPLETED, (st, w.states())
    assert w.states() == ["QUEUED", "ACTIVE", "QUEUED", "ACTIVE", "COMPLETED"]
    _, again = w.queued_again()
    meta = again.metadata or {}
    assert meta["cause"] == "checkpoint" and meta["previous"]["exit_code"] == 85
    assert w.job.native_id != w.first_native_id()
    assert (w.folder / "runs").read_text().split() == ["1", "2"]
    _report("exit 85", w.submitted, float((w.folder / "ckpt").read_text()), w)


# ------------------------------------------------------------------------------ both


@pytest.mark.parametrize("name", [pytest.param("slurm", marks=pytest.mark.slurm),
                                  pytest.param("sge", marks=pytest.mark.sge)])
def test_psij_attempt_is_in_every_run_of_a_job_that_may_run_again_only(
        name: str, tmp_path: Path) -> None:
    # A retried job (submitted anew, no scheduler requeue) has PSIJ_ATTEMPT=1 in its first
    # run and 2 in its second; a job that may not run again has none.
    _need(name)
    cfg = BatchSchedulerExecutorConfig(work_directory=tmp_path / "psij", queue_polling_interval=1,
                                       initial_queue_polling_delay=0.5)
    ex = JobExecutor.get_instance(name, config=cfg)
    script = 'echo "${PSIJ_ATTEMPT:-none}" >> runs; [ "$PSIJ_ATTEMPT" = 1 ] && exit 3; exit 0'
    retried = Watched(_bash(tmp_path / "retried", script, {"psij.retry": "attempts=2,on=failed"}),
                      tmp_path / "retried")
    plain = Watched(_bash(tmp_path / "plain", script, {}), tmp_path / "plain")
    try:
        for w in (retried, plain):
            ex.submit(w.job)
        ends = [w.job.wait(WAIT) for w in (retried, plain)]
    finally:
        for w in (retried, plain):
            if not w.job.status.state.final:
                w.job.cancel()
        ex.close()
    assert [st.state if st else None for st in ends] == [JobState.COMPLETED] * 2, ends
    assert (retried.folder / "runs").read_text().split() == ["1", "2"]
    assert (plain.folder / "runs").read_text().split() == ["none"]
