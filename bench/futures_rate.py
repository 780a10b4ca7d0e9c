"""Rate of many trivial calls through ``psij.futures.FunctionExecutor``: calls per second and
the time to the first result, for ``submit`` (calls packed as they come) and ``map`` (chunks),
on the ``local`` and ``pilot`` executors.

Prints figures; asserts nothing. Each executor runs once in this process with a temporary work
directory, after one warm-up call (which starts the executor and loads cloudpickle):

    .venv/bin/python bench/futures_rate.py [--calls 1000] [--executors local,pilot]

Per executor and way: calls/s from the first submit to the last result, the time to the first
result, the time of the submit loop and the number of jobs the calls went in. The last line is
the same as JSON.
"""

import argparse
import concurrent.futures
import json
import operator
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _help import description


def _config(name: str, work: str) -> Any:
    if name == "pilot":
        from psij.executors.pilot.executor import PilotJobExecutorConfig

        return PilotJobExecutorConfig(work_directory=work)
    from psij import JobExecutorConfig

    return JobExecutorConfig(work_directory=work)


def measure(name: str, way: str, calls: int) -> Dict[str, Any]:
    from psij.futures import FunctionExecutor

    with tempfile.TemporaryDirectory() as work, \
            FunctionExecutor(name, config=_config(name, work)) as ex:
        ex.submit(operator.add, 1, 1).result()
        start = time.perf_counter()
        first = None
        if way == "submit":
            futures = [ex.submit(operator.add, i, 1) for i in range(calls)]
            loop = time.perf_counter() - start
            for future in concurrent.futures.as_completed(futures):
                future.result()
                if first is None:
                    first = time.perf_counter() - start
            jobs = len({future.job_id for future in futures})
        else:
            results = ex.map(operator.add, range(calls), range(calls))
            loop = time.perf_counter() - start
            for _value in results:
                if first is None:
                    first = time.perf_counter() - start
            jobs = -1  # not seen through map's iterator
        total = time.perf_counter() - start
    return {"executor": name, "way": way, "calls": calls, "calls_per_s": calls / total,
            "first_result_ms": 1000 * (first or total), "submit_loop_ms": 1000 * loop,
            "jobs": jobs}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--executors", default="local,pilot")
    args = parser.parse_args(argv)
    rows = []
    for name in args.executors.split(","):
        for way in ("submit", "map"):
            row = measure(name, way, args.calls)
            rows.append(row)
            jobs = f", {row['jobs']} jobs" if row["jobs"] >= 0 else ""
            print(f"{name:6} {way:6}: {row['calls']} calls, {row['calls_per_s']:.0f} calls/s, "
                  f"first result after {row['first_result_ms']:.0f} ms, submit loop "
                  f"{row['submit_loop_ms']:.0f} ms{jobs}", flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
