"""Resource shapes of batch jobs: what groups jobs for ``max_queued_per_shape``.

A job's :class:`Shape` is made of what the scheduler places it by: node count, process count,
processes per node, cores and GPUs per process, exclusive use, memory and temporary disk
rounded into buckets, queue, account, reservation, and its custom attributes (but the
priority and ``psij.tmp``, which are accounted for elsewhere). Jobs of one shape are
interchangeable for the scheduler, so the client may keep them back and submit the most urgent
first.

Buckets: memory (``ResourceSpecV1.memory``) and temporary disk (the ``psij.tmp`` custom
attribute, bytes per node) are rounded **up** to a multiple of the executor's
``memory_bucket`` and ``tmp_bucket`` (bytes; 0 groups by the exact amount) to make the shape.
This rounding only groups jobs: the submitted script asks for the exact amounts. With
``memory_bucket`` = 1 GiB, jobs asking for 1.2 GiB and 1.9 GiB share a shape (2 GiB).

Pure values: nothing here runs commands or reads files.
"""

from typing import Any, Optional, Tuple

from psij._declared_attributes import TMP_ATTRIBUTE, tmp_bytes
from psij._priority import ATTRIBUTE, LEGACY_ATTRIBUTE
from psij._record import Record
from psij.exceptions import InvalidJobException
from psij.job_spec import JobSpec
from psij.resource_spec import ResourceSpecV1

__all__ = ["TMP_ATTRIBUTE", "Shape", "job_tmp", "round_up", "shape_of"]

# Custom attributes that do not make a shape of their own.
_NOT_SHAPE = frozenset({ATTRIBUTE, LEGACY_ATTRIBUTE, TMP_ATTRIBUTE})


class Shape(Record):
    """The resource shape of a job (see the module's documentation)."""

    nodes: int
    processes: int
    processes_per_node: int
    cores_per_process: int
    gpus_per_process: int
    exclusive: bool
    memory: Optional[int]
    tmp: Optional[int]
    queue: Optional[str]
    account: Optional[str]
    reservation: Optional[str]
    custom: Tuple[Tuple[str, str], ...]

    def describe(self) -> str:
        """A short text naming the shape (for messages and status metadata)."""
        parts = [f"{self.nodes} node(s)", f"{self.processes} process(es)",
                 f"{self.cores_per_process} core(s)/process"]
        if self.gpus_per_process:
            parts.append(f"{self.gpus_per_process} GPU(s)/process")
        if self.memory is not None:
            parts.append(f"memory<={self.memory}B")
        if self.tmp is not None:
            parts.append(f"tmp<={self.tmp}B")
        for name in ("queue", "account", "reservation"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value}")
        parts.extend(f"{k}={v}" for k, v in self.custom)
        return ", ".join(parts)


def round_up(amount: Optional[int], bucket: int) -> Optional[int]:
    """``amount`` rounded up to a multiple of ``bucket`` (itself when ``bucket`` is 0)."""
    if amount is None or bucket <= 0:
        return amount
    return -(-amount // bucket) * bucket


def job_tmp(spec: JobSpec) -> Optional[int]:
    """The temporary disk space (bytes per node) asked with ``psij.tmp``; None when unset.

    InvalidJobException for anything but a whole, non-negative, finite number of bytes.
    """
    value = spec.attributes.get_custom_attribute(TMP_ATTRIBUTE)
    return None if value is None else tmp_bytes(TMP_ATTRIBUTE, value)


def shape_of(spec: JobSpec, memory_bucket: int = 0, tmp_bucket: int = 0) -> Shape:
    """The shape of a job with ``spec`` (InvalidJobException for values that make none)."""
    resources = spec.resources if spec.resources is not None else ResourceSpecV1()
    if not isinstance(resources, ResourceSpecV1):
        raise InvalidJobException(f"JobSpec.resources: only ResourceSpecV1 is understood by "
                                  f"batch executors, got {type(resources).__name__}")
    attributes = spec.attributes
    custom = attributes.custom_attributes or {}
    return Shape(
        resources.computed_node_count, resources.computed_process_count,
        resources.computed_processes_per_node, resources.cpu_cores_per_process or 1,
        resources.gpu_cores_per_process or 0, bool(resources.exclusive_node_use),
        round_up(resources.memory, memory_bucket), round_up(job_tmp(spec), tmp_bucket),
        attributes.queue_name, attributes.account, attributes.reservation_id,
        tuple(sorted((str(k), _text(v)) for k, v in custom.items() if k not in _NOT_SHAPE)))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)
