"""One lifecycle for every executor: ``close()`` and ``with executor:`` on local, batch and
pilot alike; after close, submit raises; the pilot leaves no run folder behind."""

from pathlib import Path

import pytest

from psij import Job, JobExecutor, JobSpec, JobState, ResourceSpecV1, SubmitException
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.executors.local import LocalJobExecutorConfig
from psij.executors.pilot.executor import PilotJobExecutorConfig


def _config(name: str, tmp_path: Path):
    work = tmp_path / "work"
    if name == "local":
        return LocalJobExecutorConfig(work_directory=work)
    if name == "batch-test":
        return BatchTestExecutorConfig(work_directory=work, queue_polling_interval=0.2,
                                       initial_queue_polling_delay=0.1)
    return PilotJobExecutorConfig(work_directory=work, cores=2)


@pytest.mark.parametrize("name", ["local", "batch-test", "pilot"])
def test_with_runs_jobs_then_closes(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with JobExecutor.get_instance(name, config=_config(name, tmp_path)) as ex:
        assert isinstance(ex, JobExecutor)
        job = Job(JobSpec("/bin/true", resources=ResourceSpecV1(process_count=1)))
        ex.submit(job)
        assert job.wait(timeout=120).state is JobState.COMPLETED
    late = Job(JobSpec("/bin/true"))
    with pytest.raises(SubmitException, match="closed"):
        ex.submit(late)
    assert late.executor is None and late.status.state is JobState.NEW
    ex.close()  # a second close does nothing


@pytest.mark.parametrize("name", ["local", "pilot"])
def test_with_closes_when_the_block_raises(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with pytest.raises(KeyError):
        with JobExecutor.get_instance(name, config=_config(name, tmp_path)) as ex:
            raise KeyError("boom")
    with pytest.raises(SubmitException, match="closed"):
        ex.submit(Job(JobSpec("/bin/true")))


def test_pilot_leaves_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with JobExecutor.get_instance("pilot") as ex:
        jobs = [Job(JobSpec("/bin/sh", ["-c", f"echo {i}"],
                            resources=ResourceSpecV1(process_count=1))) for i in range(5)]
        for j in jobs:
            ex.submit(j)
        for j in jobs:
            assert j.wait(timeout=120).state is JobState.COMPLETED
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("psij-pilot-")]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("psij-pilot-")]


def test_local_jobs_started_before_close_finish(tmp_path):
    out = tmp_path / "out.txt"
    ex = JobExecutor.get_instance("local", config=_config("local", tmp_path))
    job = Job(JobSpec("/bin/sh", ["-c", "sleep 0.3; echo done"], stdout_path=out))
    ex.submit(job)
    ex.close()
    assert job.wait(timeout=120).state is JobState.COMPLETED
    assert out.read_text() == "done\n"


class _Minimal(JobExecutor):
    def submit(self, job):
        self._check_job(job)

    def cancel(self, job):
        pass

    def list(self):
        return []

    def attach(self, job, native_id):
        pass


def test_a_plugin_executor_gets_the_lifecycle_from_the_base():
    with _Minimal() as ex:
        assert isinstance(ex, _Minimal)
    ex.close()
