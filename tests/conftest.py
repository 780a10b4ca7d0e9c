"""Fixtures that more than one test module uses.

``site`` gives, for each of the PBS Pro, Torque, LSF, Cobalt, Flux and NQSV executors, one whose
scheduler commands are the fakes of ``tests/support/fake_site_scheduler.py``
(tests/test_batch_sites_runs.py, tests/test_batch_sites_staging.py). ``config``, ``job_dir`` and
``argv_dump`` are for the tests of the script-based launchers (tests/test_launchers_*.py).

After every test, the job registry's writer forgets the changes that test made it unable to
write, so that a later test's ``psij.registry.flush()`` is not False for them.

A run over the whole tests folder fails when a test module under it gave no test (a module
moved where pytest does not look, or a folder pytest cannot import), naming the module.
"""

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

import psij
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor
from support.batch_sites import EXECUTORS, fake_site
from support.launchers import ARGV_DUMP

TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    """Every test module of the tree gives at least one test when the whole tree is run."""
    started = [(config.invocation_params.dir / arg).resolve() for arg in config.args]
    if started != [TESTS] or session.testsfailed or config.getoption("ignore") \
            or config.getoption("markexpr"):
        # A part of the tree (by path, --ignore or -m: tests/setup/run-tests.sh runs the tree
        # in parts after collecting it whole), or collection errors that pytest reports itself.
        return
    given = {Path(item.path) for item in items}
    silent = sorted(str(path.relative_to(TESTS)) for path in TESTS.rglob("test_*.py")
                    if path not in given and "psij_python_harness" not in path.parts)
    if silent:
        raise pytest.UsageError(f"test modules under tests/ that gave no test: {silent}")


@pytest.fixture(params=sorted(EXECUTORS))
def site(request: pytest.FixtureRequest, tmp_path: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[Tuple[str, BatchSchedulerExecutor]]:
    """An executor whose scheduler commands are the fakes, first on PATH."""
    name: str = request.param
    executor = fake_site(name, tmp_path, monkeypatch)
    yield name, executor
    executor.close()


@pytest.fixture(autouse=True)
def _registry_failures_forgotten() -> Iterator[None]:
    """A registry that a test made unwritable must not make later tests' flush() say False:
    this process's writer forgets the changes it could not write."""
    yield
    recorder = sys.modules.get("psij._registry.recorder")
    if recorder is not None:
        recorder._WRITER.forget_failures()


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    d = tmp_path / "job dir $(x) 'q'"
    d.mkdir()
    return d


@pytest.fixture
def config(tmp_path: Path) -> psij.JobExecutorConfig:
    return psij.JobExecutorConfig(work_directory=tmp_path / "work")


@pytest.fixture
def argv_dump(tmp_path: Path) -> Path:
    path = tmp_path / "argv_dump.py"
    path.write_text(ARGV_DUMP)
    return path


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder with a short path (Unix socket paths are limited) that jobs of the real
    schedulers on this machine can read."""
    folder = Path(tempfile.mkdtemp(prefix="pjs"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
