"""The figures of a run on the real Slurm and Grid Engine, checked against what the job did: one
job burns about 2 s of CPU on one core, another holds 300 MiB (its pages touched) for 3 s (the
schedulers sample memory about every second). Both jobs of a scheduler are submitted at once;
their ends are seen from the jobs' files (status polls 300 s apart), so the figures come from
the accounting asked for after the end."""

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from real.test_batch_real import SCHEDULERS, _need

WAIT = timedelta(seconds=240)
MIB = 1 << 20
BURN = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 2:\n"
        "    pass\n")
HOLD = ("import time\nb = bytearray(300 * 1024 * 1024)\nfor i in range(0, len(b), 4096):\n"
        "    b[i] = 1\ntime.sleep(3)\n")
LIMIT = timedelta(minutes=2)


def _common(meta: Dict[str, Any], submitted: float) -> None:
    assert submitted - 2 <= meta["queued_at"] <= meta["started_at"] <= meta["ended_at"] \
        <= time.time() + 1, meta
    assert isinstance(meta["cores"], int) and meta["cores"] >= 1, meta
    assert isinstance(meta["nodes"], str) and meta["nodes"].strip(), meta
    assert meta["requested_seconds"] == LIMIT.total_seconds(), meta


@pytest.mark.parametrize("name", SCHEDULERS)
def test_cpu_time_and_peak_memory_match_what_the_jobs_did(name: str, tmp_path: Path) -> None:
    _need(name)
    config = BatchSchedulerExecutorConfig(work_directory=tmp_path / "psij",
                                          queue_polling_interval=300,
                                          initial_queue_polling_delay=300)
    ex = JobExecutor.get_instance(name, config=config)
    try:
        submitted = time.time()
        jobs = {}
        for key, code in (("burn", BURN), ("hold", HOLD)):
            jobs[key] = Job(JobSpec(sys.executable, ["-c", code],
                                    attributes=JobAttributes(duration=LIMIT)))
            ex.submit(jobs[key])
        finals = {key: job.wait(WAIT) for key, job in jobs.items()}
    finally:
        ex.close()
    for key, status in finals.items():
        assert status is not None and status.state is JobState.COMPLETED, (key, status)
    burn: Dict[str, Any] = finals["burn"].metadata or {}  # type: ignore[union-attr]
    hold: Dict[str, Any] = finals["hold"].metadata or {}  # type: ignore[union-attr]
    _common(burn, submitted)
    _common(hold, submitted)
    assert 1.5 <= burn["cpu_seconds"] <= 6, burn
    assert hold["cpu_seconds"] < burn["cpu_seconds"], hold
    # Slurm's MaxRSS and Grid Engine's ru_maxrss: the resident peak; Grid Engine's maxvmem:
    # the virtual peak.
    assert hold["max_rss_bytes"] >= 300 * MIB, hold
    assert burn["max_rss_bytes"] < 100 * MIB, burn
    if name == "sge":
        assert hold["max_vmem_bytes"] >= 300 * MIB, hold
