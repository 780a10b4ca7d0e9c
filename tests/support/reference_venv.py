"""A side virtual environment holding psij-python (the PSI/J reference implementation) from the
package index, for the tests that compare it with this package.

The environment is made once under the test cache folder (``.test-cache/`` at the top of the
repository, or ``$PSIJ_TEST_CACHE``) and reused while its marker file is there. Without a
package index the caller's test skips, saying so.
"""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]

# psij-python 0.9.11 with the versions of its dependencies whose behaviour shows in what the
# comparisons see (typeguard's checks, pystache's rendering), for every test that compares.
# (The venv's folder in the cache: not the name of the unpacked source distribution that
# tests/real/test_psij_python_suite_real.py keeps there.)
REFERENCE = "psij-python-0.9.11-side-venv"
REFERENCE_REQUIREMENTS = ("psij-python==0.9.11", "typeguard==4.6.1", "pystache==0.6.8")


def cache_dir() -> Path:
    return Path(os.environ.get("PSIJ_TEST_CACHE", REPO / ".test-cache"))


def side_venv(name: str, requirements: Sequence[str], timeout: int = 900,
              then: Sequence[Sequence[str]] = ()) -> Path:
    """The python of the venv ``<cache>/<name>`` with ``requirements`` installed, then each pip
    command of ``then`` run (made on the first call; a venv without its marker file, left by an
    install that failed or was interrupted, or made with other requirements, is made again).
    It is made at its final place, as the commands it installs name its interpreter's path.
    Skips the test when pip cannot reach a package index."""
    venv = cache_dir() / name
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    wanted = "\n".join([*requirements, *(" ".join(c) for c in then)]) + "\n"

    def made() -> bool:  # with these requirements
        try:
            return marker.read_text() == wanted and python.exists()
        except OSError:
            return False

    if made():
        return python
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f"{name}.lock", "w") as lock:  # two test processes may ask at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made():
            _make(venv, requirements, timeout, then)
            marker.write_text(wanted)
    return python


def _make(venv: Path, requirements: Sequence[str], timeout: int,
          then: Sequence[Sequence[str]]) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PSIJ_CONFIG")}
    got = subprocess.run([*pip, "install", "--quiet", *requirements],
                         capture_output=True, text=True, timeout=timeout, env=env)
    for command in then if got.returncode == 0 else ():
        got = subprocess.run([*pip, *command], capture_output=True, text=True, timeout=timeout,
                             env=env)
        if got.returncode != 0:
            break
    if got.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        text = got.stdout + got.stderr
        if any(s in text for s in ("No matching distribution", "Could not find a version",
                                   "NewConnectionError", "Network is unreachable",
                                   "Temporary failure in name resolution")):
            pytest.skip(f"no package index gave {' '.join(requirements)}: {text[-300:]}")
        pytest.fail(f"pip could not install {' '.join(requirements)}:\n{text[-3000:]}")
