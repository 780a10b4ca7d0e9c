"""Jobs the scheduler holds, end to end: a batch executor reports them QUEUED with
``held_by: "scheduler"`` once its poll sees the hold, says so again when the hold is released
(a restatement: watchers are told, callbacks see each state once as in psij-python), and the
registry and the flows' handle counts follow. On the batch-test scheduler (``batch-test.hold``,
``batch_test_tool.py release``) and on the fake PBS, Torque, LSF, Cobalt and Flux tools (the
queue ``held``)."""

import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest

import psij.registry
from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch import batch_test_tool
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from support.flow_helpers import Service, wait_for

WAIT = timedelta(seconds=60)


def until(what: str, check: Callable[[], Any]) -> Any:
    return wait_for(what, check, timeout=30.0, every=0.05)


def held_by(job: Job) -> Any:
    return (job.status.metadata or {}).get("held_by")


def test_a_hold_and_its_release_are_seen_and_said_again(tmp_path: Path) -> None:
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=0.1,
                                  initial_queue_polling_delay=0.05)
    ex = JobExecutor.get_instance("batch-test", config=cfg)
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"batch-test.hold": True})))
    called: List[Tuple[JobState, Any]] = []
    watched: List[Tuple[JobState, Any]] = []
    job.set_job_status_callback(lambda j, st: called.append((st.state, held_by(j))))
    job._add_watcher(lambda j, st: watched.append(
        (st.state, (st.metadata or {}).get("held_by"))))
    try:
        ex.submit(job)
        until("the hold seen", lambda: held_by(job) == "scheduler")
        status = job.status
        assert status.state is JobState.QUEUED
        assert status.metadata["native_state"] == "HELD"  # type: ignore[index]
        assert "held by the scheduler (HELD)" in (status.message or "")
        assert status.metadata["native_id"] == job.native_id  # type: ignore[index]
        psij.registry.flush()
        [record] = psij.registry.find([job.id], work_directory=tmp_path / "w")
        assert "held by the scheduler" in (record.message or "")
        subprocess.run([sys.executable, batch_test_tool.__file__, "--spool",
                        str(cfg.spool_directory), "release", str(job.native_id)], check=True)
        st = job.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
    finally:
        ex.close()
    # callbacks: each state once; watchers: the hold and (if a poll fell in between) its end
    assert [s for s, _ in called] == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert (JobState.QUEUED, "scheduler") in watched
    assert [s for s, _ in watched if s is not JobState.QUEUED] == \
        [JobState.ACTIVE, JobState.COMPLETED]


def test_every_site_scheduler_hold_is_reported(site: Tuple[str, BatchSchedulerExecutor]
                                               ) -> None:
    name, ex = site
    # The fake tools keep jobs of the queue "held" on hold (H, PSUSP, user_hold, urgency 0).
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(queue_name="held")))
    ex.submit(job)
    until(f"{name}: the hold seen", lambda: held_by(job) == "scheduler")
    assert job.status.state is JobState.QUEUED
    assert "held by the scheduler" in (job.status.message or "")
    job.cancel()
    st = job.wait(WAIT)
    assert st is not None and st.state is JobState.CANCELED, st


def test_held_instances_count_as_held_in_a_flow_handle(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A flow service on the batch-test scheduler: instances the scheduler holds count as
    ``held``, not ``waiting``, and as waiting again once released."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the service's batch-test spool
    spool = tmp_path / "home" / ".psij" / "work" / "batch-test-spool"
    service = Service(tmp_path / "state", str(tmp_path / "flow.sock"),
                      extra=["--poll-interval", "0.2"])
    service.start()
    try:
        with service.client() as client:
            spec = {"executable": "/bin/sleep", "arguments": ["30"], "attributes": {
                "custom_attributes": {"batch-test.hold": True}}}
            handle = client.create(spec, 2, "batch-test", lease=300,
                                   provisioning_lease=300)["handle"]
            wait_for("2 held", lambda: (client.status(handle)["held"],
                                        client.status(handle)["waiting"]) == (2, 0))
            tool = [sys.executable, batch_test_tool.__file__, "--spool", str(spool)]
            native = subprocess.run([*tool, "list"], capture_output=True, text=True,
                                    check=True).stdout.split()
            assert len(native) == 2
            subprocess.run([*tool, "release", native[0]], check=True)
            wait_for("1 held, 1 running", lambda: (
                client.status(handle)["held"], client.status(handle)["provisioned"]) == (1, 1))
            client.destroy(handle)
    finally:
        service.destroy_all()
        service.stop()
