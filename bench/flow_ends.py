"""Seconds from a ``flow`` executor job's own end to its ``wait()`` returning, with the service's
``watch`` answers and without them (the executor reading its handles every ``poll_interval``).

Starts a real ``psij flow serve`` (its own state directory, single user) and runs ``--jobs``
jobs one after the other on ``local`` through the ``flow`` executor (``poll_interval`` 2 s, the
default); each job writes the time it ends to a file as its last action (once: the service
restarts an instance that ends, and its replacement writes nothing), and the wait that returns
notes the time. Prints the median and the worst for each way. Figures only.

Run: ``.venv/bin/python bench/flow_ends.py [--jobs N] [--poll-interval S]``.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

from _help import description

from psij import Job, JobExecutor, JobSpec, JobState
from psij.flows import client as flow_client
from psij.flows.client import FlowClient, FlowError
from psij.flows.executor import FlowJobExecutorConfig


def _no_watch(self: FlowClient, handle: object = None, after: int = 0) -> int:
    raise FlowError("unknown_op", "op: watch is not known to this service")


def lags(socket: str, folder: Path, jobs: int, poll_interval: float, watch: bool) -> List[float]:
    saved = FlowClient.watch
    if not watch:
        flow_client.FlowClient.watch = _no_watch  # type: ignore[method-assign]
    executor = JobExecutor.get_instance("flow", url=f"unix://{socket}", config=(
        FlowJobExecutorConfig(poll_interval=poll_interval, lease=120, provisioning_lease=60)))
    found = []
    try:
        for n in range(jobs):
            stamp = folder / f"end-{watch}-{n}"
            job = Job(JobSpec("/bin/sh", ["-c", 'sleep 0.5; (set -C; date +%s.%N > "$0") '
                                                '2>/dev/null; :', str(stamp)]))
            executor.submit(job)
            status = job.wait()
            returned = time.time()
            if status is None or status.state is not JobState.COMPLETED:
                raise SystemExit(f"job {n} ended {status}")
            found.append(returned - float(stamp.read_text()))
    finally:
        executor.close()
        flow_client.FlowClient.watch = saved  # type: ignore[method-assign]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--poll-interval", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="psij-flow-ends-") as top:
        folder = Path(top)
        sock = str(folder / "flow.sock")
        proc = subprocess.Popen([sys.executable, "-m", "psij", "flow", "serve", "--single-user",
                                 "--state-dir", str(folder / "state"), "--socket", sock,
                                 "--log-level", "WARNING", "--set",
                                 "aggregate_problem_interval=0"], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not Path(sock).exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the flow service did not start")
                time.sleep(0.1)
            for watch in (True, False):
                found = lags(sock, folder, args.jobs, args.poll_interval, watch)
                way = "with watch" if watch else "polling only"
                print(f"{way:>12}: median {statistics.median(found):.3f} s, worst "
                      f"{max(found):.3f} s ({args.jobs} jobs on local, poll_interval "
                      f"{args.poll_interval:g} s)")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
