"""``max_queued_per_shape`` and ``use_nice`` on the real Slurm started by tests/setup.

300 jobs in 3 shapes with a cap of 5: ``squeue``, sampled all along, never shows more than 5
pending jobs of one shape; every job ends in the state its exit code calls for; within a shape
the jobs the client held start (as ``sacct`` records it) in priority order. With ``use_nice``
the nice values ``squeue -o %y`` shows follow the jobs' priorities.
"""

import random
import subprocess
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1
from psij.executors.batch.slurm import SlurmExecutorConfig

WAIT = timedelta(seconds=240)
CAP = 5
# Seconds before the first status poll: every job has arrived by then (checked), so every
# slot freed by a start is given by a choice among all the held jobs of its shape. The job
# files are not watched (``watch_files=False``): a start they show at once would free a slot
# while jobs are still arriving.
ARRIVALS = 4.0
SHAPES = {
    "a": ResourceSpecV1(),
    "b": ResourceSpecV1(cpu_cores_per_process=2),
    "c": ResourceSpecV1(memory=200 * 1024 * 1024),
}


def pending_by_name(tag: str) -> Dict[str, int]:
    out = subprocess.run(["squeue", "--me", "--noheader", "--states=PENDING", "--format=%j"],
                         capture_output=True, text=True, timeout=30).stdout
    counts: Dict[str, int] = {}
    for name in out.split():
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == tag:
            counts[parts[1]] = counts.get(parts[1], 0) + 1
    return counts


def sacct_starts(native_ids: List[str]) -> Dict[str, str]:
    out = subprocess.run(["sacct", "--allocations", "--noheader", "--parsable2",
                          "--jobs=" + ",".join(native_ids), "--format=JobIDRaw,Start"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return dict(line.split("|", 1) for line in out.split() if "|" in line)


@pytest.mark.slurm
def test_300_jobs_in_3_shapes_never_more_than_5_pending_per_shape(tmp_path: Path) -> None:
    tag = "h" + uuid.uuid4().hex[:8]
    cfg = SlurmExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=0.5,
                              initial_queue_polling_delay=ARRIVALS, max_queued_per_shape=CAP,
                              watch_files=False)
    ex = JobExecutor.get_instance("slurm", config=cfg)
    rng = random.Random(13)
    samples: List[Dict[str, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(pending_by_name(tag))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    jobs: List[Tuple[str, int, int, Job]] = []  # shape, priority, exit code, job
    held: List[Job] = []
    begin = time.monotonic()
    try:
        for i in range(300):
            shape = "abc"[i % 3]
            priority, code = rng.randint(0, 30), (3 if i % 10 == 7 else 0)
            job = Job(JobSpec("/bin/sh", ["-c", f"sleep 0.2; exit {code}"],
                              name=f"{tag}-{shape}-{i}", resources=SHAPES[shape],
                              attributes=JobAttributes(
                                  duration=timedelta(minutes=5),
                                  custom_attributes={"psij.priority": priority})))
            ex.submit(job)
            jobs.append((shape, priority, code, job))
            if job.native_id is None:
                held.append(job)
        assert time.monotonic() - begin < ARRIVALS
        assert len(held) == 300 - 3 * CAP
        for _, _, code, job in jobs:
            st = job.wait(WAIT)
            assert st is not None, f"job {job.native_id} did not end"
            want = JobState.COMPLETED if code == 0 else JobState.FAILED
            assert (st.state, st.exit_code) == (want, code), (job.native_id, st)
    finally:
        done.set()
        sampler.join()
        ex.close()
    assert len(samples) > 20
    worst = {s: max(x.get(s, 0) for x in samples) for s in "abc"}
    assert all(n <= CAP for n in worst.values()), worst
    assert max(worst.values()) >= 2  # the cap was actually reached by some shape
    starts = sacct_starts([j.native_id for _, _, _, j in jobs])  # type: ignore[misc]
    held_ids = {id(j) for j in held}
    for shape in "abc":
        # The held jobs of a shape, in the order they started (ties: submission order).
        order = sorted(((starts[j.native_id], int(j.native_id), p)  # type: ignore[index,arg-type]
                        for s, p, _, j in jobs if s == shape and id(j) in held_ids))
        priorities = [p for _, _, p in order]
        assert priorities == sorted(priorities, reverse=True), (shape, order)


@pytest.mark.slurm
def test_use_nice_gives_slurm_nice_values_in_priority_order(tmp_path: Path) -> None:
    tag = "n" + uuid.uuid4().hex[:8]
    cfg = SlurmExecutorConfig(work_directory=tmp_path / "w", use_nice=True)
    ex = JobExecutor.get_instance("slurm", config=cfg)
    priorities = [5, -3, 100, 0, 2.5, 20000]
    jobs = []
    try:
        for i, p in enumerate(priorities):
            job = Job(JobSpec("/bin/true", name=f"{tag}-{i}", attributes=JobAttributes(
                custom_attributes={"psij.priority": p, "slurm.hold": True})))
            ex.submit(job)
            jobs.append(job)
        out = subprocess.run(["squeue", "--noheader", "--format=%i|%y", "--jobs=" +
                              ",".join(j.native_id for j in jobs)],  # type: ignore[misc]
                             capture_output=True, text=True, timeout=30, check=True).stdout
        nice = dict(line.split("|") for line in out.split())
        values = [int(nice[j.native_id]) for j in jobs]  # type: ignore[index]
        by_priority = [v for _, v in sorted(zip(priorities, values))]
        assert by_priority == sorted(by_priority, reverse=True), values
        assert len(set(values)) == len(values)
        assert values[5] == 0  # clamped: Slurm takes no negative nice from a user
        assert values[3] == 10000  # priority 0
    finally:
        for job in jobs:
            job.cancel()
        for job in jobs:
            job.wait(WAIT)
        ex.close()
