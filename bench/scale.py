"""Scale benchmark: every throughput figure of the machine it runs on, in one run, against the
goals.

Prints the machine's core count (``os.sched_getaffinity``), the spawn ceiling of ``/bin/true``
from one process and from K processes (``bench/spawn_ceiling.py``; K = the cores used unless
told), the local executor's jobs/s (N jobs of ``/bin/true`` through the PSI/J API, created
first, submitted all, waited all: ``bench/workloads.py throughput``), the pilot's tasks/s
(``psij pilot run REQS.json --cores C``, read from its job report as ``bench/pilot.py`` does),
and the peers measured in the same run: psij-python 0.9.11's local executor and qcg-pilotjob
0.14.2 (side venvs made by ``bench/run.py`` and ``bench/pilot.py``). Rounds alternate the
sides; each figure is shown as the median and the range over rounds.

The CPU time of the coordinating process per task: for the local executor, the submitting
process's own (``getrusage(RUSAGE_SELF)`` around submit-all + wait-all; the Job creation before
that window is shown apart); for the pilot, the ``psij pilot run`` process's own, read from
``/proc/PID/stat`` at its exit, minus a run of 1 task (its start-up), per task. The CPU of the
children each reaped (the tasks, and any worker processes with the tasks they reaped) is shown
apart. On three cores or fewer the engine starts its tasks itself (no worker: two hand-overs
between processes fewer per task), so its CPU includes the spawning; the pilot is then measured
a second time with ``PSIJ_PILOT_WORKERS=1`` (side ``pilot-workers``), and that run's engine CPU
is the coordinating-CPU figure.

Goals, printed and never asserted: on a 16-core machine local >= 8,000 jobs/s and pilot >=
10,000 tasks/s; each at least half the K-process spawn ceiling, 6x psij-python and 15x
qcg-pilotjob measured in the same run; at most 40 us of the coordinating process's CPU per
task. Exit status 1 means a measurement could not be taken. Run: ``.venv/bin/python
bench/scale.py [--cores C] [--tasks N] [--rounds R] [--processes K] [--ours-only] [--quick]``.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pilot
from _help import description
from run import (
    OURS_PYTHON,
    REFERENCE_PYTHON,
    REFERENCE_REQUIREMENT,
    Implementation,
    _tail,
    ensure_reference_venv,
    log,
    probe_version,
)

from psij.executors.pilot._inline_tasks import INLINE_MAX_CORES

SPAWN_CEILING_SCRIPT = Path(__file__).resolve().parent / "spawn_ceiling.py"
CEILING_LIMIT_S = 600.0

GOAL_CORES = 16
LOCAL_GOAL = 8000.0  # jobs/s on GOAL_CORES cores
PILOT_GOAL = 10000.0  # tasks/s on GOAL_CORES cores
CEILING_SHARE = 0.5
PSIJ_PYTHON_FACTOR = 6.0
QCG_FACTOR = 15.0
CPU_GOAL_US = 40.0

# The sides of a round, in the order they run.
CEILING, LOCAL, PSIJ_PYTHON, PILOT, PILOT_WORKERS, PILOT_ONE, QCG = (
    "ceiling", "local", "psij-python", "pilot", "pilot-workers", "pilot-1", "qcg")
# On a node of INLINE_MAX_CORES or fewer the engine starts its tasks itself: the pilot is then
# also measured through one worker process, the design for larger nodes, whose engine CPU per
# task is the coordinating-CPU figure.
WORKERS_ENV = {"PSIJ_PILOT_WORKERS": "1"}

Result = Dict[str, float]


@dataclass
class Setup:
    """What a run measures: sizes, cores, and which peers are there."""

    tasks: int
    cores: int
    processes: int
    per_process: int
    sides: List[str]
    work: Path


def pin(cores: Optional[int]) -> Tuple[int, str]:
    """Restrict this process (and so every process it starts) to ``cores`` of its cores, where
    it has that many; the cores the run uses and a note on the pinning."""
    usable = sorted(os.sched_getaffinity(0))
    if cores is None:
        return len(usable), "not pinned"
    if cores > len(usable):
        return cores, f"not pinned: only {len(usable)} usable, so {cores} are oversubscribed"
    os.sched_setaffinity(0, usable[:cores])
    return cores, f"pinned to CPU(s) {','.join(map(str, usable[:cores]))}"


def ceiling_round(setup: Setup) -> Result:
    """The spawn ceiling from 1 process and from K, in a child of its own."""
    counts = [1] if setup.processes == 1 else [1, setup.processes]
    argv = [sys.executable, str(SPAWN_CEILING_SCRIPT), "--tasks", str(setup.tasks),
            "--at-once", "--per-process", str(setup.per_process), "--json",
            "--processes", *map(str, counts)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CEILING_LIMIT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no exit after {CEILING_LIMIT_S:.0f} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"exited with {done.returncode}\n" + _tail(done.stdout + done.stderr))
    multi = json.loads(done.stdout.strip().splitlines()[-1])["multi"]
    return {"one": multi["1"], "many": multi[str(setup.processes)]}


def side_round(side: str, setup: Setup) -> Result:
    """One round of one side; raises RuntimeError or OSError when it cannot be measured."""
    if side == CEILING:
        return ceiling_round(setup)
    if side in (LOCAL, PSIJ_PYTHON):
        python = OURS_PYTHON if side == LOCAL else REFERENCE_PYTHON
        return pilot.executor_round("local", setup.tasks, python)
    tasks = 1 if side == PILOT_ONE else setup.tasks
    requests = setup.work / f"requests-{tasks}.json"
    if not requests.exists():
        pilot.request_file(requests, tasks)
    return pilot.one_round(pilot.QCG if side == QCG else pilot.OURS, requests, tasks,
                           setup.cores, WORKERS_ENV if side == PILOT_WORKERS else None)


def describe(side: str, r: Result) -> str:
    if side == CEILING:
        return f"{r['one']:.0f} starts/s from 1 process, {r['many']:.0f} from K"
    if side in (LOCAL, PSIJ_PYTHON):
        return (f"{r['jobs_per_s']:.0f} jobs/s ({r['seconds']:.2f} s), "
                f"{r['cpu_ms_per_job'] * 1e3:.0f} us CPU/job in the submitter")
    if side == PILOT_ONE:
        return (f"1 task, whole process {r['whole_s'] * 1e3:.0f} ms, CPU "
                f"{r['self_cpu_s'] * 1e3:.0f} ms own, {r['children_cpu_s'] * 1e3:.0f} ms children")
    return (f"{r['jobs_per_s']:.0f} tasks/s ({r['span_s']:.2f} s first submit to last end, "
            f"whole process {r['whole_s']:.2f} s), CPU {r['self_cpu_s']:.2f} s own, "
            f"{r['children_cpu_s']:.2f} s children")


# -- figures over rounds -----------------------------------------------------------------------

Rounds = List[Dict[str, Result]]  # per round: side -> result


@dataclass
class Figure:
    key: str
    # The side it needs; a peer's figures are left out of the table when the peer is.
    side: str
    name: str
    unit: str
    # One round's value, or None where that round lacks what it needs.
    value: Callable[[Dict[str, Result]], Optional[float]]


def _get(side: str, key: str, scale: float = 1.0) -> Callable[[Dict[str, Result]], Optional[float]]:
    def value(round_: Dict[str, Result]) -> Optional[float]:
        result = round_.get(side)
        return None if result is None else result[key] * scale
    return value


def _pilot_per_task_us(key: str, tasks: int, side: str = PILOT
                       ) -> Callable[[Dict[str, Result]], Optional[float]]:
    """A pilot CPU figure per task, the 1-task run of the same round taken off."""
    def value(round_: Dict[str, Result]) -> Optional[float]:
        many, one = round_.get(side), round_.get(PILOT_ONE)
        if many is None or one is None or tasks < 2:
            return None
        return (many[key] - one[key]) / (tasks - 1) * 1e6
    return value


def _processes(k: int) -> str:
    return f"{k} process{'es' if k > 1 else ''}"


def figures(setup: Setup) -> List[Figure]:
    k, cores, tasks = setup.processes, setup.cores, setup.tasks
    return [
        Figure("ceiling-1", CEILING, "spawn ceiling, 1 process", "starts/s",
               _get(CEILING, "one")),
        Figure("ceiling-k", CEILING, f"spawn ceiling, {_processes(k)}", "starts/s",
               _get(CEILING, "many")),
        Figure("local", LOCAL, "local executor", "jobs/s", _get(LOCAL, "jobs_per_s")),
        Figure("local-cpu", LOCAL, "  submitter CPU per job", "us",
               _get(LOCAL, "cpu_ms_per_job", 1e3)),
        Figure("local-create", LOCAL, "  Job creation CPU per job (before)", "us",
               _get(LOCAL, "create_cpu_ms_per_job", 1e3)),
        Figure("local-children", LOCAL, "  reaped children CPU per job", "us",
               _get(LOCAL, "children_cpu_ms_per_job", 1e3)),
        Figure("pilot", PILOT, f"pilot, psij pilot run --cores {cores}", "tasks/s",
               _get(PILOT, "jobs_per_s")),
        Figure("pilot-cpu", PILOT, "  pilot process CPU per task", "us",
               _pilot_per_task_us("self_cpu_s", tasks)),
        Figure("pilot-children", PILOT, "  reaped children CPU per task", "us",
               _pilot_per_task_us("children_cpu_s", tasks)),
        Figure("pilot-workers", PILOT_WORKERS, "pilot through one worker "
               "(PSIJ_PILOT_WORKERS=1)", "tasks/s", _get(PILOT_WORKERS, "jobs_per_s")),
        Figure("pilot-workers-cpu", PILOT_WORKERS, "  pilot process (engine) CPU per task", "us",
               _pilot_per_task_us("self_cpu_s", tasks, PILOT_WORKERS)),
        Figure("pilot-start", PILOT_ONE, "  pilot process CPU, 1-task run", "ms",
               _get(PILOT_ONE, "self_cpu_s", 1e3)),
        Figure("psij-python", PSIJ_PYTHON, "psij-python local executor", "jobs/s",
               _get(PSIJ_PYTHON, "jobs_per_s")),
        Figure("psij-python-cpu", PSIJ_PYTHON, "  submitter CPU per job", "us",
               _get(PSIJ_PYTHON, "cpu_ms_per_job", 1e3)),
        Figure("qcg", QCG, f"qcg-pilotjob, --nodes {cores}", "tasks/s",
               _get(QCG, "jobs_per_s")),
    ]


def _values(figure: Figure, rounds: Rounds) -> List[float]:
    found = (figure.value(round_) for round_ in rounds)
    return [v for v in found if v is not None and not math.isnan(v)]


def _number(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.2f}"


def print_figures(setup: Setup, rounds: Rounds) -> Dict[str, Optional[float]]:
    """The table of medians and ranges; the medians by figure name."""
    rows = [("figure", "median", "range", "rounds")]
    medians: Dict[str, Optional[float]] = {}
    for figure in figures(setup):
        values = _values(figure, rounds)
        medians[figure.key] = statistics.median(values) if values else None
        if figure.side not in setup.sides:
            continue
        rows.append((figure.name,
                     f"{_number(statistics.median(values))} {figure.unit}" if values
                     else "failed",
                     f"{_number(min(values))} - {_number(max(values))}" if values else "",
                     str(len(values))))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for n, row in enumerate(rows):
        log("   " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            log("   " + "  ".join("-" * w for w in widths))
    return medians


def goal_rows(setup: Setup, m: Dict[str, Optional[float]]
              ) -> List[Tuple[str, str, Optional[float], Optional[float]]]:
    """(ours, goal text, what the goal asks, what ours did): ratio >= 1 meets it, for rates and
    for CPU alike (the CPU ratio is the goal over ours)."""
    many, psij_python, qcg = m.get("ceiling-k"), m.get("psij-python"), m.get("qcg")
    rows: List[Tuple[str, str, Optional[float], Optional[float]]] = []
    for name, goal, unit in (("local", LOCAL_GOAL, "jobs/s"), ("pilot", PILOT_GOAL, "tasks/s")):
        ours = m.get(name)
        cpu = m.get(f"{name}-cpu")
        cpu_text = f"<= {CPU_GOAL_US:g} us CPU of the coordinating process per task"
        if name == "pilot" and m.get("pilot-workers-cpu") is not None:
            # Where the engine starts the tasks itself, its CPU is the spawning's too.
            cpu, cpu_text = m.get("pilot-workers-cpu"), cpu_text + " (through a worker)"
        rows += [
            (name, f">= {goal:.0f} {unit} (goal for {GOAL_CORES} cores)", goal, ours),
            (name, f">= {CEILING_SHARE:g} x the spawn ceiling from {_processes(setup.processes)}",
             None if many is None else many * CEILING_SHARE, ours),
            (name, f">= {PSIJ_PYTHON_FACTOR:g} x psij-python's local jobs/s",
             None if psij_python is None else psij_python * PSIJ_PYTHON_FACTOR, ours),
            (name, f">= {QCG_FACTOR:g} x qcg-pilotjob's tasks/s",
             None if qcg is None else qcg * QCG_FACTOR, ours),
            (name, cpu_text, CPU_GOAL_US, cpu),
        ]
    return rows


def print_goals(setup: Setup, medians: Dict[str, Optional[float]], usable: int) -> None:
    log(f"== Goals (informational, on medians; the rates are goals for a {GOAL_CORES}-core "
        f"machine, this run used {setup.cores} of {usable} core(s))")
    for name, text, asked, ours in goal_rows(setup, medians):
        if asked is None or ours is None:
            log(f"   N/A   {name:5}  {text}")
            continue
        cpu = "CPU" in text
        if cpu and ours <= 0:
            # Tick-rounded CPU of a small run can come out at or below the 1-task run's.
            log(f"   met    {name:5}  {text}: asks {_number(asked)}, ours {_number(ours)}: "
                "below the clock's resolution at this size")
            continue
        ratio = asked / ours if cpu else ours / asked
        log(f"   {'met ' if ratio >= 1 else 'not '}  {name:5}  {text}: asks "
            f"{_number(asked)}, ours {_number(ours)}: {ratio:.2f}x the goal")


# -- the run -----------------------------------------------------------------------------------


def peers(ours_only: bool) -> Tuple[List[str], List[str]]:
    """The peers' sides that can run, and a note for each that cannot."""
    if ours_only:
        return [], []
    sides, missing = [], []
    for side, ensure in ((PSIJ_PYTHON, ensure_reference_venv), (QCG, pilot.ensure_qcg_venv)):
        problem = ensure()
        if problem is None and side == PSIJ_PYTHON:
            problem = probe_version(Implementation(side, REFERENCE_PYTHON))
        if problem is None:
            sides.append(side)
        else:
            log(f"{side} unavailable, going on without it: {problem.splitlines()[0]}")
            missing.append(side)
    return sides, missing


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    def positive(text: str) -> int:
        value = int(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
        return value

    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--cores", type=positive, help="cores to use: the pilot's --cores, "
                        "and every process pinned to that many (default: all usable)")
    parser.add_argument("--tasks", type=positive, help="tasks per measurement (default 5000, "
                        "200 with --quick)")
    parser.add_argument("--rounds", type=positive, help="rounds, alternating the sides "
                        "(default 3, 1 with --quick)")
    parser.add_argument("--processes", type=positive,
                        help="spawning processes of the multi-process ceiling (default: cores)")
    parser.add_argument("--per-process", type=positive, default=2,
                        help="running at once in each spawning process (default 2)")
    parser.add_argument("--ours-only", action="store_true", help="leave the peers out")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    for path in (OURS_PYTHON, pilot.OURS_PSIJ):
        if not path.exists():
            log(f"{path} is missing: run `make .venv/.installed` first.")
            return 1
    usable = len(os.sched_getaffinity(0))
    cores, pinning = pin(args.cores)
    peer_sides, missing = peers(args.ours_only)
    ours = Implementation("ours", OURS_PYTHON)
    problem = probe_version(ours)
    if problem:
        log(f"FAILED: {problem}")
        return 1
    setup = Setup(tasks=args.tasks or (200 if args.quick else 5000), cores=cores,
                  processes=args.processes or cores, per_process=args.per_process,
                  sides=[CEILING, LOCAL, PILOT, PILOT_ONE],
                  work=Path(tempfile.mkdtemp(prefix="psij-bench-scale-")))
    if cores <= INLINE_MAX_CORES:
        setup.sides.insert(setup.sides.index(PILOT) + 1, PILOT_WORKERS)
    for peer in peer_sides:
        setup.sides.insert(setup.sides.index(LOCAL if peer == PSIJ_PYTHON else PILOT) + 1, peer)
    rounds_wanted = args.rounds or (1 if args.quick else 3)
    log(f"Machine: {usable} core(s) usable (os.sched_getaffinity); this run uses {cores}, "
        f"{pinning}; load average {os.getloadavg()[0]:.1f} (wall figures are only comparable "
        f"on an idle machine; CPU figures much less affected); Python "
        f"{sys.version.split()[0]}")
    log(f"  ours         psij {ours.version}")
    if PSIJ_PYTHON in peer_sides:
        log(f"  psij-python  {REFERENCE_REQUIREMENT} ({REFERENCE_PYTHON})")
    if QCG in peer_sides:
        log(f"  qcg          {pilot.QCG_REQUIREMENT} ({pilot.QCG_SERVICE})")
    log(f"  {setup.tasks} tasks of /bin/true per measurement, {rounds_wanted} round(s); spawn "
        f"ceiling from 1 and {_processes(setup.processes)}, at most {setup.per_process} "
        "running in each")
    log()

    rounds: Rounds = []
    failed: List[str] = []
    try:
        # Unmeasured: the pilots' first runs write their bytecode caches.
        for side in [s for s in (PILOT_ONE, QCG) if s in setup.sides]:
            try:
                side_round(side, replace(setup, tasks=1))
            except (OSError, RuntimeError) as exc:
                log(f"   warm-up {side}: FAILED: {exc}")
        log(f"== {rounds_wanted} round(s), alternating: {', '.join(setup.sides)}")
        for round_no in range(1, rounds_wanted + 1):
            rounds.append({})
            for side in setup.sides:
                try:
                    result = side_round(side, setup)
                except (OSError, RuntimeError) as exc:
                    failed.append(f"{side} (round {round_no})")
                    log(f"   round {round_no} {side:11}: FAILED: {exc}")
                    continue
                rounds[-1][side] = result
                log(f"   round {round_no} {side:11}: {describe(side, result)}")
    finally:
        shutil.rmtree(setup.work, ignore_errors=True)
    log()
    log("== Figures")
    medians = print_figures(setup, rounds)
    if setup.tasks > 1:
        tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
        log(f"   (the pilot's CPU is read in clock ticks of {tick_us / 1e3:.0f} ms: per task, "
            f"to within about {2 * tick_us / (setup.tasks - 1):.1f} us at {setup.tasks} tasks)")
    log()
    print_goals(setup, medians, usable)
    if failed or missing:
        log()
        log("Measurements that failed: " + ", ".join(failed + [f"{m} (setup)" for m in missing]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
