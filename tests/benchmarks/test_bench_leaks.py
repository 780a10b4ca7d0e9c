"""bench/leaks.py at a tiny size: it runs each kind it is given and reports, as JSON, the
figures before and after and what was left (timing is never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

LEAKS_BENCH = Path(__file__).resolve().parents[2] / "bench" / "leaks.py"


def test_the_leak_bench_reports_each_kind_and_nothing_left(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(LEAKS_BENCH), "--count", "2", "--kinds",
                           "local,remote", "--json"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout)
    assert [r["kind"] for r in reports] == ["local", "remote"]
    for report in reports:
        assert report["count"] == 2
        assert not any(report["leaked"].values()), report
        assert set(report["start"]) == set(report["end"]) == {
            "threads", "descriptors", "children", "paths"}
    # The local jobs' keeper is kept on purpose, and said so.
    assert reports[0]["shared"]["children"] == ["keeper"]


def test_an_unknown_kind_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(LEAKS_BENCH), "--kinds", "nosuch"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "--kinds: accepted pilot, local" in done.stderr
