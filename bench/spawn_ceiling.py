"""The machine's ceiling for one process per task: how many ``/bin/true`` per second plain
``posix_spawn`` and ``os.wait`` start and reap, with at most N running at once and no bookkeeping.

No pilot, executor or scheduler can start one process per task faster than this on the same
machine, so it bounds what ``bench/pilot_iterations.py``, ``bench/pilot.py`` and
``bench/scale.py`` can show. One process (``--at-once``) shows what a single spawning process
can do; K processes (``--processes K ...``), each spawning and reaping its share with at most
``--per-process`` running, show what the whole machine can do: the total starts per second over
all K, from the moment all K are released to the moment the last one is done. Prints figures
only (``--json``: one JSON line). Run: ``.venv/bin/python bench/spawn_ceiling.py [--tasks N]
[--at-once N ...] [--processes K ...] [--per-process N] [--json]``.
"""

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

from _help import description


def rate(tasks: int, at_once: int) -> float:
    """Tasks per second for ``tasks`` x /bin/true, at most ``at_once`` running."""
    started = running = 0
    begin = time.monotonic()
    while started < tasks or running:
        while running < at_once and started < tasks:
            os.posix_spawn("/bin/true", ["/bin/true"], os.environ)
            started += 1
            running += 1
        os.wait()
        running -= 1
    return tasks / (time.monotonic() - begin)


def _spawner(release_fd: int, tasks: int, at_once: int) -> int:
    """A forked spawning process: wait for the release, spawn its share, return the exit status
    (0 when every ``/bin/true`` was started and reaped)."""
    try:
        os.read(release_fd, 1)  # returns at EOF: the parent closed its end
        os.close(release_fd)
        rate(tasks, at_once)
        return 0
    except BaseException:  # reported through the exit status
        return 1


def multi_rate(tasks: int, processes: int, at_once: int) -> float:
    """Total starts per second of ``tasks`` x /bin/true shared by ``processes`` forked processes,
    each with at most ``at_once`` running; from their common release to the last one's exit."""
    share = [tasks // processes + (1 if n < tasks % processes else 0) for n in range(processes)]
    release_r, release_w = os.pipe()
    pids: List[int] = []
    try:
        for count in share:
            pid = os.fork()
            if pid == 0:
                os.close(release_w)
                os._exit(_spawner(release_r, count, at_once))
            pids.append(pid)
    finally:
        os.close(release_r)
        begin = time.monotonic()
        os.close(release_w)  # every spawner starts now
        failed = 0
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            failed += os.waitstatus_to_exitcode(status) != 0
    elapsed = time.monotonic() - begin
    if failed or len(pids) < processes:
        raise RuntimeError(f"{failed + processes - len(pids)} of {processes} spawning "
                           "processes failed")
    return tasks / elapsed


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def measure(tasks: int, at_once: List[int], processes: List[int], per_process: int
            ) -> Dict[str, Any]:
    """Every figure as a dictionary: per-level single-process rates, per-K multi-process rates."""
    single = {str(n): rate(tasks, n) for n in at_once}
    multi = {str(k): multi_rate(max(tasks, k), k, per_process) for k in processes}
    return {"workload": "spawn_ceiling", "tasks": tasks, "cores": cores(),
            "per_process": per_process, "single": single, "multi": multi}


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--tasks", type=_positive, default=20000)
    parser.add_argument("--at-once", type=_positive, nargs="*", default=[1, 2, 4],
                        help="single-process levels (default 1 2 4; none: skip them)")
    parser.add_argument("--processes", type=_positive, nargs="*", default=[],
                        help="spawning processes, one figure per value (e.g. 1 8 16)")
    parser.add_argument("--per-process", type=_positive, default=2,
                        help="running at once in each of the K processes (default 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead")
    args = parser.parse_args(argv)
    if not args.json:
        print(f"load average {os.getloadavg()}, {cores()} core(s) usable")
    try:
        result = measure(args.tasks, args.at_once, args.processes, args.per_process)
    except (OSError, RuntimeError) as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result), flush=True)
        return 0
    for at_once, value in result["single"].items():
        print(f"{args.tasks} x /bin/true, at most {at_once} at once: {value:.0f} per second")
    for processes, value in result["multi"].items():
        print(f"{max(args.tasks, int(processes))} x /bin/true from {processes} process(es), "
              f"at most {args.per_process} at once in each: {value:.0f} per second in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
