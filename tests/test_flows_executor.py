"""The ``flow`` executor against a real flow service on local: jobs grouped by shape onto one
handle, exit codes and output handed to one job each, running/queued labels following the
handle's counts, a queued job's cancel shrinking with not_running, the handle destroyed
after its last job."""

import secrets
import time
from pathlib import Path
from typing import Iterator

import pytest

from psij import Job, JobExecutor, JobSpec, JobState
from psij.flows.executor import FlowJobExecutorConfig
from support.flow_helpers import Service, processes_with, wait_for


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path / "state", str(tmp_path / "flow.sock"),
                  ['default_intervals={"no_problem": 0, "unknown": 0, "failed_init": 0, '
                   '"failed_after_work": 0, "never_claimed": 0, "no_work": 0}',
                   "aggregate_problem_interval=0"]).start()
    yield svc
    svc.destroy_all()
    svc.stop()


def _executor(service: Service, **options: object) -> JobExecutor:
    options.setdefault("poll_interval", 0.3)
    config = FlowJobExecutorConfig(lease=60, provisioning_lease=30,
                                   **options)  # type: ignore[arg-type]
    return JobExecutor.get_instance("flow", url=f"unix://{service.socket}", config=config)


def test_jobs_of_one_shape_share_a_handle_and_each_gets_one_instance(
        service: Service, tmp_path: Path) -> None:
    executor = _executor(service)
    jobs = [Job(JobSpec("/bin/sh", ["-c", "echo hi-$$; sleep 1; exit 3"],
                        stdout_path=tmp_path / f"{n}.out")) for n in range(3)]
    for job in jobs:
        executor.submit(job)
        assert job.status.state is JobState.QUEUED
    with service.client() as client:
        handles = client.list()
        assert len(handles) == 1
        handle = handles[0]["handle"] if isinstance(handles[0], dict) else handles[0]
        assert client.status(handle)["requested"] == 3
    for job in jobs:
        status = job.wait(timeout=None)
        assert status is not None and status.state is JobState.FAILED
        assert status.exit_code == 3
    outputs = [(tmp_path / f"{n}.out").read_text() for n in range(3)]
    assert all(text.startswith("hi-") for text in outputs)
    assert len(set(outputs)) == 3  # three different instances, one for each job
    with service.client() as client:
        wait_for("the handle destroyed after its last job",
                 lambda: client.status(handle)["valid"] is False, timeout=10)
        # Every record handed to a job was deleted; what is left are replacements started
        # before the shrink and removed by it or by the destroy.
        assert {i["class"] for i in client.instances(handle)} <= {"removed"}
    executor.close()


def test_running_and_queued_follow_the_handle_and_cancel_of_a_queued_job_shrinks(
        service: Service) -> None:
    marker = f"psij-flow-exec-{secrets.token_hex(3)}"
    executor = _executor(service, create_options={"rate": 0.02})  # one start per 50 s
    spec = JobSpec("/bin/sh", ["-c", "sleep 300; :", marker])
    first, second = Job(spec), Job(JobSpec("/bin/sh", ["-c", "sleep 300; :", marker]))
    executor.submit(first)
    executor.submit(second)
    first.wait(target_states=[JobState.ACTIVE])
    time.sleep(1.5)
    assert second.status.state is JobState.QUEUED  # the handle has one provisioned
    assert len(processes_with(marker)) == 1
    handle = str(first.native_id).split("#")[0]
    executor.cancel(second)
    assert second.status.state is JobState.CANCELED
    with service.client() as client:
        assert client.status(handle)["requested"] == 1
        assert client.status(handle)["provisioned"] == 1
        executor.cancel(first)
        assert first.status.state is JobState.CANCELED
        wait_for("handle destroyed, instance gone", lambda: not client.status(handle)["valid"]
                 and not processes_with(marker), timeout=40)
    executor.close()


def test_leases_are_renewed_while_jobs_run(service: Service, tmp_path: Path) -> None:
    config = FlowJobExecutorConfig(poll_interval=0.3, lease=4, provisioning_lease=3)
    executor = JobExecutor.get_instance("flow", url=service.socket, config=config)
    job = Job(JobSpec("/bin/sh", ["-c", "sleep 9; echo done"], stdout_path=tmp_path / "out"))
    executor.submit(job)
    status = job.wait(timeout=None)
    assert status is not None and status.state is JobState.COMPLETED, status
    assert (tmp_path / "out").read_text() == "done\n"
    executor.close()


def test_the_instance_removed_for_a_cancelled_running_job_goes_to_no_other_job(
        service: Service, tmp_path: Path) -> None:
    marker = f"psij-flow-exec-{secrets.token_hex(3)}"
    executor = _executor(service, grace=0.5)
    jobs = [Job(JobSpec("/bin/sh", ["-c", "sleep 12; echo natural", marker],
                        stdout_path=tmp_path / f"{n}.out")) for n in range(2)]
    for job in jobs:
        executor.submit(job)
    for job in jobs:
        job.wait(target_states=[JobState.ACTIVE])
    wait_for("2 instances", lambda: len(processes_with(marker)) == 2)
    executor.cancel(jobs[0])
    wait_for("one instance left", lambda: len(processes_with(marker)) == 1, timeout=10)
    time.sleep(2)  # polls that would hand the removed instance over
    assert jobs[1].status.state is JobState.ACTIVE
    status = jobs[1].wait(timeout=None)
    assert status is not None and status.state is JobState.COMPLETED, status
    assert (tmp_path / "1.out").read_text() == "natural\n"
    executor.close()


def test_the_last_job_cancelled_keeps_the_grace_of_its_instance(service: Service) -> None:
    # Its handle is destroyed once the job has left, which kills at once: the instance must
    # still get its grace (it ignores TERM, so only the kill at the end of the grace ends it).
    marker = f"psij-flow-last-{secrets.token_hex(3)}"
    executor = _executor(service, grace=2.0)
    job = Job(JobSpec("/bin/sh", ["-c", "trap '' TERM; sleep 300", marker]))
    executor.submit(job)
    job.wait(target_states=[JobState.ACTIVE])
    wait_for("the instance", lambda: processes_with(marker))
    started = time.monotonic()
    executor.cancel(job)
    assert job.status.state is JobState.CANCELED
    time.sleep(0.5)
    if time.monotonic() - started < 1.5:
        assert processes_with(marker), "killed before its grace was over"
    wait_for("the instance killed after its grace", lambda: not processes_with(marker),
             timeout=30)
    assert time.monotonic() - started >= 1.5
    executor.close()


def test_a_job_ends_when_the_service_knows_it_not_at_the_next_poll(service: Service,
                                                                    tmp_path: Path) -> None:
    # Reads every 300 s: only the service's answer to the executor's watch can tell the start
    # and the end in time.
    executor = _executor(service, poll_interval=300)
    try:
        job = Job(JobSpec("/bin/sh", ["-c", "sleep 1; echo done; exit 4"],
                          stdout_path=tmp_path / "out"))
        executor.submit(job)
        status = job.wait(timeout=20)
        assert status is not None, f"not final within 20 s: {job.status}"
        assert status.state is JobState.FAILED and status.exit_code == 4
        assert (tmp_path / "out").read_text() == "done\n"
    finally:
        executor.close()


def test_a_service_without_watch_is_read_every_poll_interval(service: Service,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    from psij.flows import client as flow_client
    from psij.flows.client import FlowError

    def no_watch(self: object, handle: object = None, after: int = 0) -> int:
        raise FlowError("unknown_op", "op: expected one of create, ..., got 'watch'")

    monkeypatch.setattr(flow_client.FlowClient, "watch", no_watch)
    executor = _executor(service)  # reads every 0.3 s
    try:
        job = Job(JobSpec("/bin/sh", ["-c", "exit 0"]))
        executor.submit(job)
        status = job.wait(timeout=30)
        assert status is not None and status.state is JobState.COMPLETED
    finally:
        executor.close()
