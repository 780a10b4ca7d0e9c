"""The machine's ceiling for one process per task: how many ``/bin/true`` per second plain
``posix_spawn`` and ``os.wait`` start and reap, with at most N running at once and no bookkeeping.

No pilot, executor or scheduler can start one process per task faster than this on the same
machine, so it bounds what ``bench/pilot_iterations.py`` and ``bench/pilot.py`` can show. Prints
figures only. Run: ``.venv/bin/python bench/spawn_ceiling.py [--tasks N] [--at-once N ...]``.
"""

import argparse
import os
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--at-once", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    for at_once in args.at_once:
        print(f"{args.tasks} x /bin/true, at most {at_once} at once: "
              f"{rate(args.tasks, at_once):.0f} per second")


if __name__ == "__main__":
    main()
