"""The floor of single submissions through ``sbatch`` on this machine's Slurm, next to
psij-python's rate, in alternating rounds.

- ``cold``: ``sbatch --parsable`` started per job with a minimal script on its standard input
  and waited for, with nothing else done: what any client that runs ``sbatch`` per job pays at
  least (psij-python does that, plus its own work);
- ``warm``: the same, but each ``sbatch`` was started 50 ms earlier and has done its start-up
  (what ``spare_submit_commands`` does ahead of need): the time from giving it the script to
  its job id is the least any client using ``sbatch`` can take per job;
- ``psij-python``: ``bench/batch.py``'s single-submission worker in psij-python's venv (jobs
  deferred an hour, as ``warm`` and ``cold``).

``psij-python / warm`` is the most that any ``sbatch``-based client can gain over psij-python
here; when it is below 1.5, a 1.5x single-submission rate needs another way to the controller.
Jobs are deferred an hour (``--begin``) and cancelled after each round. Prints figures only.
Run: ``.venv/bin/python bench/sbatch_floor.py [--jobs N] [--rounds N]`` (needs a running Slurm
and, for the psij-python figure, ``bench/batch.py``'s side venv).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

from _help import description
from run import REFERENCE_PYTHON

NAME = f"sbatch-floor-{os.getpid()}"
SCRIPT = (f"#!/bin/bash\n#SBATCH --job-name={NAME}\n#SBATCH --time=1\n"
          "#SBATCH --begin=now+1hour\n#SBATCH --output=/dev/null\n/bin/true\n").encode()
ARGV = ["sbatch", "--parsable"]


def _start() -> "subprocess.Popen[bytes]":
    return subprocess.Popen(ARGV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _submit(proc: "subprocess.Popen[bytes]") -> float:
    begin = time.perf_counter()
    out, err = proc.communicate(SCRIPT)
    took = time.perf_counter() - begin
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"sbatch failed: {err.decode(errors='replace').strip()}")
    return took


def cold(jobs: int) -> List[float]:
    times = []
    for _ in range(jobs):
        begin = time.perf_counter()
        _submit(_start())
        times.append(time.perf_counter() - begin)
    return times


def warm(jobs: int) -> List[float]:
    times = []
    for _ in range(jobs):
        proc = _start()
        time.sleep(0.05)  # its start-up is done by then
        times.append(_submit(proc))
    return times


def psij_python(jobs: int) -> Optional[List[float]]:
    if not REFERENCE_PYTHON.exists():
        return None
    work = tempfile.mkdtemp(prefix="sbatch-floor-")
    done = subprocess.run([str(REFERENCE_PYTHON), os.path.join(os.path.dirname(__file__),
                                                               "batch.py"),
                           "worker", "slurm-submit", "--jobs", str(jobs), "--work", work,
                           "--defer"], capture_output=True, text=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    subprocess.run(["scancel", *result["native_ids"]], capture_output=True, timeout=120)
    return [result["median_submit_ms"] / 1e3]


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    print(f"jobs named {NAME}")
    medians: Dict[str, List[float]] = {"cold": [], "warm": [], "psij-python": []}
    for round_no in range(1, args.rounds + 1):
        for label, measure in (("cold", cold), ("warm", warm), ("psij-python", psij_python)):
            try:
                times = measure(args.jobs)
            finally:
                subprocess.run(["scancel", "--name", NAME], capture_output=True, timeout=120)
            if times is None:
                continue
            medians[label].append(statistics.median(times) * 1e3)
            print(f"round {round_no} {label:11}: median {medians[label][-1]:.2f} ms per submit")
    figures = {k: statistics.median(v) for k, v in medians.items() if v}
    print("medians of round medians: " +
          ", ".join(f"{k} {v:.2f} ms" for k, v in figures.items()))
    if "psij-python" in figures:
        print(f"most any sbatch-based client can gain over psij-python here: "
              f"{figures['psij-python'] / figures['warm']:.2f}x (warm sbatch alone)")


if __name__ == "__main__":
    main()
