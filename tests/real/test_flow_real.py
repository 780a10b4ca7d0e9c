"""Flows on the real Slurm and the real Grid Engine of this machine (run under
``flock -s /tmp/psij-test-schedulers.lock``): the count is kept while instances end, are
killed or removed from the queue; ``longest`` victims; destroy empties the queue; the two
leases of a client that went away."""

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from support.flow_helpers import Service, processes_with, wait_for

POLL = 2.0
SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]
NO_THROTTLE = ('default_intervals={"no_problem": 0, "unknown": 0, "failed_init": 0, '
               '"failed_after_work": 0, "never_claimed": 0, "no_work": 0}')


def _need(name: str) -> None:
    if shutil.which("sbatch" if name == "slurm" else "qsub") is None:
        pytest.fail(f"{name} is not installed here: start it with tests/setup")


def queued(name: str, prefix: str, where: Tuple[Path, str]) -> Dict[str, str]:
    """Native id -> state of this test's jobs on the scheduler: named with ``prefix`` and,
    since every service names its handles f1, f2, ... (another service on the same scheduler,
    another test run, has jobs of the same names), working under ``area`` (the service's state
    directory: Slurm) or with ``marker`` (the test's, in the job's arguments) in their script
    (Grid Engine, whose jobs run in the home directory); ``where`` is (area, marker)."""
    area, marker = where
    jobs = {}
    if name == "slurm":
        under = str(area) + os.sep
        out = subprocess.run(["squeue", "-h", "-o", "%i %j %T %Z"], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            job_id, job_name, state, workdir = line.split(maxsplit=3)
            if job_name.startswith(prefix) and (workdir + os.sep).startswith(under):
                jobs[job_id] = "running" if state == "RUNNING" else state
        return jobs
    out = subprocess.run(["qstat", "-xml", "-u", "*"], capture_output=True, text=True,
                         check=True).stdout
    for job in ET.fromstring(out).iter("job_list"):
        job_name = job.findtext("JB_name") or ""
        job_id = job.findtext("JB_job_number") or ""
        if job_name.startswith(prefix) and marker in _sge_script(job_id):
            state = job.findtext("state") or ""
            jobs[job_id] = "running" if state == "r" else state
    return jobs


def _sge_script(job_id: str) -> str:
    """The text of a Grid Engine job's script ("" when the job or its file is gone)."""
    out = subprocess.run(["qstat", "-j", job_id], capture_output=True, text=True).stdout
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key == "script_file":
            try:
                return Path(value.strip()).read_text(errors="replace")
            except OSError:
                return ""
    return ""


def running(name: str, prefix: str, where: Tuple[Path, str]) -> List[str]:
    return sorted(j for j, s in queued(name, prefix, where).items() if s == "running")


def remove(name: str, job_id: str) -> None:
    argv = ["scancel", job_id] if name == "slurm" else ["qdel", job_id]
    subprocess.run(argv, capture_output=True, check=True)


def remove_a_running_job(name: str, prefix: str, where: Tuple[Path, str]) -> str:
    """Removes one of this test's running jobs from the queue and returns its id. A job seen
    running may end on its own (or of a kill) before the removal reaches it, and then the
    scheduler refuses to remove it (Grid Engine's ``qdel`` exits 1): the next one is tried,
    and a refusal for a job still queued fails the test."""
    for job_id in running(name, prefix, where):
        argv = ["scancel", job_id] if name == "slurm" else ["qdel", job_id]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode == 0:
            return job_id
        assert job_id not in queued(name, prefix, where), (argv, done.stderr)
    raise AssertionError("no running job of the test left to remove")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path / "state", str(tmp_path / "flow.sock"),
                  ["aggregate_problem_interval=0", NO_THROTTLE, "max_submit_rate=1000"],
                  extra=["--poll-interval", str(POLL)])
    svc.start()
    yield svc
    svc.destroy_all()
    time.sleep(1)  # the cancellations run on the service's workers
    svc.stop()


# The schedulers here are shared by other tests: ours go first, so that counts and times
# measure the flow, not the queue (root may raise a job's priority on both).
PRIORITY = {"slurm.nice": -10000, "sge.p": 1000}


def _spec(marker: str, command: str) -> Dict[str, object]:
    return {"executable": "/bin/sh", "arguments": ["-c", command + "; :", marker],
            "attributes": {"duration": 300, "custom_attributes": PRIORITY}}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_handle_of_6_keeps_6_running_through_exits_kills_and_removals(
        name: str, service: Service) -> None:
    _need(name)
    marker = f"psij-flow-six-{secrets.token_hex(3)}"
    with service.client() as client:
        handle = client.create(_spec(marker, "sleep $(( $$ % 10 + 12 ))"), 6, name,
                               lease=300, provisioning_lease=300)["handle"]
        prefix = f"flow-{handle}-"
        where = (service.state_dir, marker)
        wait_for("6 running", lambda: client.status(handle)["provisioned"] == 6, timeout=40)
        # Instances end on their own at random; the count comes back to 6 each time.
        wait_for("4 instances ended and replaced",
                 lambda: len(client.instances(handle)) >= 4
                 and client.status(handle)["provisioned"] == 6, timeout=40)
        assert len(running(name, prefix, where)) <= 6
        # kill -9 two instances and remove one from the queue: all three replaced.
        victims = processes_with(marker)[:2]
        assert len(victims) == 2
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        removed = remove_a_running_job(name, prefix, where)
        wait_for("6 running again, without the removed job",
                 lambda: client.status(handle)["provisioned"] == 6
                 and removed not in running(name, prefix, where)
                 and len(running(name, prefix, where)) == 6, timeout=40)
        started = time.monotonic()
        client.destroy(handle)
        wait_for("the queue empty of the handle's jobs", lambda: not queued(name, prefix, where),
                 timeout=POLL + 3, every=0.1)
        assert time.monotonic() - started <= POLL + 3


@pytest.mark.parametrize("name", SCHEDULERS)
def test_shrink_longest_keeps_the_youngest(name: str, service: Service) -> None:
    _need(name)
    marker = f"psij-flow-longest-{secrets.token_hex(3)}"
    with service.client() as client:
        handle = client.create(_spec(marker, "sleep 300"), 1, name, lease=300,
                               provisioning_lease=300)["handle"]
        prefix = f"flow-{handle}-"
        where = (service.state_dir, marker)
        order: List[str] = []
        for count in range(1, 5):
            if count > 1:
                assert client.grow(handle, 1)["accepted"] is True
            seen = list(order)
            new = wait_for(f"instance {count} running", lambda seen=seen: [
                j for j in running(name, prefix, where) if j not in seen], timeout=30)
            order += sorted(new)
            # Seen running by the service too, then a poll interval: distinct start times.
            wait_for(f"{count} provisioned",
                     lambda count=count: client.status(handle)["provisioned"] == count)
            time.sleep(POLL + 0.5)
        reply = client.shrink(handle, 2, victims="longest", signal="SIGTERM", grace=2)
        assert reply["count"] == 2
        wait_for(f"the two youngest of {order} left (victims {reply.get('victims')})",
                 lambda: running(name, prefix, where) == sorted(order[2:]), timeout=POLL + 10)
        time.sleep(POLL + 1)
        assert running(name, prefix, where) == sorted(order[2:])
        assert client.status(handle)["requested"] == 2
        client.destroy(handle)
        wait_for("queue empty", lambda: not queued(name, prefix, where), timeout=POLL + 3)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_client_gone_provisioning_lease_stops_and_cleanup_lease_clears(
        name: str, service: Service, tmp_path: Path) -> None:
    _need(name)
    marker = f"psij-flow-lease-{secrets.token_hex(3)}"
    # The client is a separate process that creates the handle and goes away.
    env = dict(os.environ, PSIJ_FLOW_SOCKET=service.socket)
    made = subprocess.run(
        [sys.executable, "-m", "psij", "flow",
         "create", "--count", "2", "--executor", name, "--lease", "25",
         "--provisioning-lease", "10", "--attr", "duration=300", "--attr",
         "slurm.nice=-10000", "--attr", "sge.p=1000", "--", "/bin/sh", "-c",
         "sleep 300; :", marker], env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    handle = json.loads(made.stdout)["handle"]
    prefix = f"flow-{handle}-"
    where = (service.state_dir, marker)
    with service.client() as client:
        wait_for("2 running", lambda: client.status(handle)["provisioned"] == 2, timeout=30)
        wait_for("provisioning lease expired",
                 lambda: client.status(handle)["provisioning_remaining"] <= 0, timeout=15)
        remove(name, running(name, prefix, where)[0])
        time.sleep(2 * POLL + 2)
        status = client.status(handle)
        assert status["valid"] is True
        assert len(queued(name, prefix, where)) == 1, queued(name, prefix, where)  # not replaced
        wait_for("cleanup lease expired: everything cleared",
                 lambda: not queued(name, prefix, where) and not client.status(handle)["valid"],
                 timeout=30)
        assert client.status(handle).get("reason") == "lease_expired"


@pytest.mark.parametrize("name", SCHEDULERS)
def test_service_killed_and_restarted_takes_its_jobs_back_without_duplicates(
        name: str, service: Service) -> None:
    _need(name)
    marker = f"psij-flow-restart-{secrets.token_hex(3)}"
    with service.client() as client:
        handle = client.create(_spec(marker, "sleep 300"), 2, name, lease=300,
                               provisioning_lease=300)["handle"]
        short = client.create(_spec(marker + "-short", "exit 3"), 1, name, lease=300,
                              provisioning_lease=300)["handle"]
        prefix = f"flow-{handle}-"
        where = (service.state_dir, marker)
        wait_for("2 running", lambda: client.status(handle)["provisioned"] == 2, timeout=40)
        wait_for("2 ended records", lambda: len(client.instances(short)) >= 2, timeout=40)
        before = running(name, prefix, where)
        leases = client.status(handle)
        records = {i["id"] for i in client.instances(short)}
    service.kill9()
    service.start()
    with service.client() as client:
        assert {h["handle"] for h in client.list()} == {handle, short}
        client.destroy(short)
        after = client.status(handle)
        assert after["requested"] == 2
        assert leases["lease_remaining"] - 60 < after["lease_remaining"] \
            <= leases["lease_remaining"]
        assert records <= {i["id"] for i in client.instances(short)}
        wait_for("re-attached as running", lambda: client.status(handle)["provisioned"] == 2,
                 timeout=POLL + 10)
        for _ in range(int(POLL * 2 / 0.5) + 1):  # nothing new submitted meanwhile
            assert sorted(queued(name, prefix, where)) == before
            time.sleep(0.5)
        # The jobs taken back are followed: one removed from the queue is replaced.
        remove(name, before[0])
        wait_for("replaced", lambda: len(running(name, prefix, where)) == 2
                 and before[0] not in queued(name, prefix, where), timeout=30)
        client.destroy(handle)
