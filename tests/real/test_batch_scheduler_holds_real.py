"""Holds on the real Slurm and Grid Engine of this machine (run under
``flock -s /tmp/psij-test-schedulers.lock``): a job submitted on hold (``sbatch --hold``,
``qsub -h``) or put on hold while it waits (``scontrol hold``, ``qhold``) is reported QUEUED
with ``held_by: "scheduler"`` and said again when released (``scontrol release``, ``qrls``);
a flow handle counts such instances as ``held``, not ``waiting``."""

import subprocess
import time
import xml.etree.ElementTree as ET
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch._batch_config import BatchSchedulerExecutorConfig
from support.flow_helpers import Service, wait_for

WAIT = timedelta(seconds=120)
SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]
# Submitted on hold; kept waiting (a start time far away) so that a hold can be put on it.
ON_HOLD = {"slurm": {"slurm.hold": True}, "sge": {"sge.h": True}}
LATER = {"slurm": {"slurm.begin": "now+1hour"}, "sge": {"sge.a": "203001010000"}}
HOLD = {"slurm": ["scontrol", "hold"], "sge": ["qhold"]}
RELEASE = {"slurm": ["scontrol", "release"], "sge": ["qrls"]}


def run(argv: List[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def held_by(job: Job) -> Any:
    return (job.status.metadata or {}).get("held_by")


def until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    return wait_for(what, check, timeout=timeout, every=0.1)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_holds_are_reported_and_their_release_too(name: str, tmp_path: Path) -> None:
    ex = JobExecutor.get_instance(name, config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "w", queue_polling_interval=0.5,
        initial_queue_polling_delay=0.2))
    submitted_held = Job(JobSpec("/bin/true", attributes=JobAttributes(
        duration=timedelta(minutes=2), custom_attributes=ON_HOLD[name])))
    held_later = Job(JobSpec("/bin/true", attributes=JobAttributes(
        duration=timedelta(minutes=2), custom_attributes=LATER[name])))
    seen: List[Any] = []
    submitted_held._add_watcher(lambda j, st: seen.append(
        (st.state, (st.metadata or {}).get("held_by"))))
    try:
        ex.submit(submitted_held)
        ex.submit(held_later)
        until("the submitted hold seen", lambda: held_by(submitted_held) == "scheduler")
        assert "held by the scheduler" in (submitted_held.status.message or "")
        time.sleep(1.5)  # a few polls: the job not yet held is not said to be
        assert held_by(held_later) is None and held_later.status.state is JobState.QUEUED
        run([*HOLD[name], str(held_later.native_id)])
        until("the later hold seen", lambda: held_by(held_later) == "scheduler")
        run([*RELEASE[name], str(submitted_held.native_id)])
        st = submitted_held.wait(WAIT)
        assert st is not None and st.state is JobState.COMPLETED, st
        assert (JobState.QUEUED, "scheduler") in seen
    finally:
        held_later.cancel()
        held_later.wait(WAIT)
        ex.close()


def _native_ids(name: str, prefix: str) -> List[str]:
    """The scheduler's ids of the jobs whose name starts with ``prefix``."""
    if name == "slurm":
        out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                             check=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.split()[1:2]
                and line.split()[1].startswith(prefix)]
    out = subprocess.run(["qstat", "-xml"], capture_output=True, text=True, check=True).stdout
    return [j.findtext("JB_job_number") or "" for j in ET.fromstring(out).iter("job_list")
            if (j.findtext("JB_name") or "").startswith(prefix)]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_flow_handle_counts_held_instances_as_held(name: str, tmp_path: Path) -> None:
    service = Service(tmp_path / "state", str(tmp_path / "flow.sock"),
                      extra=["--poll-interval", "0.5"])
    service.start()
    try:
        with service.client() as client:
            spec: Dict[str, Any] = {"executable": "/bin/sleep", "arguments": ["300"],
                                    "attributes": {"duration": 600,
                                                   "custom_attributes": ON_HOLD[name]}}
            handle = client.create(spec, 2, name, lease=300, provisioning_lease=300)["handle"]
            until("2 held, none waiting", lambda: (client.status(handle)["held"],
                                                   client.status(handle)["waiting"]) == (2, 0))
            ids = until("both in the queue", lambda: _native_ids(name, f"flow-{handle}-")
                        if len(_native_ids(name, f"flow-{handle}-")) == 2 else None)
            run([*RELEASE[name], ids[0]])
            until("one held, one running", lambda: (
                client.status(handle)["held"], client.status(handle)["provisioned"]) == (1, 1),
                timeout=90)
            client.destroy(handle)
    finally:
        service.destroy_all()
        service.stop()
