"""The values of the pilot's resource arithmetic: nodes, what a task asks for, the shape a
request resolves to, and the shares and usage a pool reports.

Each value checks its fields when made (a bad one raises ``TypeError``/``ValueError`` naming
the field) and never changes afterwards. The rules that relate them, and the pool that places
shapes on nodes, are in :mod:`psij.executors.pilot.resources`, which also exports these names.

Pure: no I/O, no threads, no clock.
"""

from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from psij import _check
from psij._record import Record, derived
from psij.resource_spec import ResourceSpecV1

__all__ = [
    "UNBOUNDED", "Amount", "NodeShare", "NodeSpec", "NodeUsage", "PoolUsage", "ResourceRequest",
    "Shape",
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


class NodeSpec(Record):
    """One node of a pool: its host name and what it has."""

    name: str
    cores: int
    memory: int = 0
    gpus: int = 0
    custom: Mapping[str, int] = _NO_COUNTS

    def _validate(self) -> None:
        _check.req_str("NodeSpec.name", self.name)
        if self.name == "":
            raise ValueError("NodeSpec.name: a node needs a non-empty host name")
        self._set("cores", _count("NodeSpec.cores", self.cores, 1))
        self._set("memory", _count("NodeSpec.memory", self.memory, 0))
        self._set("gpus", _count("NodeSpec.gpus", self.gpus, 0))
        self._set("custom", _counts("NodeSpec.custom", self.custom))

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

    minimum: int
    maximum: Optional[int]
    split_into: Optional[int] = None

    def _validate(self) -> None:
        minimum, maximum = self.minimum, self.maximum
        _count("Amount.minimum", minimum, 1)
        _check.opt_int("Amount.maximum", maximum, minimum=1)
        _check.opt_int("Amount.split_into", self.split_into, minimum=1)
        if maximum is not None and maximum < minimum:
            raise ValueError(f"Amount: maximum ({maximum}) is less than minimum "
                             f"({minimum})")

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

    processes: Amount = _ONE
    nodes: Optional[Amount] = None
    processes_per_node: Amount = _ANY
    cores_per_process: int = 1
    gpus_per_process: int = 0
    memory_per_process: int = 0
    exclusive: bool = False
    custom: Mapping[str, int] = _NO_COUNTS
    # Requests key the scheduler's table of shapes: hashed once, not on every lookup.
    _hash: int = derived(init=False)

    def _validate(self) -> None:
        processes, nodes, processes_per_node = self.processes, self.nodes, self.processes_per_node
        cores_per_process, gpus_per_process = self.cores_per_process, self.gpus_per_process
        memory_per_process, exclusive = self.memory_per_process, self.exclusive
        _check.instance("ResourceRequest.processes", processes, Amount, "Amount", False)
        _check.instance("ResourceRequest.nodes", nodes, Amount, "Amount")
        _check.instance("ResourceRequest.processes_per_node", processes_per_node, Amount,
                        "Amount", False)
        _count("ResourceRequest.cores_per_process", cores_per_process, 1)
        _count("ResourceRequest.gpus_per_process", gpus_per_process, 0)
        _count("ResourceRequest.memory_per_process", memory_per_process, 0)
        _check.opt_bool("ResourceRequest.exclusive", exclusive)
        counts = _counts("ResourceRequest.custom", self.custom)
        if processes.split_into is None and processes_per_node.split_into is None \
                and (nodes is None or nodes.split_into is None):
            # Without split-into the ranges do not depend on the pool: check them now.
            _check_ranges(processes.bounds(0),
                          (1, UNBOUNDED) if nodes is None else nodes.bounds(0),
                          processes_per_node.bounds(0))
        self._set("custom", counts)
        self._set("_hash", hash((processes, nodes, processes_per_node, cores_per_process,
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
    # Lower bounds of what any placement holds, for tests that cost one comparison (derived,
    # so neither compared nor shown).
    min_cores: int = derived(init=False)
    min_gpus: int = derived(init=False)
    min_node_cores: int = derived(init=False)
    min_idle_nodes: int = derived(init=False)
    # Asks for cores alone: no GPU, memory or custom count.
    cores_only: bool = derived(init=False)
    # Placed on the first nodes with room (see ResourcePool._plan).
    in_pool_order: bool = derived(init=False)
    # Shapes key the scheduler's buckets: hashed once, not on every lookup.
    _hash: int = derived(init=False)

    def _validate(self) -> None:
        custom = self.custom
        if type(custom) is not tuple:
            custom = tuple(custom)
            self._set("custom", custom)
        cores, gpus, memory = self.cores_per_process, self.gpus_per_process, \
            self.memory_per_process
        per_node_min, per_node_max = self.per_node_min, self.per_node_max
        set_ = self._set
        set_("min_cores", self.processes_min * cores)
        set_("min_gpus", self.processes_min * gpus)
        set_("min_node_cores", per_node_min * cores)
        set_("min_idle_nodes", self.nodes_min if self.exclusive else 0)
        set_("cores_only", not gpus and not memory and not custom)
        set_("in_pool_order", not (per_node_min < per_node_max
                                   and (self.nodes_max < UNBOUNDED or per_node_min > 1)))
        set_("_hash", hash(self._values(self)))

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

    node: str
    index: int
    processes: int
    cores: Tuple[int, ...]
    gpus: Tuple[int, ...] = ()
    memory: int = 0
    custom: Mapping[str, int] = _NO_COUNTS

    def __hash__(self) -> int:
        return hash((self.node, self.index, self.processes, self.cores, self.gpus, self.memory,
                     tuple(self.custom.items())))


class NodeUsage(Record):
    """What is free on one node at one moment."""

    node: str
    free_cores: Tuple[int, ...]
    free_gpus: Tuple[int, ...]
    free_memory: int
    free_custom: Mapping[str, int]
    idle: bool

    def __hash__(self) -> int:
        return hash((self.node, self.free_cores, self.free_gpus, self.free_memory,
                     tuple(self.free_custom.items()), self.idle))


class PoolUsage(Record):
    """Totals of a pool at one moment (QCG's ``resourcesInfo``)."""

    total_nodes: int
    idle_nodes: int
    total_cores: int
    free_cores: int
    total_gpus: int
    free_gpus: int

    @property
    def used_cores(self) -> int:
        return self.total_cores - self.free_cores
