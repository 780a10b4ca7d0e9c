"""Jobs over two nodes of the real Slurm started by tests/setup (make schedulers): ranks spread by
the srun and mpirun launchers, an MPI program whose message crosses from one node to the other,
the multiple launcher inside a two-node allocation, staging around a two-node job, and a job
asking more nodes than the partition has.

The test Slurm runs one slurmd per node on this one machine (n1, n2, ...), each in a UTS
namespace of its own, so a process on n2 sees ``n2`` both as its host name and in
``SLURMD_NODENAME``. All the jobs are submitted together by a module fixture; each test then
checks its own. Without a running Slurm of at least two nodes the tests skip, saying why.
"""

import shutil
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from psij import JobSpec, JobState, ResourceSpecV1
from psij.staging import StageIn, StageOut
from real.test_batch_real import Campaign as RealCampaign
from real.test_batch_real import _scheduler_problem

pytestmark = pytest.mark.slurm

WAIT = timedelta(seconds=240)

RING_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <string.h>

/* Rank 0 sends its node's name to the last rank, which answers with its own. */
int main(int argc, char **argv) {
    int rank, size, len;
    char me[MPI_MAX_PROCESSOR_NAME], got[1024], msg[1024];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(me, &len);
    if (rank == 0) {
        snprintf(msg, sizeof msg, "ping from %s", me);
        MPI_Send(msg, (int)strlen(msg) + 1, MPI_CHAR, size - 1, 1, MPI_COMM_WORLD);
        MPI_Recv(got, sizeof got, MPI_CHAR, size - 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf("rank 0 of %d on %s received: %s\n", size, me, got);
    } else if (rank == size - 1) {
        MPI_Recv(got, sizeof got, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        snprintf(msg, sizeof msg, "pong from %s to [%s]", me, got);
        MPI_Send(msg, (int)strlen(msg) + 1, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}
"""


def _partition_nodes() -> List[str]:
    """The nodes of the default partition (the one sbatch uses without --partition)."""
    out = subprocess.run(["sinfo", "-h", "-o", "%P %N"], capture_output=True, text=True,
                         timeout=60).stdout
    for line in out.splitlines():
        name, _, nodes = line.partition(" ")
        if name.endswith("*"):
            listed = subprocess.run(["scontrol", "show", "hostnames", nodes],
                                    capture_output=True, text=True, timeout=60).stdout
            return listed.split()
    return []


def _multinode_problem() -> Optional[str]:
    problem = _scheduler_problem("slurm")
    if problem is not None:
        return problem
    nodes = _partition_nodes()
    if len(nodes) < 2:
        return (f"the default Slurm partition has {len(nodes)} node(s) ({nodes}); these tests "
                "need 2 or more (tests/setup/start-slurm.sh starts 4)")
    return None


def _compile_ring(work: Path) -> Tuple[Optional[Path], str]:
    """The MPI program built with mpicc, or None and why it could not be built."""
    if shutil.which("mpicc") is None or shutil.which("mpirun") is None:
        return None, "mpicc/mpirun not found (tests/setup/system-deps.sh installs Open MPI)"
    source = work / "ring.c"
    source.write_text(RING_C)
    binary = work / "ring"
    built = subprocess.run(["mpicc", "-o", str(binary), str(source)], capture_output=True,
                           text=True, timeout=120)
    if built.returncode != 0:
        return None, (f"mpicc cannot build an MPI program (tests/setup/system-deps.sh installs "
                      f"libopenmpi-dev): {built.stderr.strip()[-300:]}")
    return binary, ""


# Each rank prints "<rank> <host name> <Slurm node name>".
WHERE = 'echo "{rank} $(hostname) ${{SLURMD_NODENAME:-?}}"'


class Campaign(RealCampaign):
    """The jobs of this module, on Slurm, with the partition's nodes and the MPI program."""

    def __init__(self, work: Path) -> None:
        super().__init__("slurm", work)
        self.out = work / "out"
        self.out.mkdir()
        self.nodes = _partition_nodes()
        self.ring, self.ring_problem = _compile_ring(work)

    def completed(self, key: str) -> str:
        """The job's stdout, once it has completed."""
        st = self.final(key)
        spec = self.jobs[key].spec
        assert spec is not None and spec.stdout_path is not None
        stdout = Path(spec.stdout_path)
        text = stdout.read_text() if stdout.exists() else "<no stdout>"
        assert st.state is JobState.COMPLETED, f"{key}: {st}\nstdout: {text}"
        return text


def _start(work: Path) -> Campaign:
    c = Campaign(work)
    out = c.out
    two_by_two = ResourceSpecV1(node_count=2, processes_per_node=2)
    c.submit("srun", JobSpec("/bin/sh", ["-c", WHERE.format(rank="$SLURM_PROCID")],
                             launcher="srun", resources=two_by_two, stdout_path=out / "srun"))
    c.submit("mpirun", JobSpec("/bin/sh", ["-c", WHERE.format(rank="$OMPI_COMM_WORLD_RANK")],
                               launcher="mpirun",
                               resources=ResourceSpecV1(node_count=2, processes_per_node=2),
                               stdout_path=out / "mpirun", stderr_path=out / "mpirun.err"))
    if c.ring is not None:
        c.submit("ring", JobSpec(str(c.ring), launcher="mpirun",
                                 resources=ResourceSpecV1(node_count=2, processes_per_node=1),
                                 stdout_path=out / "ring", stderr_path=out / "ring.err"))
    c.submit("multiple", JobSpec(
        "/bin/sh", ["-c", 'echo "$_PSI_J_PROCESS_INDEX_ $_PSI_J_PROCESS_COUNT $(hostname) '
                          '$SLURM_JOB_NUM_NODES $SLURM_JOB_NODELIST"'],
        launcher="multiple", resources=ResourceSpecV1(node_count=2, processes_per_node=2),
        stdout_path=out / "multiple"))
    inputs = work / "inputs"
    inputs.mkdir()
    (inputs / "data.txt").write_text("input data\n")
    jd = work / "staged job"
    jd.mkdir()
    results = work / "results"
    c.submit("staging", JobSpec(
        "/bin/sh", ["-c", '{ cat in/data.txt; echo "$SLURMD_NODENAME"; } > "out.$SLURM_PROCID"'],
        launcher="srun", directory=jd, resources=ResourceSpecV1(node_count=2,
                                                                processes_per_node=1),
        stage_in=[StageIn(inputs / "data.txt", "in/data.txt")],
        stage_out=[StageOut("out.0", results / "out.0"), StageOut("out.1", results / "out.1")],
        stdout_path=out / "staging"))
    c.submit("too-many", JobSpec("/bin/true", resources=ResourceSpecV1(
        node_count=len(c.nodes) + 1)))
    return c


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Campaign]:
    problem = _multinode_problem()
    if problem is not None:
        pytest.skip(problem)
    campaign = _start(tmp_path_factory.mktemp("multinode"))
    yield campaign
    for job in campaign.jobs.values():
        if not job.status.state.final:
            try:
                job.cancel()
            except Exception:
                pass
    campaign.ex.close()


def _placements(text: str) -> Dict[int, Tuple[str, str]]:
    """rank -> (host name, Slurm node name), from WHERE's lines."""
    placed: Dict[int, Tuple[str, str]] = {}
    for line in text.splitlines():
        rank, host, node = line.split()
        assert int(rank) not in placed, text
        placed[int(rank)] = (host, node)
    return placed


def _assert_two_per_node(text: str, nodes: List[str]) -> None:
    placed = _placements(text)
    assert sorted(placed) == [0, 1, 2, 3], text
    # Each rank runs where Slurm says it does: host name and node name agree.
    assert all(host == node for host, node in placed.values()), text
    per_node: Dict[str, int] = {}
    for _, node in placed.values():
        per_node[node] = per_node.get(node, 0) + 1
    assert sorted(per_node.values()) == [2, 2], text
    assert set(per_node) <= set(nodes), (per_node, nodes)


def test_srun_puts_two_ranks_on_each_of_two_nodes(c: Campaign) -> None:
    _assert_two_per_node(c.completed("srun"), c.nodes)


def test_mpirun_puts_two_ranks_on_each_of_two_nodes(c: Campaign) -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (tests/setup/system-deps.sh installs Open MPI)")
    _assert_two_per_node(c.completed("mpirun"), c.nodes)


def test_mpi_message_crosses_between_two_nodes(c: Campaign) -> None:
    if c.ring is None:
        pytest.skip(c.ring_problem)
    text = c.completed("ring")
    line = next((x for x in text.splitlines() if x.startswith("rank 0 of 2 on ")), None)
    assert line is not None, text
    # "rank 0 of 2 on <a> received: pong from <b> to [ping from <a>]"
    words = line.split()
    sender, answerer, echoed = words[5], words[9], words[13].rstrip("]")
    assert echoed == sender, line
    assert sender != answerer and {sender, answerer} <= set(c.nodes), line


def test_multiple_runs_all_copies_on_the_first_node_of_the_allocation(c: Campaign) -> None:
    lines = [x.split() for x in c.completed("multiple").splitlines()]
    assert sorted(int(x[0]) for x in lines) == [1, 2, 3, 4], lines
    assert {x[1] for x in lines} == {"4"}, lines
    # The allocation has two nodes; the copies all run beside the batch script, on its first.
    assert {x[3] for x in lines} == {"2"}, lines
    allocated = subprocess.run(["scontrol", "show", "hostnames", lines[0][4]],
                               capture_output=True, text=True, timeout=60).stdout.split()
    assert len(allocated) == 2 and set(allocated) <= set(c.nodes), allocated
    assert {x[2] for x in lines} == {allocated[0]}, lines


def test_staging_around_a_two_node_job(c: Campaign) -> None:
    st = c.final("staging")
    assert st.state is JobState.COMPLETED, st
    results = c.work / "results"
    texts = [(results / f"out.{rank}").read_text().splitlines() for rank in (0, 1)]
    assert all(t[0] == "input data" for t in texts), texts
    nodes = {t[1] for t in texts}
    assert len(nodes) == 2 and nodes <= set(c.nodes), texts


def _squeue(native_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", native_id, "-o", "%T %r %D"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def test_more_nodes_than_the_partition_has_stays_queued_with_slurms_reason(
        c: Campaign) -> None:
    # With EnforcePartLimits=NO (Slurm's default), sbatch accepts the job and Slurm keeps it
    # PENDING for reason PartitionNodeLimit; the job is QUEUED, its message names the reason,
    # and it is one whole job that cancel ends (fail_unstartable, off here, would fail it).
    job = c.jobs["too-many"]
    native_id = str(job.native_id)
    asked = len(c.nodes) + 1
    deadline = time.monotonic() + 30
    seen = _squeue(native_id)
    while seen != f"PENDING PartitionNodeLimit {asked}" and time.monotonic() < deadline:
        time.sleep(1)
        seen = _squeue(native_id)
    assert seen == f"PENDING PartitionNodeLimit {asked}", seen
    time.sleep(3)  # several polls of the executor
    assert job.status.state is JobState.QUEUED, job.status
    assert "PartitionNodeLimit" in (job.status.message or ""), job.status  # says why it waits
    job.cancel()
    st = c.final("too-many")
    assert st.state is JobState.CANCELED, st
    assert st.metadata is not None and st.metadata.get("reason") == "PartitionNodeLimit", st
    assert _squeue(native_id).split()[:1] in ([], ["CANCELLED"])
