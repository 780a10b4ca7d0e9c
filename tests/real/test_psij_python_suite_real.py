"""psij-python 0.9.11's own tests that need two or more nodes, run against this package on the
real Slurm started by tests/setup (make schedulers).

Of psij-python's tests, only ``tests/test_resources.py::test_nodes`` runs a job over several nodes
(``/bin/hostname`` with two nodes, two processes per node, expecting four lines from two distinct
hosts), with the launchers its executor supports on Slurm: ``srun`` and ``mpirun``. Its source
distribution is fetched at test time with pip into a cache folder (``.test-cache/`` at the top of
the repository, or ``$PSIJ_TEST_CACHE``) and unpacked there; its tests run with pytest in a child
interpreter that imports this repository's ``psij`` from ``src`` (psij-python is not installed)
with ``tests/real/psij_python_harness`` on the path: the test support those tests import, which the
distribution does not ship. Without a package index the test skips, saying so; without a
Slurm of two or more nodes it skips, saying why.
"""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest

from real.test_batch_multinode_real import _multinode_problem

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "psij_python_harness"
REQUIREMENT = "psij-python==0.9.11"
SDIST = "psij-python-0.9.11"
# Every psij-python test that needs two or more nodes, with the launchers it is run with.
MULTI_NODE_TESTS = ["tests/test_resources.py::test_nodes"]
EXECUTORS = "slurm:srun,slurm:mpirun"


def _cache_dir() -> Path:
    return Path(os.environ.get("PSIJ_TEST_CACHE", REPO / ".test-cache"))


def _index_url() -> str:
    """The package index pip uses (PIP_INDEX_URL, pip's configuration, or PyPI)."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        got = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                             capture_output=True, text=True, timeout=60)
        url = got.stdout.strip() if got.returncode == 0 else ""
    return (url or "https://pypi.org/simple").rstrip("/")


def _fetch_sdist(cache: Path) -> Path:
    """The unpacked source distribution, fetched once into the cache."""
    unpacked = cache / SDIST
    if (unpacked / "tests" / "test_resources.py").is_file():
        return unpacked
    cache.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-binary", ":all:", "--dest", str(cache), REQUIREMENT],
        capture_output=True, text=True, timeout=300)
    archive = cache / f"{SDIST}.tar.gz"
    if got.returncode != 0 or not archive.is_file():
        index = _index_url()
        try:
            with urllib.request.urlopen(f"{index}/psij-python/", timeout=30):
                pass
        except (OSError, ValueError) as ex:
            pytest.skip(f"no package index reachable ({index}: {ex}) to fetch {REQUIREMENT}'s "
                        "source distribution")
        pytest.fail(f"{index} answers but pip could not fetch {REQUIREMENT}'s source "
                    f"distribution:\n{got.stdout}{got.stderr}")
    partial = cache / f"{SDIST}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for m in members:
            # Only plain files and folders under the distribution's own folder.
            inside = m.name == SDIST or m.name.startswith(SDIST + "/")
            if not inside or ".." in Path(m.name).parts or not (m.isfile() or m.isdir()):
                pytest.fail(f"{archive}: unexpected member {m.name!r}")
        # The "data" filter where this Python has it (3.12 warns without a filter).
        if hasattr(tarfile, "data_filter"):
            tar.extractall(partial, members=members, filter="data")
        else:
            tar.extractall(partial, members=members)
    shutil.rmtree(unpacked, ignore_errors=True)
    (partial / SDIST).rename(unpacked)
    partial.rmdir()
    return unpacked


@pytest.fixture(scope="module")
def psij_python_tests() -> Path:
    problem = _multinode_problem()
    if problem is not None:
        pytest.skip(problem)
    return _fetch_sdist(_cache_dir()) / "tests"


def test_psij_python_multi_node_tests_pass_against_this_package(psij_python_tests: Path,
                                                                 tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # The executor's polling interval comes from a site configuration file, as a site would set
    # it; psij-python's tests make their executors without a configuration.
    site_config = tmp_path / "psij.toml"
    site_config.write_text("[executors.slurm]\npoll_interval = 1\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PSIJ_CONFIG")}
    env.update(HOME=str(home), PSIJ_CONFIG=str(site_config),
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(HARNESS)]))
    # An empty ini file: neither this repository's pytest settings nor any found above the
    # cache folder apply to psij-python's tests.
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    argv = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(psij_python_tests),
            "-p", "no:cacheprovider", "-p", "psij_python_options", "-rA", "-v",
            f"--executors={EXECUTORS}",
            *(str(psij_python_tests.parent / t) for t in MULTI_NODE_TESTS)]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=900)
    report = run.stdout + run.stderr
    # The package under test is this repository's.
    assert f"from {REPO / 'src' / 'psij' / '__init__.py'}" in report, report
    assert run.returncode == 0, report
    for test in MULTI_NODE_TESTS:
        for executor in EXECUTORS.split(","):
            assert re.search(rf"^PASSED .*{re.escape(test)}\[{re.escape(executor)}\]$", report,
                             re.M), f"{test}[{executor}] did not pass:\n{report}"
    summary = report.strip().splitlines()[-1]
    assert re.search(rf"\b{len(MULTI_NODE_TESTS) * 2} passed\b", summary), summary
    assert not re.search(r"\b(failed|skipped|error)", summary), summary
