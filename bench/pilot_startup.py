"""Pilot start-up time: how long until a pilot accepts tasks, and until its first task has run.

Three figures, each the median of several rounds (prints only; nothing here asserts a time):

- engine ready: ``PilotEngine(...)`` plus ``start()`` on this machine's cores, in process;
- first task: from the start of the above to the end of a first ``/bin/true`` task;
- served ready: from starting ``psij pilot serve`` as a new process to its socket answering.

Run: ``.venv/bin/python bench/pilot_startup.py [--rounds N]``.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from _help import description


def engine_ready(rounds: int) -> Dict[str, float]:
    from psij.executors.pilot.allocation import discover_allocation
    from psij.executors.pilot.engine import EngineConfig, PilotEngine, TaskSpec

    ready: List[float] = []
    first: List[float] = []
    for _ in range(rounds):
        began = time.perf_counter()
        engine = PilotEngine(discover_allocation(), EngineConfig())
        engine.start()
        ready.append(time.perf_counter() - began)
        engine.submit(TaskSpec("first", "/bin/true"))
        engine.wait(["first"])
        first.append(time.perf_counter() - began)
        engine.close()
    return {"engine_ready_s": statistics.median(ready),
            "first_task_done_s": statistics.median(first)}


def served_ready(rounds: int) -> float:
    from psij.executors.pilot.service import answering

    folder = Path(tempfile.mkdtemp(prefix="pjb"))
    times: List[float] = []
    try:
        for i in range(rounds):
            path = str(folder / f"p{i}.sock")
            began = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "psij", "pilot", "serve", "--socket",
                                     path, "--wd", str(folder)], stderr=subprocess.DEVNULL)
            while not (os.path.exists(path) and answering(path, timeout=1)):
                if proc.poll() is not None:
                    raise RuntimeError("psij pilot serve exited early")
                time.sleep(0.002)
            times.append(time.perf_counter() - began)
            proc.terminate()
            proc.wait(30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    figures = engine_ready(args.rounds)
    figures["served_ready_s"] = served_ready(max(3, args.rounds // 3))
    for name, value in figures.items():
        print(f"{name:20s} {value * 1000:8.2f} ms")
    print(json.dumps({"pilot_startup": figures}))


if __name__ == "__main__":
    main()
