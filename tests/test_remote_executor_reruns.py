"""psij.remote._executor for jobs run again (``psij.requeue``, ``psij.retry``): the remote
host's executor runs the job again, the server pushes the QUEUED status of the next run with
its metadata, and the job on this side enters QUEUED again, takes the new native id and ends
with the attempt in its final status and in this machine's registry.

No SSH here: the connection is a fake that hands each request to a ``Server`` in this
process (:mod:`psij.remote._server`, the code ``psij remote serve`` runs) and delivers its
pushed messages, through JSON, on a thread of their own as the real connection does. The
remote executor is a small one written in the test that runs a job again itself; a test with
the local executor on the remote side runs once the local executor runs jobs again.
"""

import json
import queue
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

import pytest

import psij.registry
from psij import (
    Job,
    JobAttributes,
    JobExecutor,
    JobExecutorConfig,
    JobSpec,
    JobState,
    JobStatus,
)
from psij.remote import _executor as remote_executor
from psij.remote._executor import RemoteJobExecutor
from psij.remote._protocol import raised
from psij.remote._server import Server
from psij.remote._target import parse
from support.rerunning import PlayedRuns

WAIT = timedelta(seconds=60)
URL = "ssh://fakehost"
RETRY_FAILED = "attempts=2,on=failed"


class RerunningRemotely(PlayedRuns):
    """The remote host's executor: a job's run ``n`` fails with exit code 3 while ``n`` <
    ``succeed_at``, on a thread of its own (as a real executor reports later), and the job
    is run again (``_RERUNS = "submits"``) under a new native id."""

    _RERUNS = "submits"
    succeed_at = 2

    def __init__(self, config: Optional[JobExecutorConfig] = None) -> None:
        super().__init__(config=config)
        self.runs: List[Dict[str, Any]] = []

    def _start(self, job: Job) -> None:
        assert job.spec is not None
        self.runs.append(dict(job.spec.environment or {}))
        n = len(self.runs)
        job._native_id = f"remote-{n}"
        self._set_job_status(job, JobStatus(JobState.QUEUED))

        def run() -> None:
            time.sleep(0.05)
            self._set_job_status(job, JobStatus(JobState.ACTIVE))
            time.sleep(0.05)
            if n < self.succeed_at:
                self._set_job_status(job, JobStatus(JobState.FAILED, exit_code=3,
                                                    message="it broke"))
            else:
                self._set_job_status(job, JobStatus(JobState.COMPLETED, exit_code=0))

        threading.Thread(target=run, daemon=True).start()


class InProcessConnection:
    """What :class:`RemoteJobExecutor` uses of a connection, answered by a Server here."""

    def __init__(self, work_directory: Path) -> None:
        self.target = parse(URL)
        self.call_timeout = 60.0
        # An executor collected after the test lets go through the real release: it finds
        # this connection used by others and leaves it.
        self.users = 1 << 30
        self._followers: Dict[str, Callable[[Mapping[str, Any]], None]] = {}
        self._lock = threading.Lock()
        self._events: queue.Queue[Optional[Dict[str, Any]]] = queue.Queue()
        self.server = Server(self._push, work_directory=work_directory)
        self._next = 0
        self._thread = threading.Thread(target=self._dispatch, daemon=True)
        self._thread.start()

    def _push(self, message: Mapping[str, Any]) -> None:
        self._events.put(json.loads(json.dumps(message)))

    def _dispatch(self) -> None:
        while True:
            message = self._events.get()
            if message is None:
                return
            with self._lock:
                follower = self._followers.get(message.get("job"))  # type: ignore[arg-type]
            if follower is not None:
                follower(message)

    def call(self, op: str, fields: Mapping[str, Any], timeout: Any = None) -> Any:
        self._next += 1
        answer = json.loads(json.dumps(self.server.handle(
            json.loads(json.dumps({"id": self._next, "op": op, **fields})))))
        if answer.get("ok") is not True:
            raise raised(answer, self.target.where)
        return answer.get("value")

    def follow(self, job_id: str, follower: Callable[[Mapping[str, Any]], None]) -> None:
        with self._lock:
            self._followers[job_id] = follower

    def unfollow(self, job_id: str) -> None:
        with self._lock:
            self._followers.pop(job_id, None)

    def on_reconnect(self, hook: Callable[[], None]) -> None:
        pass

    def close(self) -> None:
        self._events.put(None)
        self.server.close()


@pytest.fixture
def remote(tmp_path: Path, monkeypatch: Any) -> Iterator[InProcessConnection]:
    conn = InProcessConnection(tmp_path / "remote-work")
    real = JobExecutor.get_instance

    def get_instance(name: str, version_constraint: Optional[str] = None,
                     url: Optional[str] = None, config: Optional[JobExecutorConfig] = None
                     ) -> JobExecutor:
        if name == "rerunning" and url is None:
            return RerunningRemotely(config or JobExecutorConfig(
                work_directory=conn.server.work_directory))
        return real(name, version_constraint=version_constraint, url=url, config=config)

    monkeypatch.setattr(JobExecutor, "get_instance", staticmethod(get_instance))
    monkeypatch.setattr(remote_executor._connection, "connect", lambda target: conn)
    monkeypatch.setattr(remote_executor._connection, "release", lambda c, wait=True: None)
    yield conn
    conn.close()


def client(name: str, tmp_path: Path) -> RemoteJobExecutor:
    ex = JobExecutor.get_instance(name, url=URL,
                                  config=JobExecutorConfig(work_directory=tmp_path / "work"))
    assert isinstance(ex, RemoteJobExecutor)
    return ex


def failing_once(tmp_path: Path, attempts: str = RETRY_FAILED) -> Job:
    """A job that fails (exit 3) in its first run and completes in its second: it counts its
    runs in a file, a line for each with its PSIJ_ATTEMPT ("-" when it has none)."""
    runs = tmp_path / "runs"
    script = (f'echo "${{PSIJ_ATTEMPT:--}}" >> "{runs}"; [ "$(wc -l < "{runs}")" -ge 2 ] '
              '|| exit 3')
    return Job(JobSpec("/bin/sh", ["-c", script],
                       attributes=JobAttributes(custom_attributes={"psij.retry": attempts})))


def seen_by(job: Job) -> List[Any]:
    seen: List[Any] = []
    job.set_job_status_callback(lambda j, st: seen.append(
        (st.state.name, (st.metadata or {}).get("attempt"))))
    return seen


def test_a_job_run_again_remotely_enters_queued_again_here(remote: InProcessConnection,
                                                           tmp_path: Path) -> None:
    ex = client("rerunning", tmp_path)
    job = failing_once(tmp_path)
    seen = seen_by(job)
    ex.submit(job)
    status = job.wait(WAIT)
    assert status is not None and status.state is JobState.COMPLETED, status
    assert (status.metadata or {}).get("attempt") == 2
    assert seen == [("QUEUED", None), ("ACTIVE", None), ("QUEUED", 2), ("ACTIVE", 2),
                    ("COMPLETED", 2)]
    assert job.native_id == "remote-2"
    [remote_ex] = [e for e in remote.server._executors.values()
                   if isinstance(e, RerunningRemotely)]
    assert remote_ex.runs[1].get("PSIJ_ATTEMPT") == "2"
    assert psij.registry.flush(WAIT)
    [rec] = psij.registry.find(job.id, work_directory=tmp_path / "work")
    assert (rec.state, rec.native_id, rec.attempt, rec.rerun, rec.rerun_cause) == (
        JobState.COMPLETED, "remote-2", 2, "retry", "failed")


def test_the_queued_status_of_a_rerun_carries_its_metadata_here(remote: InProcessConnection,
                                                                tmp_path: Path) -> None:
    ex = client("rerunning", tmp_path)
    job = failing_once(tmp_path)
    queued: List[JobStatus] = []
    job.set_job_status_callback(lambda j, st: queued.append(st)
                                if st.state is JobState.QUEUED else None)
    ex.submit(job)
    assert job.wait(WAIT).state is JobState.COMPLETED  # type: ignore[union-attr]
    meta = queued[-1].metadata or {}
    assert (meta["attempt"], meta["rerun"], meta["cause"]) == (2, "retry", "failed")
    assert meta["previous"] == {"native_id": "remote-1", "exit_code": 3,
                                "message": "it broke"}
    assert queued[-1].message is not None and "retried after failed" in queued[-1].message


def test_a_job_out_of_attempts_ends_failed_with_its_last_attempt(remote: InProcessConnection,
                                                                 tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    monkeypatch.setattr(RerunningRemotely, "succeed_at", 5)
    ex = client("rerunning", tmp_path)
    job = failing_once(tmp_path, "attempts=3,on=failed")
    ex.submit(job)
    status = job.wait(WAIT)
    assert status is not None and status.state is JobState.FAILED and status.exit_code == 3
    assert (status.metadata or {}).get("attempt") == 3 and job.native_id == "remote-3"


def test_a_later_run_seen_first_in_a_later_state_is_entered_from_queued(
        remote: InProcessConnection, tmp_path: Path) -> None:
    # After a reconnection the server tells only the current status: an ACTIVE of run 2
    # for a job here in run 1 enters QUEUED (attempt 2) first, then ACTIVE.
    ex = client("rerunning", tmp_path)
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={"psij.retry": RETRY_FAILED})))
    seen = seen_by(job)
    ex._check_job(job)
    ex._apply(job, {"ev": "status", "job": job.id, "native_id": "r-1", "state": "ACTIVE",
                    "time": time.time(), "exit_code": None, "message": None,
                    "metadata": None})
    ex._apply(job, {"ev": "status", "job": job.id, "native_id": "r-2", "state": "ACTIVE",
                    "time": time.time(), "exit_code": None, "message": None,
                    "metadata": {"attempt": 2}})
    # An earlier run's status coming late changes nothing.
    ex._apply(job, {"ev": "status", "job": job.id, "native_id": "r-2", "state": "QUEUED",
                    "time": time.time(), "exit_code": None, "message": None,
                    "metadata": {"attempt": 2}})
    assert seen == [("QUEUED", None), ("ACTIVE", None), ("QUEUED", 2), ("ACTIVE", 2)]
    assert job.native_id == "r-2"
    # An attempt that is not a whole number, or beyond belief, starts no run.
    for attempt in ("3", 3.0, True, 2 ** 70, -5):
        ex._apply(job, {"ev": "status", "job": job.id, "native_id": "r-2", "state": "QUEUED",
                        "time": time.time(), "exit_code": None, "message": None,
                        "metadata": {"attempt": attempt}})
    assert seen[4:] == [] and job.status.state is JobState.ACTIVE


def test_a_local_job_on_the_remote_side_is_retried(remote: InProcessConnection,
                                                   tmp_path: Path) -> None:
    ex = client("local", tmp_path)
    job = failing_once(tmp_path)
    seen = seen_by(job)
    ex.submit(job)
    status = job.wait(WAIT)
    assert status is not None and status.state is JobState.COMPLETED, status
    assert (status.metadata or {}).get("attempt") == 2
    assert [s for s in seen if s[0] in ("QUEUED", "COMPLETED")] == [
        ("QUEUED", None), ("QUEUED", 2), ("COMPLETED", 2)]
    # The remote executor's rule: PSIJ_ATTEMPT in every run of a job that may run again.
    assert (tmp_path / "runs").read_text() == "1\n2\n"


def test_a_local_job_on_the_remote_side_without_a_policy_has_no_attempt_variable(
        remote: InProcessConnection, tmp_path: Path) -> None:
    ex = client("local", tmp_path)
    job = failing_once(tmp_path, "1")  # one attempt: never run again
    ex.submit(job)
    status = job.wait(WAIT)
    assert status is not None and status.state is JobState.FAILED and status.exit_code == 3
    assert (tmp_path / "runs").read_text() == "-\n"

