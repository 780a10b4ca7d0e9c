"""bench/holding.py at a tiny size: it runs, every chosen job is counted, and it prints its
figures (timing itself is never asserted)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "holding.py"


def test_holding_bench_prints_cost_per_decision(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "2000", "--shapes", "5",
                           "--cap", "3", "--decisions", "500"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    match = re.search(r"(\d+) held jobs in 5 shapes, cap 3: ([\d.]+) us per arrival, "
                      r"([\d.]+) us per decision .* (\d+) decisions", done.stdout)
    assert match is not None, done.stdout
    assert int(match.group(1)) == 2000 - 5 * 3
    assert float(match.group(3)) > 0 and int(match.group(4)) == 500
