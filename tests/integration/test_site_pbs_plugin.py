"""A site's PBS-derived executor, written against psij-python's API the way its own PBS
executors are (subclass ``GenericPBSJobExecutor`` from ``psij.executors.batch.pbs_base``, pass a
``TemplatedScriptGenerator`` of the site's own template, use ``PBSExecutorConfig`` and
``check_status_exit_code``), runs jobs against the fake PBS Pro commands of
``tests/support/fake_site_scheduler.py``."""

from datetime import timedelta
from pathlib import Path
from typing import Dict, Optional

import pytest

from psij import Job, JobSpec, JobState, JobStatus
from psij.executors.batch.pbs_base import (
    GenericPBSJobExecutor,
    PBSExecutorConfig,
    check_status_exit_code,
)
from psij.executors.batch.script_generator import TemplatedScriptGenerator
from support.batch_sites import fake_site

# A site's template in the form psij-python's PBS templates have.
SITE_TEMPLATE = """#!/bin/bash
{{#job.name}}
#PBS -N {{.}}
{{/job.name}}
{{#job.spec.resources}}
#PBS -l select={{computed_node_count}}:ncpus={{computed_processes_per_node}}
{{/job.spec.resources}}
{{#formatted_job_duration}}
#PBS -l walltime={{.}}
{{/formatted_job_duration}}
{{#custom_attributes}}
{{#pbs}}
#PBS -{{key}} "{{value}}"
{{/pbs}}
{{/custom_attributes}}
#PBS -e /dev/null
#PBS -o /dev/null
#PBS -l site_feature=fast
{{#env}}
export {{name}}="{{value}}"
{{/env}}
{{#job.spec.directory}}
cd "{{.}}"
{{/job.spec.directory}}
exec &>> "{{psij.script_dir}}/$PBS_JOBID.out"
{{#psij.launch_command}}{{.}} {{/psij.launch_command}}
echo "$?" > "{{psij.script_dir}}/$PBS_JOBID.ec"
"""


class SitePBSJobExecutor(GenericPBSJobExecutor):
    """What a site ships: its own template, the rest from the PBS base class."""

    checked = 0

    def __init__(self, url: Optional[str] = None,
                 config: Optional[PBSExecutorConfig] = None) -> None:
        if not config:
            config = PBSExecutorConfig()
        template = Path(config.work_directory) / "site.mustache"
        template.parent.mkdir(parents=True, exist_ok=True)
        template.write_text(SITE_TEMPLATE)
        super().__init__(TemplatedScriptGenerator(config, template), url=url, config=config)

    def parse_status_output(self, exit_code: int, out: str) -> Dict[str, JobStatus]:
        SitePBSJobExecutor.checked += 1
        if exit_code != 0 and "Unknown Job Id" not in out:
            check_status_exit_code("qstat", exit_code, out)
        return super().parse_status_output(exit_code, out)


def test_site_executor_derived_from_the_pbs_base_runs_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_site("pbs", tmp_path, monkeypatch).close()  # the fake qsub/qstat/qdel on PATH
    config = PBSExecutorConfig(work_directory=tmp_path / "site work",
                               queue_polling_interval=0.2, initial_queue_polling_delay=0.1,
                               keep_files=True)
    ex = SitePBSJobExecutor(config=config)
    out = tmp_path / "out.txt"
    job = Job(JobSpec("/bin/sh", ["-c", 'echo "$GREETING"; exit 0'],
                      environment={"GREETING": "from the site"}, stdout_path=out))
    failing = Job(JobSpec("/bin/sh", ["-c", "exit 7"]))
    try:
        ex.submit(job)
        ex.submit(failing)
        script = (ex.work_directory / f"{job.id}.job").read_text()
        st = job.wait(timedelta(seconds=60))
        bad = failing.wait(timedelta(seconds=60))
    finally:
        ex.close()
    assert st is not None and st.state is JobState.COMPLETED, st
    assert out.read_text() == "from the site\n"
    assert bad is not None and bad.state is JobState.FAILED and bad.exit_code == 7, bad
    assert job.native_id is not None and job.native_id.endswith(".fakepbs")
    assert SitePBSJobExecutor.checked > 0
    assert "#PBS -l site_feature=fast" in script and "from the site" in script


def test_generator_must_be_a_script_generator() -> None:
    with pytest.raises(TypeError, match="generator"):
        GenericPBSJobExecutor("pbs://host")  # type: ignore[arg-type]
