"""The figures of a Slurm job's run from ``sacct``'s fields (see
:mod:`~psij.executors.batch._figures` for the keys).

- ``cpu_seconds``: TotalCPU of the job's allocation line (user + system of all its steps);
- ``max_rss_bytes``: the largest MaxRSS of its steps (the allocation line has none; each
  step's is the peak of its largest task, so this is the largest process tree's peak, not the
  sum over nodes); absent when Slurm gathered none (0 or empty);
- ``cores``: AllocCPUS; ``nodes``: NodeList, ``n[1-3]`` expanded to ``n1,n2,n3`` (up to
  :data:`NODES_EXPANDED` names; a longer list is kept as Slurm writes it);
- ``requested_memory_bytes``: ReqMem for the whole job: Slurm since 21.08 writes the job's
  total; older ones end it with ``n`` (per node: times NNodes) or ``c`` (per CPU: times
  AllocCPUS);
- ``requested_seconds``: Timelimit (absent when ``UNLIMITED`` or ``Partition_Limit``);
- ``queued_at``, ``started_at``, ``ended_at``: Submit, Start, End, local times as sacct
  writes them (``Unknown`` when the job never started); whole seconds.
"""

import re
from typing import Any, Dict, List, Mapping, Optional

from psij.executors.batch._figures import (
    clean_figures,
    clock_seconds,
    local_time,
    memory_bytes,
    number,
)

__all__ = ["FIELDS", "NODES_EXPANDED", "expand_nodes", "sacct_figures", "step_rss"]

# The sacct fields read here, in the order they are asked for (between ExitCode and Reason).
FIELDS = ("TotalCPU", "MaxRSS", "AllocCPUS", "NNodes", "ReqMem", "NodeList", "Submit",
          "Start", "End", "Timelimit")
NODES_EXPANDED = 1024
_TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S")
_REQ_MEM = re.compile(r"(.*?\d[KMGTP]?)([nc]?)", re.IGNORECASE)
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand_nodes(text: str) -> Optional[str]:
    """A Slurm node list with its ranges spelled out (``n[1-2],m[03-04]`` gives
    ``n1,n2,m03,m04``); the text as given when it has more than :data:`NODES_EXPANDED` names
    or a form this does not read; None for no node (``None assigned``, empty)."""
    text = text.strip()
    if not text or text in ("None assigned", "None", "(null)", "Unknown"):
        return None
    names: List[str] = []
    entries = [e for e in re.findall(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", text) if e]
    if ",".join(entries) != text:
        return text
    for entry in entries:
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]*)\]([^\[\]]*)", entry)
        if match is None:
            if "[" in entry or "]" in entry:
                return text
            names.append(entry)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            found = _RANGE.fullmatch(part)
            if found is None:
                return text
            first, last = found.group(1), found.group(2) or found.group(1)
            if int(last) < int(first) or int(last) - int(first) + len(names) >= NODES_EXPANDED:
                return text
            width = len(first) if first.startswith("0") else 0
            names.extend(f"{prefix}{index:0{width}d}{suffix}"
                         for index in range(int(first), int(last) + 1))
    return ",".join(names) if names else None


def step_rss(text: str) -> Optional[int]:
    """A step's MaxRSS in bytes (None when not gathered: empty or 0)."""
    value = memory_bytes(text, "K")
    return value if value else None


def _requested_memory(text: str, nodes: Optional[float], cpus: Optional[float]) -> Optional[int]:
    match = _REQ_MEM.fullmatch(text.strip())
    if match is None:
        return None
    amount = memory_bytes(match.group(1), "M")
    per = match.group(2).lower()
    if amount is None or not per:
        return amount
    count = nodes if per == "n" else cpus
    return None if not count else int(amount * count)


def sacct_figures(fields: Mapping[str, str], max_rss: Optional[int]) -> Dict[str, Any]:
    """The figures of one job from its allocation line's fields (by name, as in
    :data:`FIELDS`) and the largest MaxRSS of its steps."""
    nodes = number(fields.get("NNodes", ""))
    cpus = number(fields.get("AllocCPUS", ""))
    figures: Dict[str, Any] = {
        "cpu_seconds": clock_seconds(fields.get("TotalCPU")),
        "max_rss_bytes": max_rss,
        "cores": cpus,
        "nodes": expand_nodes(fields.get("NodeList", "")),
        "requested_memory_bytes": _requested_memory(fields.get("ReqMem", ""), nodes, cpus),
        "requested_seconds": clock_seconds(fields.get("Timelimit")),
        "queued_at": local_time(fields.get("Submit"), _TIME_FORMATS),
        "started_at": local_time(fields.get("Start"), _TIME_FORMATS),
        "ended_at": local_time(fields.get("End"), _TIME_FORMATS),
    }
    if not fields.get("Timelimit", "").strip():
        # Slurm's record of a job that started and ended within a moment may lack what its
        # start adds (Timelimit, ReqMem) for a second: not whole yet (see _figures_wait).
        figures["ended_at"] = None
    return clean_figures({key: value for key, value in figures.items() if value is not None})
