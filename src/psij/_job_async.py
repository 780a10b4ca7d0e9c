"""Waiting for jobs from asyncio: :meth:`psij.Job.wait_async` and
:meth:`psij.Job.status_changes`.

Both are built on the job's status notifications (the same moment its callbacks run): a
status change found in an executor's thread is handed to the event loop with
``call_soon_threadsafe``. Nothing polls and no thread is started: awaiting a thousand jobs costs a
thousand futures. Loaded on first use, so ``import psij`` never imports :mod:`asyncio`.
"""

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

from psij._lazylog import LazyLogger
from psij.job_state import JobState
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.job import Job

__all__ = ["StatusChanges", "wait_async"]

logger = LazyLogger(__name__)

Watcher = Callable[["Job", JobStatus], None]


def _timeout_seconds(timeout: Union[timedelta, float, None]) -> Optional[float]:
    # The same rules as Job.wait's limit (None or inf: no limit).
    from psij import _check

    return _check.timeout("Job.wait_async timeout", timeout)


def _reached(state: JobState, targets: Sequence[JobState]) -> bool:
    return state.final or any(state is t or bool(state.is_greater_than(t)) for t in targets)


def _hand_over(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop was closed: nobody is waiting any more
        pass


async def wait_async(job: "Job", timeout: Union[timedelta, float, None],
                     targets: Sequence[JobState]) -> Optional[JobStatus]:
    seconds = _timeout_seconds(timeout)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[JobStatus] = loop.create_future()

    def settle(status: JobStatus) -> None:
        if not done.done():
            done.set_result(status)

    def watch(_job: "Job", status: JobStatus) -> None:
        if _reached(status.state, targets):
            _hand_over(loop, settle, status)

    job._add_watcher(watch)
    try:
        # Checked after the watcher is in place, so no change falls between the two.
        now = job.wait(timedelta(0), target_states=list(targets))
        if now is not None:
            return now
        if seconds is None:
            return await done
        try:
            return await asyncio.wait_for(done, seconds)
        except asyncio.TimeoutError:
            return None
    finally:
        job._remove_watcher(watch)


class StatusChanges:
    """An async iterator over the statuses of one job: its current status first, then each
    state it enters, until a final one. Made by :meth:`psij.Job.status_changes`, which must be
    called while an event loop runs; :meth:`aclose` stops it early."""

    def __init__(self, job: "Job") -> None:
        self._job = job
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[JobStatus] = asyncio.Queue()
        self._last: Optional[JobStatus] = None
        self._closed = False
        job._add_watcher(self._watch)
        # After the watcher is in place: a change entered meanwhile is queued as well, and
        # told apart from this one by being later.
        current = job.wait(timedelta(0), target_states=[JobState.NEW])
        self._queue.put_nowait(current if current is not None else job.status)

    def _watch(self, _job: "Job", status: JobStatus) -> None:
        _hand_over(self._loop, self._queue.put_nowait, status)

    def __aiter__(self) -> "StatusChanges":
        return self

    async def __anext__(self) -> JobStatus:
        while not self._closed:
            status = await self._queue.get()
            last = self._last
            if last is not None and not status.state.is_greater_than(last.state):
                continue  # the current status, queued twice
            self._last = status
            if status.state.final:
                await self.aclose()
            return status
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop following the job."""
        if not self._closed:
            self._closed = True
            self._job._remove_watcher(self._watch)
