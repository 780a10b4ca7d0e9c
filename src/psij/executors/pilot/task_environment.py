"""The variables and node file that tell a pilot task its own share of the allocation.

Pure text: nothing is written or started here (the engine writes the node file and starts
the task). ``QCG_PM_*`` always; ``SLURM_*`` when asked, rewritten to describe the share rather
than the whole allocation so that ``srun`` or ``mpirun`` inside the task stays within it: the
counts in Slurm's own forms (``2(x3),1``), and ``SLURM_DISTRIBUTION=arbitrary`` with
``SLURM_HOSTFILE`` naming the task's node file, which is how ``srun`` is told the nodes of a
step (without it, a step takes the job's first nodes). Two values here are left for the process
layer (:mod:`~psij.executors.pilot._task_process`) to finish, as only it knows the node file's
path: an empty ``SLURM_HOSTFILE`` becomes that path, and an empty ``SLURM_NTASKS_PER_NODE``
(a share with different counts per node, where Slurm sets none) is removed. The GPUs
of the share's first node in ``CUDA_VISIBLE_DEVICES`` (``ROCR_VISIBLE_DEVICES`` and
``HIP_VISIBLE_DEVICES`` on AMD), by id where the node's GPUs are known by id, else by index.
"""

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from psij.executors._gpu_detect import GpuSet
    from psij.executors.pilot.allocation import Allocation
    from psij.executors.pilot.tasks import TaskShare

__all__ = ["ShareFiles", "nodefile_text", "pilot_environment", "slurm_counts"]

_SHARE_CACHE_SIZE = 4096


class ShareFiles:
    """The variables and node file of each distinct share of ``allocation``, made once (at
    most 4096 kept). ``slurm``: SLURM_* variables always, never, or (None) in a Slurm
    allocation."""

    def __init__(self, allocation: "Allocation", slurm: Optional[bool]) -> None:
        self._allocation = allocation
        self._slurm = allocation.kind == "slurm" if slurm is None else slurm
        self._known: Dict[Tuple[Any, ...], Tuple[Dict[str, str], str]] = {}

    def get(self, share: "TaskShare", cores_per_process: int) -> Tuple[Dict[str, str], str]:
        """A new copy of the variables describing ``share`` (QCG_PM_STEP_ID to be set), and
        its node file's text."""
        key = (share.nodes, share.processes, cores_per_process,
               share.gpus[0] if share.gpus else ())
        known = self._known.get(key)
        if known is None:
            if len(self._known) >= _SHARE_CACHE_SIZE:
                self._known.clear()
            gpus = self._allocation.gpu_ids(share.nodes[0], share.gpus[0]) \
                if share.gpus and share.gpus[0] else None
            known = (pilot_environment("", share, cores_per_process, self._slurm, gpus),
                     nodefile_text(share))
            self._known[key] = known
        return dict(known[0]), known[1]


def pilot_environment(task_id: str, share: "TaskShare", cores_per_process: int,
                      slurm: bool = True, gpus: "Optional[GpuSet]" = None) -> Dict[str, str]:
    """The QCG_PM_* and (with ``slurm``) SLURM_* variables that describe a task's own share
    (its id in QCG_PM_STEP_ID), and its GPUs: ``gpus`` (those of its first node, by id and
    vendor), else the indices of that node's GPUs."""
    nodes = ",".join(share.nodes)
    count = str(len(share.nodes))
    processes = str(share.process_count)
    per_node = ",".join(str(p) for p in share.processes)
    env = {
        "QCG_PM_NNODES": count, "QCG_PM_NODELIST": nodes, "QCG_PM_NPROCS": processes,
        "QCG_PM_NTASKS": processes, "QCG_PM_STEP_ID": task_id,
        "QCG_PM_TASKS_PER_NODE": per_node,
    }
    if slurm:
        env.update(_slurm_environment(nodes, count, processes, share, cores_per_process))
    if gpus is not None:
        env.update(gpus.environment(gpus.ids))
    elif share.gpus and share.gpus[0]:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in share.gpus[0])
    return env


def slurm_counts(counts: Sequence[int]) -> str:
    """Counts per node as Slurm writes them: ``2(x3),1`` for 2, 2, 2, 1."""
    groups: List[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        groups.append(str(counts[i]) if j == i else f"{counts[i]}(x{j - i + 1})")
        i = j + 1
    return ",".join(groups)


def _slurm_environment(nodes: str, count: str, processes: str, share: "TaskShare",
                       cores_per_process: int) -> Dict[str, str]:
    counts = share.processes
    per_node = slurm_counts(counts)
    uniform = all(c == counts[0] for c in counts)
    env = {
        "SLURM_NNODES": count, "SLURM_NODELIST": nodes, "SLURM_NPROCS": processes,
        "SLURM_NTASKS": processes, "SLURM_JOB_NODELIST": nodes, "SLURM_JOB_NUM_NODES": count,
        "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_NUM_NODES": count,
        "SLURM_STEP_NUM_TASKS": processes,
        "SLURM_NTASKS_PER_NODE": str(counts[0]) if uniform else "",
        "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_DISTRIBUTION": "arbitrary", "SLURM_HOSTFILE": "",
    }
    if cores_per_process > 1:
        env["SLURM_CPUS_PER_TASK"] = str(cores_per_process)
    return env


def nodefile_text(share: "TaskShare") -> str:
    return "".join(f"{node}\n" * processes
                   for node, processes in zip(share.nodes, share.processes))
