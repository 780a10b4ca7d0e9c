"""Pilot benchmark: ``psij pilot run`` against qcg-pilotjob 0.14.2 on the same request files.

Both pilots run as users run them, one process per round, on 2 local cores:
``.venv/bin/psij pilot run REQS.json --cores 2 --wd DIR`` and
``qcg-pm-service --file-path REQS.json --nodes 2 --wd DIR`` from a side venv created once under
``.bench-venvs/``. Rounds alternate between the two so that drift in machine load falls on
both alike. Figures:

- throughput: 1000 tasks of ``/bin/true`` (1000 job descriptions in one submit request);
  jobs/s from the first submit to the last task's end, both read from each pilot's own job
  report, and the whole process from spawn to exit;
- start-up: one ``/bin/true`` task; from spawn to the moment the task starts executing (its
  EXECUTING time in the report);
- the local executor's throughput on the same 1000 ``/bin/true`` (``bench/workloads.py
  throughput``, first submit to last final state), and the ``pilot`` executor's through the
  same PSI/J calls, in the same alternation: the pilot's tasks on its own node are started and
  reaped by the same process layer as the local executor's jobs.

Both interpreters use cached bytecode (PYTHONDONTWRITEBYTECODE is dropped for the children and
one unmeasured warm-up round runs first), as an installed package would. The targets are
printed as PASS/FAIL lines and never change the exit status; exit status 1 means a measurement
could not be taken. Run: ``.venv/bin/python bench/pilot.py [--quick] [--ours-only]``.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence, Tuple

from _help import description
from run import (
    OURS_PYTHON,
    REPO,
    Implementation,
    _child_env,
    _tail,
    build_workloads,
    ensure_side_venv,
    log,
    run_worker,
)

OURS_PSIJ = REPO / ".venv" / "bin" / "psij"
QCG_REQUIREMENT = "qcg-pilotjob==0.14.2"
QCG_VENV = REPO / ".bench-venvs" / "qcg-pilotjob-0.14.2"
QCG_SERVICE = QCG_VENV / "bin" / "qcg-pm-service"
CORES = 2
RUN_LIMIT_S = 600.0

OURS = "ours"
QCG = "qcg"
LOCAL = "local"  # this package's local executor, not a pilot
PILOT_EXECUTOR = "pilot-executor"  # the ``pilot`` executor in-process, through the PSI/J API


def ensure_qcg_venv() -> Optional[str]:
    """Create the side venv with qcg-pilotjob once; return an error text if that fails."""
    return ensure_side_venv(QCG_VENV, QCG_REQUIREMENT, QCG_SERVICE)


def _env() -> Dict[str, str]:
    env = _child_env()
    # Both sides read cached bytecode, as installed packages do (pip compiles QCG's at
    # install; the warm-up round writes ours).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def request_file(path: Path, tasks: int) -> None:
    """``tasks`` one-core ``/bin/true`` jobs in one submit request, in the form both read."""
    jobs = [{"name": f"t{i}", "execution": {"exec": "/bin/true"},
             "resources": {"numCores": {"exact": 1}}} for i in range(tasks)]
    path.write_text(json.dumps([{"request": "submit", "jobs": jobs},
                                {"request": "control", "command": "finishAfterAllTasksDone"}]))


# -- reading each pilot's report ---------------------------------------------------------------

History = List[Tuple[str, List[Tuple[datetime, str]]]]


def ours_history(wd: Path) -> History:
    """(task, [(time, state)]) from ``jobs.report`` (seed layout: dated lines indented)."""
    tasks: History = []
    for line in (wd / "jobs.report").read_text().splitlines():
        if not line.startswith(" "):
            tasks.append((line.rpartition(" (")[0], []))
        elif line[4:5].isdigit():
            when, _, state = line.strip().rpartition(": ")
            tasks[-1][1].append((datetime.fromisoformat(when), state))
    return tasks


def qcg_history(wd: Path) -> History:
    """(task, [(time, state)]) from QCG's JSON-lines report in its ``.qcgpjm-service-*``."""
    reports = list(wd.glob(".qcgpjm-service-*/jobs.report"))
    if len(reports) != 1:
        raise RuntimeError(f"expected one QCG jobs.report under {wd}, found {len(reports)}")
    tasks: History = []
    for line in reports[0].read_text().splitlines():
        entry = json.loads(line)
        tasks.append((entry["name"], [(datetime.fromisoformat(h["date"]), h["state"])
                                      for h in entry["history"]]))
    return tasks


def measure(history: History, tasks: int) -> Dict[str, float]:
    """First submit to last end, and the first task's start, as epoch seconds."""
    succeeded = [name for name, states in history if states and states[-1][1] == "SUCCEED"]
    # QCG also reports each iterated job as a whole; with one job per task it does not.
    if len(succeeded) < tasks:
        raise RuntimeError(f"only {len(succeeded)} of {tasks} tasks succeeded")
    first = min(states[0][0] for _, states in history if states)
    last = max(states[-1][0] for _, states in history if states)
    started = min(when for _, states in history for when, state in states
                  if state == "EXECUTING")
    return {"first_submit": first.timestamp(), "last_end": last.timestamp(),
            "first_start": started.timestamp()}


# -- one round ---------------------------------------------------------------------------------


def command(side: str, requests: Path, wd: Path, cores: int = CORES) -> List[str]:
    if side == OURS:
        return [str(OURS_PSIJ), "pilot", "run", str(requests), "--cores", str(cores),
                "--wd", str(wd)]
    return [str(QCG_SERVICE), "--file-path", str(requests), "--nodes", str(cores),
            "--wd", str(wd), "--report-format", "json"]


def executor_round(executor: str, tasks: int, python: Path = OURS_PYTHON) -> Dict[str, float]:
    """``tasks`` x ``/bin/true`` through the PSI/J API with an executor (``local`` or
    ``pilot``) of the package ``python`` imports (ours unless told), in a child interpreter:
    the workload's own figures, and the keys ``one_round`` returns."""
    workload = next(w for w in build_workloads(quick=False) if w.name == "throughput")
    result = run_worker(Implementation(OURS, python),
                        replace(workload, args=["--jobs", str(tasks), "--executor", executor]))
    if result.get("not_completed"):
        raise RuntimeError(f"{result['not_completed']} of {tasks} jobs did not complete")
    figures = {k: v for k, v in result.items() if isinstance(v, (int, float))}
    return {**figures, "whole_s": result["seconds"], "span_s": result["seconds"],
            "jobs_per_s": result["jobs_per_s"], "startup_s": 0.0}


def _exited_cpu_s(pid: int) -> Tuple[float, float]:
    """CPU seconds (user + system) of an exited, not yet reaped process: its own (all its
    threads), and that of the children it reaped (with their reaped descendants), from
    ``/proc/PID/stat`` while it is a zombie. NaN for both where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return float("nan"), float("nan")
    # fields[0] is the state (field 3 of proc(5)): utime, stime, cutime, cstime are 14-17.
    tick = os.sysconf("SC_CLK_TCK")
    return ((int(fields[11]) + int(fields[12])) / tick,
            (int(fields[13]) + int(fields[14])) / tick)


def run_measured(argv: List[str], output: IO[bytes], cwd: str,
                 extra_env: Optional[Dict[str, str]] = None) -> Tuple[int, float, float, float]:
    """Run ``argv`` to its exit: exit status, wall seconds, its own CPU seconds and its reaped
    children's. The CPU is read at its exit and before it is reaped, so nothing in the
    process is changed to measure it. Raises RuntimeError after ``RUN_LIMIT_S``."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output,
                            stderr=subprocess.STDOUT, env={**_env(), **(extra_env or {})},
                            cwd=cwd)
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(RUN_LIMIT_S, expire)
    timer.start()
    try:
        cpu = float("nan"), float("nan")
        if hasattr(os, "waitid"):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            cpu = _exited_cpu_s(proc.pid)
        returncode = proc.wait()
        whole = time.perf_counter() - start
    finally:
        timer.cancel()
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    if timed_out.is_set():
        raise RuntimeError(f"no exit after {RUN_LIMIT_S:.0f} s")
    return returncode, whole, cpu[0], cpu[1]


def one_round(side: str, requests: Path, tasks: int, cores: int = CORES,
              extra_env: Optional[Dict[str, str]] = None) -> Dict[str, float]:
    """Run one pilot process on ``requests`` (with ``extra_env`` added to its environment);
    figures of that run. Raises RuntimeError."""
    if side in (LOCAL, PILOT_EXECUTOR):
        return executor_round("local" if side == LOCAL else "pilot", tasks)
    with tempfile.TemporaryDirectory(prefix=f"psij-bench-pilot-{side}-") as tmp:
        wd = Path(tmp) / "wd"
        wd.mkdir()
        argv = command(side, requests, wd, cores)
        with open(Path(tmp) / "output", "wb") as output:
            spawned = time.time()
            returncode, whole, self_cpu, children_cpu = run_measured(argv, output, tmp,
                                                                     extra_env)
        if returncode != 0:
            raise RuntimeError(f"exited with {returncode}\n"
                               + _tail((Path(tmp) / "output").read_text(errors="replace")))
        history = ours_history(wd) if side == OURS else qcg_history(wd)
        times = measure(history, tasks)
    span = times["last_end"] - times["first_submit"]
    return {"whole_s": whole, "span_s": span, "jobs_per_s": tasks / span if span > 0 else 0.0,
            "startup_s": times["first_start"] - spawned, "self_cpu_s": self_cpu,
            "children_cpu_s": children_cpu}


def interpreter_and_imports(rounds: int) -> Tuple[float, float]:
    """Median seconds of a bare start of ours' interpreter, and of one that imports what
    ``psij pilot run`` imports: the part of the start-up spent before the pilot runs."""
    python = str(OURS_PSIJ.parent / "python")
    # Both end at once, as the start-up measured ends at the first task: the interpreter's
    # clean-up at exit is not part of it.
    leave = "import os; os._exit(0)"
    code = f"import psij.cli; from psij.executors.pilot.qcg import run; {leave}"
    bare: List[float] = []
    imports: List[float] = []
    for _ in range(rounds):
        for argv, samples in (([python, "-c", leave], bare), ([python, "-c", code], imports)):
            start = time.perf_counter()
            subprocess.run(argv, check=True, env=_env(), stdin=subprocess.DEVNULL)
            samples.append(time.perf_counter() - start)
    return statistics.median(bare), statistics.median(imports)


# -- the benchmark -----------------------------------------------------------------------------


def alternate(title: str, tasks: int, rounds: int, sides: Sequence[str], work: Path,
              describe: Callable[[Dict[str, float]], str]) -> Dict[str, List[Dict[str, float]]]:
    log(f"== {title} ({rounds} round(s), alternating)")
    requests = work / f"requests-{tasks}.json"
    request_file(requests, tasks)
    results: Dict[str, List[Dict[str, float]]] = {side: [] for side in sides}
    for round_no in range(1, rounds + 1):
        for side in sides:
            try:
                result = one_round(side, requests, tasks)
            except (OSError, RuntimeError) as exc:
                log(f"   round {round_no} {side:4}: FAILED: {exc}")
                continue
            results[side].append(result)
            log(f"   round {round_no} {side:4}: {describe(result)}")
    return results


def median(results: List[Dict[str, float]], key: str) -> Optional[float]:
    return statistics.median(r[key] for r in results) if results else None


def fmt(value: Optional[float], unit: str, digits: int = 3) -> str:
    return "failed" if value is None else f"{value:.{digits}f} {unit}"


def verdict(ok: Optional[bool]) -> str:
    return {True: "PASS", False: "FAIL", None: "N/A "}[ok]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true",
                        help="200 tasks and fewer rounds, for a smoke run")
    parser.add_argument("--ours-only", action="store_true",
                        help="leave qcg-pilotjob out (ours and the local executor only)")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    tasks = 200 if args.quick else 1000
    throughput_rounds = 1 if args.quick else 3
    startup_rounds = 2 if args.quick else 5
    if not OURS_PSIJ.exists():
        log(f"{OURS_PSIJ} is missing: run `make .venv/.installed` first.")
        return 1
    sides = [OURS]
    problem = None if args.ours_only else ensure_qcg_venv()
    if problem is None and not args.ours_only:
        sides.append(QCG)
    elif problem is not None:
        log(f"qcg-pilotjob unavailable, measuring ours only. FAILED: {problem}")
    log(f"Machine: {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f} (wall times "
        f"are only comparable on an idle machine), Python {sys.version.split()[0]}, "
        f"{'quick' if args.quick else 'full'} run, pilots on {CORES} local cores")
    log(f"  ours psij pilot run ({OURS_PSIJ})")
    if QCG in sides:
        log(f"  qcg  {QCG_REQUIREMENT} ({QCG_SERVICE})")
    log()

    work = Path(tempfile.mkdtemp(prefix="psij-bench-pilot-"))
    try:
        alternate("warm-up (not counted)", 1, 1, sides, work, lambda r: "ok")
        log()
        throughput = alternate(
            f"throughput: {tasks} x /bin/true", tasks, throughput_rounds,
            [*sides, LOCAL, PILOT_EXECUTOR], work,
            lambda r: f"{r['jobs_per_s']:.0f} jobs/s ({r['span_s']:.2f} s first submit to "
                      f"last end), whole process {r['whole_s']:.2f} s")
        log()
        startup = alternate(
            "start-up: spawn to the first task executing, 1 x /bin/true", 1, startup_rounds,
            sides, work, lambda r: f"start-up {r['startup_s'] * 1e3:.0f} ms, whole process "
                                   f"{r['whole_s'] * 1e3:.0f} ms")
        bare_s, imported_s = interpreter_and_imports(startup_rounds)
        log(f"   ours: of the start-up, {bare_s * 1e3:.0f} ms start a bare interpreter and "
            f"{(imported_s - bare_s) * 1e3:.0f} ms more import psij.cli and the pilot")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log()

    ours_rate = median(throughput[OURS], "jobs_per_s")
    qcg_rate = median(throughput.get(QCG, []), "jobs_per_s")
    ours_whole = median(throughput[OURS], "whole_s")
    qcg_whole = median(throughput.get(QCG, []), "whole_s")
    ours_startup = median(startup[OURS], "startup_s")
    qcg_startup = median(startup.get(QCG, []), "startup_s")
    local_rate = median(throughput[LOCAL], "jobs_per_s")
    rate_ratio = ours_rate / qcg_rate if ours_rate and qcg_rate else None
    executor_rate = median(throughput[PILOT_EXECUTOR], "jobs_per_s")
    local_ratio = ours_rate / local_rate if ours_rate and local_rate else None
    executor_ratio = executor_rate / local_rate if executor_rate and local_rate else None
    whole_ratio = qcg_whole / ours_whole if ours_whole and qcg_whole else None
    startup_ratio = qcg_startup / ours_startup if ours_startup and qcg_startup else None

    log("== Summary (medians)")
    rows = [
        ("figure", "ours", "qcg", "ours vs qcg"),
        (f"jobs/s, {tasks} tasks", fmt(ours_rate, "jobs/s", 0), fmt(qcg_rate, "jobs/s", 0),
         "no comparison" if rate_ratio is None else f"{rate_ratio:.2f}x the throughput"),
        (f"whole process, {tasks} tasks", fmt(ours_whole, "s", 2), fmt(qcg_whole, "s", 2),
         "no comparison" if whole_ratio is None else f"{whole_ratio:.2f}x faster"),
        ("start-up to first task", fmt(ours_startup, "s"), fmt(qcg_startup, "s"),
         "no comparison" if startup_ratio is None else f"{startup_ratio:.1f}x faster"),
        (f"local executor jobs/s, {tasks} jobs", fmt(local_rate, "jobs/s", 0), "",
         "no comparison" if local_ratio is None else f"pilot {local_ratio:.2f}x of local"),
        (f"pilot executor jobs/s, {tasks} jobs", fmt(executor_rate, "jobs/s", 0), "",
         "no comparison" if executor_ratio is None else f"{executor_ratio:.2f}x of local"),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for n, row in enumerate(rows):
        log("   " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            log("   " + "  ".join("-" * w for w in widths))
    log()
    log("== Targets (informational)")
    for ratio, floor, text in (
            (rate_ratio, 1.5, "throughput at least 1.5x qcg-pilotjob's jobs/s"),
            (whole_ratio, 3.0, "whole process at least 3x faster than qcg-pilotjob's"),
            (local_ratio, 0.8, "pilot throughput within 20% of the local executor's in the "
                               "same run"),
            (executor_ratio, 0.8, "pilot executor within 20% of the local executor's in the "
                                  "same run")):
        log(f"   {verdict(None if ratio is None else ratio >= floor)}  {text}"
            + ("" if ratio is None else f"  ({ratio:.2f}x)"))
    log(f"   {verdict(None if ours_startup is None else ours_startup < 0.1)}  "
        f"start-up under 0.1 s" + ("" if ours_startup is None
                                   else f"  ({ours_startup * 1e3:.0f} ms)"))

    failed = [f"{name}/{side}" for name, results, rounds in
              (("throughput", throughput, throughput_rounds), ("start-up", startup,
                                                               startup_rounds))
              for side in results if len(results[side]) < rounds]
    if failed or (len(sides) < 2 and not args.ours_only):
        log()
        log("Measurements that failed: " + (", ".join(failed) or "qcg-pilotjob setup"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
