"""Benchmark workloads, one per sub-command, each printing one JSON line of results.

Run as ``python bench/workloads.py <workload> [options]`` with the interpreter of the venv whose
``psij`` is to be measured. Only the public PSI/J API is used, so the same code measures any
implementation of it; ``bench/run.py`` drives these workloads alternately in two venvs.

This module must not import ``psij`` at module level (the ``import`` workload times a fresh
interpreter's import, and ``--help`` must work without a package), and must not judge results:
it measures and reports, the driver compares.
"""

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List

from _help import description

if TYPE_CHECKING:
    import psij

# A single /bin/true that has not finished after this long means the executor lost it; waiting
# longer would only turn a wrong result into a hang.
JOB_WAIT_LIMIT = timedelta(seconds=120)
# Interpreter start-up is fast; a child taking this long is stuck, not slow.
IMPORT_RUN_LIMIT_S = 60.0


def _clean_child_env() -> Dict[str, str]:
    """The environment for a measured child interpreter: no inherited module search paths."""
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE"):
        env.pop(var, None)
    return env


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_import(runs: int) -> Dict[str, Any]:
    """Wall and CPU time of ``python -c 'import psij'`` and of ``python -c 'pass'``, interleaved.

    CPU time (user + system of the child) is reported beside wall time because it hardly moves
    when other processes compete for the machine, while wall time does.
    """
    env = _clean_child_env()
    samples: Dict[str, List[float]] = {"baseline_s": [], "import_s": [],
                                       "baseline_cpu_s": [], "import_cpu_s": []}
    # An empty working directory keeps '' on sys.path from shadowing the installed package
    # and from making every import scan a crowded directory.
    with tempfile.TemporaryDirectory(prefix="psij-bench-import-") as cwd:
        def timed(code: str, kind: str) -> None:
            cpu_before = _children_cpu_s()
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=IMPORT_RUN_LIMIT_S)
            samples[f"{kind}_s"].append(time.perf_counter() - start)
            samples[f"{kind}_cpu_s"].append(_children_cpu_s() - cpu_before)

        # Untimed first runs write byte-code caches and warm the page cache for both commands.
        timed("pass", "baseline")
        timed("import psij", "import")
        for values in samples.values():
            values.clear()
        for _ in range(runs):
            timed("pass", "baseline")
            timed("import psij", "import")

    def cost_ms(kind: str) -> float:
        return (statistics.median(samples[f"import{kind}"])
                - statistics.median(samples[f"baseline{kind}"])) * 1e3

    return {"workload": "import", "runs": runs, **samples,
            "import_ms": cost_ms("_s"), "import_cpu_ms": cost_ms("_cpu_s")}


@contextmanager
def local_executor(name: str = "local") -> Iterator["psij.JobExecutor"]:
    """An executor (the local one unless ``name`` says otherwise) writing into a fresh work
    directory that is removed afterwards."""
    import psij

    work_dir = Path(tempfile.mkdtemp(prefix="psij-bench-work-"))
    executor = None
    try:
        config = psij.JobExecutorConfig(work_directory=work_dir)
        executor = psij.JobExecutor.get_instance(name, config=config)
        yield executor
    finally:
        close = getattr(executor, "close", None)
        if callable(close):
            close()
        shutil.rmtree(work_dir, ignore_errors=True)


def true_job() -> "psij.Job":
    import psij

    return psij.Job(psij.JobSpec(executable="/bin/true"))


def wait_all(jobs: List["psij.Job"]) -> int:
    """Wait for every job to be final; return how many did not end COMPLETED."""
    import psij

    not_completed = 0
    for job in jobs:
        status = job.wait(timeout=JOB_WAIT_LIMIT)
        if status is None or status.state != psij.JobState.COMPLETED:
            not_completed += 1
    return not_completed


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_throughput(n_jobs: int, executor_name: str = "local") -> Dict[str, Any]:
    """Jobs/s for ``n_jobs`` /bin/true jobs submitted at once, first submit to last final.

    The jobs are created before the measured window; their creation is reported on its own.
    """
    with local_executor(executor_name) as executor:
        create_cpu_start = _self_cpu_s()
        create_start = time.perf_counter()
        jobs = [true_job() for _ in range(n_jobs)]
        create_s = time.perf_counter() - create_start
        create_cpu_s = _self_cpu_s() - create_cpu_start
        cpu_start = _self_cpu_s()
        children_start = _children_cpu_s()
        start = time.perf_counter()
        for job in jobs:
            executor.submit(job)
        not_completed = wait_all(jobs)
        elapsed_s = time.perf_counter() - start
        cpu_s = _self_cpu_s() - cpu_start
        children_cpu_s = _children_cpu_s() - children_start
    return {
        "workload": "throughput",
        "jobs": n_jobs,
        "seconds": elapsed_s,
        "jobs_per_s": n_jobs / elapsed_s,
        # CPU of this process only (all its threads; children's /bin/true not counted): the
        # executor's own cost per job, which competing load on the machine hardly changes.
        "cpu_ms_per_job": cpu_s * 1e3 / n_jobs,
        # The same window's CPU of the children this process reaped (and their own reaped
        # descendants): the jobs themselves when this process reaps them, nothing when another
        # process does.
        "children_cpu_ms_per_job": children_cpu_s * 1e3 / n_jobs,
        # Building the Job objects, before the window above.
        "create_s": create_s,
        "create_cpu_ms_per_job": create_cpu_s * 1e3 / n_jobs,
        "not_completed": not_completed,
    }


def measure_latency(n_jobs: int) -> Dict[str, Any]:
    """Submit-to-COMPLETED time of ``n_jobs`` sequential /bin/true jobs after one warm-up job."""
    with local_executor() as executor:
        warm_up = true_job()
        executor.submit(warm_up)
        not_completed = wait_all([warm_up])
        samples_s: List[float] = []
        for _ in range(n_jobs):
            job = true_job()
            start = time.perf_counter()
            executor.submit(job)
            not_completed += wait_all([job])
            samples_s.append(time.perf_counter() - start)
    return {
        "workload": "latency",
        "jobs": n_jobs,
        "samples_s": samples_s,
        "median_ms": statistics.median(samples_s) * 1e3,
        "not_completed": not_completed,
    }


def resident_set_bytes() -> int:
    """This process's VmRSS from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                value, unit = line.split()[1:3]
                if unit != "kB":
                    raise ValueError(f"VmRSS: unexpected unit {unit!r} in {line!r}")
                return int(value) * 1024
    raise ValueError("/proc/self/status has no VmRSS line")


def measure_rss(batch: int, chunk: int) -> Dict[str, Any]:
    """RSS growth per finished job still referenced, after a warm-up batch of the same size.

    Jobs go in chunks of ``chunk`` submitted at once so the number of live children stays
    bounded; every Job object is kept for the whole run, as a user holding results would.
    """
    kept: List[psij.Job] = []

    def run_batch(executor: "psij.JobExecutor") -> int:
        not_completed = 0
        for first in range(0, batch, chunk):
            jobs = [true_job() for _ in range(min(chunk, batch - first))]
            for job in jobs:
                executor.submit(job)
            not_completed += wait_all(jobs)
            kept.extend(jobs)
        return not_completed

    with local_executor() as executor:
        not_completed = run_batch(executor)
        gc.collect()
        rss_before = resident_set_bytes()
        not_completed += run_batch(executor)
        gc.collect()
        rss_after = resident_set_bytes()
    return {
        "workload": "rss",
        "batch": batch,
        "jobs_kept": len(kept),
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
        "bytes_per_job": (rss_after - rss_before) / batch,
        "not_completed": not_completed,
    }


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description(__doc__))
    sub = parser.add_subparsers(dest="workload", required=True)
    p = sub.add_parser("import", help="time `import psij` in a fresh interpreter")
    p.add_argument("--runs", type=_positive_int, default=15)
    p = sub.add_parser("throughput", help="jobs/s for many /bin/true submitted at once")
    p.add_argument("--jobs", type=_positive_int, default=1000)
    p.add_argument("--executor", default="local",
                   help="the executor's name (default local; pilot runs an in-process pilot)")
    p = sub.add_parser("latency", help="submit-to-COMPLETED time of sequential jobs")
    p.add_argument("--jobs", type=_positive_int, default=30)
    p = sub.add_parser("rss", help="RSS growth per finished job still referenced")
    p.add_argument("--batch", type=_positive_int, default=2000)
    p.add_argument("--chunk", type=_positive_int, default=200)
    return parser.parse_args(argv)


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    runners: Dict[str, Callable[[], Dict[str, Any]]] = {
        "import": lambda: measure_import(args.runs),
        "throughput": lambda: measure_throughput(args.jobs, args.executor),
        "latency": lambda: measure_latency(args.jobs),
        "rss": lambda: measure_rss(args.batch, args.chunk),
    }
    result = runners[args.workload]()
    # Flushed at once: the driver keeps this line even if the process then fails to exit.
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
