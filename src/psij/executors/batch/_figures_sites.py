"""The figures of a run on PBS, LSF and Flux, read from their status commands, which show ended
jobs (see :mod:`~psij.executors.batch._figures` for the keys).

- PBS Pro and Torque (``qstat -f [-F json] -x``): ``resources_used.cput`` (CPU seconds),
  ``resources_used.mem`` and ``.vmem`` (the job's peak memory as its MoM samples it, all its
  processes on the first host together), ``exec_host`` (``host/0*2+host2/0*2``: the nodes,
  and the cores when ``Resource_List.ncpus`` is absent), ``Resource_List.walltime`` and
  ``.mem``, ``qtime``, ``stime`` (Torque ``start_time``), ``obittime`` (else ``mtime``;
  Torque ``comp_time``);
- LSF (``bjobs -o ... -json``): ``cpu_used``, ``max_mem`` (the job's peak memory as LSF
  samples it), ``nalloc_slot``, ``exec_host`` (``4*hostA:2*hostB``), ``runtimelimit``,
  ``submit_time``, ``start_time``, ``finish_time``; bjobs writes times to the minute, without
  the year unless ``LSB_DISPLAY_YEAR=Y`` (then the latest such time not in the future);
  LSF's memory limits are per process: no requested memory;
- Flux (``flux jobs -o``): ``t_submit``, ``t_run``, ``t_cleanup`` (else ``t_inactive``),
  ``ncores``, ``nodelist``, ``duration`` (0: none); Flux keeps no CPU time or memory use.
"""

import re
import time
from typing import Any, Dict, Mapping, Optional

from psij._clock import wall_time
from psij.executors.batch._figures import (
    clean_figures,
    clock_seconds,
    epoch_seconds,
    local_time,
    memory_bytes,
    number,
)
from psij.executors.batch._figures_slurm import expand_nodes
from psij.job_status import JobStatus

__all__ = ["LSF_FIELDS", "flux_figures", "lsf_figures", "pbs_figures", "with_figures"]

_CTIME = ("%a %b %d %H:%M:%S %Y",)
# The bjobs fields read here (beyond jobid, jobindex, stat, exit_code, exit_reason).
LSF_FIELDS = ("submit_time", "start_time", "finish_time", "cpu_used", "max_mem",
              "nalloc_slot", "exec_host", "runtimelimit")
_LSF_TIME = ("%b %d %H:%M %Y", "%b %d %H:%M:%S %Y", "%Y/%m/%d-%H:%M:%S")
_LSF_YEARLESS = ("%b %d %H:%M", "%b %d %H:%M:%S")
_HOST_COUNT = re.compile(r"(?:(\d+)\*)?([^*/:+\s]+)")


def with_figures(status: JobStatus, figures: Mapping[str, Any]) -> JobStatus:
    """``status`` with ``figures`` in its metadata when it is final."""
    if status.state.final and figures and status.metadata is not None:
        status.metadata.update(figures)
    return status


def _hosts(text: Optional[str], separator: str) -> "tuple[Optional[str], Optional[int]]":
    """The distinct hosts (comma-separated, in order) and the slots of an exec_host list:
    PBS ``host/0*2+host2/1`` (``+``), LSF ``4*hostA:2*hostB`` (``:``)."""
    if not text or not text.strip() or len(text) > 65536:
        return None, None
    hosts: Dict[str, None] = {}
    slots = 0
    for item in text.strip().split(separator):
        item = item.strip()
        if separator == "+":  # host/index[*count]
            host, _, rest = item.partition("/")
            count_text = rest.partition("*")[2] or "1"
        else:  # [count*]host
            match = _HOST_COUNT.fullmatch(item)
            if match is None:
                return None, None
            count_text, host = match.group(1) or "1", match.group(2)
        count = number(count_text)
        if not host or count is None or not re.fullmatch(r"[\w.\-]+", host):
            return None, None
        hosts[host] = None
        slots += int(count)
    return ",".join(hosts), slots or None


def pbs_figures(fields: Mapping[str, str]) -> Dict[str, Any]:
    """The figures of one ended PBS job (its ``qstat -f`` attributes, nested ones dotted)."""
    nodes, slots = _hosts(fields.get("exec_host"), "+")
    cores = number(fields.get("Resource_List.ncpus", "")) or slots
    ended = fields.get("obittime") or fields.get("comp_time") or fields.get("mtime")
    figures: Dict[str, Any] = {
        "cpu_seconds": clock_seconds(fields.get("resources_used.cput")),
        "max_rss_bytes": memory_bytes(fields.get("resources_used.mem")),
        "max_vmem_bytes": memory_bytes(fields.get("resources_used.vmem")),
        "cores": cores,
        "nodes": nodes,
        "requested_seconds": clock_seconds(fields.get("Resource_List.walltime")),
        "requested_memory_bytes": memory_bytes(fields.get("Resource_List.mem")),
        "queued_at": local_time(fields.get("qtime"), _CTIME),
        "started_at": local_time(fields.get("stime") or fields.get("start_time"), _CTIME),
        "ended_at": local_time(ended, _CTIME),
    }
    return clean_figures({key: value for key, value in figures.items() if value is not None})


def _lsf_time(text: Any, now: Optional[float] = None) -> Optional[float]:
    if not isinstance(text, str) or len(text) > 64:
        return None
    text = re.sub(r"\s+[A-Z]$", "", text.strip())  # (an estimate's or a remote time's mark)
    value = local_time(text, _LSF_TIME)
    if value is not None:
        return value
    current = time.localtime(wall_time() if now is None else now)
    for year in (current.tm_year, current.tm_year - 1):
        value = local_time(f"{text} {year}", tuple(f"{fmt} %Y" for fmt in _LSF_YEARLESS))
        if value is not None and value <= time.mktime(current) + 86400:
            return value
    return None


def _lsf_seconds(text: Any, unit: str) -> Optional[float]:
    """``2.5 second(s)``, ``60.0 min`` or ``hh:mm:ss`` (bjobs -hms) as seconds."""
    if not isinstance(text, str):
        return None
    words = text.split()
    if len(words) == 2 and words[1].rstrip("(s)") in (unit, unit.rstrip("s")):
        value = number(words[0])
        return None if value is None else value * (60 if unit == "min" else 1)
    return clock_seconds(text) if ":" in text else None


def lsf_figures(record: Mapping[str, Any], now: Optional[float] = None) -> Dict[str, Any]:
    """The figures of one ended LSF job (its bjobs JSON record)."""
    nodes, slots = _hosts(str(record.get("EXEC_HOST") or ""), ":")
    mem = str(record.get("MAX_MEM") or "").replace("bytes", "").replace(" ", "")
    figures: Dict[str, Any] = {
        "cpu_seconds": _lsf_seconds(record.get("CPU_USED"), "second"),
        "max_rss_bytes": memory_bytes(mem, "K"),
        "cores": number(str(record.get("NALLOC_SLOT") or "")) or slots,
        "nodes": nodes,
        "requested_seconds": _lsf_seconds(record.get("RUNTIMELIMIT"), "min"),
        "queued_at": _lsf_time(record.get("SUBMIT_TIME"), now),
        "started_at": _lsf_time(record.get("START_TIME"), now),
        "ended_at": _lsf_time(record.get("FINISH_TIME"), now),
    }
    return clean_figures({key: value for key, value in figures.items() if value is not None})


def flux_figures(fields: Mapping[str, str]) -> Dict[str, Any]:
    """The figures of one inactive Flux job (its ``flux jobs`` fields by name)."""
    duration = number(fields.get("duration", ""))
    figures: Dict[str, Any] = {
        "cores": number(fields.get("ncores", "")),
        "nodes": expand_nodes(fields.get("nodelist", "")),
        "requested_seconds": duration or None,
        "queued_at": epoch_seconds(fields.get("t_submit", "")),
        "started_at": epoch_seconds(fields.get("t_run", "")),
        "ended_at": epoch_seconds(fields.get("t_cleanup", ""))
        or epoch_seconds(fields.get("t_inactive", "")),
    }
    return clean_figures({key: value for key, value in figures.items() if value is not None})
