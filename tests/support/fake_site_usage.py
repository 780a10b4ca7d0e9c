"""What a job of the fake scheduler commands (``fake_site_scheduler.py``) used, in each tool's
own words: the job's real CPU time and peak memory (the rusage of its script, taken when it
ends) and its times, as PBS Pro (``qstat -f -F json``: ``resources_used``, ``qtime``,
``stime``, ``obittime``, ``exec_host``), Torque (``qstat -f``: the same names, ``start_time``
and ``comp_time``), LSF (``bjobs -o``: ``cpu_used`` as ``2.3 second(s)``, ``max_mem`` as
``300 Mbytes``, times to the minute without the year) and Flux (``flux jobs -o``: epoch
seconds ``t_submit``, ``t_run``, ``t_cleanup``, ``t_inactive``) write them. Standard library
only."""

import socket
import time
from typing import Any, Dict, List

WALLTIME = "00:10:00"


def record_usage(job: Dict[str, Any], usage: Any) -> None:
    """Keep what the job's script used (an ``os.wait4`` rusage)."""
    job["cpu"] = usage.ru_utime + usage.ru_stime
    job["maxrss_kb"] = usage.ru_maxrss


def _hms(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _ran(job: Dict[str, Any]) -> bool:
    return job.get("started") is not None and job.get("cpu") is not None


def pbs_usage(fields: Dict[str, Any], job: Dict[str, Any], torque: bool = False) -> None:
    """Add an ended PBS job's use to its qstat attributes (``Resource_List`` nested)."""
    fields["qtime"] = time.ctime(job["submitted"])
    if not _ran(job):
        return
    host = socket.gethostname()
    fields["resources_used"] = {
        "cput": _hms(job["cpu"]), "mem": f"{job['maxrss_kb']}kb",
        "vmem": f"{job['maxrss_kb'] + 4096}kb", "ncpus": job["slots"],
        "walltime": _hms(job["ended"] - job["started"])}
    fields["exec_host"] = "+".join(f"{host}/{i}" for i in range(job["slots"])) if torque \
        else f"{host}/0*{job['slots']}"
    fields["Resource_List"]["ncpus"] = job["slots"]
    fields["Resource_List"]["mem"] = "1gb"
    if torque:
        fields["start_time"] = time.ctime(job["started"])
        fields["comp_time"] = time.ctime(job["ended"])
    else:
        fields["stime"] = time.ctime(job["started"])
        fields["obittime"] = time.ctime(job["ended"])
        fields["mtime"] = time.ctime(job["ended"])


def torque_lines(job: Dict[str, Any]) -> List[str]:
    """The ``name = value`` lines of an ended Torque job's use."""
    fields: Dict[str, Any] = {"Resource_List": {}}
    pbs_usage(fields, job, torque=True)
    lines = []
    for key, value in fields.items():
        if isinstance(value, dict):
            lines += [f"    {key}.{sub} = {inner}" for sub, inner in value.items()]
        else:
            lines.append(f"    {key} = {value}")
    return lines


def _lsf_time(at: float) -> str:
    return time.strftime("%b %e %H:%M", time.localtime(at))


def lsf_usage(job: Dict[str, Any]) -> Dict[str, str]:
    """An ended LSF job's bjobs fields (upper-case names, every value a string)."""
    values = {"SUBMIT_TIME": _lsf_time(job["submitted"]), "RUNTIMELIMIT": "10.0 min"}
    if _ran(job):
        rss = job["maxrss_kb"]
        slots, host = job["slots"], socket.gethostname()
        values.update({
            "START_TIME": _lsf_time(job["started"]), "FINISH_TIME": _lsf_time(job["ended"]),
            "CPU_USED": f"{job['cpu']:.1f} second(s)",
            "MAX_MEM": f"{rss // 1024} Mbytes" if rss >= 1024 else f"{rss} Kbytes",
            "NALLOC_SLOT": str(slots), "EXEC_HOST": f"{slots}*{host}" if slots > 1 else host})
    return values


def flux_usage(job: Dict[str, Any]) -> Dict[str, str]:
    """A Flux job's fields (empty before it ended; t_run 0.0 when it never ran)."""
    if job["state"] != "done":
        return dict.fromkeys(("t_submit", "t_run", "t_cleanup", "t_inactive", "ncores",
                              "duration", "nodelist"), "")
    ran = _ran(job)
    ended = job.get("ended") or job["submitted"]
    return {"t_submit": f"{job['submitted']:.6f}",
            "t_run": f"{job['started']:.6f}" if ran else "0.0",
            "t_cleanup": f"{ended:.6f}" if ran else "0.0", "t_inactive": f"{ended:.6f}",
            "ncores": str(job["slots"]) if ran else "", "duration": "600.0",
            "nodelist": socket.gethostname() if ran else ""}
