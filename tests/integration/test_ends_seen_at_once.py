"""Every consumer of a batch job's end acts on it as soon as the job has written it, not at the
scheduler's next status poll: ``Job.wait`` and callbacks, ``psij run`` and ``psij wait``, the
futures layer, reruns (retry and requeue), held jobs (``max_queued_per_shape``), the
supervisor and the flow service, and an executor reached over SSH.

Each test runs the ``batch-test`` executor with its status polls 300 s apart (and, where the
consumer lets it be set, the first poll 300 s after a submission too), so that only the files
a job writes in the work directory (``<native id>.starts``, ``<native id>.ec``) can tell its
start and its end in time. A consumer that waited for a poll could not act within ``BOUND``
seconds; one that acts on the status change does so within about a second of the job's end.
The bound is generous on purpose: this is a check of behaviour, not a measure of speed
(``bench/`` measures it).
"""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, JobStatus
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.futures import FunctionExecutor, FunctionJobError
from support import futures_functions as ff

POLL = 300.0  # seconds between two status polls: far past BOUND
BOUND = 20.0  # seconds a consumer may take to act on an end here (a poll would take POLL)


def _config(tmp_path: Path, **more: Any) -> BatchTestExecutorConfig:
    return BatchTestExecutorConfig(work_directory=tmp_path / "work", queue_polling_interval=POLL,
                                   initial_queue_polling_delay=POLL, **more)


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[JobExecutor]:
    ex = JobExecutor.get_instance("batch-test", config=_config(tmp_path))
    yield ex
    ex.close()


def _shell(command: str, custom: Optional[dict] = None) -> JobSpec:  # type: ignore[type-arg]
    return JobSpec("/bin/sh", ["-c", command],
                   attributes=JobAttributes(custom_attributes=custom) if custom else None)


def _states(seen: List[JobStatus]) -> List[str]:
    return [s.state.name for s in seen]


# -- Job.wait, callbacks, wait_async ----------------------------------------------------------

def test_wait_returns_and_callbacks_run_when_the_job_writes_its_end(executor: JobExecutor
                                                                    ) -> None:
    seen: List[JobStatus] = []
    job = Job(_shell("sleep 1"))
    job.set_job_status_callback(lambda j, s: seen.append(s))
    executor.submit(job)
    status = job.wait(timeout=BOUND)
    assert status is not None, f"not final within {BOUND} s: {job.status}"
    assert status.state is JobState.COMPLETED and status.exit_code == 0
    # The callbacks of the end have run when wait returns.
    assert _states(seen) == ["QUEUED", "ACTIVE", "COMPLETED"]


def test_wait_async_and_status_changes_end_when_the_job_writes_its_end(
        executor: JobExecutor) -> None:
    import asyncio

    async def states_of(job: Job) -> List[str]:
        return [s.state.name async for s in job.status_changes()]

    async def follow() -> Tuple[Optional[JobStatus], List[str]]:
        job = Job(_shell("sleep 1; exit 3"))
        executor.submit(job)
        states = asyncio.ensure_future(states_of(job))
        return await job.wait_async(timeout=BOUND), await states

    status, states = asyncio.run(asyncio.wait_for(follow(), BOUND))
    assert status is not None and status.state is JobState.FAILED and status.exit_code == 3
    assert states[-1] == "FAILED" and states.count("FAILED") == 1


# -- reruns -----------------------------------------------------------------------------------

@pytest.mark.parametrize("custom, command", [
    ({"psij.retry": "attempts=2,on=failed"}, 'test "$PSIJ_ATTEMPT" = 2'),
    ({"psij.requeue": 1}, 'test "$PSIJ_ATTEMPT" = 2 || exit 85'),
], ids=["retry", "requeue"])
def test_the_next_run_is_submitted_when_the_run_before_writes_its_end(
        executor: JobExecutor, custom: dict, command: str) -> None:  # type: ignore[type-arg]
    seen: List[JobStatus] = []
    job = Job(_shell(command, custom))
    job.set_job_status_callback(lambda j, s: seen.append(s))
    executor.submit(job)
    first = job.native_id
    status = job.wait(timeout=BOUND)
    assert status is not None, f"not final within {BOUND} s: {job.status} after {_states(seen)}"
    assert status.state is JobState.COMPLETED, status
    assert (status.metadata or {}).get("attempt") == 2
    assert job.native_id != first  # run 2 was submitted anew, then seen ending
    states = _states(seen)
    assert states[0] == "QUEUED" and states.count("QUEUED") == 2 and states[-1] == "COMPLETED"


# -- held jobs --------------------------------------------------------------------------------

def test_a_held_job_goes_as_soon_as_the_job_before_it_leaves_the_queue(tmp_path: Path) -> None:
    from psij.executors.batch._held_jobs import HELD_MESSAGE

    ex = JobExecutor.get_instance("batch-test",
                                  config=_config(tmp_path, max_queued_per_shape=1))
    try:
        first, second = Job(_shell("sleep 1")), Job(_shell("sleep 1"))
        # In one call: submitted one by one, the first's start, which its file tells at once,
        # could free the slot before the second is submitted.
        ex.submit_many([first, second])
        # The second waits in the client: the first holds the one queued slot of the shape.
        assert second.status.message == HELD_MESSAGE and second._native_id is None
        # The first's start frees the slot (no poll tells it: they are 300 s apart, the short
        # ones of a shape holding jobs too), and the second goes then.
        assert first.wait(timeout=BOUND) is not None
        status = second.wait(timeout=BOUND)
        assert status is not None, f"not final within {BOUND} s: {second.status}"
        assert status.state is JobState.COMPLETED and second._native_id is not None
    finally:
        ex.close()


# -- futures ----------------------------------------------------------------------------------

def test_a_call_whose_job_dies_is_settled_when_the_job_writes_its_end(tmp_path: Path) -> None:
    # No result file is ever written: only the job's end can settle the call.
    ex = FunctionExecutor("batch-test", config=_config(tmp_path))
    try:
        future = ex.submit(ff.kill_myself)
        error = future.exception(timeout=BOUND)
    finally:  # not waiting for a call a poll would settle
        ex.shutdown(wait=False, cancel_futures=True)
        ex.executor.close()
    assert isinstance(error, FunctionJobError) and "exit code 137" in str(error)


# -- psij run, psij wait ----------------------------------------------------------------------

@pytest.fixture
def cli_env(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    """An environment where batch-test polls every 300 s (the configuration file's
    ``poll_interval``), with its own home (work directory and job registry)."""
    home = tmp_path / "home"
    config = home / ".config" / "psij"
    config.mkdir(parents=True)
    (config / "config.toml").write_text(f"[executors.batch-test]\npoll_interval = {POLL}\n")
    return dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))


def _psij(env: dict, *words: str) -> "subprocess.CompletedProcess[str]":  # type: ignore[type-arg]
    return subprocess.run([sys.executable, "-m", "psij", *words], capture_output=True,
                          text=True, env=env, timeout=BOUND + 10)


def test_psij_run_returns_when_the_job_writes_its_end(cli_env: dict) -> None:  # type: ignore
    # The first poll (0.2 s after the submission) sees the job running; the next is 300 s on.
    done = _psij(cli_env, "run", "--executor", "batch-test", "--", "/bin/sh", "-c",
                 "sleep 2; echo ran; exit 4")
    assert done.returncode == 4, done.stderr
    assert done.stdout == "ran\n"


@pytest.mark.parametrize("progress", [[], ["--progress", "--progress-every", "600"]],
                         ids=["plain", "progress"])
def test_psij_wait_returns_when_the_job_writes_its_end(cli_env: dict,  # type: ignore
                                                       progress: List[str]) -> None:
    ids = []
    for seconds in (3, 4):
        submitted = _psij(cli_env, "submit", "--executor", "batch-test", "--", "/bin/sh", "-c",
                          f"sleep {seconds}")
        assert submitted.returncode == 0, submitted.stderr
        ids.append(submitted.stdout.strip())
    # Attached again in a new process: its first poll (at once) sees them queued or running.
    # Showing its progress, it draws a line every 600 s and when a job changes state.
    waited = _psij(cli_env, "wait", "--json", *progress, *ids)
    assert waited.returncode == 0, waited.stderr
    rows = json.loads(waited.stdout)
    assert [(r["state"], r["final"]) for r in rows] == [("COMPLETED", True)] * 2
    if progress:
        assert waited.stderr.splitlines()[-1].startswith("2/2 final")


# -- the supervisor ---------------------------------------------------------------------------

def test_a_supervised_study_goes_on_as_each_job_writes_its_end(tmp_path: Path) -> None:
    from support.supervise_study import Study

    results = tmp_path / "r"
    results.mkdir()
    # Each client runs past the supervisor's first poll after its submission (2 s): its end
    # is told by its file or by a poll 300 s later. The server's end likewise.
    (results / "sleep").write_text("3")
    study = Study(results, executor="batch-test", clients=2, wave=2,
                  job_update_interval=POLL).start()
    assert study.wait(BOUND + 10) == 0, study.errors()
    assert study.results_done() == [0, 1]
    assert "the server finished" in study.errors()


# -- the flow service -------------------------------------------------------------------------

def test_the_flow_service_replaces_an_instance_when_its_job_writes_its_end(tmp_path: Path
                                                                          ) -> None:
    from support.flow_helpers import Service, wait_for

    service = Service(tmp_path / "state", str(tmp_path / "flow.sock"),
                      ["aggregate_problem_interval=0"],
                      extra=["--poll-interval", str(POLL)]).start()
    try:
        with service.client() as client:
            # Each instance runs past the service's first poll after its submission (1 s).
            spec = {"executable": "/bin/sh", "arguments": ["-c", "sleep 3"]}
            handle = client.create(spec, 1, "batch-test", lease=120,
                                   provisioning_lease=60)["handle"]
            ended = wait_for("an instance ended and its replacement submitted",
                             lambda: _ended_and_replaced(client, handle), timeout=BOUND)
            assert ended[0]["exit_code"] == 0
            client.destroy(handle)
    finally:
        service.stop()


def _ended_and_replaced(client: Any, handle: str) -> Any:
    ended = [i for i in client.instances(handle) if i.get("ended")]
    status = client.status(handle)
    return ended if ended and status["provisioned"] + status["waiting"] == 1 else None


# -- over SSH ---------------------------------------------------------------------------------

def test_a_job_over_ssh_ends_when_the_remote_job_writes_its_end(tmp_path: Path) -> None:
    from support.ssh_server import (
        make_ssh_user,
        remote_psij_command,
        remote_psij_reason,
        sshd_reason,
    )

    reason = sshd_reason() or remote_psij_reason()
    if reason is not None:
        pytest.skip(reason)
    user = make_ssh_user("psijend")
    try:
        url = f"ssh://{user.alias}?ssh_config={user.config}&psij={remote_psij_command()}"
        # The settings are sent to the remote side (its batch-test makes its own folders).
        config = BatchSchedulerExecutorConfig(work_directory=tmp_path / "work",
                                              queue_polling_interval=POLL,
                                              initial_queue_polling_delay=POLL)
        ex = JobExecutor.get_instance("batch-test", url=url, config=config)
        try:
            seen: List[str] = []
            ended = threading.Event()

            def told(job: Job, status: JobStatus) -> None:
                seen.append(status.state.name)
                if status.state.final:
                    ended.set()

            job = Job(_shell("sleep 1; exit 5"))
            job.set_job_status_callback(told)
            ex.submit(job)
            # Pushed by the remote side as it happens: no request is needed for it.
            assert ended.wait(BOUND), f"not final within {BOUND} s: {seen}"
            assert job.status.state is JobState.FAILED and job.status.exit_code == 5
            assert seen[0] == "QUEUED" and seen[-1] == "FAILED"
        finally:
            ex.close()
    finally:
        user.remove()
