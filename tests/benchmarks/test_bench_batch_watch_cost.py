"""bench/batch_watch_cost.py at a small size: it follows the jobs, prints the poller's own counts
(one directory look every 0.25 s, no listing and no status command while nothing changes) and,
with strace, the system calls of the process. Figures are printed, never asserted on time."""

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "batch_watch_cost.py"


def test_a_small_run_prints_the_counts() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "300", "--seconds", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    line = re.search(r"300 jobs followed for 2 s: (\d+) directory looks \([\d.]+/s\), "
                     r"(\d+) listings, (\d+) status commands", done.stdout)
    assert line is not None, done.stdout
    looks, listings, commands = map(int, line.groups())
    assert looks >= 1 and (listings, commands) == (0, 0), done.stdout
    if shutil.which("strace") is not None:
        assert re.search(r"system calls of all the process's threads over 1 s: \d+ "
                         r"\([\d.]+/s\): ", done.stdout), done.stdout


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--seconds", "0"], ["--seconds", "nan"]])
def test_absurd_sizes_are_refused(args: List[str]) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--" in done.stderr, done.stderr
