"""bench/flow_machine.py runs at a tiny size and prints its figures (timing is never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "flow_machine.py"


def test_the_flow_machine_benchmark_prints_its_figures(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--handles", "3", "--per-handle", "20",
                           "--events", "200"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["live"] == 60
    assert result["records"] >= 200
    for key in ("create_us", "submitted_us", "active_us", "replace_us", "throttled_us",
                "timer_us", "status_us", "renew_us"):
        assert result[key] > 0, key
    assert "µs per event" in done.stdout
