"""Futures benchmark: ``psij.futures.FunctionExecutor`` against submitit 1.5.2, running a
trivial Python function as jobs.

Figures, each side in a child interpreter of its own venv (submitit's in
``.bench-venvs/submitit-1.5.2``, created once), rounds alternating between the sides:

- on this machine: 1000 calls ``submit(f, i)`` one by one, then every result: ours on the
  ``local`` executor, ours on the ``pilot`` executor, and submitit's ``LocalExecutor`` (its
  defaults); calls per second from the executor's creation to the last result in hand, and
  the time from the executor's creation to the first result (ours: the first future done;
  submitit, which has no completion callback: a thread asking its jobs ``done()`` every 10
  ms). submitit waits 0.2 s between two submissions (its default throttling). Goal: ours
  through the pilot at least 10 times submitit's calls per second;
- on the real Slurm: ``map`` of 1000 calls, ours (``FunctionExecutor("slurm").map``: one job
  array) against submitit's ``SlurmExecutor.map_array`` (one job array, its defaults), each
  job with a 30-minute limit and nice -10000 (ahead of other work on the shared test Slurm);
  calls per second from the executor's creation to the last result, and the time to the first
  result in order. Goal: ours at least submitit's calls per second. Ours runs twice: with its
  executor's default queue polling (every 30 s: a result is collected when a status poll sees
  its job end) and polling every second, which shows how much of its time is that wait
  (submitit notices each result file within a second).

Usage: ``python bench/futures.py [--quick] [--no-slurm] [--ours-only]`` (``make bench-futures``).
The Slurm figures need a running Slurm (this benchmark never starts one) and are skipped with
the reason without it; while they run, the shared scheduler lock is held as a test run holds
it. Missed goals never fail the run; exit status 1 means a measurement could not be taken (or
submitit could not be installed: ours are then measured alone and the setup is said FAILED).
"""

import argparse
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from _futures_worker import OURS, SUBMITIT, worker_main
from _help import description
from batch import run_child
from run import OURS_PYTHON, REPO, Implementation, ensure_side_venv, log

SCRIPT = Path(__file__).resolve()
SUBMITIT_REQUIREMENT = "submitit==1.5.2"
SUBMITIT_VENV = REPO / ".bench-venvs" / "submitit-1.5.2"
SUBMITIT_PYTHON = SUBMITIT_VENV / "bin" / "python"
SCHEDULERS_LOCK = Path(os.environ.get("SCHEDULERS_LOCK", "/tmp/psij-test-schedulers.lock"))
ROUND_LIMIT_S = 1200.0
DRAIN_LIMIT_S = 120.0
# ours again on Slurm with this queue polling interval (seconds), beside its default (30 s):
# how much of its time is the wait for the status poll that sees the last jobs end.
FAST_POLLING_S = 1.0
LOCAL_GOAL = 10.0
SLURM_GOAL = 1.0


@dataclass(frozen=True)
class Side:
    """One side of a figure: a label, the interpreter, and its worker arguments."""

    label: str
    python: Path
    args: Tuple[str, ...]


@dataclass
class Series:
    results: List[Dict[str, Any]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)


def ensure_submitit_venv() -> Optional[str]:
    """Create the side venv with submitit once; return an error text if that fails."""
    return ensure_side_venv(SUBMITIT_VENV, SUBMITIT_REQUIREMENT, SUBMITIT_PYTHON)


def run_side(side: Side, work: Path, timeout: float) -> Dict[str, Any]:
    """One worker run of ``side`` working in ``work``; raises RuntimeError when it gives no
    result, or a wrong or missing one for a call."""
    result = run_child(Implementation(side.label, side.python),
                       [*side.args, "--work", str(work)], timeout, script=SCRIPT)
    if result.get("wrong_results"):
        raise RuntimeError(f"{result['wrong_results']} of {result['calls']} results wrong or "
                           "missing")
    return result


def alternate(title: str, sides: Sequence[Side], rounds: int, base: Path,
              after_round: Optional[Any] = None) -> Dict[str, Series]:
    """Each side ``rounds`` times, the order flipping every round."""
    log(f"== {title} ({rounds} round(s), alternating)")
    series = {side.label: Series() for side in sides}
    for round_no in range(1, rounds + 1):
        for side in (sides if round_no % 2 else list(reversed(sides))):
            work = Path(tempfile.mkdtemp(prefix="psij-bench-futures-", dir=base))
            started = time.monotonic()
            try:
                result = run_side(side, work, ROUND_LIMIT_S)
            except (OSError, RuntimeError) as exc:
                series[side.label].errors.append(str(exc))
                log(f"   round {round_no} {side.label:14}: FAILED: {exc}")
                result = None
            else:
                series[side.label].results.append(result)
                first = result["first_result_s"]
                arrays = (f", {len(result['native_ids'])} array(s)"
                          if result.get("native_ids") else "")
                log(f"   round {round_no} {side.label:14}: {result['calls_per_s']:.1f} calls/s "
                    f"({result['calls']} calls in {result['seconds']:.2f} s{arrays}, first "
                    f"result after {'-' if first is None else f'{first:.2f} s'})  "
                    f"({time.monotonic() - started:.1f} s)")
            if after_round is not None:
                after_round(work, result)
    log()
    return series


# -- Slurm ------------------------------------------------------------------------------------


def slurm_problem() -> Optional[str]:
    """Why the Slurm figures cannot be taken (None when they can): this benchmark only uses a
    Slurm that is running."""
    if shutil.which("sbatch") is None:
        return "sbatch is not installed (tests/setup/start-slurm.sh installs and starts Slurm)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol ping: {exc}"
    if "is UP" not in ping.stdout:
        return "Slurm is not running (tests/setup/start-slurm.sh starts it)"
    return None


def jobs_under(work: Path) -> List[str]:
    """The ids of the queued Slurm jobs working under ``work`` (array ids for arrays)."""
    out = subprocess.run(["squeue", "-h", "-o", "%F %Z"], capture_output=True, text=True,
                         check=False).stdout
    under = str(work) + os.sep
    return sorted({line.split()[0] for line in out.splitlines()
                   if len(line.split()) == 2 and (line.split()[1] + os.sep).startswith(under)})


def clean_up_slurm_round(work: Path, result: Optional[Dict[str, Any]]) -> None:
    """Cancel what is left of a round's jobs (all of them after a failed round), and wait
    until none is queued, so that rounds do not overlap."""
    ids = set(jobs_under(work)) | set((result or {}).get("native_ids", []))
    if not ids:
        return
    subprocess.run(["scancel", *sorted(ids)], capture_output=True, timeout=120, check=False)
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        listed = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(sorted(ids))],
                                capture_output=True, text=True, timeout=60, check=False)
        if not listed.stdout.strip():
            return
        time.sleep(1)
    log(f"   (jobs {sorted(ids)} still queued after {DRAIN_LIMIT_S:.0f} s; going on)")


# -- summary ----------------------------------------------------------------------------------


def median(series: Dict[str, Series], label: str, key: str) -> Optional[float]:
    values = [r[key] for r in series.get(label, Series()).results if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} calls/s" if unit == "calls/s" else f"{value:.2f} s"


def print_summary(rows: List[Tuple[str, Optional[float], str]],
                  goals: List[Tuple[str, Optional[float], Optional[float], float]]) -> None:
    log("== Summary (medians)")
    table = [("figure", "value")] + [(name, fmt(value, unit)) for name, value, unit in rows]
    width = max(len(name) for name, _ in table)
    for n, (name, value) in enumerate(table):
        log(f"   {name.ljust(width)}  {value}")
        if n == 0:
            log(f"   {'-' * width}  {'-' * 14}")
    log()
    log("== Goals (informational)")
    for text, ours, theirs, factor in goals:
        ratio = ours / theirs if ours and theirs else None
        verdict = "N/A " if ratio is None else ("PASS" if ratio >= factor else "FAIL")
        log(f"   {verdict}  {text}" + ("" if ratio is None else f"  ({ratio:.2f}x)"))


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true",
                        help="40 local calls and 40 Slurm calls, one round, for a smoke run")
    parser.add_argument("--no-slurm", action="store_true", help="skip the real-Slurm figures")
    parser.add_argument("--ours-only", action="store_true", help="leave submitit out")
    args = parser.parse_args(argv)
    local_calls = 40 if args.quick else 1000
    slurm_calls = 40 if args.quick else 1000
    if not OURS_PYTHON.exists():
        log(f"{OURS_PYTHON} is missing: run `make .venv/.installed` first.")
        return 1
    problem = None if args.ours_only else ensure_submitit_venv()
    with_submitit = not args.ours_only and problem is None
    if problem is not None:
        log(f"submitit unavailable, measuring ours only. FAILED: {problem}")
    log(f"Futures benchmark. Machine: {os.cpu_count()} CPU(s), load average "
        f"{os.getloadavg()[0]:.1f} (wall times are only comparable on an idle machine), "
        f"{'quick' if args.quick else 'full'} run")
    log(f"  ours     psij.futures ({OURS_PYTHON})")
    if with_submitit:
        log(f"  submitit {SUBMITIT_REQUIREMENT} ({SUBMITIT_PYTHON})")
    log()

    calls = ("--calls", str(local_calls))
    local_sides = [Side("ours/local", OURS_PYTHON, ("local", "--side", OURS, *calls)),
                   Side("ours/pilot", OURS_PYTHON,
                        ("local", "--side", OURS, "--executor", "pilot", *calls))]
    if with_submitit:
        local_sides.append(Side("submitit/local", SUBMITIT_PYTHON,
                                ("local", "--side", SUBMITIT, *calls)))
    base = Path(tempfile.mkdtemp(prefix="psij-bench-futures-"))
    base.chmod(0o755)  # the Slurm jobs read and write under it
    errors: List[str] = []
    try:
        local = alternate(f"{local_calls} calls of a trivial function on this machine, "
                          "submitted one by one", local_sides, 1, base)
        slurm: Dict[str, Series] = {}
        if args.no_slurm:
            log("== Slurm figures skipped: --no-slurm")
            log()
        else:
            slurm = slurm_series(slurm_calls, with_submitit, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rows: List[Tuple[str, Optional[float], str]] = []
    for label in (s.label for s in local_sides):
        rows.append((f"{label}, {local_calls} calls", median(local, label, "calls_per_s"),
                     "calls/s"))
        rows.append((f"{label}, first result", median(local, label, "first_result_s"), "s"))
    for label in slurm:
        rows.append((f"{label}, map of {slurm_calls}", median(slurm, label, "calls_per_s"),
                     "calls/s"))
        rows.append((f"{label}, first result in order", median(slurm, label,
                                                                "first_result_s"), "s"))
    for name, series in (("local", local), ("slurm", slurm)):
        errors += [f"{name} {label}: {e}" for label, s in series.items() for e in s.errors]
    print_summary(rows, [
        (f"ours through the pilot at least {LOCAL_GOAL:g}x submitit's LocalExecutor calls/s",
         median(local, "ours/pilot", "calls_per_s"),
         median(local, "submitit/local", "calls_per_s"), LOCAL_GOAL),
        ("ours' Slurm map (one array) at least submitit's map_array calls/s",
         median(slurm, "ours/slurm", "calls_per_s"),
         median(slurm, "submitit/slurm", "calls_per_s"), SLURM_GOAL),
        (f"the same, ours polling the queue every {FAST_POLLING_S:g} s",
         median(slurm, "ours/slurm-1s", "calls_per_s"),
         median(slurm, "submitit/slurm", "calls_per_s"), SLURM_GOAL)])
    if errors or problem is not None:
        log()
        log("Measurements that failed:")
        for error in errors or ["submitit setup"]:
            log("   " + error.splitlines()[0])
        return 1
    return 0


def slurm_series(calls: int, with_submitit: bool, base: Path) -> Dict[str, Series]:
    """``map`` of ``calls`` on the real Slurm, under the shared scheduler lock."""
    problem = slurm_problem()
    if problem is not None:
        log(f"== Slurm figures skipped: {problem}")
        log()
        return {}
    sides = [Side("ours/slurm", OURS_PYTHON, ("slurm-map", "--side", OURS,
                                              "--calls", str(calls))),
             Side("ours/slurm-1s", OURS_PYTHON, ("slurm-map", "--side", OURS, "--polling",
                                                 str(FAST_POLLING_S), "--calls", str(calls)))]
    if with_submitit:
        sides.append(Side("submitit/slurm", SUBMITIT_PYTHON,
                          ("slurm-map", "--side", SUBMITIT, "--calls", str(calls))))
    lock = os.open(SCHEDULERS_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        return alternate(f"map of {calls} calls of a trivial function on the real Slurm, one "
                         "job array each", sides, 1, base, after_round=clean_up_slurm_round)
    finally:
        os.close(lock)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
