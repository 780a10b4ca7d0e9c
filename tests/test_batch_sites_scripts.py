"""The submit scripts of the PBS Pro, Torque, LSF, Cobalt and Flux executors: golden scripts
of a job with hostile inputs, their directives read back the way each scheduler splits them,
and values a directive cannot hold, refused naming the field.

Set PSIJ_UPDATE_GOLDEN=1 to rewrite tests/golden/<name>.sh after an intended change, then review
the difference.
"""

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import List

import pytest

import psij
from psij import InvalidJobException, Job, JobAttributes, JobSpec, JobState, ResourceSpecV1
from psij._scripts.quoting import double_quoted, shell_word
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
from support.batch_sites import EXECUTORS, full_job, make

GOLDEN = Path(__file__).parent / "golden"


def render(ex: BatchSchedulerExecutor, job: Job) -> str:
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
    text = render(make(name, work), full_job(name))
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("PSIJ_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{name}: the script differs from {golden}"
    check = subprocess.run(["bash", "-n"], input=text.encode(), capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
    assert "slurm" not in text and "other" not in text and "-off" not in text


def directive_words(text: str, prefix: str) -> List[List[str]]:
    """The words of each directive line, split the way the scheduler splits them."""
    return [shlex.split(line[len(prefix):]) for line in text.splitlines()
            if line.startswith(prefix)]


def test_pbs_directives(work: Path) -> None:
    lines = directive_words(render(make("pbs", work), full_job("pbs")), "#PBS")
    assert ["-N", "name_with__quotes___dq____rm_-rf_____id_____not-a-comment"] in lines
    assert ["-l", "select=2:ncpus=6:mpiprocs=3:ngpus=3:mem=3145729kb"] in lines
    assert ["-l", "place=scatter:exclhost"] in lines and ["-l", "walltime=26:03:04"] in lines
    # The reservation is the queue the job must go to.
    assert ["-q", "resv.1"] in lines and ["-q", "debug"] not in lines
    assert ["-A", "proj-42"] in lines and ["-W", "depend=afterok:12.pbs1"] in lines
    assert ["-m", "abe"] in lines and ["-h"] in lines and ["-V"] not in lines


def test_torque_directives(work: Path) -> None:
    lines = directive_words(render(make("pbs_classic", work), full_job("pbs_classic")), "#PBS")
    assert ["-l", "nodes=2:ppn=6:gpus=3"] in lines
    assert ["-l", "mem=6291458kb"] in lines and ["-n"] in lines
    assert ["-q", "debug"] in lines and ["-W", "x=ADVRES:resv.1"] in lines


def test_lsf_directives_read_back_exactly(work: Path) -> None:
    lines = directive_words(render(make("lsf", work), full_job("lsf")), "#BSUB")
    assert ["-n", "6"] in lines and ["-R", "span[ptile=3]"] in lines
    assert ["-R", "affinity[core(2)]"] in lines and ["-gpu", "num=1/task"] in lines
    assert ["-x"] in lines and ["-M", "1048577KB"] in lines and ["-W", "26:04"] in lines
    assert ["-q", "debug"] in lines and ["-P", "proj-42"] in lines and ["-U", "resv.1"] in lines
    assert ["-R", "select[mem>4000 && type==any] span[hosts=1]"] in lines
    assert ["-B"] in lines and ["-core_isolation", "0"] in lines and ["-env", "none"] in lines


def test_cobalt_directives(work: Path) -> None:
    text = render(make("cobalt", work), full_job("cobalt"))
    lines = directive_words(text, "#COBALT")
    assert ["-n", "2"] in lines and ["--proccount", "6"] in lines and ["-t", "1564"] in lines
    assert ["-q", "resv.1"] in lines and ["-A", "proj-42"] in lines
    assert ["--attrs=mcdram=cache:numa=quad"] in lines and ["-h"] in lines
    assert ["-M", "user@example.org"] in lines
    assert "also asked for: cpu_cores_per_process=2, gpu_cores_per_process=1" in text


def test_flux_directives_read_back_exactly(work: Path) -> None:
    lines = directive_words(render(make("flux", work), full_job("flux")), "# flux:")
    assert ["-N", "2"] in lines and ["-n", "6"] in lines and ["-c", "2"] in lines
    assert ["-g", "1"] in lines and ["--exclusive"] in lines and ["-t", "93784s"] in lines
    assert ["--queue=debug"] in lines and ["--setattr=system.bank=proj-42"] in lines
    assert ["--requires=host:node[1-2]"] in lines and ["-o", "cpu-affinity=per-task"] in lines
    assert ["--unbuffered"] in lines and ["--env=-*"] in lines


@pytest.mark.parametrize("name,field,value,accepted", [
    ("pbs", "queue_name", "all q", "' '"),
    ("pbs_classic", "account", "a;b", "';'"),
    ("cobalt", "queue_name", "q$(id)", "'$()'"),
    ("lsf", "queue_name", 'q"x', "'\"'"),
    ("lsf", "account", "a`id`", "'`'"),
    ("flux", "queue_name", "q$HOME", "'$'"),
    ("flux", "account", "back\\slash", "'\\\\'"),
])
def test_unsafe_directive_values_are_refused(name: str, field: str, value: str,
                                             accepted: str, work: Path) -> None:
    ex = make(name, work)
    attributes = JobAttributes()
    setattr(attributes, field, value)
    job = Job(JobSpec("/bin/true", attributes=attributes))
    with pytest.raises(InvalidJobException, match=f"{field}.*{re.escape(accepted)}"):
        ex.submit(job)
    assert job.executor is None and job.status.state is JobState.NEW
    assert not ex.work_directory.exists() or not list(ex.work_directory.glob("*.job"))


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_newlines_in_directive_values_are_refused(name: str, work: Path) -> None:
    prefix = "pbs" if name.startswith("pbs") else name
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        custom_attributes={f"{prefix}.x": "a\nb"})))
    with pytest.raises(InvalidJobException, match="newline"):
        make(name, work).submit_script(job)


def test_flux_refuses_memory(work: Path) -> None:
    ex = make("flux", work)
    with pytest.raises(InvalidJobException, match="ResourceSpecV1.memory: Flux cannot"):
        ex.submit(Job(JobSpec("/bin/true", resources=ResourceSpecV1(memory=1024))))
    assert not ex.work_directory.exists() or not list(ex.work_directory.glob("*.job"))


def test_flux_takes_a_reservation_as_psij_python_does(work: Path) -> None:
    # psij-python's flux executor ignores reservation_id; code that sets it must still run
    # (issue 21, item 15): the job is accepted, with a warning and a comment in its script.
    ex = make("flux", work)
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(reservation_id="r1.x")))
    with pytest.warns(UserWarning, match="Flux has no reservations; 'r1.x' is not passed on"):
        text = ex.submit_script(job)
    assert '# Flux has no reservations; JobAttributes.reservation_id "r1.x" is not passed on.' \
        in text.splitlines()
    assert not [line for line in text.splitlines() if "r1.x" in line and "flux:" in line]
    assert subprocess.run(["bash", "-n"], input=text.encode()).returncode == 0


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_minimal_job_renders(name: str, work: Path) -> None:
    text = render(make(name, work), Job(JobSpec("/bin/true")))
    assert "<LAUNCHER_SCRIPT>" in text and "_PSIJ_NATIVE_ID=" in text
    assert subprocess.run(["bash", "-n"], input=text.encode()).returncode == 0


class _OtherResourceSpec(psij.ResourceSpec):
    @property
    def version(self) -> int:
        return 2


@pytest.mark.parametrize("name", ["slurm", "sge", "pbs", "pbs_classic", "lsf", "cobalt", "flux",
                                  "nqsv", "batch-test"])
def test_resources_other_than_v1_are_refused_naming_the_field(name: str, tmp_path: Path) -> None:
    ex = psij.JobExecutor.get_instance(
        name, config=psij.JobExecutorConfig(work_directory=tmp_path))
    job = psij.Job(psij.JobSpec("/bin/true", resources=_OtherResourceSpec()))
    with pytest.raises(psij.InvalidJobException, match="JobSpec.resources"):
        ex.submit_script(job)  # type: ignore[attr-defined]
