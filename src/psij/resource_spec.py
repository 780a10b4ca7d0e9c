"""What a job asks for: nodes, processes, cores, GPUs, memory.

Pure data with a consistency check at construction and on every change; no I/O.
"""

from typing import Any, Optional

from psij import _check
from psij.exceptions import InvalidJobException

__all__ = ["ResourceSpec", "ResourceSpecV1"]


class ResourceSpec:
    """Base class of versioned resource specifications; ``get_instance(1)`` gives a V1."""

    @property
    def version(self) -> int:
        raise NotImplementedError

    @staticmethod
    def get_instance(version: int) -> "ResourceSpec":
        """A new, default resource specification of the given version (only 1 exists)."""
        if version == 1:
            return ResourceSpecV1()
        raise ValueError(f"ResourceSpec version: {version!r} is not supported; accepted: 1")


_COUNTS = ("node_count", "process_count", "processes_per_node", "cpu_cores_per_process",
           "gpu_cores_per_process")


class ResourceSpecV1(ResourceSpec):
    """Version 1 resource specification.

    ``process_count`` must equal ``node_count * processes_per_node`` when all three are given,
    and be a multiple of the other one when two are given (as psij-python requires); a
    combination that breaks this raises :class:`~psij.InvalidJobException`, at construction and
    on assignment. ``computed_*`` properties fill in what is missing (default 1). ``memory`` is
    in bytes.
    """

    def __init__(
        self,
        node_count: Optional[int] = None,
        process_count: Optional[int] = None,
        processes_per_node: Optional[int] = None,
        cpu_cores_per_process: Optional[int] = None,
        gpu_cores_per_process: Optional[int] = None,
        exclusive_node_use: bool = False,
        memory: Optional[int] = None,
    ) -> None:
        self._ready = False
        self.node_count = node_count
        self.process_count = process_count
        self.processes_per_node = processes_per_node
        self.cpu_cores_per_process = cpu_cores_per_process
        self.gpu_cores_per_process = gpu_cores_per_process
        self.exclusive_node_use = exclusive_node_use
        self.memory = memory
        self._ready = True
        self._check_consistent()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _COUNTS:
            value = _check.opt_int(f"ResourceSpecV1.{name}", value, minimum=1)
        elif name == "exclusive_node_use":
            value = _check.flag("ResourceSpecV1.exclusive_node_use", value)
        elif name == "memory":
            value = _check.opt_int("ResourceSpecV1.memory", value, minimum=1)
        previous = self.__dict__.get(name)
        object.__setattr__(self, name, value)
        if name in _COUNTS and self.__dict__.get("_ready"):
            try:
                self._check_consistent()
            except InvalidJobException:
                object.__setattr__(self, name, previous)
                raise

    def _check_consistent(self) -> None:
        n, p, ppn = self.node_count, self.process_count, self.processes_per_node
        if n is not None and p is not None and ppn is not None and p != n * ppn:
            raise InvalidJobException(
                f"ResourceSpecV1: process_count ({p}) must equal node_count ({n}) x "
                f"processes_per_node ({ppn})")
        if n is not None and p is not None and ppn is None and p % n != 0:
            raise InvalidJobException(
                f"ResourceSpecV1: process_count ({p}) is not a multiple of node_count ({n})")
        if n is None and p is not None and ppn is not None and p % ppn != 0:
            raise InvalidJobException(
                f"ResourceSpecV1: process_count ({p}) is not a multiple of processes_per_node "
                f"({ppn})")

    @property
    def version(self) -> int:
        return 1

    @property
    def computed_node_count(self) -> int:
        """node_count, or process_count / processes_per_node, or 1."""
        if self.node_count is not None:
            return self.node_count
        if self.process_count is not None and self.processes_per_node is not None:
            return self.process_count // self.processes_per_node
        return 1

    @property
    def computed_process_count(self) -> int:
        """process_count, or node_count * processes_per_node, or 1."""
        if self.process_count is not None:
            return self.process_count
        return self.computed_node_count * (self.processes_per_node or 1)

    @property
    def computed_processes_per_node(self) -> int:
        """processes_per_node, or process_count / node_count (rounded up), or 1."""
        if self.processes_per_node is not None:
            return self.processes_per_node
        return max(1, -(-self.computed_process_count // self.computed_node_count))

    @property
    def memory_kb(self) -> Optional[int]:
        """Memory in KiB, rounded up; None if no memory was asked for."""
        return None if self.memory is None else -(-self.memory // 1024)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResourceSpecV1):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k)
                   for k in (*_COUNTS, "exclusive_node_use", "memory"))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in (*_COUNTS, "exclusive_node_use",
                                                                   "memory")
                           if getattr(self, k) not in (None, False))
        return f"ResourceSpecV1({fields})"
