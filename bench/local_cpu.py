"""Benchmark of the local executor's submitting process: jobs per second, and the CPU time it
spends per job (all its threads), the figure that bounds throughput on many cores.

Prints figures; asserts nothing. Each round runs in a fresh child interpreter of this project's
``.venv`` with its own temporary work directory: ``--jobs`` ``/bin/true`` jobs made, submitted at
once and waited for, after a warm-up of 50. Rounds alternate between the job registry on and
off (recording is done by a thread of the submitting process, so it counts).

    .venv/bin/python bench/local_cpu.py [--jobs 3000] [--rounds 3] [--keepers N]

``--keepers N`` runs N keepers (``PSIJ_LOCAL_KEEPERS``); by default the executor decides (one
per 2 cores, started when those running are busy). Figures per round: jobs/s, the submit loop's
time per job, the CPU time of the submitting process per job (user + system), and the CPU time
of making the Job and JobSpec objects, which is the caller's and is shown apart.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"

_ROUND = r"""
import json, resource, sys, time
from pathlib import Path
import psij.registry
from psij import Job, JobExecutor, JobExecutorConfig, JobSpec
n, record = int(sys.argv[2]), sys.argv[3] == "on"
psij.registry.set_recording(record)
ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=Path(sys.argv[1])))
warm = [Job(JobSpec("/bin/true")) for _ in range(50)]
for j in warm:
    ex.submit(j)
for j in warm:
    j.wait()
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0 = cpu()
jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
c1, t0 = cpu(), time.monotonic()
for j in jobs:
    ex.submit(j)
t1 = time.monotonic()
for j in jobs:
    j.wait()
t2, c2 = time.monotonic(), cpu()
bad = sum(1 for j in jobs if j.status.exit_code != 0)
print(json.dumps({"rate": n / (t2 - t0), "submit_us": (t1 - t0) / n * 1e6,
                  "cpu_us": (c2 - c1) / n * 1e6, "create_us": (c1 - c0) / n * 1e6,
                  "failed": bad}))
"""


def one_round(jobs: int, record: bool, keepers: int) -> dict:
    env = dict(os.environ)
    if keepers:
        env["PSIJ_LOCAL_KEEPERS"] = str(keepers)
    with tempfile.TemporaryDirectory(prefix="psij-bench-local-") as tmp:
        out = subprocess.run([str(PYTHON), "-c", _ROUND, tmp, str(jobs),
                              "on" if record else "off"],
                             capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"round failed: {out.stderr[-2000:]}")
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keepers", type=int, default=0,
                        help="run this many keepers (default: the executor decides)")
    args = parser.parse_args()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    print(f"local executor, {args.jobs} /bin/true jobs per round, {cores} cores, keepers: "
          f"{args.keepers or 'automatic'}")
    results: dict = {True: [], False: []}
    for _ in range(args.rounds):
        for record in (True, False):
            r = one_round(args.jobs, record, args.keepers)
            results[record].append(r)
            print(f"  registry {'on ' if record else 'off'}: {r['rate']:7.0f} jobs/s, submit "
                  f"{r['submit_us']:5.0f} µs/job, submitting process CPU {r['cpu_us']:5.1f} "
                  f"µs/job (making the jobs: {r['create_us']:4.1f} µs/job), "
                  f"{r['failed']} failed", flush=True)
    for record in (True, False):
        rs = results[record]
        print(f"median, registry {'on ' if record else 'off'}: "
              f"{statistics.median(r['rate'] for r in rs):7.0f} jobs/s, CPU "
              f"{statistics.median(r['cpu_us'] for r in rs):5.1f} µs/job")


if __name__ == "__main__":
    sys.exit(main())
