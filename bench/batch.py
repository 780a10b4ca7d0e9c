"""Batch benchmarks: this package against psij-python 0.9.11, on a real Slurm and with fake
scheduler commands.

Figures, each taken for both packages in the same run, rounds alternating between them:

- status commands per poll interval with many tracked jobs (no scheduler needed): this package
  on its ``batch-test`` executor, counted by wrapping the executor's command runner; and both
  packages' ``slurm`` executors against a fake ``sbatch``/``squeue`` put first on PATH (the
  fake ``squeue`` counts its calls and reports every job PENDING);
- submit throughput to the real Slurm: ``/bin/true`` jobs with a 1-minute time limit submitted
  in a loop, jobs/s of the submit calls only (goal: at least 1.5 times psij-python's), once
  with jobs starting at once and once with jobs deferred an hour; this package also a second
  time with every job through ``sbatch`` (``rest_submit=False``, as on a site without
  ``slurmrestd``), and each round says which way its jobs went;
- ``submit_many`` throughput to the real Slurm (this package only: psij-python has no bulk
  submission): the same jobs, differing in an argument and an environment value, given to one
  ``submit_many`` call, which sends them as one job array; jobs/s of that call, compared with
  psij-python's one-by-one rate of the previous figure (goal: at least 10 times);
- time from a job's end to COMPLETED seen: the job writes a timestamp as its last action, the
  status callback notes when COMPLETED arrives; with each package's default polling and with
  a 1 s polling interval for both.

Usage: ``python bench/batch.py [--quick] [--no-slurm] [--submit-only]`` (``make bench`` runs
it after ``bench/run.py``). Measurements run in child interpreters of each package's venv (``python
bench/batch.py worker ...``), as in ``bench/run.py``, whose venv handling is reused.

The Slurm figures need a running Slurm; when there is none and this is root, Slurm is started
with ``tests/setup/start-slurm.sh`` and stopped afterwards with ``stop-slurm.sh`` (only then,
and only when no test run holds the shared scheduler lock). Without root or Slurm they are
skipped with the reason. Missed targets never fail the run; exit status 1 means a measurement
could not be taken. The worker part must not import ``psij`` at module level: each venv
imports its own.
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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from _batch_worker import DEFAULT_POLLING_INTERVAL_S, worker_main
from _help import description, run_in_session
from run import (
    OURS,
    OURS_PYTHON,
    REF,
    REFERENCE_PYTHON,
    REPO,
    Implementation,
    _child_env,
    _last_result_line,
    _tail,
    ensure_reference_venv,
    log,
    probe_version,
)

SCRIPT = Path(__file__).resolve()
SETUP = REPO / "tests" / "setup"
# Shared with the Makefile's test target: a run using the schedulers holds it shared; they are
# stopped only by whoever gets it exclusively.
SCHEDULERS_LOCK = Path(os.environ.get("SCHEDULERS_LOCK", "/tmp/psij-test-schedulers.lock"))
START_SLURM_LIMIT_S = 900.0
DRAIN_LIMIT_S = 300.0
SBATCH_ONLY = "ours/sbatch"


# ====================================================================== driver


@dataclass
class Series:
    """The rounds of one measurement for one implementation."""

    results: List[Dict[str, Any]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)


def run_child(impl: Implementation, argv: List[str], timeout: float,
              script: Path = SCRIPT) -> Dict[str, Any]:
    """One worker run (``script worker ARGV``, this script's unless told) in ``impl``'s
    interpreter; raises RuntimeError when it gives no result.

    Output goes to files, not pipes (a job still holding them cannot keep us waiting); the
    worker leads its own session so that a timeout kills whatever it started too.
    """
    returncode, stdout, stderr = run_in_session(
        [str(impl.python), str(script), "worker", *argv], _child_env(), timeout,
        "psij-bench-cwd-")
    result = _last_result_line(stdout)
    if result is None:
        how = f"killed after {timeout:.0f} s" if returncode is None \
            else f"exited with {returncode}"
        raise RuntimeError(f"no result ({how})\n" + _tail(stdout + stderr))
    return result


def alternate(title: str, impls: Sequence[Implementation], rounds: int,
              argv_for: Callable[[Implementation], List[str]], timeout: float,
              describe: Callable[[Dict[str, Any]], str],
              after_round: Optional[Callable[[Dict[str, Any]], None]] = None
              ) -> Dict[str, Series]:
    """Run one measurement ``rounds`` times per implementation, alternating between them (the
    order flips every round, so that neither always runs first)."""
    log(f"== {title} ({rounds} round(s), alternating)")
    series = {impl.label: Series() for impl in impls}
    for round_no in range(1, rounds + 1):
        for impl in (impls if round_no % 2 else list(reversed(impls))):
            start = time.monotonic()
            try:
                result = run_child(impl, argv_for(impl), timeout)
            except (OSError, RuntimeError) as exc:
                series[impl.label].errors.append(str(exc))
                log(f"   round {round_no} {impl.label:4}: FAILED: {exc}")
                continue
            series[impl.label].results.append(result)
            log(f"   round {round_no} {impl.label:4}: {describe(result)}  "
                f"({time.monotonic() - start:.1f} s)")
            if after_round is not None:
                after_round(result)
    return series


@dataclass
class Row:
    """One line of the summary: a figure for ours and the reference."""

    figure: str
    unit: str
    ours: Optional[float]
    ref: Optional[float]
    higher_is_better: bool
    note: str = ""


def _fmt(value: Optional[float], unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.2f} s"
    if unit in ("ms", "ms wall"):
        return f"{value:.2f} ms"
    if unit == "jobs/s":
        return f"{value:.1f} jobs/s"
    return f"{value:g}"


def _ratio(row: Row) -> str:
    if row.ours is None or row.ref is None or row.ours <= 0 or row.ref <= 0:
        return "no comparison"
    factor = row.ours / row.ref if row.higher_is_better else row.ref / row.ours
    if round(factor, 1) == 1.0:
        return "same" if row.unit == "commands" else "about the same"
    better, worse = {"jobs/s": ("higher", "lower"), "commands": ("fewer", "more"),
                     "ms": ("less CPU", "more CPU"),
                     "ms wall": ("faster", "slower")}.get(row.unit, ("faster", "slower"))
    return f"{factor:.1f}x {better}" if factor >= 1 else f"{1 / factor:.1f}x {worse}"


def status_rows(quick: bool, impls: Sequence[Implementation], errors: List[str]) -> List[Row]:
    n_jobs = 200 if quick else 1000
    intervals = 4 if quick else 10
    common = ["--jobs", str(n_jobs), "--interval", "1", "--intervals", str(intervals)]
    timeout = 300.0 + intervals

    def describe(r: Dict[str, Any]) -> str:
        if not r["polls"]:
            return f"no status command in {r['window_s']:g} s; job states {r['states']}"
        ids = ", ".join("all of the user's" if n < 0 else str(n) for n in r["ids_per_command"])
        period = "" if r["poll_period_s"] is None else \
            f", a poll every {r['poll_period_s']:.2f} s"
        return (f"{r['per_interval']:.2f} status commands per poll interval, at most "
                f"{r['max_per_interval']} ({r['status_commands']} commands in {r['polls']} "
                f"polls over {r['window_s']:g} s at interval {r['interval_s']:g} s{period}; "
                f"jobs asked for per command: {ids}; job states {r['states']})")

    ours = [i for i in impls if i.label == OURS]
    bt = alternate(f"status commands per poll interval, {n_jobs} tracked jobs, batch-test "
                   "(ours; counted in the executor's command runner)", ours, 1,
                   lambda impl: ["status-batch-test", *common], timeout, describe)
    fake = alternate(f"status commands per poll interval, {n_jobs} tracked jobs, slurm executor "
                     "with fake sbatch/squeue on PATH (squeue counts its calls)", impls, 1,
                     lambda impl: ["status-slurm-fake", *common], timeout, describe)
    log()
    rows = []
    for name, series in (("status cmds/interval, batch-test", bt),
                         ("status cmds/interval, slurm (fake squeue)", fake)):
        values: Dict[str, Optional[float]] = {}
        for label, s in series.items():
            errors.extend(f"{name} {label}: {e}" for e in s.errors)
            values[label] = s.results[0]["max_per_interval"] if s.results else None
        rows.append(Row(f"{name}, {n_jobs} jobs", "commands", values.get(OURS),
                        values.get(REF), False, note="most in one poll"))
    return rows


# -- Slurm ------------------------------------------------------------------------------------


def slurm_up() -> bool:
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "is UP" in ping.stdout


class SlurmSession:
    """A usable Slurm for the duration of a ``with``, or the reason there is none.

    Holds the shared scheduler lock throughout, as a test run does, so that no test run stops
    Slurm under the benchmark. Starts Slurm only when it is not running and this is root, and
    then stops it afterwards, unless another run holds the lock by then.
    """

    def __init__(self) -> None:
        self.skipped: Optional[str] = None
        self.started = False
        self._lock_fd: Optional[int] = None

    def __enter__(self) -> "SlurmSession":
        self._lock_fd = os.open(SCHEDULERS_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
        if slurm_up():
            log("Slurm is running already; it will be left running.")
            return self
        if os.geteuid() != 0:
            self.skipped = ("Slurm is not running, and it can only be started as root "
                            "(tests/setup/start-slurm.sh)")
            return self
        log("Starting Slurm with tests/setup/start-slurm.sh ...")
        self.started = True
        try:
            done = subprocess.run(["bash", str(SETUP / "start-slurm.sh")], capture_output=True,
                                  text=True, timeout=START_SLURM_LIMIT_S)
            said = done.stdout + done.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = str(exc)
        if not slurm_up():
            self.skipped = "start-slurm.sh did not give a running Slurm:\n" + _tail(said, 8)
        else:
            log(_tail(said, 1).strip(" |"))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._lock_fd is not None
        try:
            if not self.started:
                return
            # Converting to exclusive drops the shared hold first; a test run still holding
            # it keeps us from getting the lock, and Slurm then stays up for that run.
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log("Slurm left running: another run on this machine is using it.")
                return
            done = subprocess.run(["bash", str(SETUP / "stop-slurm.sh")], capture_output=True,
                                  text=True, timeout=120)
            log("Stopped Slurm (started for this benchmark)." if done.returncode == 0 else
                "stop-slurm.sh failed:\n" + _tail(done.stdout + done.stderr, 8))
        finally:
            os.close(self._lock_fd)


def wait_drained(native_ids: Sequence[str]) -> None:
    """Wait until none of these jobs is pending or running, so rounds do not overlap."""
    if not native_ids:
        return
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while time.monotonic() < deadline:
        listed = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(native_ids)],
                                capture_output=True, text=True, timeout=60)
        if not listed.stdout.strip():
            return
        time.sleep(1)
    log(f"   (some jobs still queued after {DRAIN_LIMIT_S:.0f} s; going on)")


class WorkDirs:
    """One fresh work directory per Slurm round, removed once that round's jobs are gone."""

    def __init__(self) -> None:
        self.dirs: List[Path] = []

    def new(self) -> Path:
        path = Path(tempfile.mkdtemp(prefix="psij-bench-slurm-"))
        self.dirs.append(path)
        return path

    def remove_all(self) -> None:
        for path in self.dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.dirs = []


def slurm_rows(quick: bool, impls: Sequence[Implementation], errors: List[str],
               submit_only: bool = False) -> List[Row]:
    dirs = WorkDirs()
    rows: List[Row] = []
    try:
        rows.extend(_throughput_rows(quick, impls, errors, dirs))
        for label, interval in (() if submit_only else
                                (("default polling", None), ("1 s polling", 1.0))):
            rows.append(_end_to_seen_row(quick, impls, errors, dirs, label, interval))
    finally:
        dirs.remove_all()
    return rows


def _cancel_and_drain(native_ids: Sequence[str]) -> None:
    if native_ids:
        subprocess.run(["scancel", *native_ids], capture_output=True, timeout=120)
    wait_drained(native_ids)


def _throughput_series(quick: bool, impls: Sequence[Implementation], errors: List[str],
                       dirs: WorkDirs, defer: bool
                       ) -> Tuple[Dict[str, Optional[float]], Dict[str, Optional[float]],
                                  Dict[str, Optional[float]]]:
    """Rates (pooled), typical ms per submit (median of round medians) and own CPU per submit
    of single submissions, per implementation."""
    n_jobs = 20 if quick else 100
    how = ("deferred an hour (--begin; nothing runs while they are submitted, as on a cluster "
           "whose jobs run on other machines; cancelled after each round)" if defer else
           "starting at once on this machine, the cluster's only node")
    series = alternate(
        f"Slurm submit throughput, {n_jobs} x /bin/true with a 1-minute limit, {how}; submit "
        "calls only", impls, 1 if quick else 5,
        lambda impl: ["slurm-submit", "--jobs", str(n_jobs), "--work", str(dirs.new()),
                      *(["--defer"] if defer else []),
                      *(["--sbatch-only"] if impl.label == SBATCH_ONLY else [])],
        600.0,
        lambda r: (f"{r['jobs_per_s']:.1f} jobs/s ({r['jobs']} submits in {r['submit_s']:.2f} s,"
                   f" median {r['median_submit_ms']:.1f} ms per submit, "
                   f"{r['cpu_ms_per_submit']:.2f} ms own CPU per submit"
                   f"{', via ' + r['via'] if 'via' in r else ''})"),
        after_round=lambda r: (_cancel_and_drain if defer else wait_drained)(r["native_ids"]))
    values: Dict[str, Optional[float]] = {}
    cpu: Dict[str, Optional[float]] = {}
    typical: Dict[str, Optional[float]] = {}
    for label, s in series.items():
        errors.extend(f"slurm submit {label}: {e}" for e in s.errors)
        # The median of the rounds' medians: a burst of load from elsewhere on the machine
        # during one round moves it less than the pooled rate.
        typical[label] = (statistics.median(r["median_submit_ms"] for r in s.results)
                          if s.results else None)
        # Pooled: all jobs over all submit time of every round.
        values[label] = (sum(r["jobs"] for r in s.results) / sum(r["submit_s"] for r in s.results)
                         if s.results else None)
        cpu[label] = (statistics.median(r["cpu_ms_per_submit"] for r in s.results)
                      if s.results else None)
    log()
    return values, typical, cpu


def _throughput_rows(quick: bool, impls: Sequence[Implementation], errors: List[str],
                     dirs: WorkDirs) -> List[Row]:
    n_jobs = 20 if quick else 100
    rows: List[Row] = []
    ref_rate: Optional[float] = None
    # Ours once more with every job through sbatch (rest_submit=False): what the slurmrestd
    # child adds, and the figure on sites without slurmrestd.
    with_sbatch = list(impls) + [Implementation(SBATCH_ONLY, i.python, i.version)
                                 for i in impls if i.label == OURS]
    for defer, label in ((False, "jobs start at once"), (True, "jobs deferred")):
        values, typical, cpu = _throughput_series(quick, with_sbatch, errors, dirs, defer)
        rows += [Row(f"Slurm submit throughput, {n_jobs} jobs, {label}", "jobs/s",
                     values.get(OURS), values.get(REF), True),
                 Row(f"Slurm submit through sbatch only (rest_submit=False), {label}",
                     "jobs/s", values.get(SBATCH_ONLY), values.get(REF), True),
                 Row(f"Slurm submit, typical time per submit, {label}", "ms wall",
                     typical.get(OURS), typical.get(REF), False, note="median of round medians"),
                 Row(f"Slurm submit, own CPU per submit, {label}", "ms", cpu.get(OURS),
                     cpu.get(REF), False)]
        if not defer:
            ref_rate = values.get(REF)
    rows.append(_submit_many_row(quick, [i for i in impls if i.label == OURS], errors, dirs,
                                 ref_rate))
    return rows


def _submit_many_row(quick: bool, ours: Sequence[Implementation], errors: List[str],
                     dirs: WorkDirs, ref_one_by_one: Optional[float]) -> Row:
    n_jobs = 100 if quick else 500
    series = alternate(
        f"Slurm submit_many throughput (ours; one job array), {n_jobs} x /bin/true with a "
        "1-minute limit and their own argument and environment", ours, 1 if quick else 3,
        lambda impl: ["slurm-submit-many", "--jobs", str(n_jobs), "--work", str(dirs.new())],
        600.0,
        lambda r: (f"{r['jobs_per_s']:.0f} jobs/s ({r['jobs']} jobs in {r['submit_s']:.3f} s, "
                   f"{r['arrays']} array(s), {r['cpu_ms_per_submit']:.3f} ms own CPU per job)"),
        after_round=lambda r: wait_drained(r["native_ids"]))
    results = [r for s in series.values() for r in s.results]
    errors.extend(f"slurm submit_many: {e}" for s in series.values() for e in s.errors)
    ours_rate = (sum(r["jobs"] for r in results) / sum(r["submit_s"] for r in results)
                 if results else None)
    log()
    return Row(f"Slurm submit_many (ours) vs one by one (ref), {n_jobs} jobs", "jobs/s",
               ours_rate, ref_one_by_one, True, note="arrays vs loop")


def _end_to_seen_row(quick: bool, impls: Sequence[Implementation], errors: List[str],
                     dirs: WorkDirs, label: str, interval: Optional[float]) -> Row:
    n_jobs = 3 if quick else 5
    # Rounds with 1 s polling take seconds: more of them steady the median.
    rounds = 1 if quick else (2 if interval is None else 4)
    spread = interval if interval is not None else DEFAULT_POLLING_INTERVAL_S

    def argv(impl: Implementation) -> List[str]:
        args = ["slurm-end-to-seen", "--jobs", str(n_jobs), "--spread", str(spread),
                "--work", str(dirs.new())]
        if interval is not None:
            args += ["--interval", str(interval), "--initial-delay", "1"]
        return args

    def describe(r: Dict[str, Any]) -> str:
        samples = ", ".join(f"{s:.2f}" for s in r["samples_s"])
        note = f"; NOT COMPLETED: {r['not_completed']} {r['problems']}" \
            if r["not_completed"] else ""
        return (f"median {statistics.median(r['samples_s']):.2f} s" if r["samples_s"]
                else "no sample") + (f" (polling every {r['interval_s']:g} s, first after "
                                     f"{r['initial_delay_s']:g} s; samples {samples}){note}")

    series = alternate(
        f"Slurm job end -> COMPLETED seen by the callback, {label} ({n_jobs} jobs per round, "
        f"ends spread over {spread:g} s)", impls, rounds, argv, 600.0, describe,
        after_round=lambda r: wait_drained(r["native_ids"]))
    values: Dict[str, Optional[float]] = {}
    for name, s in series.items():
        errors.extend(f"slurm end-to-seen {label} {name}: {e}" for e in s.errors)
        samples = [x for r in s.results for x in r["samples_s"]]
        values[name] = statistics.median(samples) if samples else None
        missing = sum(r["not_completed"] for r in s.results)
        if missing:
            errors.append(f"slurm end-to-seen {label} {name}: {missing} job(s) not seen "
                          "COMPLETED")
    log()
    return Row(f"Slurm end -> COMPLETED seen, {label}", "s", values.get(OURS),
               values.get(REF), False, note=f"median of {n_jobs * rounds}")


# -- summary ----------------------------------------------------------------------------------


def print_summary(rows: Sequence[Row]) -> None:
    table = [("figure", "ours", "ref", "ours vs ref")]
    for row in rows:
        table.append((row.figure + (f" ({row.note})" if row.note else ""),
                      _fmt(row.ours, row.unit), _fmt(row.ref, row.unit), _ratio(row)))
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    log("== Summary (batch)")
    for n, line in enumerate(table):
        log("   " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
        if n == 0:
            log("   " + "  ".join("-" * w for w in widths))
    log()
    log("== Targets (informational)")
    goals = (("Slurm submit throughput", 1.5, "single-job submit rate at least 1.5x psij-python's"),
             ("Slurm submit, typical", 1.5, "single-job submit time at most psij-python's / 1.5"),
             ("Slurm submit_many", 10.0, "submit_many rate at least 10x psij-python's one by one"))
    for row in rows:
        for prefix, factor, text in goals:
            if row.figure.startswith(prefix):
                ratio_value = None if not row.ours or not row.ref else \
                    (row.ours / row.ref if row.higher_is_better else row.ref / row.ours)
                met = None if ratio_value is None else ratio_value >= factor
                verdict = {True: "PASS", False: "FAIL", None: "N/A "}[met]
                ratio = "" if ratio_value is None else f" ({ratio_value:.1f}x)"
                which = row.figure.rsplit(", ", 1)[-1] if "jobs " in row.figure else ""
                log(f"   {verdict}  {text}{ratio}" + (f" [{which}]" if which else ""))
    for row in rows:
        if row.figure.startswith("status cmds/interval, batch-test"):
            met = None if row.ours is None else row.ours == 1.0
            verdict = {True: "PASS", False: "FAIL", None: "N/A "}[met]
            log(f"   {verdict}  one status command per poll interval for all tracked jobs "
                f"(ours: at most {_fmt(row.ours, row.unit)} per poll)")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--no-slurm", action="store_true", help="skip the real-Slurm figures")
    parser.add_argument("--submit-only", action="store_true",
                        help="only the Slurm submit figures (single submissions, submit_many)")
    args = parser.parse_args(argv)

    if not OURS_PYTHON.exists():
        log(f"{OURS_PYTHON} is missing: run `make .venv/.installed` first.")
        return 1
    # Our tree is installed editable: its bytecode is written here, as pip writes that of an
    # installed package (psij-python's), so that no worker of either compiles modules on start
    # (with PYTHONDONTWRITEBYTECODE set, ours would in every worker: ~5 ms of a first submit).
    subprocess.run([str(OURS_PYTHON), "-m", "compileall", "-q", str(REPO / "src")],
                   check=False, stdout=subprocess.DEVNULL)
    ours = Implementation(OURS, OURS_PYTHON)
    problem = probe_version(ours)
    if problem:
        log(f"FAILED: {problem}")
        return 1
    impls = [ours]
    problem = ensure_reference_venv()
    if problem is None:
        ref = Implementation(REF, REFERENCE_PYTHON)
        problem = probe_version(ref)
        if problem is None:
            impls.append(ref)
    if problem:
        log(f"Reference unavailable, measuring ours only. FAILED: {problem}")

    log(f"Batch benchmarks. Machine: {os.cpu_count()} CPU(s), load average "
        f"{os.getloadavg()[0]:.1f}, {'quick' if args.quick else 'full'} run")
    for impl in impls:
        log(f"  {impl.label:4} psij {impl.version}")
    log()

    errors: List[str] = []
    rows = [] if args.submit_only else status_rows(args.quick, impls, errors)
    if args.no_slurm:
        log("== Slurm figures skipped: --no-slurm")
        log()
    else:
        with SlurmSession() as session:
            if session.skipped is not None:
                log(f"== Slurm figures skipped: {session.skipped}")
                log()
            else:
                rows.extend(slurm_rows(args.quick, impls, errors, args.submit_only))
    print_summary(rows)
    if errors or len(impls) < 2:
        log()
        log("Measurements that failed:")
        for error in errors or ["reference setup"]:
            log("   " + error.splitlines()[0])
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
