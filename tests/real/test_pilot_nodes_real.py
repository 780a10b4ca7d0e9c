"""A pilot spanning four nodes of a real Slurm allocation (the four-node Slurm of
tests/setup/start-slurm.sh: nodes n1..n4 on this machine, each slurmd with a host name of its
own). The pilot is submitted through the ``slurm`` executor as users do (``psij pilot serve`` in
a job of four nodes), reaches n2..n4 through one agent per node started with ``srun``, and jobs
are sent to it through the ``pilot`` executor's URL.

Asserted: tasks run on all four nodes, each where its share says (``hostname`` and
``SLURMD_NODENAME``); a task of several nodes gets a node file and ``SLURM_*`` variables naming
exactly its own nodes; when one node's agent is killed, its tasks fail naming the node, the
tasks of the other nodes complete, and later tasks go to the nodes left. Without a Slurm of four
nodes the tests skip, saying why."""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Iterator, List, Optional, Set

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.pilot.service import PilotClient, answering

WAIT = timedelta(seconds=120)
NODES = ("n1", "n2", "n3", "n4")
CORES_PER_NODE = 2


def _slurm_problem() -> Optional[str]:
    setup = "tests/setup/start-slurm.sh starts one of four nodes as root"
    if shutil.which("sbatch") is None:
        return f"Slurm is not installed ({setup})"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "UP" not in ping.stdout:
        return f"Slurm is not running: scontrol ping says {ping.stdout.strip()!r} ({setup})"
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                            text=True).stdout.split("\n")
    usable = {line.split()[0] for line in states if len(line.split()) == 2
              and line.split()[1].rstrip("*~#$!%@^-") in ("idle", "mixed", "allocated",
                                                          "completing", "planned")}
    if not set(NODES) <= usable:
        return f"Slurm has not the nodes {', '.join(NODES)} up: sinfo says {states} ({setup})"
    return None


class FourNodePilot:
    """``psij pilot serve`` in a Slurm job of four nodes, and a ``pilot`` executor on it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = folder / "pilot.sock"
        self.slurm = JobExecutor.get_instance("slurm", config=BatchSchedulerExecutorConfig(
            work_directory=folder / "psij", queue_polling_interval=1,
            initial_queue_polling_delay=0.5))
        self.job = Job(JobSpec(
            sys.executable, ["-m", "psij", "pilot", "serve", "--socket", str(self.socket),
                             "--wd", str(folder / "wd")],
            stdout_path=folder / "pilot.out", stderr_path=folder / "pilot.err",
            resources=ResourceSpecV1(node_count=len(NODES),
                                     processes_per_node=CORES_PER_NODE),
            attributes=JobAttributes(duration=timedelta(minutes=5))))
        self.slurm.submit(self.job)
        deadline = time.monotonic() + WAIT.total_seconds()
        while not answering(str(self.socket), timeout=1):
            assert not self.job.status.final, \
                f"the pilot job ended: {self.job.status}; {self.log()}"
            assert time.monotonic() < deadline, f"the pilot did not start; {self.log()}"
            time.sleep(0.2)
        self.executor = JobExecutor.get_instance("pilot", url=f"unix://{self.socket}")

    def log(self) -> str:
        return _read(self.folder / "pilot.err") + _read(self.folder / "pilot.out")

    def run(self, jobs: List[Job]) -> List[JobState]:
        for job in jobs:
            self.executor.submit(job)
        return [j.wait(WAIT).state for j in jobs]  # type: ignore[union-attr]

    def usage(self) -> dict:  # type: ignore[type-arg]
        client = PilotClient(str(self.socket))
        try:
            return client.request("usage")["usage"]  # type: ignore[no-any-return]
        finally:
            client.close()

    def stop(self) -> None:
        if self.job.status.final:
            return
        try:
            client = PilotClient(str(self.socket))
            try:
                client.request("shutdown")
            finally:
                client.close()
            final = self.job.wait(WAIT)
            assert final is not None and final.state is JobState.COMPLETED, \
                f"{final}; {self.log()}"
        finally:
            if not self.job.status.final:
                self.job.cancel()


@pytest.fixture
def pilot(shared_dir: Path) -> Iterator[FourNodePilot]:
    problem = _slurm_problem()
    if problem is not None:
        pytest.skip(problem)
    started = FourNodePilot(shared_dir)
    try:
        yield started
    finally:
        started.stop()


def sh(script: str, out: Path, **resources: int) -> Job:
    return Job(JobSpec("/bin/sh", ["-c", script], stdout_path=out,
                       stderr_path=out.with_suffix(".err"),
                       resources=ResourceSpecV1(**resources)))  # type: ignore[arg-type]


WHERE = 'echo "$(hostname) ${SLURMD_NODENAME:-unset} $QCG_PM_NODELIST"'


@pytest.mark.slurm
def test_tasks_run_on_all_four_nodes_each_with_its_own_share(
        pilot: FourNodePilot, shared_dir: Path) -> None:
    out = shared_dir / "out"
    out.mkdir()
    # As many one-core tasks as cores, all running at once: two on each node.
    ones = [sh(f"{WHERE}; sleep 2", out / f"one{i}") for i in range(8)]
    assert pilot.run(ones) == [JobState.COMPLETED] * 8, pilot.log()
    where = [_read(out / f"one{i}").split() for i in range(8)]
    for job, (host, slurmd_node, share) in zip(ones, where):
        meta = job.status.metadata or {}
        assert host == slurmd_node == share == meta["nodes"]
        # What its process used, sent by the agent of its node that reaped it.
        assert meta["cores"] == 1 and meta["cpu_seconds"] >= 0 and meta["max_rss_bytes"] > 0
    assert Counter(host for host, _, _ in where) == dict.fromkeys(NODES, 2)

    # Tasks of two whole nodes, side by side: each sees exactly its own two nodes, and an
    # srun inside it runs its processes there.
    show = (f'{WHERE}; cat "$PSIJ_NODEFILE" | tr "\\n" " "; echo; '
            'echo "$SLURM_NNODES $SLURM_JOB_NODELIST $SLURM_NODELIST $SLURM_JOB_NUM_NODES '
            '$SLURM_NTASKS $SLURM_TASKS_PER_NODE $SLURM_NTASKS_PER_NODE $QCG_PM_NNODES"; '
            'srun hostname | sort | tr "\\n" " "; echo; sleep 2')
    pairs = [sh(show, out / f"pair{i}", node_count=2, processes_per_node=2)
             for i in range(2)]
    whole = sh(show, out / "whole", node_count=4, processes_per_node=2)
    assert pilot.run(pairs) == [JobState.COMPLETED] * 2, \
        [_read(out / f"pair{i}.err") for i in range(2)]
    assert pilot.run([whole]) == [JobState.COMPLETED], _read(out / "whole.err")
    seen: Set[str] = set()
    for i, job in enumerate(pairs):
        first, nodefile, variables, stepped = _read(out / f"pair{i}").splitlines()
        nodes = (job.status.metadata or {})["nodes"].split(",")
        assert len(nodes) == 2 and not seen & set(nodes)
        seen |= set(nodes)
        listed = ",".join(nodes)
        assert first.split() == [nodes[0], nodes[0], listed]
        assert nodefile.split() == stepped.split() == [n for n in nodes for _ in range(2)]
        assert variables.split() == ["2", listed, listed, "2", "4", "2(x2)", "2", "2"]
    assert seen == set(NODES)
    first, nodefile, variables, stepped = _read(out / "whole").splitlines()
    assert first.split() == ["n1", "n1", "n1,n2,n3,n4"]
    assert nodefile.split() == stepped.split() == [n for n in NODES for _ in range(2)]
    assert variables.split() == ["4", "n1,n2,n3,n4", "n1,n2,n3,n4", "4", "8", "2(x4)", "2",
                                 "4"]


IN_PROCESS = """
import sys
from pathlib import Path

import psij

out = Path(sys.argv[1])
jobs = [psij.Job(psij.JobSpec("/bin/sh", ["-c", "hostname; sleep 2"],
                              stdout_path=out / f"{i}.txt")) for i in range(8)]
with psij.JobExecutor.get_instance("pilot") as ex:
    for job in jobs:
        ex.submit(job)
    print(" ".join(str(job.wait().state) for job in jobs))
"""


@pytest.mark.slurm
def test_the_in_process_pilot_in_a_four_node_batch_script_uses_every_node(
        shared_dir: Path) -> None:
    # As the user guide shows: the pilot executor, in the script of an sbatch --nodes=4.
    problem = _slurm_problem()
    if problem is not None:
        pytest.skip(problem)
    script = shared_dir / "in_process.py"
    script.write_text(IN_PROCESS)
    out = shared_dir / "out"
    out.mkdir()
    done = subprocess.run(
        ["sbatch", "--wait", f"--nodes={len(NODES)}", f"--ntasks-per-node={CORES_PER_NODE}",
         "--time=5", f"--output={shared_dir / 'job.out'}", f"--chdir={shared_dir}",
         f"--wrap={sys.executable} {script} {out}"],
        capture_output=True, text=True, timeout=WAIT.total_seconds())
    log = _read(shared_dir / "job.out")
    assert done.returncode == 0, done.stdout + done.stderr + log
    assert log.split() == ["COMPLETED"] * 8, log
    hosts = Counter(_read(out / f"{i}.txt").strip() for i in range(8))
    assert hosts == dict.fromkeys(NODES, 2)


def _agent_pid(job_id: str, node: str) -> int:
    """The pid of this pilot's agent on ``node`` (every node is this machine)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        # Not the srun that started it (on the pilot's node, with the same arguments).
        if b"psij.executors.pilot.agent" in argv and argv[argv.index(b"--node") + 1] == \
                node.encode() and f"SLURM_JOB_ID={job_id}".encode() in environ \
                and f"SLURMD_NODENAME={node}".encode() in environ:
            found.append(int(entry))
    assert len(found) == 1, f"expected one agent on {node} for job {job_id}, found {found}"
    return found[0]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slurm
def test_a_killed_agent_fails_its_tasks_only_and_its_node_gets_no_more(
        pilot: FourNodePilot, shared_dir: Path) -> None:
    out = shared_dir / "out"
    out.mkdir()
    # Two tasks per node; those on n3 would run long, the others a few seconds.
    script = ('hostname > "$0.where"; echo $$ > "$0.pid"; '
              'if [ "$(hostname)" = n3 ]; then exec sleep 120; fi; sleep 4; hostname')
    first = [Job(JobSpec("/bin/sh", ["-c", script, str(out / f"t{i}")],
                         stdout_path=out / f"t{i}", stderr_path=out / f"t{i}.err"))
             for i in range(8)]
    for job in first:
        pilot.executor.submit(job)
    deadline = time.monotonic() + WAIT.total_seconds()
    while not all((out / f"t{i}.pid").exists() for i in range(8)):
        assert time.monotonic() < deadline, f"the tasks did not all start; {pilot.log()}"
        time.sleep(0.1)
    where = [_read(out / f"t{i}.where").strip() for i in range(8)]
    on_n3 = [i for i, node in enumerate(where) if node == "n3"]
    assert len(on_n3) == 2 and Counter(where) == dict.fromkeys(NODES, 2)
    os.kill(_agent_pid(pilot.job.native_id, "n3"), signal.SIGKILL)  # type: ignore[arg-type]

    states = [j.wait(WAIT).state for j in first]  # type: ignore[union-attr]
    for i, job in enumerate(first):
        if i in on_n3:
            assert states[i] is JobState.FAILED, (i, job.status)
            assert (job.status.message or "").startswith("node n3 is lost: its agent"), \
                job.status.message
        else:
            assert states[i] is JobState.COMPLETED, (i, job.status, pilot.log())
            assert _read(out / f"t{i}").strip() == where[i]
    # The lost node's task processes are ended by Slurm with the agent's step.
    pids = [int(_read(out / f"t{i}.pid")) for i in on_n3]
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"the tasks of n3 ({pids}) still run"
        time.sleep(0.2)

    # Later tasks fill the six cores of the three nodes left, never n3.
    later = [sh(f"{WHERE}; sleep 2", out / f"later{i}") for i in range(6)]
    assert pilot.run(later) == [JobState.COMPLETED] * 6, pilot.log()
    hosts = Counter(_read(out / f"later{i}").split()[0] for i in range(6))
    assert hosts == {"n1": 2, "n2": 2, "n4": 2}
    # A task that needs four nodes can no longer run, and says why.
    wide = sh("true", out / "wide", node_count=4)
    assert pilot.run([wide]) == [JobState.FAILED]
    assert "node n3 is lost" in (wide.status.message or ""), wide.status.message
    usage = pilot.usage()
    assert usage["free_cores"] == 6 and usage["total_cores"] == 8


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""

