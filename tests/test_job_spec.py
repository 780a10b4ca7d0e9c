"""JobSpec filled in the ways code written for psij-python fills it: a bare spec, path-like
objects assigned where the annotations say ``str``, items appended to the arguments later. The
same values run through psij-python itself are compared in
tests/integration/test_compat_values.py; this file needs no package index."""

import os
from datetime import timedelta
from pathlib import Path

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, ResourceSpecV1
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.executors.local import LocalJobExecutorConfig

TIMEOUT = timedelta(seconds=30)


class PathLikeValue:
    """A path-like object that is not a pathlib.Path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


os.PathLike.register(PathLikeValue)


def engine_spec(tmp_path: Path) -> JobSpec:
    """What a workflow engine builds for one task: a bare spec, then paths assigned."""
    script = tmp_path / "task.sh"
    script.write_text('for a; do printf "<%s>" "$a"; done\n')
    spec = JobSpec()
    spec.executable = "/bin/sh"
    spec.arguments = [script, PathLikeValue(str(tmp_path / "in put.pkl"))]
    spec.stdout_path = tmp_path / "out.txt"
    spec.directory = PathLikeValue(str(tmp_path))
    assert spec.arguments is not None
    spec.arguments.append("--rerun")
    spec.arguments.append(Path("rel/file"))  # made text at submit
    return spec


def test_a_bare_spec_filled_with_path_like_values_runs_on_local(tmp_path: Path) -> None:
    spec = engine_spec(tmp_path)
    ex = JobExecutor.get_instance(
        "local", config=LocalJobExecutorConfig(work_directory=tmp_path / "work"))
    job = Job(spec)
    ex.submit(job)
    status = job.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.COMPLETED
    assert (tmp_path / "out.txt").read_text() == f"<{tmp_path}/in put.pkl><--rerun><rel/file>"
    assert spec.arguments == [str(tmp_path / "task.sh"), str(tmp_path / "in put.pkl"),
                              "--rerun", "rel/file"]
    assert spec.directory == tmp_path


def test_the_slurm_script_of_such_a_spec_carries_the_same_words(tmp_path: Path) -> None:
    spec = engine_spec(tmp_path)
    ex = JobExecutor.get_instance("slurm", config=BatchSchedulerExecutorConfig(
        work_directory=tmp_path / "work"))
    script = ex.submit_script(Job(spec))  # type: ignore[attr-defined]
    assert f"'{tmp_path}/in put.pkl' --rerun rel/file" in script
    assert f'#SBATCH --chdir="{tmp_path}"' in script.splitlines()


@pytest.mark.parametrize("item,message", [
    (5, r"JobSpec\.arguments\[1\]: expected str, bytes or a path-like object"),
    (None, r"JobSpec\.arguments\[1\]: expected"),
    ("a\x00b", r"JobSpec\.arguments\[1\]: NUL"),
    (PathLikeValue("a\x00b"), r"JobSpec\.arguments\[1\]: NUL"),
])
def test_an_item_appended_that_no_process_can_take_is_refused_at_submit(
        tmp_path: Path, item: object, message: str) -> None:
    spec = JobSpec("/bin/echo", ["ok"])
    assert spec.arguments is not None
    spec.arguments.append(item)  # type: ignore[arg-type]
    ex = JobExecutor.get_instance(
        "local", config=LocalJobExecutorConfig(work_directory=tmp_path / "work"))
    job = Job(spec)
    with pytest.raises((TypeError, ValueError), match=message):
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None


def test_values_taken_as_text() -> None:
    spec = JobSpec(Path("/bin/echo"), (b"a\xff", PathLikeValue("b")),
                   environment={"N": 4, "B": True, "P": Path("/x")})
    assert spec.executable == "/bin/echo"
    assert spec.arguments == [os.fsdecode(b"a\xff"), "b"]
    assert spec.environment == {"N": "4", "B": "True", "P": "/x"}
    spec.arguments = (w for w in ["x", "y"])
    assert spec.arguments == ["x", "y"]
    assert JobSpec(directory="").directory == Path(".")


@pytest.mark.parametrize("value", ["x y", {"x"}, {"x": "y"}, b"xy"])
def test_arguments_that_are_not_a_list_of_words_are_refused(value: object) -> None:
    with pytest.raises(TypeError, match="JobSpec.arguments: expected a list"):
        JobSpec("/bin/echo", value)  # type: ignore[arg-type]


def test_whole_numbers_are_names_and_0_and_1_are_flags_as_psij_python_renders_them() -> None:
    spec = JobSpec("/bin/true", name=7, inherit_environment=0,  # type: ignore[arg-type]
                   resources=ResourceSpecV1(exclusive_node_use=1),  # type: ignore[arg-type]
                   attributes=JobAttributes(queue_name=5, account=12))  # type: ignore[arg-type]
    assert (spec.name, spec.inherit_environment) == ("7", False)
    assert spec.resources.exclusive_node_use is True  # type: ignore[attr-defined]
    assert (spec.attributes.queue_name, spec.attributes.account) == ("5", "12")
    spec.attributes.reservation_id = 3  # type: ignore[assignment]
    spec.inherit_environment = 1  # type: ignore[assignment]
    assert (spec.attributes.reservation_id, spec.inherit_environment) == ("3", True)
    for bad in (2, -1, "no", None):
        with pytest.raises(TypeError, match="JobSpec.inherit_environment"):
            spec.inherit_environment = bad  # type: ignore[assignment]
    for bad in (True, 1.5, b"q", float("nan"), float("inf")):
        with pytest.raises(TypeError, match="JobAttributes.queue_name"):
            spec.attributes.queue_name = bad  # type: ignore[assignment]
    for huge in (10 ** 5000, -10 ** 100):  # past what str() converts, or absurd
        with pytest.raises(ValueError, match="JobAttributes.queue_name: .*100 digits"):
            spec.attributes.queue_name = huge  # type: ignore[assignment]
    assert spec.attributes.queue_name == "5"  # a refused value changes nothing
