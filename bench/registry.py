"""Benchmark of the job registry: what recording costs a submit, and listing a big registry.

Prints figures; asserts nothing. Each measurement runs in a fresh child interpreter of this
project's ``.venv`` with its own temporary work directory, and rounds alternate between the
registry on and off so that drift in machine load falls on both alike.

    .venv/bin/python bench/registry.py [--jobs 500] [--rounds 5] [--status-jobs 100000]

Figures:
- registry cost per submit (µs): the time of the first recording of a job (queued for the
  writer thread, in the submitting thread) and of a later status change (queued as well),
  measured directly around the recorder;
- local throughput (jobs/s): submit ``--jobs`` ``/bin/true`` jobs to ``local`` and wait for all,
  with the registry on and off;
- local throughput and latency with the keeper (the process that starts local jobs and records
  how they end after their submitter is gone) and without it (``keeper=False``: jobs started by
  the submitting process itself, as before the keeper), registry on: ``--jobs`` ``/bin/true``
  submitted at once, and the median submit-to-COMPLETED time of ``--latency-jobs`` jobs one
  after the other;
- ``psij status --all`` (s): the whole command, in a fresh process, over a registry holding
  ``--status-jobs`` final jobs;
- with ``--large N`` (not run by default: minutes): ``N`` local ``/bin/true`` jobs from one
  process, then ``N`` in all from ``--processes`` processes at once on one registry
  (``submit_many``, then ``wait()`` on each, then ``psij.registry.flush()``): the time to the
  last job's end, to the flush and to the process's exit, what flush returned, the registry's
  rows by state (every job must be there, final), rows per second (jobs over the time to the
  last flush), and the registry file's size (with its WAL); and the writer alone: ``N`` jobs'
  QUEUED, ACTIVE and COMPLETED reported as fast as one thread can, changes per second from the
  first to the end of the flush.

    .venv/bin/python bench/registry.py --large 100000 --processes 8 --skip-small
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"

_THROUGHPUT = r"""
import json, sys, time
from pathlib import Path
from psij import Job, JobExecutor, JobExecutorConfig, JobSpec
import psij.registry
wd, n, on = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "on"
psij.registry.set_recording(on)
ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=wd))
warm = Job(JobSpec("/bin/true")); ex.submit(warm); warm.wait()
jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
c0 = time.process_time()
t0 = time.perf_counter()
for j in jobs:
    ex.submit(j)
t_submit = time.perf_counter() - t0
for j in jobs:
    j.wait()
psij.registry.flush()
t_all = time.perf_counter() - t0
print(json.dumps({"submit_s": t_submit, "all_s": t_all,
                  "cpu_us": (time.process_time() - c0) / n * 1e6}))
"""

_KEEPER = r"""
import json, statistics, sys, time
from pathlib import Path
from psij import Job, JobExecutor, JobSpec
from psij.executors.local import LocalJobExecutorConfig
wd, n, lat, kept = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "on"
ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(work_directory=wd,
                                                                      keeper=kept))
warm = Job(JobSpec("/bin/true")); ex.submit(warm); warm.wait()
def cpu():  # this process's CPU time, and its keepers' (not counting the jobs)
    from psij.executors.local._keeper_client import _KEEPERS
    from psij.executors._process_watch import WATCH
    import os
    kept = 0.0
    for k in _KEEPERS.get((os.getpid(), id(WATCH)), []) if kept_on else []:
        f = open(f"/proc/{k.pid}/stat").read().rsplit(")", 1)[1].split()
        kept += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return time.process_time() + kept
kept_on = kept
jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
c0 = cpu()
t0 = time.perf_counter()
for j in jobs:
    ex.submit(j)
for j in jobs:
    j.wait()
t_all = time.perf_counter() - t0
cpu_us = (cpu() - c0) / n * 1e6
samples = []
for _ in range(lat):
    j = Job(JobSpec("/bin/true"))
    t0 = time.perf_counter()
    ex.submit(j)
    j.wait()
    samples.append(time.perf_counter() - t0)
print(json.dumps({"rate": n / t_all, "latency_ms": statistics.median(samples) * 1e3,
                  "cpu_us": cpu_us}))
"""

_COST = r"""
import json, sys, time
from pathlib import Path
from psij import Job, JobExecutorConfig, JobSpec, JobState, JobStatus
from psij.executors.local import LocalJobExecutor
from psij._registry.recorder import record, flush
wd, n = Path(sys.argv[1]), int(sys.argv[2])
ex = LocalJobExecutor(config=JobExecutorConfig(work_directory=wd))
jobs = []
for i in range(n + 1):
    j = Job(JobSpec("/bin/true", arguments=["x"]))
    j.executor = ex
    j._native_id = str(100000 + i)
    j._set_status(JobStatus(JobState.ACTIVE))
    jobs.append(j)
record(ex, jobs[-1])  # opens the registry
t0 = time.perf_counter()
for j in jobs[:n]:
    record(ex, j)
first = (time.perf_counter() - t0) / n
for j in jobs[:n]:
    j._set_status(JobStatus(JobState.COMPLETED, exit_code=0))
t0 = time.perf_counter()
for j in jobs[:n]:
    record(ex, j)
later = (time.perf_counter() - t0) / n
flush()
print(json.dumps({"first_us": first * 1e6, "later_us": later * 1e6}))
"""

_LARGE = r"""
import json, sys, time
from pathlib import Path
from psij import Job, JobExecutor, JobExecutorConfig, JobSpec
import psij.registry
wd, n = Path(sys.argv[1]), int(sys.argv[2])
ex = JobExecutor.get_instance("local", config=JobExecutorConfig(work_directory=wd))
jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
t0 = time.perf_counter()
ex.submit_many(jobs)
for j in jobs:
    j.wait()
t_jobs = time.perf_counter() - t0
ok = psij.registry.flush()
t_flush = time.perf_counter() - t0
states, why = {}, {}
for j in jobs:
    states[j.status.state.name] = states.get(j.status.state.name, 0) + 1
    if j.status.state.name != "COMPLETED":
        text = f"{j.status.state.name} {j.status.exit_code} {j.status.message}"[:200]
        why[text] = why.get(text, 0) + 1
print(json.dumps({"jobs_s": t_jobs, "flush_s": t_flush, "flush": ok, "states": states,
                  "why": sorted(why.items(), key=lambda kv: -kv[1])[:3]}))
"""

_FLOOD = r"""
import json, sys, time
from pathlib import Path
from psij import Job, JobExecutorConfig, JobSpec, JobState, JobStatus
from psij.executors.local import LocalJobExecutor
import psij.registry
wd, n = Path(sys.argv[1]), int(sys.argv[2])
ex = LocalJobExecutor(config=JobExecutorConfig(work_directory=wd))
jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
for i, j in enumerate(jobs):
    j.executor = ex
    j._native_id = str(100000 + i)
t0 = time.perf_counter()
for state in (JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED):
    for j in jobs:
        ex._set_job_status(j, JobStatus(state, exit_code=0 if state.final else None))
t_queued = time.perf_counter() - t0
ok = psij.registry.flush()
print(json.dumps({"queued_s": t_queued, "all_s": time.perf_counter() - t0, "flush": ok}))
"""

_FILL = r"""
import sys, time, uuid
from pathlib import Path
from psij._registry.accounting import NO_USE
from psij._registry.store import open_store
wd, n = Path(sys.argv[1]), int(sys.argv[2])
store = open_store(wd)
now = time.time()
rows = [(str(uuid.uuid4()), "local", "0.1.0", None, "{}", str(10000 + i),
         '{"executable": "/bin/true"}', "t%d" % (i % 10), now - n + i,
         "COMPLETED" if i % 7 else "FAILED", 6, 0 if i % 7 else 1, None, now - n + i, 1,
         1, None, None, *NO_USE)
        for i in range(n)]
store.write(rows, [])
"""


def child(code: str, *args: str) -> dict:
    done = subprocess.run([str(PYTHON), "-c", code, *args], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        sys.exit(f"measurement failed: {done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@contextlib.contextmanager
def _scratch() -> Iterator[str]:
    """A temporary folder, removed once nothing writes to it any more: a keeper outlives the
    child that started it and may still record a job's end while the folder is removed."""
    tmp = tempfile.mkdtemp()
    try:
        yield tmp
    finally:
        for _ in range(100):
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.exists(tmp):
                break
            time.sleep(0.1)


def large(n: int, processes: int) -> None:
    """``n`` jobs from one process, then from ``processes`` at once; see the module's text."""
    import sqlite3

    for count in (1, processes):
        with _scratch() as tmp:
            wd = Path(tmp) / "work"
            t0 = time.perf_counter()
            procs = [subprocess.Popen([str(PYTHON), "-c", _LARGE, str(wd),
                                       str(n // count + (k < n % count))],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for k in range(count)]
            results, warned = [], []
            for p in procs:
                out, err = p.communicate(timeout=3600)
                if p.returncode != 0:
                    sys.exit(f"measurement failed: {err}")
                results.append(json.loads(out.strip().splitlines()[-1]))
                warned += [line for line in err.splitlines() if "registry" in line]
            exited = time.perf_counter() - t0
            conn = sqlite3.connect(str(wd / "jobs.sqlite"))
            try:
                by_state = dict(conn.execute("SELECT state, count(*) FROM jobs GROUP BY state"))
            finally:
                conn.close()
            size = sum(f.stat().st_size for f in wd.glob("jobs.sqlite*"))
            flushed = max(r["flush_s"] for r in results)
            ran: dict = {}
            for r in results:
                for state, k in r["states"].items():
                    ran[state] = ran.get(state, 0) + k
            print(f"large run, {n} jobs from {count} process(es): jobs ended "
                  f"{max(r['jobs_s'] for r in results):.1f} s, flushed {flushed:.1f} s, "
                  f"exited {exited:.1f} s; flush() returned "
                  f"{sorted({r['flush'] for r in results})}; jobs ended {ran}; registry rows "
                  f"{by_state} ({sum(by_state.values())} in all), {n / flushed:.0f} jobs/s "
                  f"recorded, file {size / 1e6:.1f} MB; registry messages: {len(warned)}")
            for line in warned[:5]:
                print(f"  {line}")
            for r in results:
                for text, k in r.get("why", []):
                    print(f"  {k} job(s) ended {text}")
    with _scratch() as tmp:
        res = child(_FLOOD, str(Path(tmp) / "work"), str(n))
    print(f"registry writer alone, {n} jobs x 3 changes from one thread: queued in "
          f"{res['queued_s']:.1f} s, all written {res['all_s']:.1f} s ({3 * n / res['all_s']:.0f} "
          f"changes/s), flush() returned {res['flush']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-jobs", type=int, default=30)
    parser.add_argument("--status-jobs", type=int, default=100000)
    parser.add_argument("--large", type=int, default=0,
                        help="jobs of the large runs (default 0: none)")
    parser.add_argument("--processes", type=int, default=8,
                        help="processes of the second large run")
    parser.add_argument("--skip-small", action="store_true",
                        help="only the large runs")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.large:
        large(args.large, args.processes)
    if args.skip_small:
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return

    with _scratch() as tmp:
        costs = [child(_COST, str(Path(tmp) / f"cost{r}"), "2000") for r in range(3)]
    print(f"registry cost per job, first record (queued):  "
          f"{statistics.median(c['first_us'] for c in costs):8.1f} µs")
    print(f"registry cost per later status change (queued): "
          f"{statistics.median(c['later_us'] for c in costs):8.1f} µs")

    rates: dict = {"on": [], "off": []}
    cpus: dict = {"on": [], "off": []}
    for r in range(args.rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            with _scratch() as tmp:
                res = child(_THROUGHPUT, tmp, str(args.jobs), mode)
            rates[mode].append(args.jobs / res["all_s"])
            cpus[mode].append(res["cpu_us"])
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(f"local throughput, {args.jobs} jobs, median of {args.rounds}: registry on "
          f"{on:7.0f} jobs/s, off {off:7.0f} jobs/s ({(off - on) / off * 100:+.1f}% slower on); "
          f"CPU of the submitting process per job: on {statistics.median(cpus['on']):.0f} µs, "
          f"off {statistics.median(cpus['off']):.0f} µs")

    kept: dict = {"on": [], "off": []}
    for r in range(args.rounds):
        for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
            with _scratch() as tmp:
                kept[mode].append(child(_KEEPER, tmp, str(args.jobs), str(args.latency_jobs),
                                        mode))
    for mode in ("off", "on"):
        rate = statistics.median(k["rate"] for k in kept[mode])
        latency = statistics.median(k["latency_ms"] for k in kept[mode])
        cpu_us = statistics.median(k["cpu_us"] for k in kept[mode])
        print(f"local, keeper {mode:3}: {rate:7.0f} jobs/s ({args.jobs} jobs), latency "
              f"{latency:6.2f} ms (median of {args.rounds} rounds), CPU per job {cpu_us:.0f} µs "
              f"(submitting process and keeper)")

    with _scratch() as tmp:
        wd = Path(tmp) / ".psij" / "work"
        wd.mkdir(mode=0o700, parents=True)
        child(_FILL + "\nprint('{}')", str(wd), str(args.status_jobs))
        env = dict(os.environ, HOME=tmp)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            done = subprocess.run([str(PYTHON), "-m", "psij", "status", "--all"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
            times.append(time.perf_counter() - t0)
            if done.returncode != 0:
                sys.exit(f"psij status --all failed: {done.stderr.decode()}")
    print(f"psij status --all, {args.status_jobs} recorded jobs: "
          f"{statistics.median(times):.3f} s (median of 3, whole command)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
