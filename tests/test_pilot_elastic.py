"""An elastic in-process pilot whose allocations are jobs of the ``local`` executor: it grows
as work waits, runs every task once on the joined nodes, gives idle allocations back, stops
asking after repeated failures, and refuses agents that do not hold its allocations' token."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors.pilot import _elastic
from psij.executors.pilot.agent import connect
from psij.executors.pilot.allocation_policy import AllocationPolicy
from psij.executors.pilot.executor import PilotJobExecutor, PilotJobExecutorConfig
from psij.executors.pilot.service import answering

_WAIT = 60.0  # a bound for what normally takes a second or two, on a loaded machine


def wait_for(what: Callable[[], bool], label: str) -> None:
    deadline = time.monotonic() + _WAIT
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {label} after {_WAIT} s")
        time.sleep(0.05)


def pilot(policy: AllocationPolicy) -> PilotJobExecutor:
    executor = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(
        cores=1, allocation_policy=policy))
    assert isinstance(executor, PilotJobExecutor)
    return executor


def test_the_pilot_grows_runs_every_task_once_and_gives_idle_allocations_back(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    policy = AllocationPolicy("local", max_allocations=2, cores_per_node=2, idle_timeout=0.5,
                              retry_delay=0)
    ex = pilot(policy)
    try:
        runs = tmp_path / "runs"
        jobs = [Job(JobSpec("/bin/sh", ["-c", f'echo t{i} >> "$1"; sleep 0.2', "sh",
                                        str(runs)])) for i in range(12)]
        for job in jobs:
            ex.submit(job)
        for job in jobs:
            job.wait()
        assert [job.status.state.name for job in jobs] == ["COMPLETED"] * 12
        lines = runs.read_text().split()
        assert sorted(lines) == sorted(f"t{i}" for i in range(12))  # each once
        status = ex.allocations()
        allocations = status["allocations"]
        assert [a["name"] for a in allocations] == ["a1", "a2"]  # the most: 2
        for a in allocations:
            assert a["asked_because"].startswith("backlog of ")
            assert a["native_id"] and len(a["nodes"]) == 1
            assert a["nodes"][0].startswith(a["name"] + "-")
        joined = {a["nodes"][0] for a in allocations}
        used = {job.status.metadata["nodes"] for job in jobs}
        assert used & joined  # tasks ran on the allocations' nodes
        # Idle: both are given back, and their jobs end.
        wait_for(lambda: all(a["state"] == "ended" for a in ex.allocations()["allocations"]),
                 "given back")
        for a in ex.allocations()["allocations"]:
            assert a["ended_because"].startswith("given back: idle for ")
        assert ex.allocations()["stopped"] is None
        # The token file is private to the user.
        folder = Path(status["folder"])
        assert (folder.stat().st_mode & 0o777) == 0o700
        assert (folder / "token").stat().st_mode & 0o777 == 0o600
    finally:
        ex.close()
    assert not (folder / "token").exists()


def test_submissions_refused_stop_the_asking_and_say_why(tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    ex = pilot(AllocationPolicy("no-such-executor", max_allocations=2, max_failures=2,
                                retry_delay=0))
    try:
        jobs = [Job(JobSpec("/bin/sleep", ["0.2"])) for _ in range(3)]
        for job in jobs:
            ex.submit(job)
        wait_for(lambda: ex.allocations()["stopped"] is not None, "stopped")
        why = ex.allocations()["stopped"]
        assert "after 2 failures in a row" in why and "no-such-executor" in why
        for job in jobs:  # the pilot's own node still runs them
            job.wait()
            assert job.status.state.name == "COMPLETED"
        allocations = ex.allocations()["allocations"]
        assert len(allocations) == 2
        assert all(a["state"] == "ended" and a["ended_because"].startswith(
            "its submission failed") for a in allocations)
    finally:
        ex.close()


def test_allocations_that_end_before_joining_stop_the_asking(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)

    def failing(*args: Any) -> JobSpec:
        return JobSpec("/bin/sh", ["-c", "exit 3"])

    monkeypatch.setattr(_elastic, "allocation_spec", failing)
    ex = pilot(AllocationPolicy("local", max_failures=2, retry_delay=0))
    try:
        job = Job(JobSpec("/bin/sleep", ["0.1"]))
        blocker = Job(JobSpec("/bin/sleep", ["30"]))
        ex.submit(blocker)  # the pilot's one core is busy: the next job waits
        ex.submit(job)
        wait_for(lambda: ex.allocations()["stopped"] is not None, "stopped")
        why = ex.allocations()["stopped"]
        assert "ended before its agents joined" in why and "code 3" in why
        assert f"{tmp_path}/.psij-allocations-" in why and "a2.out" in why
        ex.cancel(blocker)
        job.wait()
        assert job.status.state.name == "COMPLETED"
    finally:
        ex.close()


def _hello(address: str, message: Dict[str, Any]) -> bytes:
    """What the pilot answers a connection that says ``message``: b"" once it closes it."""
    sock = connect(address)
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
        sock.settimeout(_WAIT)
        return sock.recv(100)
    finally:
        sock.close()


def test_strangers_are_refused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    ex = pilot(AllocationPolicy("local", max_allocations=1, min_allocations=1,
                                cores_per_node=1, retry_delay=0))
    try:
        engine = ex._local_engine()
        wait_for(lambda: [a["state"] for a in ex.allocations()["allocations"]] == ["running"],
                 "running")  # the minimum, without work
        agents = engine._agents
        assert agents is not None and agents.join_token is not None
        address = agents.address
        base = {"op": "hello", "pid": os.getpid(), "cores": 4, "gpus": 0}
        # A wrong token, a right token for an allocation the pilot never asked for, and a
        # right one for a node the allocation has already: all closed without a word.
        refused: List[Dict[str, Any]] = [
            dict(base, node="x-1", allocation="a1", token="0" * 32),
            dict(base, node="x-2", allocation="a9", token=agents.join_token),
            dict(base, node="x-3", allocation="a1", token=agents.join_token),
            dict(base, node="x-4", allocation="a1", token=agents.join_token, cores=-1),
            {"op": "hello", "node": "x-5", "token": agents.join_token},
        ]
        for message in refused:
            assert _hello(address, message) == b""
        nodes = [n.name for n in engine.pool.nodes]
        assert not any(name.startswith("x-") for name in nodes)
    finally:
        ex.close()


def test_a_served_pilot_takes_a_policy_file_and_shows_its_allocations(
        tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="pj"))  # Unix socket paths are short
    try:
        policy = folder / "policy.json"
        policy.write_text(json.dumps({"executor": "local", "min_allocations": 1,
                                      "cores_per_node": 1, "retry_delay": 0}))
        bad = folder / "bad.json"
        bad.write_text(json.dumps({"executor": "local", "idle_timeout": -1}))
        command = [sys.executable, "-m", "psij", "pilot", "serve", "--cores", "1", "--wd",
                   str(folder / "wd")]
        refused = subprocess.run([*command, "--socket", str(folder / "b.sock"),
                                  "--allocation-policy", str(bad)], capture_output=True,
                                 text=True, timeout=_WAIT)
        assert refused.returncode == 1
        assert "AllocationPolicy.idle_timeout" in refused.stderr
        sock = str(folder / "p.sock")
        with open(folder / "serve.log", "wb") as log:
            served = subprocess.Popen([*command, "--socket", sock, "--allocation-policy",
                                       str(policy)], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: answering(sock, timeout=1), "serving")
            ex = JobExecutor.get_instance("pilot", url=f"unix://{sock}")
            assert isinstance(ex, PilotJobExecutor)
            wait_for(lambda: [a["state"] for a in ex.allocations()["allocations"]]
                     == ["running"], "running")
            shown = subprocess.run([sys.executable, "-m", "psij", "pilot", "status",
                                    "--socket", sock], capture_output=True, text=True,
                                   timeout=_WAIT)
            assert shown.returncode == 0, shown.stderr
            assert "a1  running" in shown.stdout and "to keep the minimum of 1" in shown.stdout
            ex.close()
        finally:
            served.send_signal(signal.SIGTERM)
            served.wait(_WAIT)
        assert served.returncode == 0, (folder / "serve.log").read_text()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_pilot_status_of_a_pilot_that_does_not_answer(tmp_path: Path) -> None:
    shown = subprocess.run([sys.executable, "-m", "psij", "pilot", "status", "--socket",
                            str(tmp_path / "none.sock")], capture_output=True, text=True,
                           timeout=_WAIT)
    assert shown.returncode == 1 and "psij pilot status:" in shown.stderr


def test_an_allocation_job_names_the_token_file_never_the_token(tmp_path: Path) -> None:
    policy = AllocationPolicy("slurm", nodes=3, cores_per_node=8, gpus_per_node=2,
                              duration=1800, queue="debug", account="p1",
                              custom_attributes={"slurm.constraint": "gpu"})
    spec = _elastic.allocation_spec(policy, "a4", "tcp:login1:4000", tmp_path / "token",
                                    "/usr/bin/python3", tmp_path)
    assert spec.executable == "/usr/bin/python3"
    assert spec.arguments == ["-m", "psij.executors.pilot.agent", "--connect",
                              "tcp:login1:4000", "--token-file", str(tmp_path / "token"),
                              "--allocation", "a4", "--cores", "8", "--gpus", "2"]
    assert spec.environment in (None, {})
    assert spec.launcher == "srun"  # one agent per node
    resources = spec.resources
    assert resources is not None
    assert (resources.node_count, resources.processes_per_node,  # type: ignore[attr-defined]
            resources.cpu_cores_per_process,  # type: ignore[attr-defined]
            resources.gpu_cores_per_process) == (3, 1, 8, 2)  # type: ignore[attr-defined]
    attributes = spec.attributes
    assert attributes.duration.total_seconds() == 1800
    assert (attributes.queue_name, attributes.account) == ("debug", "p1")
    assert attributes.custom_attributes == {"slurm.constraint": "gpu"}
    assert str(spec.stdout_path) == str(tmp_path / "a4.out")
    one = _elastic.allocation_spec(AllocationPolicy("local"), "a1", "unix:/x", tmp_path / "t",
                                   "python3", tmp_path)
    assert one.launcher == "single" and "--cores" not in one.arguments


def test_closing_cancels_the_tasks_on_allocations_and_gives_them_back(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    ex = pilot(AllocationPolicy("local", min_allocations=1, cores_per_node=1, retry_delay=0))
    try:
        wait_for(lambda: [a["state"] for a in ex.allocations()["allocations"]] == ["running"],
                 "running")
        jobs = [Job(JobSpec("/bin/sleep", ["30"])) for _ in range(2)]
        for job in jobs:
            ex.submit(job)
        for job in jobs:
            job.wait(target_states=[JobState.ACTIVE])
        node = ex.allocations()["allocations"][0]["nodes"][0]
        assert node in {job.status.metadata["nodes"] for job in jobs}
        wait_for(lambda: ex.allocations()["allocations"][0]["running_tasks"] == 1,
                 "counted: the task running on a1")
        native = int(ex.allocations()["allocations"][0]["native_id"])
    finally:
        ex.close()
    for job in jobs:
        assert job.wait(timeout=_WAIT).state is JobState.CANCELED  # type: ignore[union-attr]

    def gone() -> bool:
        try:
            os.kill(native, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, "ended: the allocation's job")


def test_an_allocation_cancelled_from_outside_fails_its_tasks_and_another_is_asked_for(
        tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    ex = pilot(AllocationPolicy("local", max_allocations=1, cores_per_node=1, max_failures=5,
                                retry_delay=0))
    try:
        marks = tmp_path / "marks"
        marks.mkdir()
        jobs = [Job(JobSpec("/bin/sh", ["-c", f'echo $$ > {marks}/{i}; exec sleep 60']))
                for i in range(3)]
        for job in jobs:
            ex.submit(job)

        def on_a1() -> bool:
            return any(job.status.state is JobState.ACTIVE and job.status.metadata.get(
                "nodes", "").startswith("a1-") for job in jobs)

        wait_for(on_a1, "running on a1")
        victim = next(job for job in jobs if job.status.metadata.get(
            "nodes", "").startswith("a1-"))
        wait_for(lambda: (marks / str(jobs.index(victim))).exists(), "started")
        task_pid = int((marks / str(jobs.index(victim))).read_text())
        native = int(ex.allocations()["allocations"][0]["native_id"])
        os.kill(native, 15)  # as a scheduler's cancel does to the allocation's job
        status = victim.wait(timeout=_WAIT)
        assert status is not None and status.state is JobState.FAILED
        # The agent stopped it as its job was cancelled (or, had it died first, the node is
        # lost): either way it failed, saying why.
        message = status.message or ""
        assert "killed by SIGTERM" in message or ("is lost" in message and "a1-" in message)

        def task_gone() -> bool:
            try:
                os.kill(task_pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(task_gone, "ended: the task of the cancelled allocation")
        # The third job still waits for room: a2 is asked for and takes it.
        wait_for(lambda: [a["name"] for a in ex.allocations()["allocations"]] == ["a1", "a2"],
                 "asked for a2")
        a1 = ex.allocations()["allocations"][0]
        assert a1["state"] == "ended" and "code 143" in a1["ended_because"]
        # The job left waiting runs on a2 (the pilot's own core is still busy).
        wait_for(lambda: any(job.status.state is JobState.ACTIVE and job.status.metadata.get(
            "nodes", "").startswith("a2-") for job in jobs), "running on a2")
    finally:
        ex.close()
