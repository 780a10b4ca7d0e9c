"""The worker half of ``bench/futures.py``: one measurement, run in a child interpreter of the
venv of the side measured (``python bench/futures.py worker ...``): this package's
``psij.futures`` from ``.venv``, or submitit from its side venv. Nothing here imports either
package at module level. The function called is defined here and this module is registered
with cloudpickle (which both sides pickle with) to be pickled by value, so that no job needs
this folder on its search path.

Each workload prints one JSON line last: the figures, and the scheduler ids of the jobs it
submitted (the driver cancels whatever is left of them after a failed round).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

OURS = "ours"
SUBMITIT = "submitit"
# Both sides' Slurm jobs go ahead of other users' jobs on the shared test Slurm (root may
# lower a job's nice value), so that waits behind other work do not weigh on either side.
SLURM_NICE = -10000
# Each Slurm job's time limit: long enough for a queue of 1000 calls on this machine.
SLURM_LIMIT_MIN = 30


def trivial(x: int) -> int:
    """The function every call runs."""
    return x * 2 + 1


class FirstSeen:
    """The first moment any of the calls had a result (monotonic seconds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.at: Optional[float] = None

    def mark(self, *_: object) -> None:
        now = time.monotonic()
        with self._lock:
            if self.at is None:
                self.at = now


def _watch_first(jobs: List[Any], first: FirstSeen, stop: threading.Event,
                 every_s: float = 0.01) -> threading.Thread:
    """A thread asking submitit's jobs ``done()`` (as submitted so far) until one is: submitit
    has no completion callback, and its ``result()`` waits in steps of a second, so this
    notes a result sooner than a caller of ``result()`` would see it."""
    def watch() -> None:
        while not stop.is_set() and first.at is None:
            for job in list(jobs):
                if job.done():
                    first.mark()
                    return
            time.sleep(every_s)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _figures(calls: int, t0: float, t_end: float, first: Optional[float],
             results: List[int]) -> Dict[str, Any]:
    wrong = sum(1 for i, r in enumerate(results) if r != trivial(i))
    span = t_end - t0
    return {"calls": calls, "seconds": span, "calls_per_s": calls / span if span > 0 else 0.0,
            "first_result_s": None if first is None else first - t0,
            "wrong_results": wrong + calls - len(results)}


# -- local ------------------------------------------------------------------------------------


def ours_local(executor: str, calls: int, work: Path) -> Dict[str, Any]:
    """``calls`` x ``submit(trivial, i)`` on this package's ``executor`` (``local`` or
    ``pilot``), from the executor's creation to the last result in hand."""
    from psij.futures import FunctionExecutor

    first = FirstSeen()
    t0 = time.monotonic()
    with FunctionExecutor(executor, work_directory=work) as ex:
        futures = []
        for i in range(calls):
            future = ex.submit(trivial, i)
            future.add_done_callback(first.mark)
            futures.append(future)
        results = [f.result() for f in futures]
        t_end = time.monotonic()
    return {**_figures(calls, t0, t_end, first.at, results), "native_ids": []}


def submitit_local(calls: int, work: Path) -> Dict[str, Any]:
    """``calls`` x ``submit(trivial, i)`` on submitit's ``LocalExecutor`` with its defaults,
    from the executor's creation to the last result in hand."""
    import submitit

    first = FirstSeen()
    stop = threading.Event()
    t0 = time.monotonic()
    ex = submitit.LocalExecutor(folder=str(work / "submitit"))
    ex.update_parameters(timeout_min=SLURM_LIMIT_MIN)
    jobs: List[Any] = []
    watcher = _watch_first(jobs, first, stop)
    try:
        for i in range(calls):
            jobs.append(ex.submit(trivial, i))
        results = [job.result() for job in jobs]
        t_end = time.monotonic()
    finally:
        stop.set()
        watcher.join()
    return {**_figures(calls, t0, t_end, first.at, results), "native_ids": []}


# -- Slurm ------------------------------------------------------------------------------------


def _in_order(results: Iterable[int]) -> Tuple[List[int], Optional[float]]:
    """The results in order, and the moment the first of them came."""
    out: List[int] = []
    first = None
    for value in results:
        if first is None:
            first = time.monotonic()
        out.append(value)
    return out, first


def ours_slurm_map(calls: int, work: Path, polling: Optional[float]) -> Dict[str, Any]:
    """``map(trivial, range(calls))`` on this package's ``slurm`` executor: one array; its
    queue polling interval ``polling`` seconds (the executor's default when None)."""
    import psij
    from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
    from psij.futures import FunctionExecutor

    attributes = psij.JobAttributes(duration=timedelta(minutes=SLURM_LIMIT_MIN),
                                    custom_attributes={"slurm.nice": SLURM_NICE})
    config = None if polling is None else BatchSchedulerExecutorConfig(
        queue_polling_interval=polling, initial_queue_polling_delay=min(polling, 2.0))
    t0 = time.monotonic()
    with FunctionExecutor("slurm", config=config, attributes=attributes,
                          work_directory=work) as ex:
        results, first = _in_order(ex.map(trivial, range(calls)))
        t_end = time.monotonic()
    return {**_figures(calls, t0, t_end, first, results), "native_ids": _slurm_ids_under(work)}


def submitit_slurm_map(calls: int, work: Path) -> Dict[str, Any]:
    """``map_array(trivial, range(calls))`` on submitit's ``SlurmExecutor`` with its defaults
    (``srun`` inside each array element, 256 elements at most at once), then each job's
    ``result()`` in order."""
    import submitit

    t0 = time.monotonic()
    ex = submitit.SlurmExecutor(folder=str(work / "submitit"))
    ex.update_parameters(time=SLURM_LIMIT_MIN, additional_parameters={"nice": SLURM_NICE})
    jobs = ex.map_array(trivial, range(calls))
    native_ids = sorted({job.job_id.split("_")[0] for job in jobs})
    results, first = _in_order(job.result() for job in jobs)
    t_end = time.monotonic()
    return {**_figures(calls, t0, t_end, first, results), "native_ids": native_ids}


def _slurm_ids_under(work: Path, wait_s: float = 30.0) -> List[str]:
    """The ids (array ids for arrays) of the Slurm jobs named ``fn:trivial`` working under
    ``work``, in the accounting records of the last hour. Slurm's accounting records a job a
    moment after it ended: asked again for up to ``wait_s`` until it has some."""
    under = str(work) + os.sep
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-S", "now-1hours", "--name",
                              "fn:trivial", "-o", "JobID,WorkDir"], capture_output=True,
                             text=True, check=False).stdout
        ids = {line.partition("|")[0].split("_")[0] for line in out.splitlines()
               if (line.partition("|")[2] + os.sep).startswith(under)}
        if ids or time.monotonic() > deadline:
            return sorted(ids)
        time.sleep(0.5)


# -- entry ------------------------------------------------------------------------------------

WORKLOADS: Dict[str, Callable[[argparse.Namespace], Dict[str, Any]]] = {
    "local": lambda a: (ours_local(a.executor, a.calls, a.work) if a.side == OURS
                        else submitit_local(a.calls, a.work)),
    "slurm-map": lambda a: (ours_slurm_map(a.calls, a.work, a.polling) if a.side == OURS
                            else submitit_slurm_map(a.calls, a.work)),
}


def worker_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="futures.py worker")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--side", choices=[OURS, SUBMITIT], required=True)
    parser.add_argument("--executor", default="local", help="ours' executor for 'local'")
    parser.add_argument("--polling", type=float, default=None,
                        help="ours' queue polling interval on Slurm, seconds (default: the "
                             "executor's)")
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    # Slurm jobs work where they were submitted: the driver finds a round's jobs by that.
    os.chdir(args.work)
    # Both sides pickle with cloudpickle: by value, the jobs need not import this module.
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    result = WORKLOADS[args.workload](args)
    print(json.dumps({"workload": args.workload, "side": args.side, **result}), flush=True)
    return 0
