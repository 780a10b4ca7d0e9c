"""Which nodes and cores a pilot owns: this machine, the allocation a batch scheduler gave the
job it runs in (Slurm, PBS, Grid Engine, LSF), or nodes given explicitly.

The ``parse_*`` functions are pure: they turn the text of one scheduler variable or host file
into names and counts, and raise ``ValueError`` naming the variable and the text they could not
read. :func:`discover_allocation` is the only function that reads the environment (and the host
file a variable names); it never starts a process or contacts a scheduler.

An :class:`Allocation` also says which node this process runs on (tasks there are spawned
directly) and, when known, that node's GPUs by id and vendor (``local_gpus``: what
:func:`allocation_from_options` found there, which is the one function here that looks for
GPUs, through :mod:`psij.executors._gpu_detect`; other nodes get the count the scheduler's
variables give) and how to start a process on the others (the argument prefix that runs the pilot's
agent on node ``{node}``: ``srun`` inside Slurm, ``mpirun`` inside PBS, Grid Engine and LSF).
An empty prefix runs the agent on this machine, which is what "virtual" nodes for tests use.
"""

import os
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from psij import _check
from psij._record import Record, replace
from psij.executors._gpu_detect import GpuSet
from psij.executors.pilot.resources import NodeSpec

__all__ = [
    "Allocation", "allocation_from_options", "configured_allocation", "discover_allocation",
    "local_allocation", "nodes_from_spec", "parse_host_slots_file", "parse_lsb_mcpu_hosts",
    "parse_pe_hostfile", "parse_slurm_counts", "parse_slurm_nodelist", "with_local_gpus",
]

SRUN_AGENT_LAUNCHER = ("srun", "--nodes=1", "--ntasks=1", "--nodelist={node}", "--overlap",
                       "--cpu-bind=none", "--kill-on-bad-exit=1")
"""Starts one process on one node of the Slurm allocation, without taking its cores."""

MPIRUN_AGENT_LAUNCHER = ("mpirun", "-n", "1", "--host", "{node}")
"""Starts one process on one node through the MPI runtime (PBS, Grid Engine, LSF)."""

SSH_AGENT_LAUNCHER = ("ssh", "-o", "BatchMode=yes", "{node}")
"""Starts one process on one node with ssh, where no MPI runtime is installed."""

_KINDS = ("local", "slurm", "pbs", "sge", "lsf", "config")


class Allocation(Record):
    """The nodes a pilot schedules tasks on, the one it runs on, and how it reaches the others.

    ``agent_launcher`` is an argument prefix in which ``{node}`` stands for a node name; the
    agent's own command is appended to it. An empty prefix runs the agent on this machine.
    ``local_gpus``, when given, names the GPUs of the local node (as many as its ``gpus``).
    """

    nodes: Tuple[NodeSpec, ...]
    local_node: Optional[str]
    kind: str = "config"
    agent_launcher: Tuple[str, ...] = ()
    local_gpus: Optional[GpuSet] = None

    def _validate(self) -> None:
        nodes, local_node, kind = self.nodes, self.local_node, self.kind
        agent_launcher, local_gpus = self.agent_launcher, self.local_gpus
        checked = tuple(nodes) if isinstance(nodes, (list, tuple)) else nodes
        if not isinstance(checked, tuple) or not checked:
            raise _check.fail_type("Allocation.nodes", nodes, "a non-empty list of NodeSpec")
        for i, node in enumerate(checked):
            _check.instance(f"Allocation.nodes[{i}]", node, NodeSpec, "NodeSpec", False)
        names = [n.name for n in checked]
        if len(set(names)) != len(names):
            raise ValueError(f"Allocation.nodes: node names must be unique, got {names}")
        _check.opt_str("Allocation.local_node", local_node)
        if local_node is not None and local_node not in names:
            raise ValueError(f"Allocation.local_node: {local_node!r} is not one of the "
                             f"nodes {names}")
        if kind not in _KINDS:
            raise ValueError(f"Allocation.kind: {kind!r} is not one of {', '.join(_KINDS)}")
        launcher = _check.opt_str_list("Allocation.agent_launcher", list(agent_launcher))
        if local_gpus is not None:
            _check.instance("Allocation.local_gpus", local_gpus, GpuSet, "GpuSet", False)
            local = next((n for n in checked if n.name == local_node), None)
            if local is None or local.gpus != len(local_gpus.ids):
                raise ValueError(f"Allocation.local_gpus: {len(local_gpus.ids)} GPU ids for "
                                 f"the local node {local_node!r}, which has "
                                 f"{0 if local is None else local.gpus} GPUs")
        self._set("nodes", checked)
        self._set("agent_launcher", tuple(launcher or ()))

    @property
    def remote_nodes(self) -> Tuple[str, ...]:
        """The nodes reached through an agent."""
        return tuple(n.name for n in self.nodes if n.name != self.local_node)

    def describe(self) -> str:
        cores = sum(n.cores for n in self.nodes)
        return (f"{self.kind} allocation: {len(self.nodes)} node(s), {cores} core(s) "
                f"({', '.join(f'{n.name}:{n.cores}' for n in self.nodes)})")

    def describe_gpus(self) -> str:
        """The local node's GPUs in words, with where they were found."""
        if self.local_node is None:
            return "none here: every node is reached through an agent"
        if self.local_gpus is None:
            gpus = next(n.gpus for n in self.nodes if n.name == self.local_node)
            return f"{gpus} (indices 0 to {gpus - 1})" if gpus else "none"
        return self.local_gpus.describe()

    def gpu_ids(self, node: str, indices: Sequence[int]) -> Optional[GpuSet]:
        """The GPUs of ``node`` that the pool's ``indices`` (``0`` to ``gpus - 1``) stand for,
        with their vendor; None when the node's GPUs are known only by count (they are then
        ``CUDA_VISIBLE_DEVICES`` indices)."""
        gpus = self.local_gpus
        if gpus is None or node != self.local_node:
            return None
        return GpuSet(tuple(gpus.ids[i] for i in indices), gpus.vendor, gpus.source)


# -- pure parsers ------------------------------------------------------------------------------


def _split_top_level(text: str, what: str) -> List[str]:
    """Split at commas that are not inside brackets."""
    items: List[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"{what}: nested brackets are not a host list: {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{what}: unbalanced ']' in {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"{what}: unbalanced '[' in {text!r}")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


# Patterns as text: compiled (and cached by ``re``) when first used, not at import.
_RANGE = r"^(\d+)(?:-(\d+))?$"


def _expand_ranges(inside: str, text: str, what: str) -> List[str]:
    values: List[str] = []
    for part in inside.split(","):
        m = re.match(_RANGE, part.strip())
        if m is None:
            raise ValueError(f"{what}: {part!r} in {text!r} is not a number or a range a-b")
        low, high = m.group(1), m.group(2)
        if high is None:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"{what}: the range {part!r} in {text!r} goes backwards")
        width = len(low) if low.startswith("0") else 0
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def _expand_host(item: str, text: str, what: str) -> List[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, inside, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    tails = _expand_host(rest, text, what)
    return [prefix + value + tail for value in _expand_ranges(inside, text, what)
            for tail in tails]


def parse_slurm_nodelist(text: str, what: str = "SLURM_JOB_NODELIST") -> List[str]:
    """Expand a Slurm host list: ``node[01-03,07],gpu1`` is node01, node02, node03, node07 and
    gpu1 (zero padding kept; several bracket groups in one name expand as a product)."""
    hosts: List[str] = []
    for item in _split_top_level(text, what):
        hosts.extend(_expand_host(item, text, what))
    if not hosts:
        raise ValueError(f"{what}: no host in {text!r}")
    return hosts


_COUNT = r"^(\d+)(?:\(x(\d+)\))?$"


def parse_slurm_counts(text: str, what: str = "SLURM_JOB_CPUS_PER_NODE") -> List[int]:
    """Expand a Slurm per-node count list: ``4(x2),2`` is 4, 4, 2."""
    counts: List[int] = []
    for part in text.split(","):
        m = re.match(_COUNT, part.strip())
        if m is None:
            raise ValueError(f"{what}: {part!r} in {text!r} is not N or N(xM)")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def parse_host_slots_file(text: str, what: str) -> List[Tuple[str, int]]:
    """A file with one host name per slot (PBS_NODEFILE, LSB_DJOB_HOSTFILE): the hosts in order
    of first appearance, each with the number of lines naming it."""
    counts: Dict[str, int] = {}
    for line in text.splitlines():
        host = line.strip()
        if host:
            counts[host] = counts.get(host, 0) + 1
    if not counts:
        raise ValueError(f"{what}: the host file names no host")
    return list(counts.items())


def parse_pe_hostfile(text: str, what: str = "PE_HOSTFILE") -> List[Tuple[str, int]]:
    """Grid Engine's PE_HOSTFILE: ``host slots queue processor-range`` per line; a host listed
    for several queues gets the sum of its slots."""
    counts: Dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2 or not fields[1].isdigit():
            raise ValueError(f"{what}: line {number} is not 'host slots queue range': {line!r}")
        counts[fields[0]] = counts.get(fields[0], 0) + int(fields[1])
    if not counts:
        raise ValueError(f"{what}: the host file names no host")
    return list(counts.items())


def parse_lsb_mcpu_hosts(text: str, what: str = "LSB_MCPU_HOSTS") -> List[Tuple[str, int]]:
    """LSF's LSB_MCPU_HOSTS: ``hostA 4 hostB 2`` (host, slots pairs)."""
    fields = text.split()
    if not fields or len(fields) % 2:
        raise ValueError(f"{what}: expected 'host count' pairs, got {text!r}")
    pairs: List[Tuple[str, int]] = []
    for host, count in zip(fields[::2], fields[1::2]):
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"{what}: {count!r} after {host!r} is not a slot count in {text!r}")
        pairs.append((host, int(count)))
    return pairs


_NODE_ITEM = r"^(.+?)(?::(\d+))?$"


def nodes_from_spec(text: str) -> List[NodeSpec]:
    """Nodes given on a command line: ``vnode1:1,vnode2:1`` or ``n[1-3]:4`` (name:cores, the
    name a Slurm host list; cores default to 1)."""
    _check.req_str("nodes", text)
    nodes: List[NodeSpec] = []
    for item in _split_top_level(text, "nodes"):
        m = re.match(_NODE_ITEM, item)
        assert m is not None
        if ":" in item and m.group(2) is None:
            raise ValueError(f"nodes: {item!r} is not NAME or NAME:CORES")
        cores = int(m.group(2) or 1)
        if cores < 1:
            raise ValueError(f"nodes: {item!r} gives a node no core")
        nodes.extend(NodeSpec(name, cores) for name in parse_slurm_nodelist(m.group(1), "nodes"))
    if not nodes:
        raise ValueError(f"nodes: no node in {text!r}")
    return nodes


# -- allocations -------------------------------------------------------------------------------


def host_name() -> str:
    """This machine's host name (what ``socket.gethostname`` gives, without loading the
    socket module on the pilot's start-up path)."""
    return os.uname().nodename


def _local_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _local_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_allocation(cores: Optional[int] = None) -> Allocation:
    """This machine alone: the cores this process may run on (or ``cores``) and its memory."""
    count = _check.opt_int("cores", cores, minimum=1)
    name = host_name() or "localhost"
    node = NodeSpec(name, count if count is not None else _local_cores(), _local_memory())
    return Allocation((node,), name, "local")


def configured_allocation(nodes: Sequence[Union[NodeSpec, Tuple[str, int]]],
                          local_node: Optional[str] = None,
                          agent_launcher: Sequence[str] = ()) -> Allocation:
    """Nodes given explicitly, as NodeSpec or (name, cores). Without ``local_node`` every node
    is reached through an agent started with ``agent_launcher`` (empty: on this machine)."""
    if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence) or not nodes:
        raise _check.fail_type("nodes", nodes, "a non-empty list of NodeSpec or (name, cores)")
    specs: List[NodeSpec] = []
    for i, node in enumerate(nodes):
        if isinstance(node, NodeSpec):
            specs.append(node)
        elif isinstance(node, (tuple, list)) and len(node) == 2:
            specs.append(NodeSpec(node[0], node[1]))
        else:
            raise _check.fail_type(f"nodes[{i}]", node, "NodeSpec or a (name, cores) pair")
    return Allocation(tuple(specs), local_node, "config", tuple(agent_launcher))


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def _pick_local(names: Iterable[str], environ: Mapping[str, str], *hints: str) -> Optional[str]:
    """The node this process runs on: named by a scheduler variable, else by host name."""
    names = list(names)
    for hint in hints:
        value = environ.get(hint)
        if value and value in names:
            return value
        if value and _short(value) in names:
            return _short(value)
    host = host_name()
    for candidate in (host, _short(host)):
        if candidate in names:
            return candidate
    shorts = {_short(n): n for n in names}
    return shorts.get(_short(host))


def _read_file(variable: str, path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as ex:
        raise ValueError(f"{variable}: cannot read the host file {path!r}: {ex.strerror}") \
            from ex


def _mpirun_or_ssh() -> Tuple[str, ...]:
    import shutil

    return MPIRUN_AGENT_LAUNCHER if shutil.which("mpirun") else SSH_AGENT_LAUNCHER


def _slurm(environ: Mapping[str, str]) -> Allocation:
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ["SLURM_NODELIST"]
    hosts = parse_slurm_nodelist(nodelist)
    cpus_text = environ.get("SLURM_JOB_CPUS_PER_NODE")
    if cpus_text:
        cpus = parse_slurm_counts(cpus_text)
        if len(cpus) != len(hosts):
            raise ValueError(f"SLURM_JOB_CPUS_PER_NODE: {cpus_text!r} gives {len(cpus)} "
                             f"counts for the {len(hosts)} nodes of {nodelist!r}")
    else:
        cpus = [int(environ.get("SLURM_CPUS_ON_NODE", "1") or 1)] * len(hosts)
    memory = [0] * len(hosts)
    per_node = environ.get("SLURM_MEM_PER_NODE", "")
    per_cpu = environ.get("SLURM_MEM_PER_CPU", "")
    if per_node.isdigit():
        memory = [int(per_node) << 20] * len(hosts)
    elif per_cpu.isdigit():
        memory = [int(per_cpu) * c << 20 for c in cpus]
    gpus_text = environ.get("SLURM_GPUS_ON_NODE", "")
    gpus = int(gpus_text) if gpus_text.isdigit() else 0
    nodes = tuple(NodeSpec(h, c, m, gpus) for h, c, m in zip(hosts, cpus, memory))
    return Allocation(nodes, _pick_local(hosts, environ, "SLURMD_NODENAME"), "slurm",
                      SRUN_AGENT_LAUNCHER)


def _from_pairs(pairs: List[Tuple[str, int]], environ: Mapping[str, str], kind: str
                ) -> Allocation:
    nodes = tuple(NodeSpec(h, c) for h, c in pairs)
    return Allocation(nodes, _pick_local([h for h, _ in pairs], environ, "HOSTNAME"), kind,
                      _mpirun_or_ssh())


def discover_allocation(environ: Optional[Mapping[str, str]] = None,
                        cores: Optional[int] = None) -> Allocation:
    """The allocation this process runs in, from the batch scheduler's variables (Slurm, then
    PBS, Grid Engine, LSF), or this machine alone (``cores`` overrides its core count)."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"):
        return _slurm(env)
    if env.get("PBS_NODEFILE"):
        path = env["PBS_NODEFILE"]
        return _from_pairs(parse_host_slots_file(_read_file("PBS_NODEFILE", path),
                                                 "PBS_NODEFILE"), env, "pbs")
    if env.get("PE_HOSTFILE"):
        path = env["PE_HOSTFILE"]
        return _from_pairs(parse_pe_hostfile(_read_file("PE_HOSTFILE", path)), env, "sge")
    if env.get("LSB_DJOB_HOSTFILE") and os.path.exists(env["LSB_DJOB_HOSTFILE"]):
        path = env["LSB_DJOB_HOSTFILE"]
        return _from_pairs(parse_host_slots_file(_read_file("LSB_DJOB_HOSTFILE", path),
                                                 "LSB_DJOB_HOSTFILE"), env, "lsf")
    if env.get("LSB_MCPU_HOSTS"):
        return _from_pairs(parse_lsb_mcpu_hosts(env["LSB_MCPU_HOSTS"]), env, "lsf")
    return local_allocation(cores)


def with_local_gpus(allocation: Allocation, gpus: GpuSet, given: bool = False) -> Allocation:
    """``allocation`` with ``gpus`` as its local node's GPUs (unchanged without a local node).

    Found GPUs (``given`` False) replace what the scheduler's variables said of that node only
    when some were found; a node the allocation gives GPUs to keeps their count (as ids ``0``
    to ``count - 1``). ``given`` GPUs (an override) always replace them, and need a local
    node (``ValueError`` naming their source otherwise)."""
    local = allocation.local_node
    if local is None:
        if given:
            raise ValueError(f"{gpus.source}: no node of this pilot is the one it runs on "
                             f"(the others get their GPUs from the batch allocation)")
        return allocation
    index = next(i for i, n in enumerate(allocation.nodes) if n.name == local)
    spec = allocation.nodes[index]
    if not gpus.ids and not given and spec.gpus:
        gpus = GpuSet(tuple(str(i) for i in range(spec.gpus)), gpus.vendor,
                      f"the {allocation.kind} allocation")
    nodes = list(allocation.nodes)
    nodes[index] = replace(spec, gpus=len(gpus.ids))
    return Allocation(tuple(nodes), local, allocation.kind, allocation.agent_launcher, gpus)


def allocation_from_options(cores: Optional[int] = None, nodes: Optional[str] = None,
                            environ: Optional[Mapping[str, str]] = None,
                            gpus: Optional[str] = None) -> Allocation:
    """The allocation the ``--cores``/``--nodes`` options of the pilot commands describe.

    With ``nodes`` (a :func:`nodes_from_spec` text) those nodes: the one this process runs on,
    if named, is used directly, the others through agents started with the launcher of the
    batch allocation this runs in (on this machine outside one). Without, the batch
    allocation this runs in, else this machine with ``cores`` cores (default: all it may
    use). The node this process runs on gets the GPUs found there (:func:`with_local_gpus`),
    or those ``gpus`` names (``--gpus``: a count or a list of ids). ``environ`` stands for
    this process's environment. Raises ``ValueError``/``TypeError`` naming the option.
    """
    from psij.executors._gpu_detect import detect_gpus, found_gpus, gpus_from_setting

    found = discover_allocation(environ, cores=cores)
    machine = found_gpus() if environ is None else detect_gpus(environ)
    given = None if gpus is None else gpus_from_setting("--gpus", gpus, machine)
    if nodes is not None:
        specs = nodes_from_spec(nodes)
        names = {node.name for node in specs}
        local = found.local_node if found.local_node in names else None
        found = configured_allocation(specs, local,
                                      found.agent_launcher if found.kind != "local" else ())
    return with_local_gpus(found, given or machine, given is not None)
