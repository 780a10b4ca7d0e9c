"""One run of ``bench/batch_ends.py``: N short jobs through one batch executor, and for each the
seconds from the job's own end to ``job.wait()`` returning here.

Runs in the interpreter of the implementation measured (this project's ``.venv`` or
psij-python's side venv), so it imports ``psij`` only inside functions, and only names that
psij-python 0.9.11 has too. Each job runs ``/bin/sh END_SCRIPT STAMP SECONDS``: it sleeps, then
writes the time (``date +%s.%N``) to its own file as its last action. Every job has its own
waiting thread, started as soon as the job is submitted (``--mode single``) or as soon as
``submit_many`` returned (``--mode array``), which notes the time ``wait()`` returned; so no job
waits behind another's ``wait()``. Prints one JSON line, whose keys ``batch_ends.py`` reads:

- ``unsupported``: why this implementation cannot run this executor (no other key then);
- ``samples_s``: per job, seconds from its end stamp to its ``wait()`` returning (only jobs
  that ended COMPLETED with a stamp); ``problems``: the others, named with their state;
- ``begin``/``end``: the epoch times bounding the run (before the executor is made, after the
  last ``wait()`` returned), over which the scheduler commands are counted;
- ``submit_s``: seconds spent in ``submit``/``submit_many``; ``ends_spread_s``: seconds from
  the first job's end stamp to the last one's (jobs that all end at once all wait for the same
  poll); ``native_ids``.

Usage: ``python bench/_ends_worker.py --executor slurm --mode single --jobs 50 --work DIR``.
"""

import argparse
import importlib
import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

# The script each job runs: its arguments are plain words, which any launcher passes intact.
END_SCRIPT = 'sleep "$2"\ndate +%s.%N >"$1.tmp" && mv "$1.tmp" "$1"\n'
# Where each executor's configuration class is, in both implementations.
CONFIGS = {
    "slurm": ("psij.executors.batch.slurm", "SlurmExecutorConfig"),
    "sge": ("psij.executors.batch.sge", "SgeExecutorConfig"),
    "batch-test": ("psij.executors.batch.batch_test", "BatchTestExecutorConfig"),
}


# Settings of this package only (--accounting-wait), given to the configuration as they are.
EXTRA: Dict[str, Any] = {}


def _config(executor: str, work: Path, interval: Optional[float]) -> Any:
    module_name, class_name = CONFIGS[executor]
    config_class = getattr(importlib.import_module(module_name), class_name)
    if interval is None:  # the implementation's own default polling
        return config_class(work_directory=work, **EXTRA)
    return config_class(work_directory=work, queue_polling_interval=interval, **EXTRA)


def _make_executor(executor: str, work: Path, interval: Optional[float]) -> Tuple[Any, Any]:
    """The executor and its configuration, or raises LookupError saying why there is none."""
    import psij

    try:
        config = _config(executor, work, interval)
    except (ImportError, AttributeError) as exc:
        raise LookupError(f"psij {psij.__version__} has no {executor} executor ({exc})") \
            from None
    try:
        return psij.JobExecutor.get_instance(executor, config=config), config
    except ValueError as exc:
        raise LookupError(f"psij {psij.__version__}: {exc}") from None


def run(executor_name: str, mode: str, n_jobs: int, work: Path, interval: Optional[float],
        job_seconds: float, name: str, wait_limit: float) -> Dict[str, Any]:
    import psij

    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamps = work / "stamps"
    stamps.mkdir(mode=0o700, exist_ok=True)
    end_script = work / "end.sh"
    end_script.write_text(END_SCRIPT)
    begin = time.time()
    try:
        executor, config = _make_executor(executor_name, work / "psij", interval)
    except LookupError as exc:
        return {"unsupported": str(exc), "implementation": f"psij {psij.__version__}"}
    if mode == "array" and not hasattr(executor, "submit_many"):
        return {"unsupported": f"psij {psij.__version__} has no submit_many"}
    jobs = []
    for i in range(n_jobs):
        spec = psij.JobSpec("/bin/sh", [str(end_script), str(stamps / f"end-{i}"),
                                        f"{job_seconds:g}"], name=name,
                            attributes=psij.JobAttributes(duration=timedelta(minutes=5)))
        jobs.append(psij.Job(spec))
    returned: Dict[int, Tuple[float, str]] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + wait_limit

    def waiter(i: int, job: Any) -> None:
        try:
            left = max(1.0, deadline - time.monotonic())
            status = job.wait(timeout=timedelta(seconds=left))
            when = time.time()
            state = "timed out" if status is None else str(status.state)
        except Exception as exc:  # one job's failure is that job's problem
            when, state = time.time(), f"wait() raised {exc!r}"
        with lock:
            returned[i] = (when, state)

    threads = [threading.Thread(target=waiter, args=(i, job), daemon=True)
               for i, job in enumerate(jobs)]
    submit_s = 0.0
    if mode == "single":
        for job, thread in zip(jobs, threads):
            start = time.perf_counter()
            executor.submit(job)
            submit_s += time.perf_counter() - start
            thread.start()
    else:
        start = time.perf_counter()
        executor.submit_many(jobs)
        submit_s = time.perf_counter() - start
        for thread in threads:
            thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()) + 5.0)
    end = time.time()
    samples: List[float] = []
    ends: List[float] = []
    problems: List[str] = []
    for i, job in enumerate(jobs):
        when, state = returned.get(i, (end, "wait() did not return"))
        stamp = stamps / f"end-{i}"
        if state != "COMPLETED" or not stamp.exists():
            problems.append(f"job {i} ({job.native_id}): {state}"
                            + ("" if stamp.exists() else ", no end stamp"))
            if state != "COMPLETED":
                try:
                    job.cancel()
                except Exception:  # already gone, or never submitted
                    pass
            continue
        ends.append(float(stamp.read_text()))
        samples.append(when - ends[-1])
    return {"implementation": f"psij {psij.__version__}", "executor": executor_name,
            "mode": mode, "jobs": n_jobs, "interval_s": float(config.queue_polling_interval),
            "begin": begin, "end": end, "submit_s": submit_s, "samples_s": samples,
            "ends_spread_s": max(ends) - min(ends) if ends else None,
            "problems": problems, "native_ids": [str(job.native_id) for job in jobs]}


def main() -> None:
    parser = argparse.ArgumentParser(description="One run of bench/batch_ends.py.")
    parser.add_argument("--executor", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--mode", choices=("single", "array"), required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--interval", type=float, help="polling interval (default: the "
                                                       "implementation's own)")
    parser.add_argument("--job-seconds", type=float, default=1.0)
    parser.add_argument("--name", default="psij-bench-ends")
    parser.add_argument("--wait-limit", type=float, default=600.0)
    parser.add_argument("--accounting-wait", type=float, help="this package's setting")
    args = parser.parse_args()
    if args.accounting_wait is not None:
        EXTRA["accounting_wait"] = args.accounting_wait
    result = run(args.executor, args.mode, args.jobs, args.work, args.interval,
                 args.job_seconds, args.name, args.wait_limit)
    # Flushed at once: the driver keeps this line even if the process then fails to exit.
    print(json.dumps(result), flush=True)
    # Polling threads of either implementation may still be running a command; the run is
    # over, so the process ends without waiting for them.
    os._exit(0)


if __name__ == "__main__":
    main()
