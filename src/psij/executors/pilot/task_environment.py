"""The variables and node file that tell a pilot task its own share of the allocation.

Pure text: nothing is written or started here (the engine writes the node file and starts
the task). ``QCG_PM_*`` always; ``SLURM_*`` when asked, rewritten to describe the share rather
than the whole allocation so that ``srun`` or ``mpirun`` inside the task stays within it; the GPUs
of the share's first node in ``CUDA_VISIBLE_DEVICES`` (``ROCR_VISIBLE_DEVICES`` and
``HIP_VISIBLE_DEVICES`` on AMD), by id where the node's GPUs are known by id, else by index.
"""

from typing import TYPE_CHECKING, Dict, Optional

if TYPE_CHECKING:
    from psij.executors._gpu_detect import GpuSet
    from psij.executors.pilot.tasks import TaskShare

__all__ = ["nodefile_text", "pilot_environment"]


def pilot_environment(task_id: str, share: "TaskShare", cores_per_process: int,
                      slurm: bool = True, gpus: Optional["GpuSet"] = None) -> Dict[str, str]:
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
        env.update(_slurm_environment(nodes, count, processes, per_node, cores_per_process))
    if gpus is not None:
        env.update(gpus.environment(gpus.ids))
    elif share.gpus and share.gpus[0]:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in share.gpus[0])
    return env


def _slurm_environment(nodes: str, count: str, processes: str, per_node: str,
                       cores_per_process: int) -> Dict[str, str]:
    env = {
        "SLURM_NNODES": count, "SLURM_NODELIST": nodes, "SLURM_NPROCS": processes,
        "SLURM_NTASKS": processes, "SLURM_JOB_NODELIST": nodes, "SLURM_JOB_NUM_NODES": count,
        "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_NUM_NODES": count,
        "SLURM_STEP_NUM_TASKS": processes, "SLURM_NTASKS_PER_NODE": per_node,
        "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_TASKS_PER_NODE": per_node,
    }
    if cores_per_process > 1:
        env["SLURM_CPUS_PER_TASK"] = str(cores_per_process)
    return env


def nodefile_text(share: "TaskShare") -> str:
    return "".join(f"{node}\n" * processes
                   for node, processes in zip(share.nodes, share.processes))
