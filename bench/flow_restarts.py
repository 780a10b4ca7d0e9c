"""Restarts per second a flow service sustains on ``local`` with ``/bin/true`` instances.

Starts a real ``psij flow serve`` (its own state directory, single user), creates
``--handles`` handles of ``--count`` instances of ``/bin/true`` each, lets them run for
```--seconds`` and counts the instances that ended (the service restarts each one as it ends),
first with the throttle off (every per-class interval, the aggregate interval and the start
rate limits out of the way), then the same with ``--sync normal``, then with the service's
default throttle. Every restart costs a
process start, its exit, a journal transaction or two (SQLite, ``synchronous=FULL``) and the
executor's bookkeeping. Prints figures only; compare with ``bench/spawn_ceiling.py``.

Run: ``.venv/bin/python bench/flow_restarts.py [--handles N] [--count N] [--seconds S]``.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

from _help import description

from psij.flows.client import FlowClient, FlowError

NO_THROTTLE = ['default_intervals={"no_problem": 0, "unknown": 0, "failed_init": 0, '
               '"failed_after_work": 0, "never_claimed": 0, "no_work": 0}',
               "aggregate_problem_interval=0", "max_submit_rate=1000000",
               "max_rate=1000000", "default_rate=1000000"]


def _ended(client: FlowClient, handles: List[str]) -> int:
    """Instances ended so far (the service's "recently" spans the whole run)."""
    return sum(int(client.status(h)["recently_terminated"]) for h in handles)


def measure(options: List[str], handles: int, count: int, seconds: float,
            sync: str = "full") -> float:
    with tempfile.TemporaryDirectory(prefix="psij-flow-bench-") as top:
        state, sock = Path(top) / "state", str(Path(top) / "flow.sock")
        argv = [sys.executable, "-m", "psij", "flow", "serve", "--single-user", "--state-dir",
                str(state), "--socket", sock, "--log-level", "WARNING", "--sync", sync]
        for option in [*options, "recent_window=86400"]:
            argv += ["--set", option]
        proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with FlowClient(sock, timeout=5) as probe:
                        probe.list()
                    break
                except FlowError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("the flow service did not start") from None
                    time.sleep(0.1)
            with FlowClient(sock, timeout=300) as client:
                made = [client.create({"executable": "/bin/true"}, count, "local",
                                      lease=3600, provisioning_lease=3600,
                                      **({"rate": 1000000} if options else {}))["handle"]
                        for _ in range(handles)]
                time.sleep(2)  # warm-up
                first, begin = _ended(client, made), time.monotonic()
                waits = []
                while time.monotonic() - begin < seconds:
                    time.sleep(0.5)
                    asked = time.monotonic()
                    client.status(made[0])
                    waits.append(time.monotonic() - asked)
                last, end = _ended(client, made), time.monotonic()
                waits.sort()
                print(f"  status answered in {1000 * waits[len(waits) // 2]:.1f} ms (median), "
                      f"{1000 * waits[-1]:.1f} ms (slowest) meanwhile")
                for handle in made:
                    client.destroy(handle)
            return (last - first) / (end - begin)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--handles", type=int, default=4)
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    what = f"{args.handles} handles x {args.count} /bin/true on local, {args.seconds:g} s"
    off = measure(NO_THROTTLE, args.handles, args.count, args.seconds)
    print(f"{what}, throttle off: {off:.1f} restarts per second")
    fast = measure(NO_THROTTLE, args.handles, args.count, args.seconds, "normal")
    print(f"{what}, throttle off, --sync normal: {fast:.1f} restarts per second")
    on = measure([], args.handles, args.count, args.seconds)
    print(f"{what}, default throttle: {on:.1f} restarts per second")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
