"""bench/report_size.py runs at a tiny size and prints each figure it promises, for the pilot
run and the registry (timing is never asserted)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "report_size.py"


def test_the_report_bench_prints_its_figures_for_both_sources(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "300"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for source in ("pilot", "registry"):
        assert f"{source}: 300 runs" in out
    assert len(re.findall(r"page size +\d+\.\d+ MB \(\d+ bytes\)", out)) == 2
    assert len(re.findall(r"psij report --html +\d+\.\d+ s \(whole command, fresh process; "
                          r"status 0\)", out)) == 2
    assert len(re.findall(r"HTML page +\d+\.\d+ s", out)) == 2
