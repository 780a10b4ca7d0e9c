"""bench/flow_ends.py runs at a tiny size and prints its two figures (never asserted)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "flow_ends.py"


def test_it_prints_the_lag_with_and_without_watch() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "1", "--poll-interval", "0.5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["with watch", "polling only"]
    assert all(re.search(r"median \d+\.\d{3} s, worst \d+\.\d{3} s \(1 jobs", line)
               for line in lines)
