"""The benchmark of the pilot across nodes (bench/pilot_nodes.py), in its quickest form, runs the
pilot in Slurm jobs of four nodes and of one, and prints every figure it promises; timing is
never asserted. Its options are checked before anything is submitted."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from real.test_pilot_nodes_real import _slurm_problem

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pilot_nodes.py"
NUMBER = r"\d+(\.\d+)?"


def run_bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)


def test_bad_options_are_refused_naming_the_option(tmp_path: Path) -> None:
    done = run_bench(tmp_path, "--nodes", "0")
    assert done.returncode == 2
    assert "--nodes: a whole number of at least 1 is accepted, got 0" in done.stderr


@pytest.mark.slurm
def test_quick_run_prints_every_figure_for_four_nodes_and_one(tmp_path: Path) -> None:
    problem = _slurm_problem()
    if problem is not None:
        pytest.skip(problem)
    done = run_bench(tmp_path, "--quick", "--tasks", "60", "--cores-per-node", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "== Pilot across nodes: 60 tasks of /bin/true, median of 1 round(s)" in out
    row = (rf"^  (\d node\(s\) x \d core\(s\)) +(?P<steady>{NUMBER}) +\d+ - \d+ "
           rf"+(?P<core>{NUMBER}) /core +(?P<whole>{NUMBER}) +(?P<ready>{NUMBER}) s "
           rf"+(?P<nodes>\d+)$")
    rows = {m.group(1): (float(m["steady"]), float(m["core"]), int(m["nodes"]),
                         float(m["whole"]), float(m["ready"]))
            for m in re.finditer(row, out, re.M)}
    assert set(rows) == {"4 node(s) x 1 core(s)", "1 node(s) x 1 core(s)",
                         "1 node(s) x 4 core(s)"}, out
    assert all(tps > 0 and per_core > 0 and whole > 0 and ready >= 0
               for tps, per_core, _, whole, ready in rows.values()), out
    assert rows["4 node(s) x 1 core(s)"][2] == 4  # every node ran tasks
    assert re.search(rf"^  (PASS|FAIL) +per allocated core, 4 node\(s\) x 1 core\(s\) vs "
                     rf"1 node\(s\) x 1 core\(s\): {NUMBER}x \(goal >= 0.8x\)$", out, re.M), out
    assert re.search(rf"^  INFO +same machine, 4 node\(s\) x 1 core\(s\) vs 1 node\(s\) x 4 "
                     rf"core\(s\): {NUMBER}x the steady tasks/s$", out, re.M), out
    assert re.search(rf"^Machine: \d+ core\(s\) usable here \(os.sched_getaffinity\); load "
                     rf"average {NUMBER} before the runs, {NUMBER} after$", out, re.M), out
    assert "Caveat: " in out
