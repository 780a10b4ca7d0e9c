"""The GPUs of this machine that a local resource pool hands out, and how a job is told its own.

Found, in order: the ids listed in ``CUDA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES`` or
``HIP_VISIBLE_DEVICES`` (the first one set: a batch job's share of a node, for one; an empty
value, ``-1`` or ``NoDevFiles`` means none), else the GPUs ``nvidia-smi -L`` lists (ids 0, 1,
...), else none. A pool configured with a count of GPUs uses the first ids found, or ``0`` to
``count - 1`` when fewer are found.

A job is given its GPUs as the pilot gives a task its own (the lowest free ids first,
``psij.executors.pilot.resources``; ``CUDA_VISIBLE_DEVICES`` in
``psij.executors.pilot.task_environment``): the variable the ids came from is set to the job's
ids, comma-separated (``CUDA_VISIBLE_DEVICES`` when they came from ``nvidia-smi`` or the
configuration).
"""

import functools
import os
import shutil
import subprocess
from typing import Mapping, Optional, Sequence, Tuple

__all__ = ["CUDA", "VISIBLE", "gpu_environment", "gpu_ids_for", "visible_gpus"]

CUDA = "CUDA_VISIBLE_DEVICES"
VISIBLE = (CUDA, "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
_NONE = ("-1", "NoDevFiles")
_SMI_TIMEOUT = 10.0


def _listed(text: str) -> Tuple[str, ...]:
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part or part in _NONE:
            break  # as the drivers read the list: it ends at the first id that is none
        ids.append(part)
    return tuple(ids)


@functools.lru_cache(maxsize=1)
def _nvidia_smi_count() -> int:
    """How many GPUs ``nvidia-smi -L`` lists (0 without it, or when it fails); asked once."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return 0
    try:
        done = subprocess.run([program, "-L"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=_SMI_TIMEOUT, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return 0
    if done.returncode != 0:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def visible_gpus(environ: Optional[Mapping[str, str]] = None
                 ) -> Tuple[Tuple[str, ...], str]:
    """The ids of the GPUs this process may use, and the variable that gives a job its own
    (see the module's documentation)."""
    env = os.environ if environ is None else environ
    for name in VISIBLE:
        if name in env:
            return _listed(env[name]), name
    return tuple(str(i) for i in range(_nvidia_smi_count())), CUDA


def gpu_ids_for(count: int, environ: Optional[Mapping[str, str]] = None
                ) -> Tuple[Tuple[str, ...], str]:
    """``count`` GPU ids for a pool (the first ones found, else ``0`` to ``count - 1``), and
    the variable that gives a job its own."""
    if count <= 0:
        return (), CUDA
    found, name = visible_gpus(environ)
    if len(found) >= count:
        return found[:count], name
    return tuple(str(i) for i in range(count)), CUDA


def gpu_environment(ids: Sequence[str], name: str) -> Mapping[str, str]:
    """What a job given the GPUs ``ids`` gets in its environment."""
    return {name: ",".join(ids)} if ids else {}
