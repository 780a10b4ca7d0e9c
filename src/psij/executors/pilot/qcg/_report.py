"""What a QCG-PilotJob file run says back: task states in QCG's words, ``jobs.report``
entries and the JSON responses written to ``service.log``.

Pure formatting: no I/O, no clock, nothing started. The runner
(:mod:`psij.executors.pilot.qcg.run`) gathers the facts into :class:`TaskReport` records and
writes what these functions return.
"""

from datetime import datetime, timedelta
from typing import Any, Dict, Mapping, Optional, Tuple

from psij._record import Record
from psij.executors.pilot.qcg._schema import SEED
from psij.executors.pilot.scheduler import TaskState

__all__ = ["TaskReport", "error_response", "format_report_entry", "job_info_data",
           "job_status_data", "ok_response", "qcg_state", "resources_data"]


_QCG_STATES = {
    TaskState.WAITING: "QUEUED",
    TaskState.QUEUED: "QUEUED",
    TaskState.RUNNING: "EXECUTING",
    TaskState.SUCCEEDED: "SUCCEED",
    TaskState.FAILED: "FAILED",
    TaskState.CANCELED: "CANCELED",
    TaskState.OMITTED: "OMITTED",
}


def qcg_state(state: TaskState) -> str:
    """The QCG name of a task state."""
    return _QCG_STATES[state]


class TaskReport(Record):
    """What the responses and ``jobs.report`` say about one task."""

    name: str
    state: str
    history: Tuple[Tuple[datetime, str], ...] = ()
    allocation: Optional[str] = None
    wd: Optional[str] = None
    runtime: Optional[timedelta] = None
    exit_code: Optional[int] = None
    message: Optional[str] = None
    core_ids: Optional[str] = None
    cpu_seconds: Optional[float] = None
    max_rss_bytes: Optional[int] = None

    def runtime_fields(self) -> Dict[str, str]:
        """QCG's runtime entries (``allocation``, ``wd``, ``rtime``, ``exit_code``), then the
        pilot's own of the same kind: ``core_ids`` (the cores given on each node, as
        ``node[0:1]``), ``cpu_seconds`` (user + system, of the task's process and the
        descendants it waited for) and ``max_rss_bytes`` (its peak resident memory)."""
        fields: Dict[str, str] = {}
        if self.allocation is not None:
            fields["allocation"] = self.allocation
        if self.wd is not None:
            fields["wd"] = self.wd
        if self.runtime is not None:
            fields["rtime"] = str(self.runtime)
        if self.exit_code is not None:
            fields["exit_code"] = str(self.exit_code)
        if self.core_ids is not None:
            fields["core_ids"] = self.core_ids
        if self.cpu_seconds is not None:
            fields["cpu_seconds"] = f"{self.cpu_seconds:.3f}"
        if self.max_rss_bytes is not None:
            fields["max_rss_bytes"] = str(self.max_rss_bytes)
        return fields

    def history_text(self) -> str:
        return "".join(f"\n{when}: {state}" for when, state in self.history)


def format_report_entry(report: TaskReport) -> str:
    """One entry of ``jobs.report``: the name and final state, the dated history, then the
    allocation (``node:cores``, comma separated), working directory, run time, exit code, the
    core ids, CPU seconds and peak memory (:meth:`TaskReport.runtime_fields`) and the reason of
    a failure, each on its own indented line."""
    lines = [f"{report.name} ({report.state})"]
    lines.extend(f"    {when}: {state}" for when, state in report.history)
    lines.extend(f"    {key}: {value}" for key, value in report.runtime_fields().items())
    if report.message:
        lines.append(f"    message: {_one_line(report.message)}")
    return "\n".join(lines) + "\n"


def ok_response(data: Optional[Mapping[str, Any]] = None, message: Optional[str] = None
                ) -> Dict[str, Any]:
    response: Dict[str, Any] = {"code": 0}
    if message is not None:
        response["message"] = message
    if data is not None:
        response["data"] = dict(data)
    return response


def error_response(message: str) -> Dict[str, Any]:
    return {"code": 1, "message": message}


def job_status_data(report: TaskReport) -> Dict[str, Any]:
    """The seed's ``jobStatus`` data for one task: name, status, history and runtime."""
    return {"jobName": report.name, "status": report.state, "history": report.history_text(),
            "runtime": report.runtime_fields()}


def job_info_data(report: TaskReport) -> Dict[str, Any]:
    data = job_status_data(report)
    if report.message:
        data["messages"] = report.message
    return data


def resources_data(dialect: str, total_nodes: int, total_cores: int, used_cores: int
                   ) -> Dict[str, int]:
    free = total_cores - used_cores
    if dialect == SEED:
        return {"totalCores": total_cores, "totalNodes": total_nodes, "usedCores": used_cores,
                "freeCores": free}
    return {"total_nodes": total_nodes, "total_cores": total_cores, "used_cores": used_cores,
            "free_cores": free}


def _one_line(text: str) -> str:
    return " ".join(text.split())
