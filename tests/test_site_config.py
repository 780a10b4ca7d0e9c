"""Site defaults in TOML: the user's file, the site's file and the one named by PSIJ_CONFIG give
per-executor defaults; a job's own values win, then an explicit executor configuration, then
the files in that order. Errors name the file and the key."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from psij import Job, JobAttributes, JobExecutor, JobSpec, JobState, _site_config
from psij.executors.batch.batch_test import BatchTestExecutorConfig
from psij.executors.local import LocalJobExecutorConfig

PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    (home / ".config" / "psij").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("PSIJ_CONFIG", raising=False)
    site = tmp_path / "etc" / "psij" / "config.toml"
    site.parent.mkdir(parents=True)
    monkeypatch.setattr(_site_config, "SITE_FILE", site)
    _site_config.reset()
    paths = {"user": home / ".config" / "psij" / "config.toml", "site": site,
             "env": tmp_path / "other.toml", "home": home}
    yield paths
    _site_config.reset()


def test_precedence_env_file_then_user_then_site(files, monkeypatch) -> None:
    files["site"].write_text('[executors.slurm]\nqueue = "site-q"\naccount = "site-acct"\n')
    files["user"].write_text('[executors.slurm]\nqueue = "user-q"\n')
    found = _site_config.settings()["slurm"]
    assert found["queue"] == _site_config.Setting("user-q", str(files["user"]))
    assert found["account"] == _site_config.Setting("site-acct", str(files["site"]))
    files["env"].write_text('[executors.slurm]\nqueue = "env-q"\n')
    monkeypatch.setenv("PSIJ_CONFIG", str(files["env"]))
    _site_config.reset()
    env_queue = _site_config.settings()["slurm"]["queue"]
    assert env_queue == _site_config.Setting("env-q", str(files["env"]))


def test_batch_job_gets_queue_account_and_custom_attributes(files, tmp_path) -> None:
    files["user"].write_text(
        '[executors.batch-test]\nqueue = "debug"\naccount = "proj-7"\npoll_interval = 7\n'
        'custom_attributes = { "batch-test.constraint" = "gpu", "batch-test.qos" = "low" }\n')
    ex = JobExecutor.get_instance("batch-test")
    assert ex.config.queue_polling_interval == 7.0
    job = Job(JobSpec("/bin/true", attributes=JobAttributes(
        account="mine", custom_attributes={"batch-test.qos": "high"})))
    script = ex.submit_script(job)
    assert '#BATCH_TEST --queue="debug"' in script
    assert '#BATCH_TEST --account="mine"' in script  # the job's own value wins
    assert '#BATCH_TEST --constraint="gpu"' in script
    assert '#BATCH_TEST --qos="high"' in script and "low" not in script
    # An explicit configuration wins over the file.
    cfg = BatchTestExecutorConfig(work_directory=tmp_path / "w", queue_polling_interval=3)
    assert JobExecutor.get_instance("batch-test", config=cfg).config.queue_polling_interval == 3


def test_local_work_directory_launcher_and_time_limit(files, tmp_path) -> None:
    work = tmp_path / "site-work"
    files["site"].write_text(f'[executors.local]\nwork_directory = "{work}"\n'
                             'launcher = "multiple"\nenforce_duration = true\n')
    with JobExecutor.get_instance("local") as ex:
        assert ex.config.work_directory == work
        assert ex.config.enforce_duration is True
        out = tmp_path / "out"
        job = Job(JobSpec("/bin/echo", ["hi"], stdout_path=out))
        ex.submit(job)
        assert job.wait(timeout=120).state is JobState.COMPLETED
    assert job.spec.launcher == "multiple"
    assert (work / "local").is_dir()
    own = LocalJobExecutorConfig(work_directory=tmp_path / "own")
    assert JobExecutor.get_instance("local", config=own).config.work_directory == tmp_path / "own"


def test_local_resource_pool_and_batch_spares_from_the_file(files, tmp_path) -> None:
    files["user"].write_text('[executors.local]\nresource_pool = { cores = 1, gpus = [0, 2] }\n'
                             '[executors.batch-test]\nspare_submit_commands = 0\n')
    ex = JobExecutor.get_instance("local")
    assert ex.config.resource_pool == {"cores": 1, "gpus": ["0", "2"]}
    gate = tmp_path / "gate"
    first = Job(JobSpec("/bin/sh", ["-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
    second = Job(JobSpec("/bin/true"))
    ex.submit(first)
    ex.submit(second)
    # One core in the pool: the second job waits for the first.
    assert second.status.state is JobState.QUEUED
    assert second.status.metadata.get("waiting_for") == "local resources"
    gate.touch()
    assert first.wait(timeout=120).state is JobState.COMPLETED
    assert second.wait(timeout=120).state is JobState.COMPLETED
    ex.close()
    assert JobExecutor.get_instance("batch-test").config.spare_submit_commands == 0


def test_slurm_rest_submit_from_the_file(files) -> None:
    files["user"].write_text('[executors.slurm]\nrest_submit = false\n')
    ex = JobExecutor.get_instance("slurm")
    assert ex.config.rest_submit is False
    # off: no slurmrestd is asked, whatever the machine has
    assert ex._direct_submit(("sbatch", "--parsable"), "#!/bin/bash\ntrue\n") is None
    assert ex._rest is None


HOSTILE = [
    ('queue = 5', "executors.slurm.queue", "a non-empty string"),
    ('queue = ""', "executors.slurm.queue", "a non-empty string"),
    ('enforce_duration = "yes"', "executors.slurm.enforce_duration", "true or false"),
    ('poll_interval = nan', "executors.slurm.poll_interval", "seconds above 0"),
    ('poll_interval = -1', "executors.slurm.poll_interval", "seconds above 0"),
    ('poll_interval = 1e300', "executors.slurm.poll_interval", "seconds above 0"),
    ('poll_interval = true', "executors.slurm.poll_interval", "seconds above 0"),
    ('poll_interval = "10"', "executors.slurm.poll_interval", "seconds above 0"),
    ('custom_attributes = { "slurm.x" = inf }', "executors.slurm.custom_attributes.slurm.x",
     "finite"),
    ('custom_attributes = { "slurm.x" = 100000000000000000000000 }',
     "executors.slurm.custom_attributes.slurm.x", "64 bits"),
    ('custom_attributes = { "slurm.x" = [1] }', "executors.slurm.custom_attributes.slurm.x",
     "a string"),
    ('custom_attributes = "a"', "executors.slurm.custom_attributes", "a table"),
    ('resource_pool = "yes"', "executors.slurm.resource_pool", "true, false or a table"),
    ('resource_pool = { cores = nan }', "executors.slurm.resource_pool", "cores"),
    ('resource_pool = { cores = -1 }', "executors.slurm.resource_pool", "cores"),
    ('resource_pool = { nodes = 2 }', "executors.slurm.resource_pool", "unknown key 'nodes'"),
    ('resource_pool = { memory = 100000000000000000000 }', "executors.slurm.resource_pool",
     "memory"),
    ('resource_pool = { gpus = [0, 0] }', "executors.slurm.resource_pool",
     "GPU 0 is listed twice"),
    ('resource_pool = { gpus = 5000 }', "executors.slurm.resource_pool",
     "a count from 0 to 4096"),
    ('spare_submit_commands = 17', "executors.slurm.spare_submit_commands", "0 to 16"),
    ('spare_submit_commands = -1', "executors.slurm.spare_submit_commands", "0 to 16"),
    ('spare_submit_commands = true', "executors.slurm.spare_submit_commands", "0 to 16"),
    ('spare_submit_commands = 1.5', "executors.slurm.spare_submit_commands", "0 to 16"),
    ('rest_submit = "no"', "executors.slurm.rest_submit", "true or false"),
    ('rest_submit = 0', "executors.slurm.rest_submit", "true or false"),
    ('colour = "blue"', "executors.slurm.colour", "accepted: queue"),
    ('queue = "\\ud800"', "", "not valid TOML"),
    ('this is not toml', "", "not valid TOML"),
]


@pytest.mark.parametrize("line,key,accepted", HOSTILE)
def test_hostile_values_name_the_file_and_the_key(files, line, key, accepted) -> None:
    files["user"].write_text(f"[executors.slurm]\n{line}\n")
    with pytest.raises(_site_config.SiteConfigError) as info:
        _site_config.settings()
    message = str(info.value)
    assert message.startswith(f"{files['user']}: ")
    assert key in message and accepted in message


def test_other_file_errors(files, monkeypatch) -> None:
    files["site"].write_bytes(b'[executors.slurm]\nqueue = "\xff"\n')
    with pytest.raises(_site_config.SiteConfigError, match="not UTF-8"):
        _site_config.settings()
    files["site"].write_text('[queues]\nx = 1\n')
    _site_config.reset()
    with pytest.raises(_site_config.SiteConfigError, match="unknown key 'queues'"):
        _site_config.settings()
    files["site"].write_text('executors = 3\n')
    _site_config.reset()
    with pytest.raises(_site_config.SiteConfigError, match="key 'executors'"):
        _site_config.settings()
    files["site"].unlink()
    monkeypatch.setenv("PSIJ_CONFIG", str(files["env"]))
    _site_config.reset()
    with pytest.raises(_site_config.SiteConfigError, match="named by PSIJ_CONFIG"):
        _site_config.settings()


def test_a_broken_file_fails_submit_and_leaves_the_job_new(files, tmp_path) -> None:
    files["user"].write_text('[executors.local]\nqueue = 5\n')
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "w"))
    job = Job(JobSpec("/bin/true"))
    with pytest.raises(ValueError, match="executors.local.queue"):
        ex.submit(job)
    assert job.status.state is JobState.NEW and job.executor is None


def test_psij_config_prints_each_setting_and_its_file(files) -> None:
    files["site"].write_text('[executors.slurm]\naccount = "a1"\n')
    files["user"].write_text('[executors.slurm]\nqueue = "q1"\n')
    env = dict(os.environ, HOME=str(files["home"]), XDG_CONFIG_HOME=str(files["home"] / ".config"))
    code = (f"import psij._site_config as s, pathlib, sys; s.SITE_FILE = pathlib.Path("
            f"{str(files['site'])!r}); from psij.cli import main; sys.exit(main(['config']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f'account = "a1"    # from {files["site"]}' in done.stdout
    assert f'queue = "q1"    # from {files["user"]}' in done.stdout
    assert f"user         {files['user']}  (found)" in done.stdout


def test_psij_config_reports_a_broken_file(files) -> None:
    files["env"].write_text('[executors.slurm]\npoll_interval = nan\n')
    env = dict(os.environ, PSIJ_CONFIG=str(files["env"]), HOME=str(files["home"]))
    done = subprocess.run([PSIJ_SCRIPT, "config"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 1
    assert str(files["env"]) in done.stderr and "executors.slurm.poll_interval" in done.stderr


def test_import_psij_does_not_read_the_configuration(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("not toml at all\n")
    code = ("import sys, json, psij\n"
            "first = 'psij._site_config' in sys.modules\n"
            "import psij.executors.local, psij._site_config as s\n"
            "print(json.dumps([first, s._cache is None]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PSIJ_CONFIG=str(bad)), timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, True]
