"""Golden submit scripts: every template, every resource field, attribute and custom attribute,
with hostile strings in paths, names, arguments and the environment.

Set PSIJ_UPDATE_GOLDEN=1 to rewrite tests/golden/*.sh after an intended change, then review the
difference. Besides the byte comparison, each script is checked by bash for syntax and its
directives are read back with an sbatch-style parser.
"""

import os
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Dict, Type

import pytest

from psij import InvalidJobException, Job, JobAttributes, JobSpec, ResourceSpecV1
from psij._scripts.quoting import double_quoted, shell_word
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from psij.executors.batch.batch_test import BatchTestJobExecutor
from psij.executors.batch.batch_test_tool import parse_directive_line
from psij.executors.batch.sge import SgeJobExecutor
from psij.executors.batch.slurm import SlurmJobExecutor

GOLDEN = Path(__file__).parent / "golden"
HOSTILE_DIR = "/data/it's \"quoted\" $(whoami) `id` é ✓"
HOSTILE_NAME = "name with 'quotes' \"dq\" $(rm -rf ~) `id` é #not-a-comment"
EXECUTORS: Dict[str, Type[BatchSchedulerExecutor]] = {
    "slurm": SlurmJobExecutor, "sge": SgeJobExecutor, "batch-test": BatchTestJobExecutor}
PREFIX = {"slurm": "slurm", "sge": "sge", "batch-test": "batch-test"}


def full_job(prefix: str, hostile_name: bool = True) -> Job:
    custom: Dict[str, object] = {f"{prefix}.flag": True, f"{prefix}.off": False,
                                 "other.ignored": "x"}
    custom[f"{prefix}.constraint" if prefix != "sge" else "sge.l"] = \
        "a&b" if prefix != "sge" else "h_vmem=2G,arch=lx-amd64"
    spec = JobSpec(
        executable="/opt/my app/run $(x).sh",
        arguments=["plain", "two words", "it's", "$(touch /tmp/pwned)", "`id`", "a\"b",
                   "back\\slash", "new\nline", "é ✓", ""],
        directory=HOSTILE_DIR,
        name=HOSTILE_NAME if hostile_name else "plain-name",
        inherit_environment=False,
        environment={"PLAIN": "v", "HOSTILE": "$(id) `id` \"q\" 'q' \\ $HOME\nline2", "NUM": 7},
        stdin_path="/in/put file.txt", stdout_path=f"{HOSTILE_DIR}/out.txt",
        stderr_path="/err/e r r's.txt",
        resources=ResourceSpecV1(node_count=2, processes_per_node=3, cpu_cores_per_process=2,
                                 gpu_cores_per_process=1, exclusive_node_use=True,
                                 memory=3 * 1024**3 + 1),
        attributes=JobAttributes(duration=timedelta(days=1, hours=2, minutes=3, seconds=4),
                                 queue_name="debug", account="proj-42",
                                 reservation_id="resv.1", custom_attributes=custom),
        pre_launch="/etc/pre launch.sh", post_launch="post.sh", launcher="multiple")
    job = Job(spec)
    job._id = "00000000-1111-2222-3333-444444444444"
    return job


def render(name: str, job: Job, work: Path) -> str:
    ex = EXECUTORS[name](config=BatchSchedulerExecutorConfig(work_directory=work))
    text = ex.submit_script(job)
    launch = ex._create_script_context(job)["psij"]["launch_command"]  # type: ignore[index]
    text = text.replace(shell_word(launch[1]), "<LAUNCHER_SCRIPT>")
    return text.replace(double_quoted(str(ex.work_directory.absolute())), "<SCRIPT_DIR>")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    # The work directory is hostile too; it is replaced by <SCRIPT_DIR> in the golden files.
    return tmp_path / "work 'dir' \"q\" $(x) `y` é"


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_golden_script(name: str, work: Path) -> None:
    job = full_job(PREFIX[name], hostile_name=True)
    text = render(name, job, work)
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("PSIJ_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{name}: the script differs from {golden}"
    check = subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


def test_slurm_directives_read_back_exactly(work: Path) -> None:
    job = full_job("slurm")
    text = render("slurm", job, work)
    options = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            for word in parse_directive_line(line[len("#SBATCH"):]):
                key, _, value = word.partition("=")
                options[key] = value
    assert options["--job-name"] == HOSTILE_NAME
    assert options["--partition"] == "debug" and options["--account"] == "proj-42"
    assert options["--reservation"] == "resv.1" and options["--constraint"] == "a&b"
    assert options["--flag"] == "" and "--off" not in options and "--ignored" not in options
    assert options["--time"] == "1-02:03:04"
    assert options["--nodes"] == "2" and options["--ntasks"] == "6"
    assert options["--ntasks-per-node"] == "3" and options["--cpus-per-task"] == "2"
    assert options["--gpus-per-task"] == "1" and options["--mem"] == "3145729K"
    assert "--exclusive" in options and options["--export"] == "NONE"


def test_sge_makes_the_name_plain_and_refuses_unquotable_values(work: Path) -> None:
    text = render("sge", full_job("sge"), work)
    assert "#$ -N name_with__quotes___dq____rm_-rf___" in text
    assert "#$ -pe smp 12" in text and "#$ -l h_rt=26:03:04" in text
    bad = full_job("sge")
    assert bad.spec is not None
    bad.spec.attributes.queue_name = "all q"
    ex = SgeJobExecutor(config=BatchSchedulerExecutorConfig(work_directory=work))
    with pytest.raises(InvalidJobException, match="queue_name.*' '"):
        ex.submit_script(bad)


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_minimal_job_renders(name: str, work: Path) -> None:
    job = Job(JobSpec("/bin/true"))
    text = render(name, job, work)
    assert "<LAUNCHER_SCRIPT>" in text and "_PSIJ_NATIVE_ID" in text
    assert subprocess.run(["bash", "-n"], input=text.encode()).returncode == 0


PLUGIN_TEMPLATE = """#!/bin/bash
{{#env}}
export {{name}}="{{value}}"
{{/env}}
cd "{{psij.script_dir}}"
{{#psij.launch_command}}{{.}} {{/psij.launch_command}}
"""


def test_plugin_style_template_gets_values_exactly(tmp_path: Path) -> None:
    # How executors written for the PSI/J Python API render their own templates: values inside
    # double quotes and launch-command words unquoted, both through the default escape.
    from psij._scripts.generator import TemplatedScriptGenerator

    template = tmp_path / "plugin.mustache"
    template.write_text(PLUGIN_TEMPLATE)
    work = tmp_path / "w 'q' $(x)"
    ex = BatchTestJobExecutor(config=BatchSchedulerExecutorConfig(work_directory=work))
    generator = TemplatedScriptGenerator(ex.config, template)
    out = tmp_path / "out 'o'.txt"
    value = "it's \"quoted\" $(touch PWNED) `x` \\ é"
    job = Job(JobSpec("/bin/sh", ["-c", 'printf "%s|%s" "$V" "$1"', "sh", value],
                      environment={"V": value}, stdout_path=out))
    script = tmp_path / "job.sh"
    with script.open("w") as f:
        generator.generate_submit_script(job, ex._create_script_context(job), f)
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path)
    assert out.read_text() == f"{value}|{value}"
    assert not list(tmp_path.rglob("PWNED"))


# ------------------------------------------------ Slurm job names and directory (issue 21, 18)

def test_slurm_names_an_unnamed_job_after_its_script_and_writes_its_directory(
        tmp_path: Path) -> None:
    ex = SlurmJobExecutor(config=BatchSchedulerExecutorConfig(work_directory=tmp_path))
    folder = tmp_path / "run 'q' $(x) é"
    unnamed = Job(JobSpec("/bin/bash", directory=folder))
    lines = ex.submit_script(unnamed).splitlines()
    # psij-python never writes a name, so Slurm takes the script's: <job id>.job, not /bin/bash.
    assert f'#SBATCH --job-name="{unnamed.id}.job"' in lines
    chdir = [line for line in lines if line.startswith("#SBATCH --chdir=")]
    assert len(chdir) == 1 and parse_directive_line(chdir[0][len("#SBATCH"):]) == \
        [f"--chdir={folder}"]
    named = ex.submit_script(Job(JobSpec("/bin/bash", name="my run"))).splitlines()
    assert '#SBATCH --job-name="my run"' in named
    assert f'#SBATCH --chdir="{double_quoted(os.getcwd())}"' in named  # the default directory


def test_slurm_refuses_a_directory_its_directive_cannot_hold(tmp_path: Path) -> None:
    ex = SlurmJobExecutor(config=BatchSchedulerExecutorConfig(work_directory=tmp_path))
    job = Job(JobSpec("/bin/true", directory="/tmp/two\nlines"))
    with pytest.raises(InvalidJobException, match="JobSpec.directory"):
        ex.submit(job)
    assert job.executor is None and not list(tmp_path.rglob("*.job"))
    # Elsewhere the directory is only a shell word: accepted.
    assert "two" in SgeJobExecutor(config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path)).submit_script(job)


def test_unnamed_slurm_jobs_share_an_array_named_after_the_first(tmp_path: Path) -> None:
    from psij.executors.batch import _arrays

    ex = SlurmJobExecutor(config=BatchSchedulerExecutorConfig(work_directory=tmp_path))
    jobs = [Job(JobSpec("/bin/echo", [str(i)], directory=tmp_path)) for i in range(3)]
    shapes = []
    for job in jobs:
        ex._check_script_values(job, job.spec)  # type: ignore[arg-type]
        context = ex._create_script_context(job)
        shapes.append(ex.generator.render(_arrays.shape_context(context)))
    assert shapes[0] == shapes[1] == shapes[2] and _arrays.NAME_MARK in shapes[0]
    named = Job(JobSpec("/bin/echo", name="x", directory=tmp_path))
    assert _arrays.NAME_MARK not in ex.generator.render(
        _arrays.shape_context(ex._create_script_context(named)))
