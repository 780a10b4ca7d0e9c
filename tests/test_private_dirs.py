"""Directories psij keeps scripts, journals and spools in are refused unless private.

The attacks are played with real local users made here (useradd; the tests run as root): the
attacker prepares or changes a directory as itself, and the victim (root, so also the case
where the owner check matters most) must refuse it with an error naming the path. Nothing is
mocked: real executors, real launcher scripts, the real batch-test tool.
"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List

import pytest

from psij import Job, JobExecutorConfig, JobSpec
from psij._private_dirs import (
    UnsafePathError,
    check_private_dir,
    check_private_file,
    ensure_private_dir,
)
from psij.exceptions import SubmitException
from psij.executors.batch.batch_test import BatchTestExecutorConfig, BatchTestJobExecutor
from psij.executors.local import LocalJobExecutor
from psij.launchers import script_based_launcher
from psij.launchers.multiple import MultipleLauncher
from psij.launchers.script_based_launcher import deploy_files
from support.local_users import User, make_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="needs root and useradd to make the test users")


@pytest.fixture(scope="module")
def attacker() -> Iterator[User]:
    user = make_user("psijatk")
    yield user
    subprocess.run(["userdel", user.name], capture_output=True)


def as_user(user: User, argv: List[str]) -> "subprocess.CompletedProcess[str]":
    """Run ``argv`` as ``user`` (real uid and gid, no supplementary groups)."""
    return subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=[],
                          capture_output=True, text=True, cwd="/")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder like /tmp (pytest's tmp_path is 0700): anyone may make folders in it."""
    with tempfile.TemporaryDirectory(prefix="psij-sec-") as name:
        os.chmod(name, 0o1777)
        yield Path(name)


def attacker_dir(attacker: User, path: Path, mode: str = "777") -> Path:
    """A directory made by the attacker, as the attacker."""
    result = as_user(attacker, ["sh", "-c", f'mkdir "$1" && chmod {mode} "$1"', "sh",
                                str(path)])
    assert result.returncode == 0, result.stderr
    assert path.stat().st_uid == attacker.uid
    return path


def everything_under(folder: Path) -> List[Path]:
    return [folder, *folder.rglob("*")]


# -- the check itself --------------------------------------------------------------------------


def test_private_directories_are_accepted_and_created_0700(tmp_path: Path) -> None:
    old = os.umask(0)  # even with a permissive umask
    try:
        made = ensure_private_dir(tmp_path / "a" / "b" / "c", "work directory")
    finally:
        os.umask(old)
    for level in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    (tmp_path / "read-only-for-others").mkdir(0o755)
    check_private_dir(tmp_path / "read-only-for-others", "work directory")  # 0755 is fine


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_a_directory_writable_by_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(mode)
    with pytest.raises(UnsafePathError) as info:
        ensure_private_dir(loose / "local", "local journal directory", within=loose)
    text = str(info.value)
    assert str(loose) in text and "writable by group or others" in text
    assert f"{mode & 0o7777:04o}" in text
    assert "owned by you" in text and "not a symbolic link" in text  # what is accepted
    assert not (loose / "local").exists()  # nothing made in it


def test_a_symbolic_link_and_a_file_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        ensure_private_dir(tmp_path / "link", "work directory")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UnsafePathError, match="is not a directory"):
        check_private_dir(tmp_path / "file", "work directory")
    (tmp_path / "file").chmod(0o666)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        check_private_file(tmp_path / "file", "deployed launcher file")


@pytest.mark.parametrize("bad", ["x\ud800", "a\x00b"])
def test_an_unusable_path_is_refused_naming_it(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="work directory .*" + bad[0]):
        ensure_private_dir(str(tmp_path / bad), "work directory")
    with pytest.raises(ValueError, match="work directory"):
        check_private_dir(str(tmp_path / bad), "work directory")
    assert list(tmp_path.iterdir()) == []


def test_root_refuses_a_directory_of_another_user(attacker: User, shared: Path) -> None:
    # 0700: only its owner may write in it, and that owner is not us. Root could write there
    # too, but the attacker could change what root would run.
    theirs = attacker_dir(attacker, shared / "theirs", "700")
    with pytest.raises(UnsafePathError) as info:
        ensure_private_dir(theirs, "work directory")
    assert f"is owned by {attacker.name}, uid {attacker.uid}, not by you" in str(info.value)
    assert str(theirs) in str(info.value)


# -- the reproduction: a shared work directory and the launcher scripts -------------------------


def test_multiple_launcher_job_refuses_a_work_directory_made_by_another_user(
        attacker: User, shared: Path) -> None:
    work = attacker_dir(attacker, shared / "work")
    ex = LocalJobExecutor(config=JobExecutorConfig(work_directory=work))
    job = Job(JobSpec("/bin/true", launcher="multiple"))
    with pytest.raises(UnsafePathError) as info:
        ex.submit(job)
    assert str(work) in str(info.value) and "owned by" in str(info.value)
    # Nothing of the victim's was put where the attacker could append to it.
    assert list(work.iterdir()) == []
    # The launcher alone refuses it as well.
    with pytest.raises(UnsafePathError, match=str(work)):
        MultipleLauncher(config=JobExecutorConfig(work_directory=work)).get_launch_command(job)
    assert list(work.iterdir()) == []


def test_local_list_and_attach_do_not_read_journals_of_another_user(
        attacker: User, shared: Path) -> None:
    # A forged journal could make attach() report any exit code for any process.
    work = attacker_dir(attacker, shared / "work", "755")
    attacker_dir(attacker, work / "local", "755")
    ex = LocalJobExecutor(config=JobExecutorConfig(work_directory=work))
    with pytest.raises(UnsafePathError, match=str(work)):
        ex.list()
    with pytest.raises(UnsafePathError, match=str(work)):
        ex.attach(Job(), str(os.getpid()))


def test_own_world_writable_work_directory_is_refused_for_every_job(
        attacker: User, shared: Path) -> None:
    work = shared / "work"
    work.mkdir()
    work.chmod(0o777)  # ours, but anyone may add or swap files in it
    for spec in (JobSpec("/bin/true"), JobSpec("/bin/true", launcher="multiple")):
        ex = LocalJobExecutor(config=JobExecutorConfig(work_directory=work))
        with pytest.raises(UnsafePathError, match="writable by group or others"):
            ex.submit(Job(spec))
    # The attacker can still write there, but finds nothing of ours to change.
    assert as_user(attacker, ["touch", str(work / "planted")]).returncode == 0
    assert sorted(p.name for p in work.iterdir()) == ["planted"]


def test_launchers_folder_planted_while_the_work_directory_was_open_is_refused(
        attacker: User, shared: Path) -> None:
    work = shared / "work"
    work.mkdir()
    work.chmod(0o777)
    planted = attacker_dir(attacker, work / "launchers")
    work.chmod(0o700)  # fixed afterwards; the attacker's folder inside is still theirs
    with pytest.raises(UnsafePathError) as info:
        deploy_files(work, [Path(script_based_launcher.__file__)])
    assert str(planted) in str(info.value) and "owned by" in str(info.value)


def test_deployed_script_cache_checks_the_folder_again(attacker: User, shared: Path) -> None:
    work = shared / "work"
    launcher = MultipleLauncher(config=JobExecutorConfig(work_directory=work))
    job = Job(JobSpec("/bin/true"))
    script = Path(launcher.get_launch_command(job)[1])
    folder = script.parent
    assert folder.parent.parent == work
    for path in everything_under(work):
        expected = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    # The folder changes hands after it was deployed and cached: it is not trusted any more.
    os.chown(folder, attacker.uid, attacker.gid)
    with pytest.raises(UnsafePathError, match=str(folder)):
        launcher.get_launch_command(job)
    with pytest.raises(UnsafePathError, match=str(folder)):
        deploy_files(work, launcher._files_to_deploy())
    os.chown(folder, 0, 0)
    os.chmod(work, 0o777)
    with pytest.raises(UnsafePathError, match="writable by group or others"):
        launcher.get_launch_command(job)
    os.chmod(work, 0o700)
    assert launcher.get_launch_command(job)[1] == str(script)


def test_a_deployed_file_others_could_write_is_replaced(shared: Path) -> None:
    work = shared / "work"
    files = MultipleLauncher(config=JobExecutorConfig(work_directory=work))._files_to_deploy()
    folder = deploy_files(work, files)
    script_based_launcher._deployed.clear()  # as a new process would find it
    (folder / "launcher_lib.sh").chmod(0o666)
    again = deploy_files(work, files)
    assert again == folder
    assert stat.S_IMODE((again / "launcher_lib.sh").stat().st_mode) == 0o600


# -- the other places that keep files --------------------------------------------------------


def test_batch_work_directory_made_by_another_user_is_refused(attacker: User,
                                                              shared: Path) -> None:
    work = attacker_dir(attacker, shared / "work", "755")
    ex = BatchTestJobExecutor(config=BatchTestExecutorConfig(
        work_directory=work, spool_directory=shared / "spool"))
    try:
        with pytest.raises(UnsafePathError, match=str(work)):
            ex.submit(Job(JobSpec("/bin/true")))
        # Attached jobs' exit-code files would be read there: refused as well.
        job = Job()
        with pytest.raises(UnsafePathError, match=str(work)):
            ex.attach(job, "1")
        assert job.executor is None
    finally:
        ex.close()
    assert list(work.iterdir()) == []


def test_batch_test_spool_of_another_user_is_refused(attacker: User, shared: Path) -> None:
    spool = attacker_dir(attacker, shared / "spool")
    ex = BatchTestJobExecutor(config=BatchTestExecutorConfig(
        work_directory=shared / "work", spool_directory=spool))
    try:
        with pytest.raises(SubmitException) as info:
            ex.submit(Job(JobSpec("/bin/true", environment={"TOKEN": "s3cret"})))
    finally:
        ex.close()
    assert f"batch-test spool {spool}" in str(info.value) and "owned by" in str(info.value)
    assert list(spool.iterdir()) == []


def test_batch_test_spool_is_not_readable_by_others(attacker: User, shared: Path) -> None:
    from datetime import timedelta

    work = shared / "work"
    ex = BatchTestJobExecutor(config=BatchTestExecutorConfig(work_directory=work,
                                                             keep_files=True))
    try:
        job = Job(JobSpec("/bin/true", environment={"TOKEN": "s3cret"}))
        ex.submit(job)
        assert job.wait(timedelta(seconds=60)) is not None
    finally:
        ex.close()
    spool = work / "batch-test-spool"
    paths = everything_under(spool)
    assert any(p.name == "script" for p in paths)
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    script = next(p for p in paths if p.name == "script")
    assert "s3cret" in script.read_text()
    # The other user cannot read the job's environment, nor list the jobs.
    seen = as_user(attacker, ["cat", str(script)])
    assert seen.returncode != 0 and "s3cret" not in seen.stdout
    assert as_user(attacker, ["ls", str(spool / "jobs")]).returncode != 0


def test_pilot_run_refuses_a_work_directory_of_another_user(attacker: User,
                                                           shared: Path) -> None:
    wd = attacker_dir(attacker, shared / "wd")
    requests = shared / "requests.json"
    requests.write_text('[{"request": "submit", "jobs": [{"name": "a", "execution": '
                        '{"exec": "/bin/true"}}]}]')
    result = subprocess.run([sys.executable, "-m", "psij", "pilot", "run", str(requests),
                             "--wd", str(wd), "--cores", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result
    assert f"pilot work directory (--wd) {wd}: is owned by {attacker.name}" in result.stderr
    assert list(wd.iterdir()) == []  # no journal, no log, no report


def test_pilot_journal_and_task_tmp_root_of_another_user_are_refused(
        attacker: User, shared: Path) -> None:
    from psij.executors.pilot._task_process import TaskProcesses
    from psij.executors.pilot.allocation import allocation_from_options
    from psij.executors.pilot.engine import EngineConfig, PilotEngine

    theirs = attacker_dir(attacker, shared / "theirs")
    engine = PilotEngine(allocation_from_options(1, None), EngineConfig(
        work_directory=shared, journal=theirs / "psij-pilot.journal"))
    with pytest.raises(UnsafePathError, match=f"pilot journal directory {theirs}"):
        engine.start()
    engine.close()
    with pytest.raises(UnsafePathError, match=str(theirs)):
        TaskProcesses(theirs, lambda task, code: None)
    assert list(theirs.iterdir()) == []
