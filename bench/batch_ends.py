"""From a batch job's end to ``job.wait()`` returning, on the real Slurm and Grid Engine: this
package against psij-python 0.9.11 in the same run, with the scheduler commands each sends.

For each scheduler (``--executor``, repeatable: ``slurm``, ``sge``; ``batch-test`` runs the
fake scheduler of this package, for a quick check without a cluster), ``--jobs`` jobs (50) of
about ``--job-seconds`` (1 s) each: ``/bin/sh END_SCRIPT STAMP 1``, which sleeps, then writes
its own end time (``date +%s.%N``) to its own file as its last action. They are submitted:

- one by one (``submit``), by this package and by psij-python;
- with ``submit_many``, by this package only (psij-python has none), which sends jobs that
  differ only in their arguments as one job array (``psij.executors.batch._arrays``).

Each run is one child interpreter of the implementation measured (``bench/_ends_worker.py``
in this project's ``.venv``, or in psij-python's side venv from ``tests/support/
reference_venv.py``, made once under ``.test-cache/``; ``--reference-python`` names another
interpreter with psij-python 0.9.11). In it every job has its own thread blocked in
``job.wait()``, started when the job was submitted, which notes when ``wait()`` returned: no
job's figure waits behind another's. The figure per job is the seconds from its end stamp to
that moment; the run prints their median, 90th percentile (nearest rank) and worst. Both
implementations poll with their own default interval (30 s for both) unless ``--interval``
says otherwise.

Scheduler commands are counted by small wrapper scripts put first on the child's PATH (one
folder per run), each noting its time and name in the run's log and then running the real
command found on the original PATH: ``squeue``, ``sacct`` and ``scontrol`` for Slurm,
``qstat`` and ``qacct`` for Grid Engine (submission commands are not counted). The run's
commands per minute are those noted between the start of the child's executor and the last
``wait()`` returning; the totals add up every run of an implementation.

A scheduler that is not running is skipped, saying so; the figures are printed, never judged,
and the exit status is 1 only when a run could not be measured (a child that gave no result, a
job that did not end COMPLETED, psij-python that could not be installed). The run holds the
shared scheduler lock (``$SCHEDULERS_LOCK``, as ``make test`` does), so that the schedulers are
not stopped under it. Run: ``make bench-ends`` or ``.venv/bin/python bench/batch_ends.py
[--jobs N] [--executor slurm] [--interval S] [--accounting-wait S] [--no-reference]``.
"""

import argparse
import contextlib
import fcntl
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from _help import description, run_in_session
from run import OURS_PYTHON, REPO, _child_env, _tail, log

WORKER = Path(__file__).resolve().parent / "_ends_worker.py"
SCHEDULERS_LOCK = Path(os.environ.get("SCHEDULERS_LOCK", "/tmp/psij-test-schedulers.lock"))
# The scheduler commands counted, per executor.
COUNTED: Dict[str, Tuple[str, ...]] = {
    "slurm": ("squeue", "sacct", "scontrol"),
    "sge": ("qstat", "qacct"),
    "batch-test": (),  # its fake scheduler runs through the Python interpreter
}
REAL_SCHEDULERS = ("slurm", "sge")
MODES = {"single": "one by one", "array": "submit_many"}
OURS_LABEL = "ours"
REF_LABEL = "psij-python"


# ---------------------------------------------------------------- command counting


def make_wrappers(folder: Path, names: Sequence[str], log_path: Path,
                  path: Optional[str]) -> List[str]:
    """Write to ``folder`` one wrapper script per command of ``names`` found on ``path``: each
    appends ``<epoch seconds> <name> <client|job>`` to ``log_path`` and runs the real command
    with its arguments. ``job`` marks a command run inside a batch job (its ``SLURM_JOB_ID`` or
    ``JOB_ID`` differs from this process's): the job's own script, not the client polling (jobs
    inherit the PATH). Returns the names found (a command not installed gets no wrapper)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
    here = f"{os.environ.get('SLURM_JOB_ID', '')}/{os.environ.get('JOB_ID', '')}"
    found = []
    for name in names:
        real = shutil.which(name, path=path)
        if real is None:
            continue
        wrapper = folder / name
        wrapper.write_text(
            "#!/bin/sh\n"
            f'case "${{SLURM_JOB_ID:-}}/${{JOB_ID:-}}" in {shlex.quote(here)}) _w=client ;; '
            "*) _w=job ;; esac\n"
            f"printf '%s %s %s\\n' \"$(date +%s.%N)\" {shlex.quote(name)} \"$_w\" "
            f">>{shlex.quote(str(log_path))}\n"
            f"exec {shlex.quote(real)} \"$@\"\n")
        wrapper.chmod(0o700)
        found.append(name)
    return found


def read_commands(log_path: Path, begin: float, end: float
                  ) -> Tuple[Dict[str, int], Dict[str, int]]:
    """How many times each command was started between ``begin`` and ``end`` (epoch s): by
    the client, and inside the jobs."""
    client: Dict[str, int] = {}
    jobs: Dict[str, int] = {}
    try:
        text = log_path.read_text()
    except FileNotFoundError:
        return client, jobs
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) != 3:
            continue
        try:
            moment = float(fields[0])
        except ValueError:
            continue
        if begin <= moment <= end:
            counts = client if fields[2] == "client" else jobs
            counts[fields[1]] = counts.get(fields[1], 0) + 1
    return client, jobs


# ---------------------------------------------------------------- figures


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least ``fraction`` of the
    samples at or below it."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class Run:
    """One child run: one implementation, one executor, one way of submitting."""

    executor: str
    label: str
    mode: str
    result: Dict[str, Any] = field(default_factory=dict)
    commands: Dict[str, int] = field(default_factory=dict)  # the client's
    job_commands: Dict[str, int] = field(default_factory=dict)  # the jobs' own
    note: str = ""  # why there are no figures
    error: str = ""

    @property
    def minutes(self) -> float:
        return max(self.result.get("end", 0.0) - self.result.get("begin", 0.0), 1e-9) / 60

    @property
    def samples(self) -> List[float]:
        samples: List[float] = self.result.get("samples_s", [])
        return samples

    def per_minute(self) -> float:
        return sum(self.commands.values()) / self.minutes


def _commands_text(commands: Dict[str, int], names: Sequence[str], minutes: float) -> str:
    if not names:
        return "scheduler commands not counted (its fake scheduler runs through Python)"
    total = sum(commands.values())
    parts = ", ".join(f"{n} {commands.get(n, 0)}" for n in names)
    return (f"{total} commands in {minutes:.2f} min: {total / minutes:.2f}/min"
            + (f" ({parts})" if parts else ""))


def describe(run: Run) -> str:
    r = run.result
    samples = run.samples
    text = f"{len(samples)} of {r['jobs']} jobs measured"
    if samples:
        text += (f"; end -> wait() returned: median {statistics.median(samples):.2f} s, "
                 f"p90 {percentile(samples, 0.9):.2f} s, worst {max(samples):.2f} s; "
                 f"the jobs ended within {r['ends_spread_s']:.2f} s of one another")
    text += (f"; polling every {r['interval_s']:g} s; submitting took {r['submit_s']:.2f} s; "
             + _commands_text(run.commands, COUNTED[run.executor], run.minutes))
    if run.job_commands:
        text += ("; not counted, run by the jobs' own scripts: "
                 + ", ".join(f"{n} {c}" for n, c in sorted(run.job_commands.items())))
    return text


# ---------------------------------------------------------------- runs


def run_child(python: Path, argv: List[str], path: str, timeout: float) -> Dict[str, Any]:
    """The worker's JSON result; raises RuntimeError when it gives none. Output goes to files,
    not pipes (a job still holding them cannot keep us waiting); the worker leads its own
    session, so that a timeout kills whatever it started too."""
    env = _child_env()
    env["PATH"] = path
    returncode, stdout, stderr = run_in_session([str(python), str(WORKER), *argv], env, timeout,
                                                "psij-bench-ends-cwd-")
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                parsed: Dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            return parsed
    how = f"killed after {timeout:.0f} s" if returncode is None else f"exited with {returncode}"
    raise RuntimeError(f"no result ({how})\n" + _tail(stdout + stderr))


def _clean_up(executor: str, name: str) -> None:
    """Cancel what a failed run may have left in the queue (its jobs all carry ``name``)."""
    argv = {"slurm": ["scancel", "--name", name], "sge": ["qdel", name]}.get(executor)
    if argv is not None and shutil.which(argv[0]) is not None:
        subprocess.run(argv, capture_output=True, timeout=120)


def measure(run: Run, python: Path, args: argparse.Namespace, scratch: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix=f"{run.label}-{run.executor}-{run.mode}-",
                                   dir=scratch))
    wrappers = folder / "bin"
    wrappers.mkdir(mode=0o700)
    log_path = folder / "commands.log"
    original_path = os.environ.get("PATH", os.defpath)
    make_wrappers(wrappers, COUNTED[run.executor], log_path, original_path)
    name = f"bench-ends-{os.getpid()}"
    argv = ["--executor", run.executor, "--mode", run.mode, "--jobs", str(args.jobs),
            "--work", str(folder / "work"), "--job-seconds", f"{args.job_seconds:g}",
            "--name", name, "--wait-limit", f"{args.wait_limit:g}"]
    if args.interval is not None:
        argv += ["--interval", f"{args.interval:g}"]
    if args.accounting_wait is not None and run.label == OURS_LABEL:
        argv += ["--accounting-wait", f"{args.accounting_wait:g}"]
    started = time.monotonic()
    try:
        run.result = run_child(python, argv, f"{wrappers}{os.pathsep}{original_path}",
                               args.wait_limit + 300)
    except (OSError, RuntimeError) as exc:
        run.error = str(exc)
        _clean_up(run.executor, name)
        log(f"   {run.label} {MODES[run.mode]}: FAILED: {exc}")
        return
    if "unsupported" in run.result:
        run.note = run.result["unsupported"]
        log(f"   {run.label} {MODES[run.mode]}: not measured: {run.note}")
        return
    run.commands, run.job_commands = read_commands(log_path, run.result["begin"],
                                                   run.result["end"])
    if run.result["problems"]:
        run.error = (f"{len(run.result['problems'])} job(s) not measured: "
                     + "; ".join(run.result["problems"][:3]))
        _clean_up(run.executor, name)
    log(f"   {run.label} {MODES[run.mode]} ({run.result['implementation']}): {describe(run)} "
        f"({time.monotonic() - started:.1f} s)")
    if run.error:
        log(f"   {run.label} {MODES[run.mode]}: ERROR: {run.error}")


def scheduler_problem(executor: str) -> Optional[str]:
    """Why ``executor``'s scheduler cannot be used here, or None."""
    try:
        if executor == "slurm":
            if shutil.which("sbatch") is None:
                return "Slurm is not installed"
            ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True,
                                  timeout=60)
            if "UP" not in ping.stdout:
                return f"Slurm is not running (scontrol ping: {ping.stdout.strip()!r})"
        elif executor == "sge":
            if shutil.which("qsub") is None:
                return "Grid Engine is not installed"
            qstat = subprocess.run(["qstat"], capture_output=True, text=True, timeout=60)
            if qstat.returncode != 0:
                return f"Grid Engine is not running (qstat: {qstat.stderr.strip()!r})"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{executor}: {exc}"
    return None


def reference_python(args: argparse.Namespace) -> Tuple[Optional[Path], str]:
    """psij-python's interpreter, or None and why (an empty reason when left out on purpose;
    a reason starting with ERROR when it should have been there)."""
    if args.no_reference:
        return None, ""
    if args.reference_python is not None:
        if not os.access(args.reference_python, os.X_OK):
            return None, f"ERROR: --reference-python {args.reference_python}: not executable"
        return args.reference_python, ""
    sys.path.insert(0, str(REPO / "tests"))
    import pytest

    from support.reference_venv import REFERENCE, REFERENCE_REQUIREMENTS, side_venv

    log(f"psij-python: the side venv {REFERENCE} under the test cache (made once) ...")
    try:
        return side_venv(REFERENCE, REFERENCE_REQUIREMENTS), ""
    except pytest.skip.Exception as exc:  # no package index: say so, go on without it
        return None, f"psij-python left out: {exc}"
    except pytest.fail.Exception as exc:
        return None, f"ERROR: psij-python could not be installed: {exc}"


@contextlib.contextmanager
def _shared_lock() -> Iterator[None]:
    """Hold the scheduler lock shared while the real schedulers are used."""
    fd = os.open(SCHEDULERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _row(run: Run, version: str) -> str:
    who = f"{run.label} {version}".strip()
    start = f"{run.executor:10} {who:18} {MODES[run.mode]:11}"
    if run.note or (run.error and not run.result.get("samples_s")):
        return f"{start} {run.note or 'FAILED: ' + run.error.splitlines()[0]}"
    samples = run.samples
    figures = (f"{statistics.median(samples):7.2f} {percentile(samples, 0.9):7.2f} "
               f"{max(samples):7.2f}") if samples else f"{'-':>7} {'-':>7} {'-':>7}"
    counted = f"{run.per_minute():9.2f} {sum(run.commands.values()):8}" \
        if COUNTED[run.executor] else f"{'-':>9} {'-':>8}"
    return (f"{start} {len(samples):>3}/{run.result['jobs']:<3} {figures} {counted} "
            f"{run.minutes:7.2f}")


def summary(runs: List[Run], args: argparse.Namespace) -> None:
    log()
    log(f"== summary: seconds from each job's own end to its wait() returning ({args.jobs} "
        f"jobs of {args.job_seconds:g} s per run, one waiting thread per job; polling "
        + ("each implementation's default" if args.interval is None
           else f"every {args.interval:g} s") + ")")
    log(f"{'scheduler':10} {'implementation':18} {'submitted':11} {'jobs':7} {'median':>7} "
        f"{'p90':>7} {'worst':>7} {'cmds/min':>9} {'commands':>8} {'minutes':>7}")
    versions = {r.label: r.result.get("implementation", "").replace("psij ", "")
                for r in runs if r.result.get("implementation")}
    for run in runs:
        log(_row(run, versions.get(run.label, "")))
    log()
    log("scheduler commands per minute over every run of each implementation:")
    for label in (OURS_LABEL, REF_LABEL):
        for executor in sorted({r.executor for r in runs}):
            done = [r for r in runs if r.label == label and r.executor == executor and r.result
                    and "unsupported" not in r.result]
            if not done or not COUNTED[executor]:
                continue
            commands: Dict[str, int] = {}
            for r in done:
                for name, n in r.commands.items():
                    commands[name] = commands.get(name, 0) + n
            minutes = sum(r.minutes for r in done)
            log(f"   {label} on {executor} ({len(done)} run(s)): "
                + _commands_text(commands, COUNTED[executor], minutes))


def main() -> int:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--jobs", type=int, default=50, help="jobs per run (default 50)")
    parser.add_argument("--executor", action="append", choices=sorted(COUNTED),
                        help="slurm, sge (both by default) or batch-test; repeatable")
    parser.add_argument("--modes", default="single,array",
                        help="single (one by one), array (submit_many) or both (default)")
    parser.add_argument("--interval", type=float,
                        help="status polling interval in s (default: each implementation's)")
    parser.add_argument("--job-seconds", type=float, default=1.0,
                        help="how long each job sleeps before its end stamp (default 1)")
    parser.add_argument("--wait-limit", type=float, default=900.0,
                        help="seconds a run may wait for its jobs (default 900)")
    parser.add_argument("--accounting-wait", type=float,
                        help="this package's accounting_wait in s (default: its own, 8; 0: "
                             "final statuses do not wait for the scheduler's record)")
    parser.add_argument("--no-reference", action="store_true",
                        help="leave psij-python out")
    parser.add_argument("--reference-python", type=Path,
                        help="an interpreter with psij-python 0.9.11 (default: the side venv "
                             "of tests/support/reference_venv.py, made once)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for number, text in ((args.jobs, "--jobs"), (args.job_seconds, "--job-seconds"),
                         (args.wait_limit, "--wait-limit"), (args.interval, "--interval")):
        if number is not None and not (math.isfinite(number) and number > 0):
            parser.error(f"{text}: expected a positive number, got {number!r}")
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: expected single, array or single,array, got {args.modes!r}")
    executors = args.executor or list(REAL_SCHEDULERS)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    log(f"{' '.join(sys.argv)}")
    log(f"{cores} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    failed = False
    ref_python, why = reference_python(args)
    if why:
        log(why)
        failed = why.startswith("ERROR")
    runs: List[Run] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="psij-bench-ends-") as scratch:
        for executor in executors:
            problem = scheduler_problem(executor)
            if problem is not None:
                log(f"== {executor}: skipped: {problem}")
                continue
            plan = [(OURS_LABEL, OURS_PYTHON, mode) for mode in modes]
            if ref_python is not None and "single" in modes:
                plan.insert(1, (REF_LABEL, ref_python, "single"))
            log(f"== {executor}: {args.jobs} jobs of {args.job_seconds:g} s per run")
            held = _shared_lock() if executor in REAL_SCHEDULERS \
                else contextlib.nullcontext()
            with held:
                for label, python, mode in plan:
                    run = Run(executor, label, mode)
                    measure(run, python, args, Path(scratch))
                    runs.append(run)
                    failed = failed or bool(run.error)
    if runs:
        summary(runs, args)
    log(f"wall time {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
