"""How the launcher scripts are deployed into the work directory (one folder per content,
named by its digest, safe against edits and concurrent deploys) and where the package finds
its data folders.
"""

import hashlib
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List

import pytest

import psij
from psij import _data
from psij.launchers import script_based_launcher
from psij.launchers.multiple import MultipleLauncher
from psij.launchers.script_based_launcher import ScriptBasedLauncher, deploy_files
from psij.launchers.single import SingleLauncher

# --- deployment ----------------------------------------------------------------------------

def deployed_folders(work: Path) -> List[str]:
    return sorted(p.name for p in (work / "launchers").iterdir())


def test_deploy_is_idempotent(config: psij.JobExecutorConfig) -> None:
    job = psij.Job(psij.JobSpec("true"))
    first = SingleLauncher(config=config).get_launch_command(job)[1]
    second = SingleLauncher(config=config).get_launch_command(job)[1]
    assert first == second
    folder = Path(first).parent
    assert deployed_folders(config.work_directory) == [folder.name]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    lib = _data.data_dir("launchers") / "launcher_lib.sh"
    assert (folder / "launcher_lib.sh").read_bytes() == lib.read_bytes()
    assert stat.S_IMODE((folder / "single_launch.sh").stat().st_mode) & 0o077 == 0
    MultipleLauncher(config=config).get_launch_command(job)
    assert len(deployed_folders(config.work_directory)) == 2


def test_deployed_folder_is_named_by_the_sha256_of_names_and_contents(
        config: psij.JobExecutorConfig) -> None:
    launcher = SingleLauncher(config=config)
    folder = Path(launcher.get_launch_command(psij.Job(psij.JobSpec("true")))[1]).parent
    digest = hashlib.sha256()
    for path in launcher._files_to_deploy():
        for part in (path.name.encode(), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "big") + part)
    assert folder.name == digest.hexdigest()[:32]


def test_changed_script_gets_a_new_folder(tmp_path: Path) -> None:
    script = tmp_path / "custom_launch.sh"
    script.write_text('source "$(dirname "$0")/launcher_lib.sh"\necho v1\n')
    config = psij.JobExecutorConfig(work_directory=tmp_path / "work")
    job = psij.Job(psij.JobSpec("true"))
    old = ScriptBasedLauncher(script, config).get_launch_command(job)[1]
    script.write_text('source "$(dirname "$0")/launcher_lib.sh"\necho v2\n')
    new = ScriptBasedLauncher(script, config).get_launch_command(job)[1]
    assert old != new
    assert Path(old).read_text().endswith("v1\n") and Path(new).read_text().endswith("v2\n")


def test_edited_deployment_is_replaced(config: psij.JobExecutorConfig,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    job = psij.Job(psij.JobSpec("true"))
    script = Path(SingleLauncher(config=config).get_launch_command(job)[1])
    original = script.read_bytes()
    script.write_text("broken\n")
    monkeypatch.setattr(script_based_launcher, "_deployed", {})  # as in a fresh process
    again = Path(SingleLauncher(config=config).get_launch_command(job)[1])
    assert again == script
    assert script.read_bytes() == original
    assert deployed_folders(config.work_directory) == [script.parent.name]


def test_deploy_refuses_two_files_with_one_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.sh").write_text("1")
    (tmp_path / "b" / "x.sh").write_text("2")
    with pytest.raises(ValueError, match=r"x\.sh"):
        deploy_files(tmp_path / "work", [tmp_path / "a" / "x.sh", tmp_path / "b" / "x.sh"])


def test_missing_script_is_reported(config: psij.JobExecutorConfig, tmp_path: Path) -> None:
    launcher = ScriptBasedLauncher(tmp_path / "nope.sh", config)
    with pytest.raises(FileNotFoundError, match=r"nope\.sh"):
        launcher.get_launch_command(psij.Job(psij.JobSpec("true")))


def test_concurrent_deploys_end_in_one_folder(tmp_path: Path) -> None:
    work = tmp_path / "shared work"
    start_at = time.time() + 1.0
    code = textwrap.dedent(f"""\
        import time, psij
        from psij.launchers.single import SingleLauncher
        from psij.launchers.script_based_launcher import deploy_files
        launcher = SingleLauncher(psij.JobExecutorConfig(work_directory={str(work)!r}))
        files = launcher._files_to_deploy()
        time.sleep(max(0.0, {start_at!r} - time.time()))
        print(deploy_files(launcher.config.work_directory, files))
        """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outputs)) == 1
    folder = Path(outputs[0])
    assert deployed_folders(work) == [folder.name]
    assert sorted(p.name for p in folder.iterdir()) == ["launcher_lib.sh", "single_launch.sh"]


# --- data folders --------------------------------------------------------------------------

def test_data_dir_finds_the_source_tree() -> None:
    folder = _data.data_dir("launchers")
    assert (folder / "launcher_lib.sh").is_file()
    assert _data.data_dir("templates").is_dir()
    with pytest.raises(ValueError, match="'scripts'"):
        _data.data_dir("scripts")


def test_data_dir_prefers_the_installed_copy(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "src" / "psij"
    package.mkdir(parents=True)
    monkeypatch.setattr(_data, "__file__", str(package / "_data.py"))
    _data.data_dir.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="launchers"):
            _data.data_dir("launchers")
        (tmp_path / "launchers").mkdir()
        assert _data.data_dir("launchers") == tmp_path / "launchers"
        _data.data_dir.cache_clear()
        (package / "_data" / "launchers").mkdir(parents=True)
        assert _data.data_dir("launchers") == package / "_data" / "launchers"
    finally:
        _data.data_dir.cache_clear()
