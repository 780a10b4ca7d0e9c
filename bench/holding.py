"""The cost of one decision of the batch executors' holding machine (``max_queued_per_shape``):
microseconds to choose the next job to submit when a queued one starts, with many held jobs.

Fills the machine with ``--jobs`` held jobs spread over ``--shapes`` shapes (random
priorities), then feeds starts of queued jobs, each of which makes the machine pick the held
job of that shape with the highest priority (one ``LeftQueue`` step, then the ``Submitted``
step of the chosen job). Prints the microseconds per arrival and per decision (the goal is at
most 20 us per decision with 1 000 000 held jobs in 50 shapes). Pure computation: no
scheduler, no files. Run: ``.venv/bin/python bench/holding.py [--jobs N] [--shapes N]``.
"""

import argparse
import os
import random
import time

from _help import description

from psij.executors.batch._holding import Arrived, Holding, LeftQueue, Submit, Submitted


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--shapes", type=int, default=50)
    parser.add_argument("--cap", type=int, default=10)
    parser.add_argument("--decisions", type=int, default=200_000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    rng = random.Random(1)
    machine = Holding(args.cap)
    queued = {s: [] for s in range(args.shapes)}  # type: dict
    events = [Arrived(i, i % args.shapes, rng.randint(0, 1000)) for i in range(args.jobs)]
    begin = time.perf_counter()
    for event in events:
        for action in machine.step(event):
            if isinstance(action, Submit):
                machine.step(Submitted(action.key))
                queued[event.shape].append(action.key)
    arrival = (time.perf_counter() - begin) / args.jobs * 1e6
    held = machine.held()
    decisions = min(args.decisions, held)
    shapes = [rng.randrange(args.shapes) for _ in range(decisions)]
    begin = time.perf_counter()
    for shape in shapes:
        waiting = queued[shape]
        actions = machine.step(LeftQueue(waiting.pop()))
        if actions:
            key = actions[0].key
            machine.step(Submitted(key))
            waiting.append(key)
    per_decision = (time.perf_counter() - begin) / decisions * 1e6
    print(f"holding machine, {held} held jobs in {args.shapes} shapes, cap {args.cap}: "
          f"{arrival:.2f} us per arrival, {per_decision:.2f} us per decision "
          f"(start of a queued job -> next job chosen and submitted; goal <= 20 us), "
          f"{machine.decisions} decisions")


if __name__ == "__main__":
    main()
