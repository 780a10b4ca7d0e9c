"""The helpers psij-python's tests import from ``_test_tools``: an executor set up from the
test parameters, a bounded wait, and a completion check that shows the job's output when it
fails."""

import shutil
import tempfile
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Iterator, Optional, Union

from executor_test_params import ExecutorTestParams

from psij import Job, JobAttributes, JobExecutor, JobState, JobStatus, ResourceSpecV1

# Executors whose jobs start at once; a scheduler's may wait in its queue.
_QUICK = {"local", "batch-test"}


def _test_dir() -> Path:
    return Path.home() / ".psij" / "test"


def _make_test_dir() -> None:
    _test_dir().mkdir(parents=True, exist_ok=True)


def _get_timeout(execparams: ExecutorTestParams) -> Optional[timedelta]:
    # Bounded for every executor, so that a job that never ends fails its test instead of
    # hanging the run.
    return timedelta(minutes=10 if execparams.executor in _QUICK else 5)


def _contents(path: Optional[Path]) -> str:
    if path is None:
        return ""
    try:
        return Path(path).read_text()
    except OSError as ex:
        return f"<cannot read {path}: {ex}>"


def assert_completed(job: Job, status: Optional[JobStatus], attached: bool = False) -> None:
    assert status is not None, f"job {job.id} did not end in time (last: {job.status})"
    if status.state is JobState.COMPLETED:
        return
    what = f"job {job.id} ({job.native_id}) ended {status.state}, exit code " \
           f"{status.exit_code}, message: {status.message}"
    if not attached and job.spec is not None:
        what += f"\nstdout: {_contents(job.spec.stdout_path)}\nstderr: " \
                f"{_contents(job.spec.stderr_path)}"
    raise AssertionError(what)


def _get_executor_instance(ep: ExecutorTestParams, job: Optional[Job] = None) -> JobExecutor:
    if job is not None:
        spec = job.spec
        assert spec is not None
        spec.launcher = ep.launcher
        attributes = JobAttributes(custom_attributes=ep.custom_attributes)
        if ep.account is not None:
            attributes.account = ep.account
        if ep.queue_name is not None:
            attributes.queue_name = ep.queue_name
        resources = spec.resources
        if (ep.multi_node_queue_name is not None and isinstance(resources, ResourceSpecV1)
                and resources.computed_node_count > 1):
            attributes.queue_name = ep.multi_node_queue_name
        spec.attributes = attributes
    return JobExecutor.get_instance(ep.executor, url=ep.url)


@contextmanager
def _deploy(path: Union[str, Path]) -> Iterator[Path]:
    """A copy of ``path`` in the test directory (which the job's nodes are assumed to see),
    removed afterwards."""
    _make_test_dir()
    handle, name = tempfile.mkstemp(dir=_test_dir())
    copy = Path(name)
    try:
        with open(handle, "wb") as out, open(path, "rb") as source:
            shutil.copyfileobj(source, out)
        yield copy
    finally:
        copy.unlink()
