"""What the tests of the PBS Pro, Torque, LSF, Cobalt and Flux executors share: the executors
by name, the full hostile job of the golden scripts, and executors whose scheduler commands
are the fakes of ``tests/support/fake_site_scheduler.py`` (``fake_site``; the ``site`` fixture of
``tests/conftest.py`` gives one per executor)."""

import os
import shlex
import sys
from datetime import timedelta
from pathlib import Path
from typing import Dict, Type

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, ResourceSpecV1
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from psij.executors.batch.cobalt import CobaltJobExecutor
from psij.executors.batch.flux import FluxJobExecutor
from psij.executors.batch.lsf import LsfJobExecutor
from psij.executors.batch.nqsv import NQSVJobExecutor
from psij.executors.batch.pbs import PBSJobExecutor
from psij.executors.batch.pbs_classic import PBSClassicJobExecutor

FAKE = Path(__file__).parent / "fake_site_scheduler.py"
FAKE_NQSV = Path(__file__).parent / "fake_nqsv.py"
HOSTILE_DIR = "/data/it's \"quoted\" $(whoami) `id` é ✓"
HOSTILE_NAME = "name with 'quotes' \"dq\" $(rm -rf ~) `id` é #not-a-comment"
EXECUTORS: Dict[str, Type[BatchSchedulerExecutor]] = {
    "pbs": PBSJobExecutor, "pbs_classic": PBSClassicJobExecutor, "lsf": LsfJobExecutor,
    "cobalt": CobaltJobExecutor, "flux": FluxJobExecutor, "nqsv": NQSVJobExecutor}
WAIT = timedelta(seconds=30)


def make(name: str, work: Path) -> BatchSchedulerExecutor:
    return EXECUTORS[name](config=BatchSchedulerExecutorConfig(work_directory=work))


# A custom attribute value each scheduler's directives can hold, and the option it becomes.
CUSTOM = {
    "pbs": {"pbs.W": "depend=afterok:12.pbs1", "pbs.m": "abe", "pbs.h": True},
    "pbs_classic": {"pbs.W": "depend=afterok:12.host", "pbs.m": "abe", "pbs.h": True},
    "lsf": {"lsf.R": "select[mem>4000 && type==any] span[hosts=1]", "lsf.B": True,
            "lsf.core_isolation": "0"},
    "cobalt": {"cobalt.attrs": "mcdram=cache:numa=quad", "cobalt.h": True,
               "cobalt.M": "user@example.org"},
    "flux": {"flux.requires": "host:node[1-2]", "flux.o": "cpu-affinity=per-task",
             "flux.unbuffered": True},
    "nqsv": {"nqsv.m": "be", "nqsv.M": "user@example.org", "nqsv.X": True},
}


def full_job(name: str) -> Job:
    prefix = "pbs" if name.startswith("pbs") else name
    custom: Dict[str, object] = {**CUSTOM[name], f"{prefix}.off": False, "other.ignored": "x",
                                 "slurm.qos": "debug"}
    supported_memory = None if name == "flux" else 3 * 1024**3 + 1
    spec = JobSpec(
        executable="/opt/my app/run $(x).sh",
        arguments=["plain", "two words", "it's", "$(touch /tmp/pwned)", "`id`", "a\"b",
                   "back\\slash", "new\nline", "é ✓", ""],
        directory=HOSTILE_DIR, name=HOSTILE_NAME, inherit_environment=False,
        environment={"PLAIN": "v", "HOSTILE": "$(id) `id` \"q\" 'q' \\ $HOME\nline2", "NUM": 7},
        stdin_path="/in/put file.txt", stdout_path=f"{HOSTILE_DIR}/out.txt",
        stderr_path="/err/e r r's.txt",
        resources=ResourceSpecV1(node_count=2, processes_per_node=3, cpu_cores_per_process=2,
                                 gpu_cores_per_process=1, exclusive_node_use=True,
                                 memory=supported_memory),
        attributes=JobAttributes(duration=timedelta(days=1, hours=2, minutes=3, seconds=4),
                                 queue_name="debug", account="proj-42",
                                 reservation_id=None if name == "flux" else "resv.1",
                                 custom_attributes=custom),
        pre_launch="/etc/pre launch.sh", post_launch="post.sh", launcher="multiple")
    job = Job(spec)
    job._id = "00000000-1111-2222-3333-444444444444"
    return job


TOOLS = {"pbs": ("pbs", ["qsub", "qstat", "qdel", "qselect"]),
         "pbs_classic": ("torque", ["qsub", "qstat", "qdel", "qselect"]),
         "lsf": ("lsf", ["bsub", "bjobs", "bkill"]),
         "cobalt": ("cobalt", ["qsub", "qstat", "qdel"]),
         "flux": ("flux", ["flux"]),
         "nqsv": ("nqsv", ["qsub", "qstat", "qdel"])}


def fake_site(name: str, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> BatchSchedulerExecutor:
    flavour, tools = TOOLS[name]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spool = tmp_path / "spool"
    for tool in tools:
        wrapper = bin_dir / tool
        args = [sys.executable, "-S", str(FAKE), str(spool), flavour]
        if name == "nqsv":
            args = [sys.executable, "-S", str(FAKE_NQSV), str(spool)]
        if tool != "flux":
            args.append(tool)
        wrapper.write_text(f"#!/bin/sh\nexec {' '.join(map(shlex.quote, args))} \"$@\"\n")
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    config = BatchSchedulerExecutorConfig(work_directory=tmp_path / "work",
                                          queue_polling_interval=0.2,
                                          initial_queue_polling_delay=0.1)
    executor = JobExecutor.get_instance(name, config=config)
    assert isinstance(executor, BatchSchedulerExecutor)
    return executor
