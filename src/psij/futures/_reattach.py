"""Futures for function jobs recorded in the job registry, after the client that submitted
them ended: :func:`reattach`.

A function job's recorded JobSpec runs ``python -m psij.futures._run DIR``; its call files in
``DIR`` say which calls it holds (one future each, in order), and the key beside ``DIR`` checks
their results. The jobs are re-attached through :mod:`psij.registry` (their executors follow
them from then on); nothing of the process that submitted them is needed.
"""

import os
from typing import Dict, Iterable, List, Optional, Union

from psij import _check
from psij.futures import _wire
from psij.futures._executor import RUNNER_MODULE
from psij.futures._future import FunctionFuture
from psij.futures._job_calls import JobCalls
from psij.futures._workdir import WorkDirectory
from psij.job import Job
from psij.job_status import JobStatus

__all__ = ["reattach"]


def _call_directory(record: object) -> str:
    spec = getattr(record, "spec", None)
    arguments = list(getattr(spec, "arguments", None) or [])
    if len(arguments) != 3 or arguments[:2] != ["-m", RUNNER_MODULE]:
        raise ValueError(f"reattach: job {getattr(record, 'id', '?')} is not a function job "
                         f"(its arguments are {arguments[:3]!r})")
    return str(arguments[2])


def _function_names(directory: str, count: int) -> List[str]:
    names = []
    for index in range(count):
        name = "?"
        try:
            with open(_wire.call_file(directory, index), "rb") as stream:
                import json

                header = json.loads(stream.readline(_wire.HEADER_LIMIT))
                name = str(header.get("function", "?"))
        except (OSError, ValueError):
            pass
        names.append(name)
    return names


def _indexes(directory: str) -> List[int]:
    try:
        names = os.listdir(directory)
    except OSError as ex:
        raise FileNotFoundError(f"reattach: the call directory {directory} cannot be read "
                                f"({ex.strerror or ex}); were its files removed?") from ex
    found = sorted(int(n[1:-3]) for n in names
                   if n.startswith("c") and n.endswith(".in") and n[1:-3].isdigit())
    return found


def reattach(ids: Union[str, Iterable[str]], *, work_directory: Optional[str] = None,
             keep_files: bool = False) -> List[FunctionFuture]:
    """The futures of the function jobs ``ids`` (PSI/J job ids, as ``FunctionFuture.job_id``
    and ``psij list`` show them), one per call, in the order of ``ids`` then of the calls in
    each job. ``work_directory`` is the executors' work directory whose registry recorded the
    jobs (default ``~/.psij/work``). The results of jobs that ended meanwhile are read at once;
    the others come when the jobs end. Raises ValueError naming an id that is not recorded or
    not a function job."""
    from psij import registry

    wanted = [ids] if isinstance(ids, str) else list(ids)
    for i, job_id in enumerate(wanted):
        if not isinstance(job_id, str):
            raise _check.fail_type(f"reattach ids[{i}]", job_id, "str (a job id)")
    keep = _check.opt_bool("reattach keep_files", keep_files)
    records = {record.id: record for record in registry.find(wanted,
                                                             work_directory=work_directory)}
    missing = [job_id for job_id in wanted if job_id not in records]
    if missing:
        raise ValueError(f"reattach: no job {missing[0]!r} in the job registry "
                         f"{registry.registry_file(work_directory)}")
    books: Dict[str, JobCalls] = {}
    works: Dict[str, WorkDirectory] = {}
    ordered = []
    for job_id in wanted:
        record = records[job_id]
        directory = _call_directory(record)
        parent = os.path.dirname(directory)
        if parent not in works:
            works[parent] = WorkDirectory(parent, "reattach work directory")
        indexes = _indexes(directory)
        names = _function_names(directory, len(indexes))
        futures = [FunctionFuture(name) for name in names]
        calls = JobCalls(works[parent], directory, futures, keep, _forget)
        books[job_id] = calls
        ordered.append(record)

    def status_changed(job: Job, status: JobStatus) -> None:
        books[job.id].status_changed(job, status)

    jobs = registry.attach(ordered, status_changed)
    for job in jobs:
        books[job.id].bind(job)
        if job.status.final:  # ended before the callback was set
            books[job.id].status_changed(job, job.status)
    return [future for job_id in wanted for future in books[job_id].futures]


def _forget(calls: JobCalls) -> None:
    """Re-attached books are kept by their futures only."""
