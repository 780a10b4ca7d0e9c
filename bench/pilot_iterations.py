"""Iterations benchmark: one job of N ``/bin/true`` iterations, ``psij pilot run`` against
qcg-pilotjob 0.14.2, on 2 local cores.

The request file is the same for both: ``{"name": "it", "iteration": {"stop": N}}`` with one
core per iteration. Each pilot runs as users run it (see ``bench/pilot.py``, whose helpers and
side venv this reuses), one process per round, the two alternating. Figures per side:

- time to first task: from spawning the pilot to the first iteration's EXECUTING time in its
  own report;
- tasks/s: N over the span from the job's submission to the last iteration's end, both read
  from the pilot's report;
- peak RSS: the largest resident set of the pilot process or any of its descendants, from
  ``wait4`` (the ``/bin/true`` tasks are tiny, so this is the pilot's own).

Goals (printed as PASS/FAIL, never the exit status): first task < 2 s, at least 3x qcg's
tasks/s, peak RSS < 300 MB. The load average is printed with the figures: the machine is shared.
Run: ``.venv/bin/python bench/pilot_iterations.py [--iterations N] [--rounds R]``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from _help import description
from pilot import (
    OURS,
    QCG,
    QCG_REQUIREMENT,
    RUN_LIMIT_S,
    command,
    ensure_qcg_venv,
    fmt,
    measure,
    ours_history,
    qcg_history,
    verdict,
)
from pilot import _env as pilot_env
from run import _tail, log

FIRST_TASK_GOAL_S = 2.0
RATE_FACTOR_GOAL = 3.0
RSS_GOAL_MB = 300.0


def request_file(path: Path, iterations: int) -> None:
    job = {"name": "it", "iteration": {"stop": iterations},
           "execution": {"exec": "/bin/true"}, "resources": {"numCores": {"exact": 1}}}
    path.write_text(json.dumps([{"request": "submit", "jobs": [job]},
                                {"request": "control", "command": "finishAfterAllTasksDone"}]))


def one_round(side: str, requests: Path, iterations: int) -> Dict[str, float]:
    """One pilot process on ``requests``; raises RuntimeError when it could not be measured."""
    with tempfile.TemporaryDirectory(prefix=f"psij-bench-iter-{side}-") as tmp:
        wd = Path(tmp) / "wd"
        wd.mkdir()
        with open(Path(tmp) / "output", "wb") as output:
            spawned = time.time()
            proc = subprocess.Popen(command(side, requests, wd), stdin=subprocess.DEVNULL,
                                    stdout=output, stderr=subprocess.STDOUT, env=pilot_env(),
                                    cwd=tmp)
            deadline = time.monotonic() + RUN_LIMIT_S * 3
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise RuntimeError("no exit in time")
                time.sleep(0.2)
            proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"exited with {proc.returncode}\n"
                               + _tail((Path(tmp) / "output").read_text(errors="replace")))
        history = ours_history(wd) if side == OURS else qcg_history(wd)
        times = measure(history, iterations)
    span = times["last_end"] - times["first_submit"]
    return {"first_task_s": times["first_start"] - spawned,
            "tasks_per_s": iterations / span if span > 0 else 0.0,
            "rss_mb": usage.ru_maxrss / 1024.0}


def median(results: List[Dict[str, float]], key: str) -> Optional[float]:
    return statistics.median(r[key] for r in results) if results else None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--ours-only", action="store_true", help="do not run qcg-pilotjob")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    sides = [OURS]
    if not args.ours_only:
        problem = ensure_qcg_venv()
        if problem is None:
            sides.append(QCG)
        else:
            log(f"qcg-pilotjob unavailable, measuring ours only. FAILED: {problem}")
    log(f"== {args.iterations} iterations of /bin/true, one job, 2 cores "
        f"({args.rounds} round(s), alternating); load average {os.getloadavg()}")
    results: Dict[str, List[Dict[str, float]]] = {side: [] for side in sides}
    failed = False
    with tempfile.TemporaryDirectory(prefix="psij-bench-iter-") as work:
        requests = Path(work) / "requests.json"
        request_file(requests, args.iterations)
        # One unmeasured round each first: both then read cached bytecode.
        warm = Path(work) / "warm.json"
        request_file(warm, 100)
        for side in sides:
            try:
                one_round(side, warm, 100)
            except (OSError, RuntimeError) as exc:
                log(f"   warm-up {side}: FAILED: {exc}")
        for round_no in range(1, args.rounds + 1):
            for side in sides:
                try:
                    result = one_round(side, requests, args.iterations)
                except (OSError, RuntimeError) as exc:
                    log(f"   round {round_no} {side:4}: FAILED: {exc}")
                    failed = True
                    continue
                results[side].append(result)
                log(f"   round {round_no} {side:4}: first task {result['first_task_s']:.3f} s, "
                    f"{result['tasks_per_s']:.0f} tasks/s, peak RSS "
                    f"{result['rss_mb']:.0f} MB; load average {os.getloadavg()}")
    first = median(results[OURS], "first_task_s")
    rate = median(results[OURS], "tasks_per_s")
    rss = median(results[OURS], "rss_mb")
    qcg_rate = median(results.get(QCG, []), "tasks_per_s")
    log()
    log(f"{'figure':28} {'ours':>14} {'qcg ' + QCG_REQUIREMENT.split('==')[1]:>14}")
    log(f"{'time to first task':28} {fmt(first, 's'):>14} "
        f"{fmt(median(results.get(QCG, []), 'first_task_s'), 's'):>14}")
    log(f"{'tasks/s':28} {fmt(rate, 'tasks/s', 0):>14} {fmt(qcg_rate, 'tasks/s', 0):>14}")
    log(f"{'peak RSS':28} {fmt(rss, 'MB', 0):>14} "
        f"{fmt(median(results.get(QCG, []), 'rss_mb'), 'MB', 0):>14}")
    ratio = rate / qcg_rate if rate and qcg_rate else None
    log()
    log(f"{verdict(None if first is None else first < FIRST_TASK_GOAL_S)} first task "
        f"< {FIRST_TASK_GOAL_S:.0f} s")
    log(f"{verdict(None if ratio is None else ratio >= RATE_FACTOR_GOAL)} tasks/s at least "
        f"{RATE_FACTOR_GOAL:.0f}x qcg-pilotjob's"
        + ("" if ratio is None else f" ({ratio:.2f}x)"))
    log(f"{verdict(None if rss is None else rss < RSS_GOAL_MB)} peak RSS < "
        f"{RSS_GOAL_MB:.0f} MB")
    log(f"load average at the end {os.getloadavg()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
