"""Ending the processes of pilot tasks whose worker died without ending them.

A worker killed with SIGKILL leaves its tasks running, re-parented to ``init``, with nobody to
watch or signal them. The engine then calls :func:`end_orphaned_tasks` with the tasks that
worker had: every process group it knows the leader of is KILLed when that leader is still
the task's (its initial environment carries the run's marker and the task's id, as on resume,
see :mod:`~psij.executors.pilot.journal`) or when the leader is gone but its group is not; and
since the worker may have died between a start and its report, every process of this user
whose environment carries the run's marker and one of those tasks' ids is KILLed too, with its
group (one look at ``/proc``, only on such a fault).

It kills only what it can prove is one of those tasks; it decides nothing about their states.
"""

import os
from typing import Dict, Iterable, Optional, Set

from psij.executors._process import SIGKILL, killpg, signal_reaped_group
from psij.executors.pilot.journal import RUN_VARIABLE, is_task_process

__all__ = ["end_orphaned_tasks", "end_run_processes"]


def end_orphaned_tasks(run: str, tasks: Dict[str, Optional[int]]) -> None:
    """KILL what is left of ``tasks`` (task id -> leader pid when known) of run ``run``."""
    for task_id, pid in tasks.items():
        if pid is None:
            continue
        if is_task_process(pid, run, task_id):
            killpg(pid, SIGKILL)
        else:
            signal_reaped_group(pid, SIGKILL)  # only if no process has that id any more
    _kill_marked(run, tasks)


def end_run_processes(run: str) -> None:
    """KILL every process of this user whose environment carries the marker of run ``run``,
    with its group: the tasks of an engine that is gone."""
    _kill_marked(run, None)


def _kill_marked(run: str, task_ids: Optional[Iterable[str]]) -> None:
    """KILL this user's processes marked with ``run`` and one of ``task_ids`` (None: any)."""
    marker = f"{RUN_VARIABLE}={run}".encode()
    wanted: Optional[Set[bytes]] = None
    if task_ids is not None:
        wanted = {f"QCG_PM_STEP_ID={t}".encode("utf-8", "surrogatepass") for t in task_ids}
        if not wanted:
            return
    uid = os.getuid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if not name.isdigit():
            continue
        path = f"/proc/{name}"
        try:
            if os.stat(path).st_uid != uid:
                continue
            with open(f"{path}/environ", "rb") as f:
                variables = set(f.read().split(b"\0"))
        except OSError:
            continue
        if marker in variables and (wanted is None or not wanted.isdisjoint(variables)):
            pid = int(name)
            try:
                group = os.getpgid(pid)
            except OSError:
                continue
            if group == pid or group != os.getpgrp():
                killpg(group, SIGKILL)
            try:
                os.kill(pid, SIGKILL)
            except OSError:
                pass
