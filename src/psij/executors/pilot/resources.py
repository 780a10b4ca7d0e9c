"""Resource arithmetic of the pilot: the nodes of an allocation, what a task asks for, and the
concrete cores, GPUs, memory and custom counts of the nodes it is given.

This module is pure: no I/O, no threads, no clock. It does not decide *which task* runs next
(that is :mod:`psij.executors.pilot.scheduler`); it only answers "can this shape be placed now,
and where" and keeps the books of what is free.

Rules:

- A pool is an ordered list of nodes; a node may join later (:meth:`ResourcePool.add_node`,
  an elastic pilot's allocations), at the end of the list. A node has ``cores`` (ids
  ``0..cores-1``), ``gpus`` (ids ``0..gpus-1``), ``memory`` in bytes and custom countable
  resources (name to count).
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
- A node can be *lost* (its agent died): from then on nothing is placed on it, shapes are
  planned as if it were not there (``could_ever_fit`` included), and what tasks held on it is
  never given back to be used again. A lost node stays lost.
- A bad request raises ``TypeError``/``ValueError`` naming the field; releasing what is not held
  raises ``ValueError`` and leaves the pool unchanged.
"""

from bisect import bisect_left, insort
from types import MappingProxyType
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from psij import _check
from psij.executors.pilot.resource_values import (
    _NO_COUNTS,
    _NO_IDS,
    UNBOUNDED,
    Amount,
    NodeShare,
    NodeSpec,
    NodeUsage,
    PoolUsage,
    ResourceRequest,
    Shape,
    _check_ranges,
    _count,
    _counts,
    _plural,
)

__all__ = [
    "UNBOUNDED", "Amount", "NodeShare", "NodeSpec", "NodeUsage", "PoolUsage", "ResourcePool",
    "ResourceRequest", "Shape",
]


class _NodeState:
    """The free/used books of one node."""

    __slots__ = ("free_cores", "free_custom", "free_gpus", "free_memory", "holders", "index",
                 "lost", "name", "spec")

    def __init__(self, spec: NodeSpec, index: int) -> None:
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.free_cores: List[int] = list(range(spec.cores))
        self.free_gpus: List[int] = list(range(spec.gpus))
        self.free_memory = spec.memory
        self.free_custom: Dict[str, int] = dict(spec.custom)
        self.holders = 0
        self.lost: Optional[str] = None  # why, once the node is lost


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
        self._lost: Dict[str, str] = {}  # lost nodes, with why

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

    @property
    def lost_nodes(self) -> Mapping[str, str]:
        """The nodes lost so far, each with why."""
        return MappingProxyType(dict(self._lost))

    def add_node(self, spec: NodeSpec) -> None:
        """Add node ``spec`` (idle) at the end of the pool; its name must be new, even a lost
        node's. Shapes resolved before keep the bounds they had."""
        _check.instance("node", spec, NodeSpec, "NodeSpec", False)
        if spec.name in self._by_name:
            raise ValueError(f"node: {spec.name!r} is in this pool already; node names must "
                             "be unique")
        index = len(self._specs)
        self._specs = (*self._specs, spec)
        self._states.append(_NodeState(spec, index))
        self._by_name[spec.name] = index
        self._total_cores += spec.cores
        self._free_cores += spec.cores
        self._free_gpus += spec.gpus
        self._idle_nodes += 1
        self._node_free_cores.append(spec.cores)
        if spec.cores:
            self._open_nodes.append(index)  # the largest index: the list stays in order

    def lose_node(self, name: str, why: str) -> None:
        """Place nothing on node ``name`` from now on (see the module rules); what its tasks
        hold stays held until released, and is then dropped. Losing it again does nothing."""
        index = self._by_name.get(name)
        if index is None:
            raise ValueError(f"node: {name!r} is not in this pool; nodes: "
                             f"{', '.join(self._by_name)}")
        st = self._states[index]
        if st.lost is not None:
            return
        st.lost = why
        self._lost[name] = why
        self._free_cores -= self._node_free_cores[index]
        self._free_gpus -= len(st.free_gpus)
        if self._node_free_cores[index]:
            del self._open_nodes[bisect_left(self._open_nodes, index)]
        self._node_free_cores[index] = 0
        if st.holders == 0:
            self._idle_nodes -= 1
        st.free_cores, st.free_gpus, st.free_memory = [], [], 0
        st.free_custom = dict.fromkeys(st.free_custom, 0)

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
                         idle=st.holders == 0 and st.lost is None)

    def describe(self) -> str:
        """The pool's capacity in words, for messages."""
        if len(self._specs) <= 4:
            return (f"{_plural(len(self._specs), 'node')}: "
                    + ", ".join(s.describe() for s in self._specs) + self._describe_lost())
        largest = max(self._specs, key=lambda s: (s.cores, s.gpus, s.memory))
        text = (f"{len(self._specs)} nodes, {self._total_cores} cores in total; the largest "
                f"is {largest.describe()}")
        names = sorted({k for s in self._specs for k in s.custom})
        if names:
            text += "; custom at most " + ", ".join(
                f"{k}={max(s.custom.get(k, 0) for s in self._specs)}" for k in names) \
                + " per node"
        return text + self._describe_lost()

    def _describe_lost(self) -> str:
        return "".join(f"; node {name} is lost: {why}" for name, why in self._lost.items())

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
        if st.lost is not None:
            return 0
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
        if st.lost is not None:
            st.holders -= 1  # what it held is gone with the node
            return
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
