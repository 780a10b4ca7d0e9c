"""bench/supervise.py at a tiny size: it runs and prints its figures (never asserted)."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "supervise.py"


def test_bench_prints_the_machine_cost_and_the_study_overhead() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--updates", "300", "--clients", "20"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "µs per client status update (300 updates)" in done.stdout
    assert done.stdout.count("study of 20 /bin/true clients on local") == 2
