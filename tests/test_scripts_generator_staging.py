"""Golden submit scripts with staging, for every batch template: the full hostile job of the
golden tests plus stage-in, stage-out and cleanup entries with hostile paths.

Set PSIJ_UPDATE_GOLDEN=1 to rewrite tests/golden/staging/<name>.sh after an intended change,
then review the difference. Besides the byte comparison: the script with staging differs from
the one without (tests/golden/<name>.sh, unchanged) only by the staging lines, and the staging
library passes bash's syntax check.
"""

import difflib
import os
import subprocess
from pathlib import Path
from typing import Dict, Type

import pytest

import test_scripts_generator as test_batch_scripts
from psij import Job
from psij._scripts.quoting import double_quoted, shell_word
from psij.executors.batch.batch_scheduler_executor import (
    BatchSchedulerExecutor,
    BatchSchedulerExecutorConfig,
)
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode
from support import batch_sites as _batch_sites

GOLDEN = Path(__file__).parent / "golden"
EXECUTORS: Dict[str, Type[BatchSchedulerExecutor]] = {
    **test_batch_scripts.EXECUTORS, **_batch_sites.EXECUTORS}
HOSTILE = "/data/in 'q' \"d\" $(touch PWNED) `id` é ✓"
LIB = Path(__file__).parent.parent / "launchers" / "staging_lib.sh"


def full_job(name: str) -> Job:
    if name in test_batch_scripts.EXECUTORS:
        return test_batch_scripts.full_job(test_batch_scripts.PREFIX[name])
    return _batch_sites.full_job(name)


def add_staging(job: Job) -> Job:
    spec = job.spec
    assert spec is not None
    spec.stage_in = [StageIn(f"file://{HOSTILE}/a.txt", "a.txt"),
                     StageIn(f"{HOSTILE}/b", "sub dir/b'", StagingMode.LINK),
                     StageIn("file://localhost/srv/c", f"{HOSTILE}/c", StagingMode.MOVE)]
    spec.stage_out = [StageOut("out $(x).txt", f"{HOSTILE}/out.txt"),
                      StageOut("log", "/results/log", StageOutFlags.IF_PRESENT,
                               StagingMode.MOVE),
                      StageOut("part", "/results/part", StageOutFlags.ON_CANCEL,
                               StagingMode.LINK)]
    spec.cleanup = ["scratch 'x'", "/tmp/psij scratch"]
    spec.cleanup_flags = StageOutFlags.ON_SUCCESS | StageOutFlags.ON_CANCEL
    return job


def render(name: str, job: Job, work: Path) -> str:
    ex = EXECUTORS[name](config=BatchSchedulerExecutorConfig(work_directory=work))
    text = ex.submit_script(job)
    context = ex._create_script_context(job)
    launch = context["psij"]["launch_command"]  # type: ignore[index]
    text = text.replace(shell_word(launch[1]), "<LAUNCHER_SCRIPT>")
    staging = context["psij"]["staging"]  # type: ignore[index]
    if staging is not None:
        text = text.replace(shell_word(staging["lib"]), "<STAGING_LIB>")
    return text.replace(double_quoted(str(ex.work_directory.absolute())), "<SCRIPT_DIR>")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path / "work 'dir' \"q\" $(x) `y` é"


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_golden_script_with_staging(name: str, work: Path) -> None:
    job = add_staging(full_job(name))
    text = render(name, job, work)
    golden = GOLDEN / "staging" / f"{name}.sh"
    if os.environ.get("PSIJ_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{name}: the script differs from {golden}"
    raw = EXECUTORS[name](config=BatchSchedulerExecutorConfig(work_directory=work)
                          ).submit_script(job)
    check = subprocess.run(["bash", "-n"], input=raw.encode(), capture_output=True)
    assert check.returncode == 0, check.stderr.decode()


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_staging_changes_only_the_staging_lines(name: str, work: Path) -> None:
    plain = render(name, full_job(name), work)
    assert plain == (GOLDEN / f"{name}.sh").read_text()  # jobs without staging: unchanged
    staged = render(name, add_staging(full_job(name)), work)
    removed, added = [], []
    for line in difflib.ndiff(plain.splitlines(), staged.splitlines()):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    assert removed == ["_psij_run _psij_launch"]
    # (Grid Engine scripts ask for -notify with or without staging: psij_signals.)
    assert [a for a in added if a.startswith("#")] == []
    assert all(a.startswith(("_psij_", "source <STAGING_LIB>", "#")) for a in added), added
    assert added.count("_psij_staging_run _psij_launch") == 1


def test_paths_are_absolute_and_each_one_shell_word(work: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = Job(test_batch_scripts.full_job("batch-test").spec)
    assert job.spec is not None
    job.spec.stage_in = [StageIn("rel in.txt", "x")]
    job.spec.stage_out = [StageOut("y", "rel/out's")]
    text = render("batch-test", job, work)
    directory = test_batch_scripts.HOSTILE_DIR
    assert (f"_psij_stage_in COPY {shell_word(str(tmp_path / 'rel in.txt'))} "
            f"{shell_word(directory + '/x')}\n") in text
    target = shell_word(str(tmp_path / "rel" / "out's"))
    assert f"_psij_stage_out 14 COPY y {shell_word(directory + '/y')} {target}\n" in text


def test_staging_library_syntax() -> None:
    check = subprocess.run(["bash", "-n", str(LIB)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
