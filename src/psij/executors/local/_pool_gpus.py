"""The GPUs a local resource pool hands out, and how a job is told its own.

The GPUs of this machine are found by :mod:`psij.executors._gpu_detect` (the one finding the
pilot's own node uses too; its names are re-exported here). A pool's ``gpus`` setting
overrides them: a count takes the first ones found, or ids ``0`` to ``count - 1`` when fewer
are found; a list of ids names them.

A job is given its GPUs as the pilot gives a task its own (the lowest free ids first,
:mod:`psij.executors.local._pool_machine`), in the variables of the GPUs' vendor
(:meth:`~psij._gpu_ids.GpuSet.environment`: ``CUDA_VISIBLE_DEVICES``, or on AMD
``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``). GPUs are never shared between jobs.

Nothing here starts a process but through the detection module.
"""

from typing import Any, Optional

from psij.executors._gpu_detect import (
    AMD,
    MAX_GPUS,
    NVIDIA,
    GpuSet,
    detect_gpus,
    found_gpus,
    gpus_from_setting,
)

__all__ = ["AMD", "MAX_GPUS", "NVIDIA", "GpuSet", "detect_gpus", "found_gpus", "pool_gpus"]


def pool_gpus(field: str, setting: Optional[Any]) -> GpuSet:
    """The GPUs of a pool: this machine's (``setting`` None), or those of a ``gpus`` setting
    (see :func:`~psij.executors._gpu_detect.gpus_from_setting`)."""
    if setting is None:
        return found_gpus()
    return gpus_from_setting(field, setting)
