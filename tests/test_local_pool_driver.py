"""The local executor with a resource pool (``LocalJobExecutorConfig(resource_pool=...)``), run
for real: jobs write lines to a log when they start and end, and the order and overlap of
those lines show what the pool let run together."""

import math
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import psij.registry
from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobExecutor,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
)
from psij.executors.local import LocalJobExecutor, LocalJobExecutorConfig
from psij.executors.local._pool_driver import WAITING_MESSAGE, machine_capacity

WAIT = timedelta(seconds=60)
MIB = 2 ** 20


def executor(tmp_path: Path, pool: Any = False) -> JobExecutor:
    return JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "w", cancel_grace_period=1.0, resource_pool=pool))


def logged(tmp_path: Path, name: str, priority: Optional[float] = None, cores: int = 1,
           memory: Optional[int] = None, hold: str = "sleep 0.2") -> Job:
    """A job that logs ``start name``, runs ``hold``, then logs ``end name``."""
    log = tmp_path / "log"
    attrs = JobAttributes(custom_attributes=None if priority is None
                          else {"psij.priority": priority})
    return Job(JobSpec("/bin/sh", ["-c", f"echo start {name} >> {log}; {hold}; "
                                         f"echo end {name} >> {log}"],
                       resources=ResourceSpecV1(cpu_cores_per_process=cores, memory=memory),
                       attributes=attrs))


def until(path: Path) -> str:
    """A shell loop that waits (at most 30 s, then fails) for ``path`` to exist."""
    return (f"i=0; while [ ! -e {path} ]; do i=$((i+1)); [ $i -gt 600 ] && exit 1; "
            "sleep 0.05; done")


def events(tmp_path: Path) -> List[str]:
    return (tmp_path / "log").read_text().splitlines()


def most_at_once(lines: List[str]) -> int:
    running, most = 0, 0
    for line in lines:
        running += 1 if line.startswith("start ") else -1
        most = max(most, running)
    return most


def starts(lines: List[str]) -> List[str]:
    return [line.split()[1] for line in lines if line.startswith("start ")]


def final(job: Job) -> JobStatus:
    st = job.wait(WAIT)
    assert st is not None, f"job {job.id} did not end"
    return st


def test_two_cores_run_two_jobs_at_a_time_in_priority_then_arrival_order(
        tmp_path: Path) -> None:
    ex = executor(tmp_path, {"cores": 2})
    gates = [tmp_path / f"gate{i}" for i in (0, 1)]
    # Two blockers that each wait for the other to start: both complete only if the pool runs
    # two jobs at once. The first is let go first and the second only when every other job has
    # ended, so the waiting jobs run one at a time, in the order the pool chose.
    blockers = [logged(tmp_path, f"b{i}", hold=f"touch {tmp_path}/b{i}; "
                       f"{until(tmp_path / f'b{1 - i}')}; {until(gates[i])}") for i in (0, 1)]
    for b in blockers:
        ex.submit(b)
    priorities = [1, 5, 3, 5, 0, 3.0]
    jobs = [logged(tmp_path, f"j{i}", p) for i, p in enumerate(priorities)]
    ex.submit_many(jobs)
    for i, j in enumerate(jobs):
        st = j.status
        assert st.state is JobState.QUEUED and j.native_id is None
        assert st.metadata == {"waiting_for": "local resources", "waiting": i + 1}
    gates[0].touch()
    for j in [blockers[0], *jobs]:
        assert final(j).state is JobState.COMPLETED
    gates[1].touch()
    assert final(blockers[1]).state is JobState.COMPLETED
    lines = events(tmp_path)
    assert most_at_once(lines) <= 2
    assert starts(lines)[2:] == ["j1", "j3", "j2", "j5", "j0", "j4"]
    ex.close()


def test_a_job_asking_more_cores_than_the_pool_has_runs_alone(tmp_path: Path) -> None:
    ex = executor(tmp_path, {"cores": 2})
    gate = tmp_path / "gate"
    first = logged(tmp_path, "first", hold=until(gate))
    big = logged(tmp_path, "big", cores=4)
    after = logged(tmp_path, "after")  # fits beside the first, but waits behind the big one
    for j in (first, big, after):
        ex.submit(j)
    assert big.status.state is JobState.QUEUED and after.status.state is JobState.QUEUED
    gate.touch()
    for j in (first, big, after):
        assert final(j).state is JobState.COMPLETED
    assert events(tmp_path) == ["start first", "end first", "start big", "end big",
                                "start after", "end after"]
    ex.close()


@pytest.mark.parametrize("asks", ["memory", "tmp", "gpus"])
def test_a_job_asking_more_of_any_resource_than_the_pool_has_runs_alone(
        tmp_path: Path, asks: str) -> None:
    """The pool has 4 cores (and its memory, disk and 2 GPUs); the big job asks for 2**50
    bytes, or 3 GPUs: it waits for the running job (which asks for none of it) to end, and the
    next one waits for it."""
    ex = executor(tmp_path, {"cores": 4, "gpus": 2})
    gate = tmp_path / "gate"
    first = logged(tmp_path, "first", hold=until(gate))
    big = logged(tmp_path, "big")
    assert big.spec is not None and isinstance(big.spec.resources, ResourceSpecV1)
    if asks == "memory":
        big.spec.resources.memory = 1 << 50
    elif asks == "tmp":
        big.spec.attributes.custom_attributes = {"psij.tmp": 1 << 50}
    else:
        big.spec.resources.gpu_cores_per_process = 3
    after = logged(tmp_path, "after")
    for j in (first, big, after):
        ex.submit(j)
    assert big.status.state is JobState.QUEUED and after.status.state is JobState.QUEUED
    gate.touch()
    for j in (first, big, after):
        assert final(j).state is JobState.COMPLETED
    assert events(tmp_path) == ["start first", "end first", "start big", "end big",
                                "start after", "end after"]
    ex.close()


def gpu_job(tmp_path: Path, name: str, gpus: Optional[int], hold: str = "sleep 0.2",
            environment: Optional[Dict[str, str]] = None) -> Job:
    """A job that logs ``start name <its CUDA_VISIBLE_DEVICES or ->``."""
    log = tmp_path / "log"
    return Job(JobSpec("/bin/sh", ["-c", f"echo start {name} ${{CUDA_VISIBLE_DEVICES--}} "
                                         f">> {log}; {hold}; echo end {name} >> {log}"],
                       resources=ResourceSpecV1(process_count=1, gpu_cores_per_process=gpus),
                       environment=environment))


def test_gpu_jobs_get_their_own_gpus_in_cuda_visible_devices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    ex = executor(tmp_path, {"cores": 8, "gpus": 2})
    gates = [tmp_path / f"g{i}" for i in range(2)]
    one = gpu_job(tmp_path, "one", 1, hold=until(gates[0]))
    two = gpu_job(tmp_path, "two", 1, hold=until(gates[1]))
    cpu = gpu_job(tmp_path, "cpu", None)  # asks for none: runs beside them, told nothing
    third = gpu_job(tmp_path, "third", 1)  # no GPU left: waits, though cores are free
    mine = gpu_job(tmp_path, "mine", 1, environment={"CUDA_VISIBLE_DEVICES": "7"})
    for j in (one, two, cpu, third):
        ex.submit(j)
    assert final(cpu).state is JobState.COMPLETED
    assert third.status.state is JobState.QUEUED
    gates[1].touch()
    assert final(two).state is JobState.COMPLETED
    assert final(third).state is JobState.COMPLETED  # on the GPU "two" gave back
    gates[0].touch()
    assert final(one).state is JobState.COMPLETED
    ex.submit(mine)
    assert final(mine).state is JobState.COMPLETED
    started = {line.split()[1]: line.split()[2] for line in events(tmp_path)
               if line.startswith("start ")}
    assert started == {"one": "0", "two": "1", "third": "1", "cpu": "-", "mine": "7"}
    ex.close()


def test_the_pools_gpus_are_those_this_process_may_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,GPU-ab12")
    assert machine_capacity().gpus == 3
    ex = executor(tmp_path, True)
    assert ex._pool.gpu_ids == ("3", "5", "GPU-ab12")  # type: ignore[attr-defined]
    both = gpu_job(tmp_path, "both", 2)
    ex.submit(both)
    assert final(both).state is JobState.COMPLETED
    assert events(tmp_path)[0] == "start both 3,5"
    ex.close()
    fewer = executor(tmp_path, {"gpus": 2})  # the first two of those found
    assert fewer._pool.gpu_ids == ("3", "5")  # type: ignore[attr-defined]
    more = executor(tmp_path, {"gpus": 4})  # more than found: counted from 0
    assert more._pool.gpu_ids == ("0", "1", "2", "3")  # type: ignore[attr-defined]
    fewer.close()
    more.close()


def test_a_pool_given_gpu_ids_hands_them_out_in_the_vendors_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An AMD machine (ROCR_VISIBLE_DEVICES says the vendor); the setting names two GPUs.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "0,1,2,3,4,5")
    ex = executor(tmp_path, {"cores": 4, "gpus": ["5", "2"]})
    assert ex._pool.gpu_ids == ("5", "2")  # type: ignore[attr-defined]
    out = tmp_path / "out"
    job = Job(JobSpec("/bin/sh", ["-c", f'echo "$ROCR_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES '
                                        f'${{CUDA_VISIBLE_DEVICES--}}" > {out}'],
                      resources=ResourceSpecV1(process_count=1, gpu_cores_per_process=1)))
    ex.submit(job)
    assert final(job).state is JobState.COMPLETED
    assert out.read_text() == "5 0 -\n"
    ex.close()


@pytest.mark.parametrize("environ, ids, variable", [
    ({"CUDA_VISIBLE_DEVICES": "0,2"}, ("0", "2"), "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": ""}, (), "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, (), "CUDA_VISIBLE_DEVICES"),
    ({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, ("1",), "CUDA_VISIBLE_DEVICES"),
    ({"ROCR_VISIBLE_DEVICES": "4, 6"}, ("4", "6"), "ROCR_VISIBLE_DEVICES"),
    ({"HIP_VISIBLE_DEVICES": "1"}, ("1",), "HIP_VISIBLE_DEVICES"),
])
def test_visible_gpus_are_read_as_the_drivers_read_them(
        environ: Dict[str, str], ids: Any, variable: str) -> None:
    from psij.executors.local._pool_gpus import detect_gpus

    found = detect_gpus(environ)
    assert (found.ids, found.source) == (ids, variable)


def test_cancel_of_a_waiting_job_ends_it_without_starting_it(tmp_path: Path) -> None:
    ex = executor(tmp_path, {"cores": 1})
    gate = tmp_path / "gate"
    blocker = logged(tmp_path, "blocker", hold=until(gate))
    waiting = logged(tmp_path, "waiting")
    seen: List[JobState] = []
    waiting.set_job_status_callback(lambda j, s: seen.append(s.state))
    ex.submit(blocker)
    ex.submit(waiting)
    assert waiting.status.state is JobState.QUEUED
    waiting.cancel()
    st = waiting.status
    assert st.state is JobState.CANCELED
    assert st.message == "cancelled while waiting for local resources"
    assert seen == [JobState.QUEUED, JobState.CANCELED]
    later = logged(tmp_path, "later")
    ex.submit(later)
    gate.touch()
    assert final(blocker).state is JobState.COMPLETED
    assert final(later).state is JobState.COMPLETED
    assert events(tmp_path) == ["start blocker", "end blocker", "start later", "end later"]
    assert waiting.native_id is None
    ex.close()


def test_a_waiting_job_that_cannot_run_fails_and_frees_its_place(tmp_path: Path) -> None:
    ex = executor(tmp_path, {"cores": 1})
    gate = tmp_path / "gate"
    blocker = logged(tmp_path, "blocker", hold=until(gate))
    missing = Job(JobSpec(str(tmp_path / "no-such-program")))
    after = logged(tmp_path, "after")
    for j in (blocker, missing, after):
        ex.submit(j)
    assert missing.status.state is JobState.QUEUED
    gate.touch()
    st = final(missing)
    assert st.state is JobState.FAILED and st.exit_code == 127
    assert final(after).state is JobState.COMPLETED
    assert final(blocker).state is JobState.COMPLETED
    ex.close()


def test_memory_demand_holds_back_what_does_not_fit(tmp_path: Path) -> None:
    ex = executor(tmp_path, {"cores": 8, "memory": 1000 * MIB})
    gate = tmp_path / "gate"
    m1 = logged(tmp_path, "m1", memory=600 * MIB, hold=until(gate))
    m2 = logged(tmp_path, "m2", memory=300 * MIB)  # 900 MiB in all: runs beside m1
    m3 = logged(tmp_path, "m3", memory=600 * MIB)  # 1200 MiB: waits for m1
    for j in (m1, m2, m3):
        ex.submit(j)
    assert final(m2).state is JobState.COMPLETED
    assert m1.status.state is JobState.ACTIVE
    assert m3.status.state is JobState.QUEUED
    gate.touch()
    assert final(m1).state is JobState.COMPLETED
    assert final(m3).state is JobState.COMPLETED
    lines = events(tmp_path)
    assert lines.index("start m3") > lines.index("end m1")
    ex.close()


def test_without_a_pool_every_job_starts_at_once(tmp_path: Path) -> None:
    ex = executor(tmp_path)
    assert ex.config.resource_pool is False  # type: ignore[attr-defined]
    n = 4
    # Each asks for more cores than this machine has, and waits for every other one to start:
    # all complete only if all ran together.
    jobs = [logged(tmp_path, f"j{i}", cores=machine_capacity().cores + 1,
                   hold=f"touch {tmp_path}/s{i}; "
                        + "; ".join(until(tmp_path / f"s{k}") for k in range(n)))
            for i in range(n)]
    ex.submit_many(jobs)
    for j in jobs:
        assert final(j).state is JobState.COMPLETED
    assert most_at_once(events(tmp_path)) == n
    ex.close()


def test_true_is_this_machines_capacity_and_missing_keys_are_the_machines() -> None:
    machine = machine_capacity()
    whole = LocalJobExecutor(config=LocalJobExecutorConfig(resource_pool=True))
    part = LocalJobExecutor(config=LocalJobExecutorConfig(resource_pool={"cores": 3, "tmp": 0}))
    assert whole._pool is not None and part._pool is not None
    assert (whole._pool.capacity.cores, whole._pool.capacity.memory) == (machine.cores,
                                                                        machine.memory)
    assert (part._pool.capacity.cores, part._pool.capacity.memory,
            part._pool.capacity.tmp) == (3, machine.memory, 0)
    assert LocalJobExecutor(config=LocalJobExecutorConfig())._pool is None


@pytest.mark.parametrize("value, error, accepted", [
    ("yes", TypeError, "False, True or a dict"),
    (None, TypeError, "False, True or a dict"),
    (1, TypeError, "False, True or a dict"),
    (2.0, TypeError, "False, True or a dict"),
    ([("cores", 2)], TypeError, "False, True or a dict"),
    ({"cores": math.nan}, TypeError, "an int"),
    ({"memory": math.inf}, TypeError, "an int (bytes)"),
    ({"cores": 2.0}, TypeError, "an int"),
    ({"cores": True}, TypeError, "an int"),
    ({"cores": "2"}, TypeError, "an int"),
    ({"tmp": "\udcff"}, TypeError, "an int (bytes)"),
    ({"cores": -1}, ValueError, "from 1 to"),
    ({"cores": 0}, ValueError, "from 1 to"),
    ({"memory": -5}, ValueError, "from 0 to"),
    ({"tmp": 2 ** 80}, ValueError, "from 0 to"),
    ({"gpu": 1}, ValueError, "accepted keys are 'cores', 'memory' and 'tmp' (bytes), and "
                             "'gpus'"),
    ({"gpus": -1}, ValueError, "from 0 to"),
    ({"gpus": 1.0}, TypeError, "a count from 0 to 4096 or a list of distinct GPU ids"),
    ({"gpus": 4097}, ValueError, "a count from 0 to 4096"),
    ({"gpus": ["0", "0"]}, ValueError, "GPU 0 is listed twice"),
    ({"gpus": "0,,1"}, ValueError, "'' is not a GPU id"),
    ({1: 1}, ValueError, "accepted keys are"),
])
def test_hostile_pool_settings_are_refused_naming_the_setting(
        value: Any, error: type, accepted: str) -> None:
    with pytest.raises(error) as info:
        LocalJobExecutorConfig(resource_pool=value)
    assert "LocalJobExecutorConfig.resource_pool" in str(info.value)
    assert accepted in str(info.value)
    config = LocalJobExecutorConfig()
    config.resource_pool = value  # changed after it was checked: checked again
    with pytest.raises(error, match="LocalJobExecutorConfig.resource_pool"):
        LocalJobExecutor(config=config)


def test_a_bad_priority_is_refused_at_submit_and_the_pool_goes_on(tmp_path: Path) -> None:
    ex = executor(tmp_path, {"cores": 1})
    bad = logged(tmp_path, "bad", math.nan)
    with pytest.raises(InvalidJobException, match="psij.priority: expected a finite number"):
        ex.submit(bad)
    assert bad.status.state is JobState.NEW and bad.executor is None
    good = logged(tmp_path, "good", 2)
    ex.submit(good)
    assert final(good).state is JobState.COMPLETED
    ex.close()


def test_the_setting_is_read_from_a_dict_copy(tmp_path: Path) -> None:
    setting: Dict[str, int] = {"cores": 1}
    config = LocalJobExecutorConfig(resource_pool=setting)
    setting["cores"] = -3  # the caller's dict changing later changes nothing
    assert config.resource_pool == {"cores": 1}


ATTACH = textwrap.dedent("""
    import sys
    import psij.registry
    try:
        psij.registry.reattach([sys.argv[1]], work_directory=sys.argv[2])
    except psij.registry.AttachError as e:
        print(e)
""")


def test_attach_of_a_waiting_job_from_another_process_says_it_waits(tmp_path: Path) -> None:
    ex = executor(tmp_path, {"cores": 1})
    gate = tmp_path / "gate"
    blocker = logged(tmp_path, "blocker", hold=until(gate))
    waiting = logged(tmp_path, "waiting")
    ex.submit(blocker)
    ex.submit(waiting)
    try:
        assert waiting.status.message == WAITING_MESSAGE
        psij.registry.flush()
        out = subprocess.run([sys.executable, "-c", ATTACH, waiting.id, str(tmp_path / "w")],
                             capture_output=True, text=True, timeout=60)
        assert "waits for the local resource pool (resource_pool) of the process that " \
               "submitted it" in out.stdout, out
    finally:
        gate.touch()
    assert final(waiting).state is JobState.COMPLETED
    ex.close()


def test_many_waiting_jobs_that_fail_at_start_end_one_after_another(tmp_path: Path) -> None:
    # Each failed start frees its place and starts the next from the same thread: carried out
    # one after another, not nested (the stack does not grow with the number of jobs).
    ex = executor(tmp_path, {"cores": 1})
    gate = tmp_path / "gate"
    blocker = logged(tmp_path, "blocker", hold=until(gate))
    ex.submit(blocker)
    missing = [Job(JobSpec(str(tmp_path / "no-such-program"))) for _ in range(1500)]
    ex.submit_many(missing)
    last = logged(tmp_path, "last")
    ex.submit(last)
    gate.touch()
    assert final(last).state is JobState.COMPLETED
    assert {(final(j).state, final(j).exit_code) for j in missing} == {(JobState.FAILED, 127)}
    ex.close()
