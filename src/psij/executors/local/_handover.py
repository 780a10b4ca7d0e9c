"""Handing a local job to a keeper before ``submit`` returns, so that it runs and is in the job
registry even if the submitting process is killed the next instant.

:func:`hand_over` writes the job's start on its keeper's socket (``Keeper.start``) with the
job's registry row (:func:`psij._registry.durable.submit_row`), which the keeper commits with
the job's pid as its native id; the job is QUEUED then, ACTIVE once the keeper answers with
its pid. Within :func:`batched` (``submit_many``) the starts of this thread are queued and sent
in messages of up to 64 jobs per keeper, the last as it ends, before ``submit_many`` returns.
A job no keeper took (started by this process, waiting for the resource pool or a stage-in,
or that could not start) has its row committed by :func:`commit_rest` before ``submit``
returns, the rows of one ``submit_many`` in one transaction.

It sets no job state but the QUEUED of a job handed over; the executor sets the others.
"""

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Protocol, Tuple

from psij._registry.durable import commit_rows, recorded, submit_row
from psij.executors._process import LaunchError
from psij.executors.local._journal import Journal, run_store
from psij.executors.local._keeper_client import Failure, Keeper, KeeperGone, Start
from psij.executors.local._prepared import Prepared, spawn_failure
from psij.executors.local._start import NATIVE_IDS, start_failure, stream_items
from psij.executors.local._worker import STARTS, WORKER, prepare
from psij.job import Job
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.executors.local._prepared import Run

__all__ = ["HandsOver", "batched", "commit_rest", "hand_over"]


class HandsOver(Protocol):
    """What :func:`hand_over` takes from the executor."""

    @property
    def _registry(self) -> str: ...

    @property
    def _work(self) -> Path: ...

    def _journal(self) -> Journal: ...

    def _launch_command(self, run: "Run") -> List[str]: ...

    def _on_exit(self, run: "Run", status: Optional[int]) -> None: ...

    def _start_again(self, run: "Run", prepared: Prepared) -> None: ...

    def _started(self, run: "Run", pid: int) -> None: ...

    def _finish(self, run: "Run", status: JobStatus) -> None: ...

    def _set_job_status(self, job: Job, status: JobStatus) -> None: ...


class _Batch(threading.local):
    """This thread's ``submit_many`` in progress: the jobs handed over and those to commit."""

    def __init__(self) -> None:
        self.open = False
        self.kept: List[Tuple[Keeper, Job]] = []
        self.rest: List[Job] = []


_BATCH = _Batch()
_BATCH_MESSAGE = 64  # jobs of a submit_many sent to a keeper in one message


def hand_over(executor: HandsOver, run: "Run", prepared: Prepared, keeper: Keeper,
              on_path: Any) -> bool:
    """Have ``keeper`` start the job of ``run`` (which records it and its exit even after this
    process ends); False when it must be started here (no keeper could take it).
    ``on_path(program, env)``: the program's path found on ``PATH``."""
    job = run.job
    spec = job.spec
    assert spec is not None
    env = prepared.env
    if prepared.direct:
        argv = [spec.executable or ""] + (spec.arguments or [])
        streams, fds = stream_items(spec)
    else:
        argv = executor._launch_command(run)
        assert run.launcher_out is not None
        os.close(os.open(run.launcher_out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        streams, fds = (None, run.launcher_out, run.launcher_out), []
    program = argv[0]
    if "/" not in program:
        path = env.get("PATH") if "PATH" in env or prepared.base is None \
            else prepared.base[1].get("PATH")
        try:
            program = on_path(program, {} if path is None else {"PATH": path})
        except FileNotFoundError as ex:  # not on PATH
            raise spawn_failure(LaunchError(f"executable {argv[0]!r} was not found (no "
                                            "such file, or not on PATH)", 127), job,
                                prepared) from ex
    base = prepared.base
    in_registry = run_store(executor._work) is not None
    row = submit_row(executor, job) if in_registry and not recorded(job) else None  # type: ignore[arg-type]
    item = (program, argv, str(prepared.job_dir), None if base is None else base[0], env,
            streams, job.id, executor._journal().text, executor._registry, in_registry, row)

    def started(pid: Optional[int], start: str, failure: Optional[Failure]) -> None:
        # On the watch thread: quick; the status and the rest are the worker's.
        if pid is None:
            assert failure is not None
            if failure[1] == "unsent":  # never sent to the keeper that ended: another
                WORKER.put(lambda: executor._start_again(run, prepared))
                return
            run.starting = False
            NATIVE_IDS.answered()
            WORKER.put(lambda: executor._finish(run, start_failure(
                failure, spec, prepared.job_dir, argv[0])))
            return
        run.pid, run.start = pid, start
        job._native_id = str(pid)
        run.starting = False
        run.activating = True
        NATIVE_IDS.answered()
        STARTS.put(lambda: executor._started(run, pid))

    run.kept, run.keeper, run.starting = True, keeper, True
    batch = _BATCH if _BATCH.open else None
    try:
        keeper.start(Start(item, fds, base, started,
                           lambda pid, status: executor._on_exit(run, status)),
                     send=batch is None)
    except KeeperGone:
        run.kept, run.keeper, run.starting = False, None, False
        return False
    run.row_sent = row is not None
    if batch is not None:
        batch.kept.append((keeper, job))  # QUEUED once all are sent
        if keeper.queued() >= _BATCH_MESSAGE:  # the keeper starts while the rest is made
            keeper.send_queued()
        return True
    # After the start is sent: a callback reading job.native_id waits for its answer.
    # (ACTIVE may be there already: then QUEUED is skipped, its callbacks came with it.)
    executor._set_job_status(job, JobStatus._made(JobState.QUEUED))
    prepare()
    return True


def commit_rest(executor: Any, run: "Run") -> None:
    """Commit the row of a job whose row no keeper took (now, or with its ``submit_many``)."""
    if run.row_sent:
        return
    if _BATCH.open:
        _BATCH.rest.append(run.job)
    else:
        commit_rows(executor, [run.job])


@contextmanager
def batched(executor: Any) -> Iterator[None]:
    """This thread's hand-overs within are sent, one message per keeper, as it ends (a
    ``submit_many``), and the rows of the other jobs committed in one transaction."""
    if _BATCH.open:
        yield
        return
    _BATCH.open = True
    try:
        yield
    finally:
        kept, rest = _BATCH.kept, _BATCH.rest
        _BATCH.open, _BATCH.kept, _BATCH.rest = False, [], []
        for keeper in {id(k): k for k, _ in kept}.values():
            keeper.send_queued()
        for _, job in kept:
            executor._set_job_status(job, JobStatus._made(JobState.QUEUED))
        if kept:
            prepare()
        commit_rows(executor, rest)
