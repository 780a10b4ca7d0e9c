"""GPUs of a pilot's own node: found (a fake ``nvidia-smi`` first on PATH, the visible-devices
variables) or given (``--gpus``, ``PilotJobExecutorConfig.gpus``), handed to tasks by id in
their vendor's variables, never to two tasks at once; other nodes keep the count their
allocation gives. Real pilots: in this process (the ``pilot`` executor) and ``psij pilot
serve``."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, JobStatus, ResourceSpecV1
from psij.executors._gpu_detect import AMD, NVIDIA, GpuSet
from psij.executors.pilot.allocation import (
    allocation_from_options,
    configured_allocation,
    with_local_gpus,
)
from psij.executors.pilot.executor import PilotJobExecutorConfig
from psij.executors.pilot.service import answering
from psij.executors.pilot.task_environment import pilot_environment
from psij.executors.pilot.tasks import TaskShare

WAIT = timedelta(seconds=60)
_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
              "SLURM_JOB_ID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")


def final(job: Job) -> JobStatus:
    status = job.wait(WAIT)
    assert status is not None, f"job {job.native_id} did not end in time"
    return status


def fake_gpu_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int) -> Path:
    """This process sees a node with ``gpus`` NVIDIA GPUs: an ``nvidia-smi`` that lists them,
    first on PATH, and no visible-devices or Slurm variable. Its folder is returned."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i:04d})'\n" for i in range(gpus))
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{lines}")
    smi.chmod(0o700)
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


def gpu_job(tmp_path: Path, name: str, gpus: int = 1) -> Job:
    """A job that writes the GPUs it was given to ``name.out`` and, while it runs, holds a
    folder per GPU id: a second job given the same id at the same time finds it taken
    (``mkdir`` is atomic) and writes ``CLASH`` instead."""
    held = tmp_path / "held"
    script = (f'ids="$CUDA_VISIBLE_DEVICES"; for g in $(echo "$ids" | tr , " "); do '
              f'mkdir "{held}/$g" 2>/dev/null || echo CLASH >> "{tmp_path}/clashes"; done; '
              f'echo "$ids" > "{tmp_path}/{name}.out"; sleep 0.2; '
              f'for g in $(echo "$ids" | tr , " "); do rmdir "{held}/$g"; done')
    return Job(JobSpec("/bin/sh", ["-c", script],
                       resources=ResourceSpecV1(gpu_cores_per_process=gpus)))


def run_jobs(executor: JobExecutor, jobs: List[Job]) -> List[JobState]:
    for job in jobs:
        executor.submit(job)
    return [final(job).state for job in jobs]


@pytest.fixture
def held(tmp_path: Path) -> Path:
    (tmp_path / "held").mkdir()
    return tmp_path / "held"


# -- in-process pilot ---------------------------------------------------------------------------


def test_four_one_gpu_tasks_on_a_two_gpu_node_each_get_one_gpu_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: Path) -> None:
    fake_gpu_node(tmp_path, monkeypatch, 2)
    ex = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(cores=8))
    try:
        jobs = [gpu_job(tmp_path, f"t{i}") for i in range(4)]
        assert run_jobs(ex, jobs) == [JobState.COMPLETED] * 4
    finally:
        ex.close()
    seen = [(tmp_path / f"t{i}.out").read_text().strip() for i in range(4)]
    assert sorted(set(seen)) <= ["0", "1"] and len(seen) == 4  # each exactly one id
    assert not (tmp_path / "clashes").exists()  # never two at once on the same id


def test_eight_tasks_on_a_one_gpu_node_run_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: Path) -> None:
    fake_gpu_node(tmp_path, monkeypatch, 1)
    ex = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(cores=8))
    try:
        assert run_jobs(ex, [gpu_job(tmp_path, f"t{i}") for i in range(8)]) \
            == [JobState.COMPLETED] * 8
    finally:
        ex.close()
    assert [(tmp_path / f"t{i}.out").read_text() for i in range(8)] == ["0\n"] * 8
    assert not (tmp_path / "clashes").exists()


def test_a_task_asking_more_gpus_than_the_node_has_fails_saying_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: Path) -> None:
    fake_gpu_node(tmp_path, monkeypatch, 2)
    ex = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(cores=8))
    try:
        job = gpu_job(tmp_path, "big", gpus=3)
        ex.submit(job)
        status = final(job)
    finally:
        ex.close()
    assert status.state is JobState.FAILED
    message = status.message or ""
    assert "of 1 core, 3 GPUs" in message and "which can never fit" in message
    assert "(8 cores, 2 GPUs," in message


def test_the_config_names_the_gpus_and_amd_tasks_get_the_rocm_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "4,5,6")  # an AMD node: the vendor
    ex = JobExecutor.get_instance("pilot", config=PilotJobExecutorConfig(cores=4,
                                                                         gpus="6,4"))
    out = tmp_path / "amd.out"
    job = Job(JobSpec("/bin/sh", ["-c", f'echo "$ROCR_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES '
                                        f'${{CUDA_VISIBLE_DEVICES--}}" > {out}'],
                      resources=ResourceSpecV1(gpu_cores_per_process=2)))
    try:
        assert run_jobs(ex, [job]) == [JobState.COMPLETED]
    finally:
        ex.close()
    assert out.read_text() == "6,4 0,1 -\n"


@pytest.mark.parametrize("value, error, words", [
    (-1, ValueError, "got -1"),
    (5000, ValueError, "a count from 0 to 4096"),
    ("1,1", ValueError, "GPU 1 is listed twice"),
    ("", ValueError, "'' is not a GPU id"),
    (1.5, TypeError, "got float"),
    ("\udcff", ValueError, "is not a GPU id"),
])
def test_bad_gpus_in_the_pilot_config_are_refused_naming_the_field(
        value: object, error: type, words: str) -> None:
    with pytest.raises(error) as info:
        PilotJobExecutorConfig(gpus=value)  # type: ignore[arg-type]
    assert str(info.value).startswith("PilotJobExecutorConfig.gpus: ")
    assert words in str(info.value)


# -- allocations --------------------------------------------------------------------------------


SLURM = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)",
         "SLURMD_NODENAME": "n1", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_ID": "7"}


def test_in_a_slurm_job_the_own_node_gets_its_ids_and_the_others_keep_their_count() -> None:
    found = allocation_from_options(None, None, dict(SLURM, CUDA_VISIBLE_DEVICES="1,3"))
    assert [(n.name, n.gpus) for n in found.nodes] == [("n1", 2), ("n2", 2)]
    assert found.local_gpus == GpuSet(("1", "3"), NVIDIA, "CUDA_VISIBLE_DEVICES")
    assert found.gpu_ids("n1", [1]) == GpuSet(("3",), NVIDIA, "CUDA_VISIBLE_DEVICES")
    assert found.gpu_ids("n2", [1]) is None  # an agent's node: indices, as before
    # Nothing found on the own node: it keeps the allocation's count, as ids.
    plain = allocation_from_options(None, None, dict(SLURM, CUDA_VISIBLE_DEVICES=""))
    assert plain.local_gpus == GpuSet(("0", "1"), NVIDIA, "the slurm allocation")


def test_a_given_gpu_list_replaces_what_was_found_and_needs_an_own_node() -> None:
    given = allocation_from_options(2, None, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, gpus="3,1")
    assert given.nodes[0].gpus == 2
    assert given.local_gpus == GpuSet(("3", "1"), NVIDIA, "--gpus")
    assert given.describe_gpus() == "2 GPUs (nvidia: 3, 1) from --gpus"
    fewer = allocation_from_options(2, None, {"CUDA_VISIBLE_DEVICES": "5,6,7"}, gpus="2")
    assert fewer.local_gpus is not None and fewer.local_gpus.ids == ("5", "6")
    with pytest.raises(ValueError, match="--gpus: no node of this pilot is the one it runs"):
        allocation_from_options(None, "vn1:1,vn2:1", {"CUDA_VISIBLE_DEVICES": ""}, gpus="1")
    with pytest.raises(ValueError, match="--gpus: GPU 0 is listed twice"):
        allocation_from_options(2, None, {}, gpus="0,0")


def test_a_share_gets_the_ids_of_its_node_in_its_vendors_variables() -> None:
    share = TaskShare(("n1",), (1,), ((0,),), ((1,),))
    cuda = pilot_environment("t", share, 1, False, GpuSet(("GPU-b",), NVIDIA))
    assert cuda["CUDA_VISIBLE_DEVICES"] == "GPU-b"
    rocm = pilot_environment("t", share, 1, False, GpuSet(("7",), AMD))
    assert (rocm["ROCR_VISIBLE_DEVICES"], rocm["HIP_VISIBLE_DEVICES"]) == ("7", "0")
    assert "CUDA_VISIBLE_DEVICES" not in rocm
    legacy = pilot_environment("t", share, 1, False)
    assert legacy["CUDA_VISIBLE_DEVICES"] == "1"


def test_with_local_gpus_leaves_an_allocation_without_an_own_node_alone() -> None:
    remote = configured_allocation([("a", 1), ("b", 1)], None)
    assert with_local_gpus(remote, GpuSet(("0",))) is remote


# -- psij pilot serve ---------------------------------------------------------------------------


class Served:
    """A ``psij pilot serve`` process on a short socket path, its stderr kept in a file."""

    def __init__(self, folder: Path, env: Dict[str, str], *options: str) -> None:
        self.socket = str(folder / "pilot.sock")
        self.log = folder / "serve.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "psij", "pilot", "serve", "--socket", self.socket,
                 "--cores", "4", "--wd", str(folder / "wd"), *options],
                stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + 30
        while not answering(self.socket, timeout=1):
            assert self.proc.poll() is None, f"serve exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, "the pilot did not start"
            time.sleep(0.02)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        return self.log.read_text()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are limited to about 100 bytes: pytest's tmp_path is often longer.
    folder = Path(tempfile.mkdtemp(prefix="pg"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def serve_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int) -> Dict[str, str]:
    fake_gpu_node(tmp_path, monkeypatch, gpus)
    return dict(os.environ)


def test_serve_prints_the_gpus_it_found_and_hands_them_out(
        tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch, held: Path) -> None:
    served = Served(short_dir, serve_env(tmp_path, monkeypatch, 2))
    try:
        served.wait_until_serving()
        ex = JobExecutor.get_instance("pilot", url=f"unix://{served.socket}")
        jobs = [gpu_job(tmp_path, f"t{i}") for i in range(4)]
        assert run_jobs(ex, jobs) == [JobState.COMPLETED] * 4
        ex.close()
    finally:
        log = served.stop()
    assert "GPUs of this node: 2 GPUs (nvidia: 0, 1) from nvidia-smi -L" in log
    assert sorted({(tmp_path / f"t{i}.out").read_text() for i in range(4)}) <= ["0\n", "1\n"]
    assert not (tmp_path / "clashes").exists()


def test_serve_with_gpus_given_prints_and_uses_them(
        tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch, held: Path) -> None:
    served = Served(short_dir, serve_env(tmp_path, monkeypatch, 1), "--gpus", "GPU-a,GPU-b")
    try:
        served.wait_until_serving()
        ex = JobExecutor.get_instance("pilot", url=f"unix://{served.socket}")
        assert run_jobs(ex, [gpu_job(tmp_path, "both", gpus=2)]) == [JobState.COMPLETED]
        ex.close()
    finally:
        log = served.stop()
    assert "GPUs of this node: 2 GPUs (nvidia: GPU-a, GPU-b) from --gpus" in log
    assert (tmp_path / "both.out").read_text() == "GPU-a,GPU-b\n"


@pytest.mark.parametrize("command", [["serve", "--socket", "/nonexistent/s.sock"],
                                     ["run", "requests.json"]])
@pytest.mark.parametrize("value, words", [
    ("-3", "'-3' is not a GPU id"),
    ("0,0", "GPU 0 is listed twice"),
    ("4097", "a count from 0 to 4096"),
    ("0,x y", "'x y' is not a GPU id"),
])
def test_bad_gpus_options_are_refused_naming_the_option(
        tmp_path: Path, command: List[str], value: str, words: str) -> None:
    (tmp_path / "requests.json").write_text("[]")
    done = subprocess.run([sys.executable, "-m", "psij", "pilot", *command, f"--gpus={value}"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "--gpus" in done.stderr and words in done.stderr


def test_pilot_run_check_accepts_a_gpu_list(tmp_path: Path) -> None:
    (tmp_path / "requests.json").write_text("[]")
    done = subprocess.run([sys.executable, "-m", "psij", "pilot", "run", "requests.json",
                           "--check", "--gpus", "0,1"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr

