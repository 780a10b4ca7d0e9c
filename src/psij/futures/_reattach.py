"""Futures for function jobs recorded in the job registry, after the client that submitted
them ended: :func:`reattach`.

A function job's recorded JobSpec runs ``python -m psij.futures._run DIR``; its call files in
``DIR`` say which calls it holds (one future each, in order), and the key beside ``DIR`` checks
their results. The jobs are re-attached through :mod:`psij.registry` (their executors follow
them from then on); nothing of the process that submitted them is needed. It submits and
cancels nothing, and reads only call directories that are private (as ``_private_dirs``
checks them).
"""

import os
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Tuple, Union

from psij import _check
from psij._clock import MonotonicClock
from psij._private_dirs import check_private_dir
from psij.futures import _wire
from psij.futures._executor import RUNNER_MODULE
from psij.futures._future import FunctionFuture
from psij.futures._job_calls import JobCalls
from psij.futures._workdir import WorkDirectory
from psij.futures.errors import FunctionJobError
from psij.job import Job
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij import registry

__all__ = ["reattach"]

_CLOCK = MonotonicClock()
_ATTACH_PATIENCE = 5.0  # seconds of retries for jobs their executor does not know yet
_ATTACH_RETRY = 0.2


def _call_directory(record: object) -> str:
    spec = getattr(record, "spec", None)
    arguments = list(getattr(spec, "arguments", None) or [])
    if len(arguments) != 3 or arguments[:2] != ["-m", RUNNER_MODULE]:
        raise ValueError(f"reattach: job {getattr(record, 'id', '?')} is not a function job "
                         f"(its arguments are {arguments[:3]!r})")
    return str(arguments[2])


def _function_names(directory: str) -> List[str]:
    """The functions of the calls in ``directory``, from their headers (unchecked: names
    only)."""
    path = _wire.calls_file(directory)
    names: List[str] = []
    try:
        with _wire.open_signed(path) as calls:
            while True:
                header = _wire.read_header(calls, path)
                if header is None:
                    return names
                names.append(str(header.get("function", "?")))
                calls.seek(header["size"], os.SEEK_CUR)
    except (OSError, _wire.WireError) as ex:
        raise FileNotFoundError(f"reattach: the calls of {directory} cannot be read ({ex}); "
                                f"were its files removed?") from ex


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
        if record.url is not None:
            raise ValueError(f"reattach: job {job_id} ran its calls on {record.url}: the "
                             f"results of function jobs on another host come back only to the "
                             f"process that submitted them (psij status shows the job's state)")
        directory = _call_directory(record)
        parent = os.path.dirname(directory)
        if parent not in works:
            works[parent] = WorkDirectory(parent, "reattach work directory")
        check_private_dir(directory, f"reattach: the call directory of job {job_id}")
        names = _function_names(directory)
        futures = [FunctionFuture(name) for name in names]
        calls = JobCalls(works[parent], directory, futures, keep, _forget)
        books[job_id] = calls
        ordered.append(record)

    def status_changed(job: Job, status: JobStatus) -> None:
        books[job.id].status_changed(job, status)

    jobs, failures = _attach(ordered, status_changed)
    for record, error in failures:
        for future in books[record.id].futures:
            future._settle(False, FunctionJobError(
                f"job {record.id} ({record.executor} {record.native_id}) could not be "
                f"re-attached: {error}", record.id, record.native_id))
            future._ready()
    for job in jobs:
        books[job.id].bind(job)
        for future in books[job.id].futures:
            future._ready()
        if job.status.final:  # ended before the callback was set
            books[job.id].status_changed(job, job.status)
    return [future for job_id in wanted for future in books[job_id].futures]


def _attach(records: List["registry.JobRecord"], callback: Callable[[Job, JobStatus], None]
            ) -> Tuple[List[Job], List[Tuple["registry.JobRecord", Exception]]]:
    """The records attached; those that could not be, with the reason, after a few tries
    (a job recorded moments ago may not be known to its executor yet)."""
    from psij import registry

    jobs: List[Job] = []
    left = records
    deadline = _CLOCK.now() + _ATTACH_PATIENCE
    while True:
        try:
            jobs += registry.attach(left, callback)
            return jobs, []
        except registry.AttachError as ex:
            jobs += ex.jobs
            if _CLOCK.now() >= deadline:
                return jobs, ex.failures
            left = [record for record, _error in ex.failures]
            _CLOCK.sleep(_ATTACH_RETRY)


def _forget(calls: JobCalls) -> None:
    """Re-attached books are kept by their futures only."""
