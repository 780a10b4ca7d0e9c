"""Resource arithmetic of the pilot: the nodes of an allocation, what a task asks for, and the
concrete cores, GPUs, memory and custom counts of the nodes it is given.

This module is pure: no I/O, no threads, no clock. It does not decide *which task* runs next
(that is :mod:`psij.executors.pilot.scheduler`); it only answers "can this shape be placed now,
and where" and keeps the books of what is free.

Rules:

- A pool is a fixed, ordered list of nodes. A node has ``cores`` (ids ``0..cores-1``), ``gpus``
  (ids ``0..gpus-1``), ``memory`` in bytes and custom countable resources (name to count).
- A task asks for *processes*. Each process needs ``cores_per_process`` cores and
  ``gpus_per_process`` GPUs of one node and ``memory_per_process`` bytes of that node's memory.
  Custom resources are counted per node used: every node the task gets must have them free.
- The number of processes, of nodes, and of processes on each used node are each a range
  (:class:`Amount`); "exactly n" is the range ``n..n``. Whenever a range allows more, the task
  gets the most that is free *now*, never less than its minimum (the ``min``/``max`` rule of
  QCG-PilotJob requests). ``split-into`` k caps a range at ``total // k`` (never below its
  minimum), where the total is the pool's processes for the process count, its node count for
  the node count and the largest node's processes for the per-node count.
- An ``exclusive`` task takes whole idle nodes: every core, GPU, byte and custom count of each
  node it uses, whatever the number of processes it runs there.
- Where nodes are chosen: a task that needs one process per node at least and any number of
  nodes, or exactly the same number on each node, takes the first nodes (in pool order) that
  have room, packing them; a task with a per-node range and a bounded node count (or a per-node
  minimum above one) takes the nodes where the most processes fit (ties in pool order), so that
  it gets the maximum. Either way it uses as few nodes as reach its maximum, each node gets at
  least its per-node minimum, and the rest fills the first chosen nodes. Core and GPU ids are
  the lowest free ones of each node.
- Memory is reserved per process (``memory_per_process`` times the processes on the node), or
  the whole node's memory for an exclusive task.
- The planner is exact: a shape is placed whenever some choice of nodes satisfies it, and
  whether it fits only ever improves when resources are released. The scheduler relies on this
  to remember that a shape did not fit until something is released.
- A bad request raises ``TypeError``/``ValueError`` naming the field; releasing what is not held
  raises ``ValueError`` and leaves the pool unchanged.
"""

from bisect import bisect_left, insort
from types import MappingProxyType
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from psij import _check
from psij.executors.pilot._record import Record
from psij.resource_spec import ResourceSpecV1

__all__ = [
    "UNBOUNDED", "Amount", "NodeShare", "NodeSpec", "NodeUsage", "PoolUsage", "ResourcePool",
    "ResourceRequest", "Shape",
]

UNBOUNDED = 1 << 62
"""The upper bound of a range that has none (larger than any real count)."""

_NO_COUNTS: Mapping[str, int] = MappingProxyType({})
_NO_IDS: List[int] = []  # never changed: the ids of a share without GPUs

_QCG_AMOUNT_KEYS = ("exact", "min", "max", "split-into")


def _counts(field_name: str, value: Any) -> Mapping[str, int]:
    """A read-only, name-sorted copy of a custom-resource mapping, checked."""
    if value is None:
        return _NO_COUNTS
    if not isinstance(value, Mapping):
        raise _check.fail_type(field_name, value, "a dict of str to int")
    if not value:
        return _NO_COUNTS
    out: Dict[str, int] = {}
    for name in sorted(value, key=lambda k: str(k)):
        if not isinstance(name, str) or name == "":
            raise _check.fail_type(f"{field_name} key", name, "a non-empty str")
        count = _check.opt_int(f"{field_name}[{name!r}]", value[name], minimum=0)
        if count is None:
            raise _check.fail_type(f"{field_name}[{name!r}]", None, "int")
        out[name] = count
    return MappingProxyType(out)


def _count(field_name: str, value: Any, minimum: int) -> int:
    checked = _check.opt_int(field_name, value, minimum=minimum)
    if checked is None:
        raise _check.fail_type(field_name, value, "int")
    return checked


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_set = object.__setattr__


class NodeSpec(Record):
    """One node of a pool: its host name and what it has."""

    _fields = ("name", "cores", "memory", "gpus", "custom")
    __slots__ = _fields
    name: str
    cores: int
    memory: int
    gpus: int
    custom: Mapping[str, int]

    def __init__(self, name: str, cores: int, memory: int = 0, gpus: int = 0,
                 custom: Optional[Mapping[str, int]] = None) -> None:
        _check.req_str("NodeSpec.name", name)
        if name == "":
            raise ValueError("NodeSpec.name: a node needs a non-empty host name")
        _set(self, "name", name)
        _set(self, "cores", _count("NodeSpec.cores", cores, 1))
        _set(self, "memory", _count("NodeSpec.memory", memory, 0))
        _set(self, "gpus", _count("NodeSpec.gpus", gpus, 0))
        _set(self, "custom", _counts("NodeSpec.custom", custom))

    def __hash__(self) -> int:
        return hash((self.name, self.cores, self.memory, self.gpus,
                     tuple(self.custom.items())))

    def describe(self) -> str:
        parts = [_plural(self.cores, "core")]
        if self.gpus:
            parts.append(_plural(self.gpus, "GPU"))
        if self.memory:
            parts.append(_bytes(self.memory))
        parts.extend(f"{k}={v}" for k, v in self.custom.items())
        return f"{self.name} ({', '.join(parts)})"


class Amount(Record):
    """A count a task asks for: between ``minimum`` and ``maximum`` (None: no upper bound).

    The task gets the most that is free, at least ``minimum``. ``split_into`` k further caps the
    maximum at the pool's total divided by k (see the module rules).
    """

    _fields = ("minimum", "maximum", "split_into")
    __slots__ = _fields
    minimum: int
    maximum: Optional[int]
    split_into: Optional[int]

    def __init__(self, minimum: int, maximum: Optional[int],
                 split_into: Optional[int] = None) -> None:
        _count("Amount.minimum", minimum, 1)
        _check.opt_int("Amount.maximum", maximum, minimum=1)
        _check.opt_int("Amount.split_into", split_into, minimum=1)
        if maximum is not None and maximum < minimum:
            raise ValueError(f"Amount: maximum ({maximum}) is less than minimum "
                             f"({minimum})")
        _set(self, "minimum", minimum)
        _set(self, "maximum", maximum)
        _set(self, "split_into", split_into)

    @classmethod
    def exact(cls, n: int) -> "Amount":
        return cls(n, n)

    @classmethod
    def at_least(cls, n: int) -> "Amount":
        return cls(n, None)

    @classmethod
    def from_qcg(cls, field_name: str, spec: Any) -> "Amount":
        """Read a QCG ``numCores``/``numNodes`` element: ``exact``, or ``min``/``max``
        (either may be left out: ``min`` defaults to 1, ``max`` to no bound), with an optional
        ``split-into`` that goes with ``min``.
        """
        if not isinstance(spec, Mapping):
            raise _check.fail_type(field_name, spec, "a dict with exact, min, max, split-into")
        unknown = [k for k in spec if k not in _QCG_AMOUNT_KEYS]
        if unknown:
            raise ValueError(f"{field_name}: unknown key {unknown[0]!r}; accepted: "
                             f"{', '.join(_QCG_AMOUNT_KEYS)}")
        values = {k: _count(f"{field_name}.{k}", spec[k], 1) for k in spec}
        if "exact" in values:
            others = [k for k in ("min", "max", "split-into") if k in values]
            if others:
                raise ValueError(f"{field_name}: 'exact' cannot be combined with "
                                 f"{others[0]!r}; use either exact or min/max")
            return cls.exact(values["exact"])
        if not values:
            raise ValueError(f"{field_name}: give 'exact' or 'min'/'max'")
        minimum = values.get("min", 1)
        maximum = values.get("max")
        if maximum is not None and maximum < minimum:
            raise ValueError(f"{field_name}: max ({maximum}) is less than min ({minimum})")
        return cls(minimum, maximum, values.get("split-into"))

    def bounds(self, total: int) -> Tuple[int, int]:
        """The concrete range in a pool whose relevant total is ``total``."""
        high = UNBOUNDED if self.maximum is None else self.maximum
        if self.split_into is not None:
            high = min(high, max(self.minimum, total // self.split_into))
        return self.minimum, high

    def describe(self) -> str:
        if self.split_into is not None:
            return f"at least {self.minimum}, split into {self.split_into}"
        if self.maximum == self.minimum:
            return str(self.minimum)
        if self.maximum is None:
            return f"at least {self.minimum}"
        return f"{self.minimum} to {self.maximum}"


_ONE = Amount.exact(1)
_ANY = Amount.at_least(1)


class ResourceRequest(Record):
    """What one task asks for, independent of any pool (see the module rules).

    ``nodes=None`` means any number of nodes. ``custom`` counts are per node used.
    Build one from PSI/J with :meth:`from_resource_spec` or from QCG with :meth:`from_qcg`.
    """

    _fields = ("processes", "nodes", "processes_per_node", "cores_per_process",
               "gpus_per_process", "memory_per_process", "exclusive", "custom")
    # Requests key the scheduler's table of shapes: hashed once, not on every lookup.
    __slots__ = (*_fields, "_hash")
    processes: Amount
    nodes: Optional[Amount]
    processes_per_node: Amount
    cores_per_process: int
    gpus_per_process: int
    memory_per_process: int
    exclusive: bool
    custom: Mapping[str, int]
    _hash: int

    def __init__(self, processes: Amount = _ONE, nodes: Optional[Amount] = None,
                 processes_per_node: Amount = _ANY, cores_per_process: int = 1,
                 gpus_per_process: int = 0, memory_per_process: int = 0,
                 exclusive: bool = False, custom: Optional[Mapping[str, int]] = None) -> None:
        _check.instance("ResourceRequest.processes", processes, Amount, "Amount", False)
        _check.instance("ResourceRequest.nodes", nodes, Amount, "Amount")
        _check.instance("ResourceRequest.processes_per_node", processes_per_node, Amount,
                        "Amount", False)
        _count("ResourceRequest.cores_per_process", cores_per_process, 1)
        _count("ResourceRequest.gpus_per_process", gpus_per_process, 0)
        _count("ResourceRequest.memory_per_process", memory_per_process, 0)
        _check.opt_bool("ResourceRequest.exclusive", exclusive)
        counts = _counts("ResourceRequest.custom", custom)
        if processes.split_into is None and processes_per_node.split_into is None \
                and (nodes is None or nodes.split_into is None):
            # Without split-into the ranges do not depend on the pool: check them now.
            _check_ranges(processes.bounds(0),
                          (1, UNBOUNDED) if nodes is None else nodes.bounds(0),
                          processes_per_node.bounds(0))
        _set(self, "processes", processes)
        _set(self, "nodes", nodes)
        _set(self, "processes_per_node", processes_per_node)
        _set(self, "cores_per_process", cores_per_process)
        _set(self, "gpus_per_process", gpus_per_process)
        _set(self, "memory_per_process", memory_per_process)
        _set(self, "exclusive", exclusive)
        _set(self, "custom", counts)
        _set(self, "_hash", hash((processes, nodes, processes_per_node, cores_per_process,
                                  gpus_per_process, memory_per_process, exclusive,
                                  tuple(counts.items()))))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def from_resource_spec(cls, spec: ResourceSpecV1,
                           custom: Optional[Mapping[str, int]] = None) -> "ResourceRequest":
        """The request of a PSI/J job.

        ``process_count`` alone spreads the processes over any nodes; with ``node_count`` each
        of exactly that many nodes runs ``process_count / node_count`` processes; with
        ``processes_per_node`` alone the job uses ``ceil(process_count / processes_per_node)``
        nodes with at most that many processes each. ``memory`` (the job's total) is divided
        evenly among the processes, rounded up.
        """
        if not isinstance(spec, ResourceSpecV1):
            raise _check.fail_type("resource_spec", spec, "psij.ResourceSpecV1")
        processes = spec.computed_process_count
        nodes: Optional[Amount] = None
        per_node = _ANY
        if spec.node_count is not None:
            nodes = Amount.exact(spec.node_count)
            per_node = Amount.exact(spec.computed_processes_per_node)
        elif spec.processes_per_node is not None:
            ppn = spec.processes_per_node
            nodes = Amount.exact(-(-processes // ppn))
            per_node = Amount.exact(ppn) if processes % ppn == 0 else Amount(1, ppn)
        memory = spec.memory or 0
        return cls(
            processes=Amount.exact(processes),
            nodes=nodes,
            processes_per_node=per_node,
            cores_per_process=spec.cpu_cores_per_process or 1,
            gpus_per_process=spec.gpu_cores_per_process or 0,
            memory_per_process=-(-memory // processes),
            exclusive=spec.exclusive_node_use,
            custom=_counts("custom", custom),
        )

    @classmethod
    def from_qcg(cls, num_cores: Optional[Mapping[str, Any]] = None,
                 num_nodes: Optional[Mapping[str, Any]] = None,
                 custom: Optional[Mapping[str, int]] = None) -> "ResourceRequest":
        """The request of a QCG-PilotJob task (its ``resources`` element).

        ``numCores`` alone: that many cores on any nodes. ``numNodes`` alone: that many whole
        nodes. Both: that many nodes with that many cores on each. Neither: one core.
        A process is one core here.
        """
        counts = _counts("custom", custom)
        cores = None if num_cores is None else Amount.from_qcg("numCores", num_cores)
        if num_nodes is None:
            return cls(processes=cores or _ONE, custom=counts)
        nodes = Amount.from_qcg("numNodes", num_nodes)
        if cores is None:
            return cls(processes=_ANY, nodes=nodes, exclusive=True, custom=counts)
        return cls(processes=_ANY, nodes=nodes, processes_per_node=cores, custom=counts)

    def describe(self) -> str:
        return _describe(self.processes.describe(),
                         None if self.nodes is None else self.nodes.describe(),
                         self.processes_per_node.describe(), self.cores_per_process,
                         self.gpus_per_process, self.memory_per_process, self.exclusive,
                         tuple(self.custom.items()))


def _check_ranges(processes: Tuple[int, int], nodes: Tuple[int, int],
                  per_node: Tuple[int, int]) -> None:
    if nodes[0] * per_node[0] > processes[1]:
        raise ValueError(
            f"ResourceRequest: {nodes[0]} nodes with at least {per_node[0]} processes each "
            f"need more than the at most {processes[1]} processes asked for")
    if nodes[1] < UNBOUNDED and per_node[1] < UNBOUNDED and nodes[1] * per_node[1] < processes[0]:
        raise ValueError(
            f"ResourceRequest: at most {nodes[1]} nodes with at most {per_node[1]} processes "
            f"each cannot run the at least {processes[0]} processes asked for")


def _range_text(low: int, high: int) -> str:
    if low == high:
        return str(low)
    if high >= UNBOUNDED:
        return f"at least {low}"
    return f"{low} to {high}"


def _describe(processes: str, nodes: Optional[str], per_node: str, cores_per_process: int,
              gpus_per_process: int, memory_per_process: int, exclusive: bool,
              custom: Sequence[Tuple[str, int]]) -> str:
    each = [_plural(cores_per_process, "core")]
    if gpus_per_process:
        each.append(_plural(gpus_per_process, "GPU"))
    if memory_per_process:
        each.append(_bytes(memory_per_process))
    text = f"{processes} processes of {', '.join(each)}"
    if nodes is None:
        text += " on any number of nodes"
    else:
        text += f" on {nodes} nodes"
    if per_node not in ("1", "at least 1"):
        text += f" ({per_node} per node)"
    if exclusive:
        text += ", whole nodes only"
    if custom:
        text += ", per node " + ", ".join(f"{k}={v}" for k, v in custom)
    return text


class Shape(Record):
    """A request made concrete for one pool: every range resolved to numbers.

    Tasks with equal shapes are interchangeable for placement, which is what lets the scheduler
    queue them together. Built by :meth:`ResourcePool.resolve` from checked values.
    """

    _fields = ("processes_min", "processes_max", "nodes_min", "nodes_max", "per_node_min",
               "per_node_max", "cores_per_process", "gpus_per_process", "memory_per_process",
               "exclusive", "custom")
    # The fields, then lower bounds of what any placement holds, for tests that cost one
    # comparison (derived, so neither compared nor shown).
    __slots__ = (*_fields, "min_cores", "min_gpus", "min_node_cores", "min_idle_nodes",
                 "cores_only", "in_pool_order", "_hash")
    processes_min: int
    processes_max: int
    nodes_min: int
    nodes_max: int
    per_node_min: int
    per_node_max: int
    cores_per_process: int
    gpus_per_process: int
    memory_per_process: int
    exclusive: bool
    custom: Tuple[Tuple[str, int], ...]
    min_cores: int
    min_gpus: int
    min_node_cores: int
    min_idle_nodes: int
    cores_only: bool  # asks for cores alone: no GPU, memory or custom count
    in_pool_order: bool  # placed on the first nodes with room (see ResourcePool._plan)
    _hash: int

    def __init__(self, processes_min: int, processes_max: int, nodes_min: int, nodes_max: int,
                 per_node_min: int, per_node_max: int, cores_per_process: int,
                 gpus_per_process: int, memory_per_process: int, exclusive: bool,
                 custom: Tuple[Tuple[str, int], ...]) -> None:
        _set(self, "processes_min", processes_min)
        _set(self, "processes_max", processes_max)
        _set(self, "nodes_min", nodes_min)
        _set(self, "nodes_max", nodes_max)
        _set(self, "per_node_min", per_node_min)
        _set(self, "per_node_max", per_node_max)
        _set(self, "cores_per_process", cores_per_process)
        _set(self, "gpus_per_process", gpus_per_process)
        _set(self, "memory_per_process", memory_per_process)
        _set(self, "exclusive", exclusive)
        _set(self, "custom", tuple(custom))
        _set(self, "min_cores", processes_min * cores_per_process)
        _set(self, "min_gpus", processes_min * gpus_per_process)
        _set(self, "min_node_cores", per_node_min * cores_per_process)
        _set(self, "min_idle_nodes", nodes_min if exclusive else 0)
        _set(self, "cores_only", not gpus_per_process and not memory_per_process and not custom)
        _set(self, "in_pool_order", not (per_node_min < per_node_max
                                         and (nodes_max < UNBOUNDED or per_node_min > 1)))
        # Shapes key the scheduler's buckets: hashed once, not on every lookup.
        _set(self, "_hash", hash(self._values(self)))

    def __hash__(self) -> int:
        return self._hash

    def describe(self) -> str:
        nodes = None if self.nodes_max >= UNBOUNDED and self.nodes_min == 1 \
            else _range_text(self.nodes_min, self.nodes_max)
        return _describe(_range_text(self.processes_min, self.processes_max), nodes,
                         _range_text(self.per_node_min, self.per_node_max),
                         self.cores_per_process, self.gpus_per_process,
                         self.memory_per_process, self.exclusive, self.custom)


class NodeShare(Record):
    """The part of one node given to one task: ``processes`` run on ``cores`` and ``gpus``."""

    _fields = ("node", "index", "processes", "cores", "gpus", "memory", "custom")
    __slots__ = _fields
    node: str
    index: int
    processes: int
    cores: Tuple[int, ...]
    gpus: Tuple[int, ...]
    memory: int
    custom: Mapping[str, int]

    def __init__(self, node: str, index: int, processes: int, cores: Tuple[int, ...],
                 gpus: Tuple[int, ...] = (), memory: int = 0,
                 custom: Mapping[str, int] = _NO_COUNTS) -> None:
        _set(self, "node", node)
        _set(self, "index", index)
        _set(self, "processes", processes)
        _set(self, "cores", cores)
        _set(self, "gpus", gpus)
        _set(self, "memory", memory)
        _set(self, "custom", custom)

    def __hash__(self) -> int:
        return hash((self.node, self.index, self.processes, self.cores, self.gpus, self.memory,
                     tuple(self.custom.items())))


class NodeUsage(Record):
    """What is free on one node at one moment."""

    _fields = ("node", "free_cores", "free_gpus", "free_memory", "free_custom", "idle")
    __slots__ = _fields
    node: str
    free_cores: Tuple[int, ...]
    free_gpus: Tuple[int, ...]
    free_memory: int
    free_custom: Mapping[str, int]
    idle: bool

    def __init__(self, node: str, free_cores: Tuple[int, ...], free_gpus: Tuple[int, ...],
                 free_memory: int, free_custom: Mapping[str, int], idle: bool) -> None:
        _set(self, "node", node)
        _set(self, "free_cores", free_cores)
        _set(self, "free_gpus", free_gpus)
        _set(self, "free_memory", free_memory)
        _set(self, "free_custom", free_custom)
        _set(self, "idle", idle)

    def __hash__(self) -> int:
        return hash((self.node, self.free_cores, self.free_gpus, self.free_memory,
                     tuple(self.free_custom.items()), self.idle))


class PoolUsage(Record):
    """Totals of a pool at one moment (QCG's ``resourcesInfo``)."""

    _fields = ("total_nodes", "idle_nodes", "total_cores", "free_cores", "total_gpus",
               "free_gpus")
    __slots__ = _fields
    total_nodes: int
    idle_nodes: int
    total_cores: int
    free_cores: int
    total_gpus: int
    free_gpus: int

    def __init__(self, total_nodes: int, idle_nodes: int, total_cores: int, free_cores: int,
                 total_gpus: int, free_gpus: int) -> None:
        _set(self, "total_nodes", total_nodes)
        _set(self, "idle_nodes", idle_nodes)
        _set(self, "total_cores", total_cores)
        _set(self, "free_cores", free_cores)
        _set(self, "total_gpus", total_gpus)
        _set(self, "free_gpus", free_gpus)

    @property
    def used_cores(self) -> int:
        return self.total_cores - self.free_cores


class _NodeState:
    """The free/used books of one node."""

    __slots__ = ("free_cores", "free_custom", "free_gpus", "free_memory", "holders", "index",
                 "name", "spec")

    def __init__(self, spec: NodeSpec, index: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.free_cores: List[int] = list(range(spec.cores))
        self.free_gpus: List[int] = list(range(spec.gpus))
        self.free_memory = spec.memory
        self.free_custom: Dict[str, int] = dict(spec.custom)
        self.holders = 0


Plan = List[Tuple[int, int]]
"""(node index, processes) pairs chosen for a shape."""


class ResourcePool:
    """The nodes of an allocation and what is free on each of them."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence):
            raise _check.fail_type("ResourcePool.nodes", nodes, "a list of NodeSpec")
        if not nodes:
            raise ValueError("ResourcePool.nodes: a pool needs at least one node")
        seen = set()
        for i, spec in enumerate(nodes):
            _check.instance(f"ResourcePool.nodes[{i}]", spec, NodeSpec, "NodeSpec", False)
            if spec.name in seen:
                raise ValueError(f"ResourcePool.nodes[{i}]: node name {spec.name!r} appears "
                                 f"twice; node names must be unique")
            seen.add(spec.name)
        self._specs: Tuple[NodeSpec, ...] = tuple(nodes)
        self._states = [_NodeState(spec, i) for i, spec in enumerate(self._specs)]
        self._by_name = {spec.name: i for i, spec in enumerate(self._specs)}
        self._total_cores = sum(s.cores for s in self._specs)
        self._free_cores = self._total_cores
        self._free_gpus = sum(s.gpus for s in self._specs)
        self._idle_nodes = len(self._specs)
        # Free cores per node, mirrored here so that a planning pass can skip full nodes
        # without looking at their books.
        self._node_free_cores = [s.cores for s in self._specs]
        # Indices of the nodes with at least one free core, in pool order: when the pool is
        # nearly full, planning looks at these few instead of every node.
        self._open_nodes = list(range(len(self._specs)))
        # The shares handed out and not yet given back, by identity: a release is legal
        # exactly when it returns these very objects.
        self._held: Dict[int, NodeShare] = {}

    @classmethod
    def uniform(cls, count: int, cores: int, memory: int = 0, gpus: int = 0,
                custom: Optional[Mapping[str, int]] = None,
                prefix: str = "node") -> "ResourcePool":
        """A pool of ``count`` identical nodes named ``{prefix}0``, ``{prefix}1``, ..."""
        _count("count", count, 1)
        counts = _counts("custom", custom)
        return cls([NodeSpec(f"{prefix}{i}", cores, memory, gpus, counts)
                    for i in range(count)])

    @property
    def nodes(self) -> Tuple[NodeSpec, ...]:
        return self._specs

    def usage(self) -> PoolUsage:
        return PoolUsage(
            total_nodes=len(self._specs), idle_nodes=self._idle_nodes,
            total_cores=self._total_cores, free_cores=self._free_cores,
            total_gpus=sum(s.gpus for s in self._specs),
            free_gpus=self._free_gpus)

    def free_totals(self) -> Tuple[int, int, int]:
        """Free cores, free GPUs and idle nodes now; a shape needing more cannot fit."""
        return self._free_cores, self._free_gpus, self._idle_nodes

    def node_usage(self, name: str) -> NodeUsage:
        index = self._by_name.get(name)
        if index is None:
            raise ValueError(f"node: {name!r} is not in this pool; nodes: "
                             f"{', '.join(self._by_name)}")
        st = self._states[index]
        return NodeUsage(node=name, free_cores=tuple(st.free_cores),
                         free_gpus=tuple(st.free_gpus), free_memory=st.free_memory,
                         free_custom=MappingProxyType(dict(st.free_custom)),
                         idle=st.holders == 0)

    def describe(self) -> str:
        """The pool's capacity in words, for messages."""
        if len(self._specs) <= 4:
            return (f"{_plural(len(self._specs), 'node')}: "
                    + ", ".join(s.describe() for s in self._specs))
        largest = max(self._specs, key=lambda s: (s.cores, s.gpus, s.memory))
        text = (f"{len(self._specs)} nodes, {self._total_cores} cores in total; the largest "
                f"is {largest.describe()}")
        names = sorted({k for s in self._specs for k in s.custom})
        if names:
            text += "; custom at most " + ", ".join(
                f"{k}={max(s.custom.get(k, 0) for s in self._specs)}" for k in names) \
                + " per node"
        return text

    def resolve(self, request: ResourceRequest) -> Shape:
        """The shape of ``request`` in this pool (``split-into`` needs the pool's totals)."""
        cpp = request.cores_per_process
        processes = request.processes.bounds(sum(s.cores // cpp for s in self._specs))
        nodes = (1, UNBOUNDED) if request.nodes is None \
            else request.nodes.bounds(len(self._specs))
        per_node = request.processes_per_node.bounds(max(s.cores // cpp for s in self._specs))
        _check_ranges(processes, nodes, per_node)
        return Shape(
            processes_min=processes[0], processes_max=processes[1],
            nodes_min=nodes[0], nodes_max=nodes[1],
            per_node_min=per_node[0], per_node_max=per_node[1],
            cores_per_process=cpp, gpus_per_process=request.gpus_per_process,
            memory_per_process=request.memory_per_process, exclusive=request.exclusive,
            custom=tuple(request.custom.items()))

    def could_ever_fit(self, shape: Shape) -> bool:
        """Whether ``shape`` fits this pool when nothing else runs."""
        return self._plan(shape, empty=True) is not None

    def allocate(self, shape: Shape) -> Optional[Tuple[NodeShare, ...]]:
        """Take resources for ``shape`` now, or return None (and change nothing) if it does
        not fit what is free."""
        if self._free_cores < shape.min_cores or self._free_gpus < shape.min_gpus \
                or self._idle_nodes < shape.min_idle_nodes:
            return None
        if shape.in_pool_order and not shape.exclusive:
            plan = self._plan_on_open_nodes(shape)
        else:
            plan = self._plan(shape, empty=False)
        if plan is None:
            return None
        if len(plan) == 1:
            return (self._take(shape, plan[0][0], plan[0][1]),)
        take = self._take
        return tuple([take(shape, index, processes) for index, processes in plan])

    def release(self, shares: Sequence[NodeShare]) -> None:
        """Give back what :meth:`allocate` returned. Raises ``ValueError`` and changes nothing
        unless every share is one that this pool handed out and has not taken back."""
        held = self._held
        if len(shares) == 1:
            share = shares[0]
            if held.pop(id(share), None) is not share:
                raise ValueError(f"release: {share!r} is not held from this pool (released "
                                 f"already, or never allocated by it)")
            self._give_back(share)
            return
        for share in shares:
            if held.get(id(share)) is not share:
                raise ValueError(f"release: {share!r} is not held from this pool (released "
                                 f"already, or never allocated by it)")
        if len({id(share) for share in shares}) != len(shares):
            raise ValueError("release: the same share is given back twice")
        for share in shares:
            del held[id(share)]
            self._give_back(share)

    # -- planning -------------------------------------------------------------------------

    def _capacity(self, st: _NodeState, shape: Shape, empty: bool) -> int:
        """How many processes of ``shape`` this node can take (0 if fewer than its minimum).

        An exclusive shape is only asked about idle nodes, so it counts the whole node."""
        if empty or shape.exclusive:
            spec = st.spec
            cores, gpus, memory, custom = spec.cores, spec.gpus, spec.memory, spec.custom
        else:
            cores, gpus = self._node_free_cores[st.index], len(st.free_gpus)
            memory, custom = st.free_memory, st.free_custom
        n = cores // shape.cores_per_process
        if shape.gpus_per_process:
            n = min(n, gpus // shape.gpus_per_process)
        if shape.memory_per_process:
            n = min(n, memory // shape.memory_per_process)
        for name, count in shape.custom:
            if custom.get(name, 0) < count:
                return 0
        if n > shape.per_node_max:
            n = shape.per_node_max
        return n if n >= shape.per_node_min else 0

    def _plan_on_open_nodes(self, shape: Shape) -> Optional[Plan]:
        """What :meth:`_plan` gives a shape placed in pool order on what is free now, in one
        pass over the nodes with a free core (the path of almost every decision)."""
        free = self._node_free_cores
        need = shape.min_node_cores
        most = shape.processes_max
        if most == 1 and shape.cores_only:
            # One process: the first node with its cores free.
            for index in self._open_nodes:
                if free[index] >= need:
                    return [(index, 1)]
            return None
        lowest = shape.per_node_min
        needed = shape.nodes_min
        limit = most // lowest
        if shape.nodes_max < limit:
            limit = shape.nodes_max
        highest = shape.per_node_max
        cpp = shape.cores_per_process
        states = self._states
        cores_only = shape.cores_only
        chosen: Plan = []
        total = 0
        for index in self._open_nodes:
            room = free[index]
            if room < need:
                continue
            if cores_only:
                capacity = room // cpp
                if capacity > highest:
                    capacity = highest
            else:
                capacity = self._capacity(states[index], shape, False)
                if not capacity:
                    continue
            chosen.append((index, capacity))
            total += capacity
            if len(chosen) == limit or (total >= most and len(chosen) >= needed):
                break
        if len(chosen) < needed or total < shape.processes_min:
            return None
        if len(chosen) == 1:
            index, capacity = chosen[0]
            return [(index, capacity if capacity < most else most)]
        extra = min(total, most) - len(chosen) * lowest
        plan: Plan = []
        for index, capacity in chosen:
            more = min(capacity - lowest, extra)
            extra -= more
            plan.append((index, lowest + more))
        return plan

    def _plan(self, shape: Shape, empty: bool) -> Optional[Plan]:
        # Pool order is as good as any when each node needs only one process, or exactly the
        # same number; otherwise the nodes with the most room come first, so that the fill
        # below finds a placement whenever one exists.
        if shape.per_node_min < shape.per_node_max \
                and (shape.nodes_max < UNBOUNDED or shape.per_node_min > 1):
            candidates = list(self._capacities(shape, empty))
            candidates.sort(key=lambda pair: -pair[1])
            return self._fill(shape, candidates)
        return self._fill(shape, self._capacities(shape, empty))

    def _capacities(self, shape: Shape, empty: bool) -> Iterator[Tuple[int, int]]:
        """(node index, capacity) of the nodes that can take part of ``shape``, in pool order."""
        states = self._states
        if empty or shape.exclusive:
            for st in states:
                if empty or st.holders == 0:
                    capacity = self._capacity(st, shape, empty)
                    if capacity:
                        yield st.index, capacity
            return
        need = shape.min_node_cores
        free = self._node_free_cores
        for index in self._open_nodes:
            if free[index] >= need:
                capacity = self._capacity(states[index], shape, False)
                if capacity:
                    yield index, capacity

    @staticmethod
    def _fill(shape: Shape, candidates: Iterable[Tuple[int, int]]) -> Optional[Plan]:
        """Processes per node over the first nodes of ``candidates`` (capacities each at least
        the per-node minimum): as few nodes as reach the most processes allowed, or as many as
        allowed when that cannot be reached; each gets its minimum, and what is left goes to
        the first ones."""
        lowest = shape.per_node_min
        most = shape.processes_max
        needed = shape.nodes_min
        limit = min(shape.nodes_max, most // lowest)
        chosen: Plan = []
        total = 0
        for candidate in candidates:
            if len(chosen) == limit:
                break
            chosen.append(candidate)
            total += candidate[1]
            if total >= most and len(chosen) >= needed:
                break
        if len(chosen) < needed or total < shape.processes_min:
            return None
        extra = min(total, most) - len(chosen) * lowest
        plan: Plan = []
        for index, capacity in chosen:
            more = min(capacity - lowest, extra)
            extra -= more
            plan.append((index, lowest + more))
        return plan

    # -- books ----------------------------------------------------------------------------

    def _take(self, shape: Shape, index: int, processes: int) -> NodeShare:
        st = self._states[index]
        custom: Mapping[str, int] = _NO_COUNTS
        if shape.exclusive:
            cores, gpus = st.free_cores, st.free_gpus
            st.free_cores, st.free_gpus = [], []
            memory = st.free_memory
            if st.free_custom:
                custom = MappingProxyType(dict(st.free_custom))
                st.free_custom = dict.fromkeys(st.free_custom, 0)
        else:
            n_cores = processes * shape.cores_per_process
            free_cores = st.free_cores
            cores = free_cores[:n_cores]
            del free_cores[:n_cores]
            gpus = _NO_IDS
            if shape.gpus_per_process:
                n_gpus = processes * shape.gpus_per_process
                gpus = st.free_gpus[:n_gpus]
                del st.free_gpus[:n_gpus]
            memory = processes * shape.memory_per_process
            if shape.custom:
                custom = MappingProxyType(dict(shape.custom))
                for name, count in shape.custom:
                    st.free_custom[name] -= count
        st.free_memory -= memory
        if st.holders == 0:
            self._idle_nodes -= 1
        st.holders += 1
        taken = len(cores)
        self._free_cores -= taken
        if gpus:
            self._free_gpus -= len(gpus)
        left = self._node_free_cores[index] - taken
        self._node_free_cores[index] = left
        if taken and left == 0:
            del self._open_nodes[bisect_left(self._open_nodes, index)]
        share = NodeShare(st.name, index, processes, tuple(cores), tuple(gpus), memory, custom)
        self._held[id(share)] = share
        return share

    def _give_back(self, share: NodeShare) -> None:
        index = share.index
        st = self._states[index]
        cores = share.cores
        free_cores = st.free_cores
        if len(cores) == 1:
            insort(free_cores, cores[0])
        else:
            free_cores.extend(cores)
            free_cores.sort()
        if share.gpus:
            st.free_gpus.extend(share.gpus)
            st.free_gpus.sort()
            self._free_gpus += len(share.gpus)
        st.free_memory += share.memory
        if share.custom:
            for name, count in share.custom.items():
                st.free_custom[name] += count
        st.holders -= 1
        if st.holders == 0:
            self._idle_nodes += 1
        given = len(cores)
        self._free_cores += given
        before = self._node_free_cores[index]
        if given and before == 0:
            insort(self._open_nodes, index)
        self._node_free_cores[index] = before + given
