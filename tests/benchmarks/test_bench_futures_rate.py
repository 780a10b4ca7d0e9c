"""bench/futures_rate.py runs at a tiny size and prints its figures (timing is never
asserted)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "futures_rate.py"


def test_the_futures_rate_benchmark_prints_its_figures(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--calls", "20"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(r["executor"], r["way"]) for r in rows] == [
        ("local", "submit"), ("local", "map"), ("pilot", "submit"), ("pilot", "map")]
    for row in rows:
        assert row["calls"] == 20 and row["calls_per_s"] > 0
    assert all(1 <= row["jobs"] <= 20 for row in rows if row["way"] == "submit")
    assert "calls/s" in done.stdout
