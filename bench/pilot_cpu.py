"""The CPU time a pilot's coordinating process spends per task: ``psij pilot run`` on N tasks of
``/bin/true``, with the process's own CPU (every thread: request reading, the engine) apart from
its children's (its workers and the tasks), and the wall time.

The coordinating process keeps books while its workers start and reap the tasks, so its own
CPU per task is the figure that bounds throughput on many cores, and one that can be measured
on two. Each round runs the command in a fresh interpreter that reads its own resource usage
at the end; the median of the rounds is printed, with the tasks per second. Prints only;
nothing here asserts a figure.

Run: ``.venv/bin/python bench/pilot_cpu.py [--tasks N] [--cores N] [--rounds N]``.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from _help import description

# Run in the child: the command in process, then its own and its children's CPU as JSON.
_CHILD = """
import json, resource, sys, time
start = time.monotonic()
from psij.cli import main
status = main(sys.argv[1:])
wall = time.monotonic() - start
me = resource.getrusage(resource.RUSAGE_SELF)
them = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"status": status, "wall": wall, "self": me.ru_utime + me.ru_stime,
                  "children": them.ru_utime + them.ru_stime}))
"""


def one_round(requests: Path, cores: int, work: Path) -> Dict[str, float]:
    shutil.rmtree(work, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", _CHILD, "pilot", "run", str(requests),
                           "--cores", str(cores), "--wd", str(work)],
                          capture_output=True, text=True, check=True)
    figures: Dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if figures["status"] != 0:
        raise SystemExit(f"psij pilot run exited with {figures['status']}: {done.stderr}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="psij-bench-cpu-") as folder:
        requests = Path(folder) / "requests.json"
        requests.write_text(json.dumps([{"request": "submit", "jobs": [
            {"name": f"t{i}", "execution": {"exec": "/bin/true"},
             "resources": {"numCores": {"exact": 1}}} for i in range(args.tasks)]}]))
        rounds: List[Dict[str, float]] = []
        for i in range(args.rounds):
            figures = one_round(requests, args.cores, Path(folder) / "wd")
            rounds.append(figures)
            print(f"round {i + 1}: coordinating process {figures['self']:.2f} s CPU, "
                  f"children {figures['children']:.2f} s CPU, wall {figures['wall']:.2f} s",
                  flush=True)
    per_task = statistics.median(r["self"] for r in rounds) / args.tasks * 1e6
    wall = statistics.median(r["wall"] for r in rounds)
    print(f"{args.tasks} tasks of /bin/true on {args.cores} core(s) (machine: "
          f"{os.cpu_count()} cores), medians of {args.rounds} rounds:")
    print(f"  coordinating process CPU per task: {per_task:.0f} us")
    print(f"  wall: {wall:.2f} s ({args.tasks / wall:.0f} tasks/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
