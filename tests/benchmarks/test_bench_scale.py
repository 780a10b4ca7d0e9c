"""The scale benchmark, in its quickest form, prints every figure it promises and exits 0; the
spawn ceiling measures from several processes; a pilot's own CPU is told from its children's.

Timing is never asserted: only that each figure is there, with a number, where it belongs.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

BENCH = Path(__file__).resolve().parents[2] / "bench"

NUMBER = r"-?\d+(\.\d+)?"


def run_bench(tmp_path: Path, script: str, args: List[str]) -> str:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def figure(stdout: str, name: str, unit: str) -> float:
    """The median of the figure table's row ``name``; fails if the row is missing or failed."""
    match = re.search(rf"^ +{re.escape(name)} +({NUMBER}) {re.escape(unit)} ", stdout, re.M)
    assert match, f"no figure {name!r} in {unit} in:\n{stdout}"
    return float(match.group(1))


def test_scale_prints_every_figure_and_goal(tmp_path: Path) -> None:
    stdout = run_bench(tmp_path, "scale.py", ["--quick", "--ours-only", "--tasks", "12",
                                              "--rounds", "2", "--cores", "1",
                                              "--processes", "2"])
    usable = len(os.sched_getaffinity(0))
    assert f"Machine: {usable} core(s) usable (os.sched_getaffinity); this run uses 1, " \
           "pinned to CPU(s) " in stdout
    assert figure(stdout, "spawn ceiling, 1 process", "starts/s") > 0
    assert figure(stdout, "spawn ceiling, 2 processes", "starts/s") > 0
    assert figure(stdout, "local executor", "jobs/s") > 0
    assert figure(stdout, "pilot, psij pilot run --cores 1", "tasks/s") > 0
    # The CPU figures are there for both of ours (two rows share the submitter's name, one per
    # side; only ours runs here); the pilot's per-task figures are differences and may be 0.
    assert figure(stdout, "submitter CPU per job", "us") > 0
    assert figure(stdout, "Job creation CPU per job (before)", "us") >= 0
    assert figure(stdout, "reaped children CPU per job", "us") >= 0
    figure(stdout, "pilot process CPU per task", "us")
    figure(stdout, "reaped children CPU per task", "us")
    assert figure(stdout, "pilot process CPU, 1-task run", "ms") > 0
    # Both rounds counted, and the peers left out of the table.
    assert re.search(r"^ +local executor +\S+ jobs/s +\S+ - \S+ +2$", stdout, re.M), stdout
    assert "psij-python local executor" not in stdout and "qcg-pilotjob, " not in stdout
    goals = stdout.split("== Goals", 1)[1]
    assert "goals for a 16-core machine, this run used 1 of" in goals
    for side in ("local", "pilot"):
        lines = [line.split(None, 2) for line in goals.splitlines()[1:] if line.strip()]
        texts = [rest for verdict, name, rest in lines if name == side]
        assert len(texts) == 5, goals
        rated = [t for t in texts if not t.startswith((">= 6 x", ">= 15 x"))]
        # Every goal ours can be judged on alone carries the ratio (a per-task CPU of a run
        # this small may be under what the clock resolves); the peers' are N/A.
        assert all(re.search(rf": ({NUMBER})x the goal$", t)
                   or t.endswith("below the clock's resolution at this size") for t in rated), \
            goals
    assert re.search(r"local +>= 8000 jobs/s \(goal for 16 cores\)", goals)
    assert re.search(r"pilot +>= 10000 tasks/s \(goal for 16 cores\)", goals)
    assert re.search(r"pilot +<= 40 us CPU of the coordinating process per task", goals)
    assert re.search(r"N/A +local +>= 6 x psij-python's", goals)
    assert re.search(r"N/A +pilot +>= 15 x qcg-pilotjob's", goals)


def test_spawn_ceiling_from_several_processes(tmp_path: Path) -> None:
    stdout = run_bench(tmp_path, "spawn_ceiling.py", ["--tasks", "20", "--at-once", "2",
                                                      "--processes", "1", "3"])
    lines = [line for line in stdout.splitlines() if "/bin/true" in line]
    assert "at most 2 at once: " in lines[0]
    assert [line.split(" process")[0].split()[-1] for line in lines[1:]] == ["1", "3"]
    assert all(float(line.split(": ")[1].split()[0]) > 0 for line in lines)
    result = json.loads(run_bench(tmp_path, "spawn_ceiling.py",
                                  ["--tasks", "5", "--at-once", "--processes", "7", "--json"]))
    # Fewer tasks than processes: every process still gets one.
    assert result["tasks"] == 5 and list(result["multi"]) == ["7"] and not result["single"]


BURNER = """
import subprocess, sys, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
burn(float(sys.argv[1]))
if len(sys.argv) > 2:
    subprocess.run([sys.executable, __file__, sys.argv[2]], check=True)
"""


def test_run_measured_tells_own_cpu_from_children(tmp_path: Path) -> None:
    burner = tmp_path / "burner.py"
    burner.write_text(BURNER)
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import json, pilot\n"
            f"with open({str(tmp_path / 'out')!r}, 'wb') as out:\n"
            f"    print(json.dumps(pilot.run_measured([sys.executable, {str(burner)!r}, "
            f"'0.4', '0.15'], out, {str(tmp_path)!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    returncode, _whole, own, children = json.loads(done.stdout)
    assert returncode == 0
    # Burnt 0.4 s itself and 0.15 s in its child, each plus an interpreter's start.
    assert 0.35 <= own < 0.9, own
    assert 0.1 <= children < 0.4, children
