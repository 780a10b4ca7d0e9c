"""Benchmark driver: this package against psij-python 0.9.11, workload by workload.

Both packages are imported as ``psij``, so each measurement runs ``bench/workloads.py`` in a
child interpreter of the matching venv: the project's ``.venv`` (editable install) for this
package, and a side venv with psij-python from PyPI, created once under ``.bench-venvs/``.
Rounds alternate between the two so that drift in machine load falls on both alike.

The driver prints figures and compares them with the performance targets; it never fails
because a target is missed (exit status 1 means a measurement itself could not be taken).
It must not measure anything in its own process.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from _help import description, run_in_session

REPO = Path(__file__).resolve().parent.parent
WORKLOADS_SCRIPT = REPO / "bench" / "workloads.py"
OURS_PYTHON = REPO / ".venv" / "bin" / "python"
REFERENCE_REQUIREMENT = "psij-python==0.9.11"
REFERENCE_VENV = REPO / ".bench-venvs" / "psij-python-0.9.11"
REFERENCE_PYTHON = REFERENCE_VENV / "bin" / "python"
PIP_INSTALL_LIMIT_S = 600.0

OURS = "ours"
REF = "ref"


@dataclass
class Implementation:
    """One side of the comparison: a label and the interpreter that imports its ``psij``."""

    label: str
    python: Path
    version: str = "?"


@dataclass
class Figure:
    """One reported number: how to reduce every round's JSON result of one side to it."""

    name: str
    unit: str
    higher_is_better: bool
    reduce: Callable[[List[Dict[str, Any]]], float]
    # False for a figure shown for context only (a bare interpreter's start), whose ratio
    # between the two sides says nothing about either package.
    compared: bool = True


@dataclass
class Workload:
    """How to run one workload; its first figure is the headline the targets judge."""

    name: str
    title: str
    rounds: int
    args: List[str]
    timeout_s: float
    figures: List[Figure]
    # Formats one round's JSON result as a short progress note.
    describe: Callable[[Dict[str, Any]], str]


@dataclass
class Outcome:
    """All rounds of one workload for one implementation, and what went wrong, if anything."""

    results: List[Dict[str, Any]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    def value(self, figure: Figure) -> Optional[float]:
        return figure.reduce(self.results) if self.results else None


def _pooled_difference_ms(kind: str) -> Callable[[List[Dict[str, Any]]], float]:
    """Median import sample minus median baseline sample, over all rounds."""
    def reduce(results: List[Dict[str, Any]]) -> float:
        baseline: List[float] = [s for r in results for s in r[f"baseline{kind}"]]
        imported: List[float] = [s for r in results for s in r[f"import{kind}"]]
        return (statistics.median(imported) - statistics.median(baseline)) * 1e3
    return reduce


def _pooled_median_ms(key: str) -> Callable[[List[Dict[str, Any]]], float]:
    """Median of one kind of sample over all rounds, in milliseconds."""
    def reduce(results: List[Dict[str, Any]]) -> float:
        samples: List[float] = [s for r in results for s in r[key]]
        return statistics.median(samples) * 1e3
    return reduce


def _describe_import(result: Dict[str, Any]) -> str:
    bare_ms = statistics.median(result["baseline_s"]) * 1e3
    total_ms = statistics.median(result["import_s"]) * 1e3
    return (f"bare interpreter {bare_ms:.1f} ms, with import psij {total_ms:.1f} ms, so the "
            f"import costs {result['import_ms']:.1f} ms wall, {result['import_cpu_ms']:.1f} ms "
            f"CPU (medians of {result['runs']} runs)")


def _pooled_latency_ms(results: List[Dict[str, Any]]) -> float:
    samples: List[float] = [s for r in results for s in r["samples_s"]]
    return statistics.median(samples) * 1e3


def _median_of(key: str) -> Callable[[List[Dict[str, Any]]], float]:
    return lambda results: statistics.median(r[key] for r in results)


def build_workloads(quick: bool) -> List[Workload]:
    """The four workloads; ``quick`` shrinks rounds and sizes for a smoke run."""
    return [
        Workload(
            name="import", title="import psij, minus a bare interpreter start",
            # Rounds x runs = samples per implementation: 15 in a full run.
            rounds=2 if quick else 5, args=["--runs", "2" if quick else "3"], timeout_s=300.0,
            # The headline is the cost of the import alone; both raw medians are shown beside it.
            figures=[Figure("import", "ms", False, _pooled_difference_ms("_s")),
                     Figure("import cpu", "ms", False, _pooled_difference_ms("_cpu_s")),
                     Figure("bare interpreter", "ms", False, _pooled_median_ms("baseline_s"),
                            compared=False),
                     Figure("with import psij", "ms", False, _pooled_median_ms("import_s"))],
            describe=_describe_import),
        Workload(
            name="throughput", title="local executor throughput, /bin/true submitted at once",
            rounds=1 if quick else 3, args=["--jobs", "200" if quick else "1000"],
            timeout_s=900.0,
            figures=[Figure("throughput", "jobs/s", True, _median_of("jobs_per_s")),
                     Figure("cpu per job", "ms/job", False, _median_of("cpu_ms_per_job"))],
            describe=lambda r: f"{r['jobs_per_s']:.0f} jobs/s ({r['jobs']} jobs in "
                               f"{r['seconds']:.2f} s, {r['cpu_ms_per_job']:.2f} ms CPU/job)"),
        Workload(
            name="latency", title="single-job latency, submit to COMPLETED",
            # Rounds x jobs = samples per implementation: 30 in a full run.
            rounds=1 if quick else 3, args=["--jobs", "5" if quick else "10"], timeout_s=300.0,
            figures=[Figure("latency", "ms", False, _pooled_latency_ms)],
            describe=lambda r: f"median {r['median_ms']:.2f} ms over {r['jobs']} jobs"),
        Workload(
            name="rss", title="RSS growth per finished job still referenced",
            rounds=1 if quick else 2,
            args=["--batch", "400" if quick else "2000", "--chunk", "200"], timeout_s=1800.0,
            figures=[Figure("rss", "bytes/job", False, _median_of("bytes_per_job"))],
            describe=lambda r: f"{r['bytes_per_job']:.0f} bytes/job "
                               f"(VmRSS {r['rss_before_bytes'] / 2**20:.1f} -> "
                               f"{r['rss_after_bytes'] / 2**20:.1f} MiB, "
                               f"{r['jobs_kept']} jobs kept)"),
    ]


@dataclass
class Target:
    """A performance goal on a workload's headline figure: ``check(ours, ref)`` says if met."""

    workload: str
    text: str
    check: Callable[[float, Optional[float]], Optional[bool]]


def _ratio_at_least(factor: float, higher_is_better: bool
                    ) -> Callable[[float, Optional[float]], Optional[bool]]:
    def check(ours: float, ref: Optional[float]) -> Optional[bool]:
        if ref is None:
            return None
        if higher_is_better:
            return ours >= factor * ref
        return ours * factor <= ref
    return check


IMPORT_BUDGET_MS = 30.0

TARGETS = [
    Target("import", "import at least 3x faster", _ratio_at_least(3.0, higher_is_better=False)),
    Target("import", f"import at most {IMPORT_BUDGET_MS:.0f} ms over a bare interpreter",
           lambda ours, _ref: ours <= IMPORT_BUDGET_MS),
    Target("throughput", "throughput at least 5x the jobs/s",
           _ratio_at_least(5.0, higher_is_better=True)),
    Target("latency", "latency at most 1/4", _ratio_at_least(4.0, higher_is_better=False)),
    Target("rss", "at most 1024 bytes RSS per finished job", lambda ours, _ref: ours <= 1024),
]


def log(text: str = "") -> None:
    print(text, flush=True)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("      | " + line for line in text.strip().splitlines()[-lines:])


def _child_env() -> Dict[str, str]:
    env = dict(os.environ)
    # A search path inherited from the caller would let one venv import the other's psij.
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    return env


def ensure_side_venv(venv: Path, requirement: str, program: Path) -> Optional[str]:
    """Create the side venv ``venv`` with ``requirement`` once (cached: its ``.installed``
    stamp is written last, so a venv whose install was interrupted is rebuilt on the next
    run, as is one without ``program``); return an error text if that fails."""
    stamp = venv / ".installed"
    if stamp.exists() and program.exists():
        return None
    log(f"Creating {venv.relative_to(REPO)} with {requirement} (once; cached) ...")
    # The base interpreter, not this venv's, so the side venv does not chain to .venv.
    base_python = Path(getattr(sys, "_base_executable", sys.executable))
    steps = [
        [str(base_python), "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", requirement],
    ]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=_child_env(),
                                  timeout=PIP_INSTALL_LIMIT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(argv)}: {exc}"
        if done.returncode != 0:
            return (f"{' '.join(argv)} exited with {done.returncode}\n"
                    + _tail(done.stdout + done.stderr))
    stamp.touch()
    return None


def ensure_reference_venv() -> Optional[str]:
    """Create the side venv with psij-python once; return an error text if that fails."""
    return ensure_side_venv(REFERENCE_VENV, REFERENCE_REQUIREMENT, REFERENCE_PYTHON)


def probe_version(impl: Implementation) -> Optional[str]:
    """Fill in the version and check which ``psij`` the interpreter imports."""
    code = "import psij, json; print(json.dumps([psij.__version__, psij.__file__]))"
    try:
        # From an empty directory: '' on sys.path must not offer some other ``psij``.
        with tempfile.TemporaryDirectory(prefix="psij-bench-cwd-") as cwd:
            done = subprocess.run([str(impl.python), "-c", code], capture_output=True,
                                  text=True, env=_child_env(), cwd=cwd, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{impl.python}: {exc}"
    if done.returncode != 0:
        return f"{impl.python} cannot import psij:\n" + _tail(done.stderr)
    version, location = json.loads(done.stdout.strip().splitlines()[-1])
    impl.version = f"{version} ({location})"
    return None


def _last_result_line(stdout: str) -> Optional[Dict[str, Any]]:
    # Anything the package prints itself comes before the result line, or is not JSON.
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"workload"'):
            parsed: Dict[str, Any] = json.loads(line)
            return parsed
    return None


def run_worker(impl: Implementation, workload: Workload) -> Dict[str, Any]:
    """One round of one workload in ``impl``'s interpreter; raises RuntimeError on failure.

    Output goes to files rather than pipes so that a job process still holding the worker's
    stdout cannot keep the driver waiting, and the worker leads its own session so a timeout
    kills it together with whatever it started in that session.
    """
    argv = [str(impl.python), str(WORKLOADS_SCRIPT), workload.name, *workload.args]
    returncode, stdout, stderr = run_in_session(argv, _child_env(), workload.timeout_s,
                                                "psij-bench-cwd-")
    result = _last_result_line(stdout)
    if returncode is None:
        if result is None:
            raise RuntimeError(f"no result after {workload.timeout_s:.0f} s; killed\n"
                               + _tail(stderr))
        result["warning"] = (f"printed its result but had not exited after "
                             f"{workload.timeout_s:.0f} s; killed")
        return result
    if returncode != 0 or result is None:
        raise RuntimeError(f"exited with {returncode} and {'a' if result else 'no'} result "
                           "line\n" + _tail(stdout + stderr))
    if result.get("not_completed"):
        result["warning"] = f"{result['not_completed']} job(s) did not end COMPLETED"
    return result


def run_workload(workload: Workload, impls: Sequence[Implementation]
                 ) -> Dict[str, Outcome]:
    log(f"== {workload.name}: {workload.title} ({workload.rounds} round(s), alternating)")
    outcomes = {impl.label: Outcome() for impl in impls}
    for round_no in range(1, workload.rounds + 1):
        for impl in impls:
            start = time.monotonic()
            try:
                result = run_worker(impl, workload)
            except (OSError, RuntimeError) as exc:
                outcomes[impl.label].errors.append(str(exc))
                log(f"   round {round_no} {impl.label:4}: FAILED: {exc}")
                continue
            outcomes[impl.label].results.append(result)
            note = f"  [{result['warning']}]" if "warning" in result else ""
            log(f"   round {round_no} {impl.label:4}: {workload.describe(result)}"
                f"  ({time.monotonic() - start:.1f} s){note}")
    for figure in workload.figures:
        ours, ref = _values(outcomes, figure)
        log(f"   => {figure.name}: {compare_text(figure, ours, ref)}")
    log()
    return outcomes


def _values(outcomes: Dict[str, Outcome], figure: Figure
            ) -> Tuple[Optional[float], Optional[float]]:
    ref = outcomes.get(REF)
    return outcomes[OURS].value(figure), (ref.value(figure) if ref else None)


def _format_value(value: Optional[float], unit: str) -> str:
    if value is None:
        return "failed"
    if unit.startswith("ms"):
        return f"{value:.2f} {unit}"
    return f"{value:.0f} {unit}"


def ratio_text(figure: Figure, ours: Optional[float], ref: Optional[float]) -> str:
    """'N.Nx <better>' or 'N.Nx <worse>', in words that fit the figure's unit."""
    if not figure.compared:
        return "-"
    if ours is None or ref is None:
        return "no comparison"
    better, worse = {
        "ms": ("faster", "slower"),
        "ms/job": ("less CPU", "more CPU"),
        "jobs/s": ("higher throughput", "lower throughput"),
        "bytes/job": ("less memory", "more memory"),
    }[figure.unit]
    if ours <= 0 or ref <= 0:
        # Memory growth can be zero or negative; a ratio of such numbers means nothing.
        return better if (ours > ref) == figure.higher_is_better else worse
    factor = ours / ref if figure.higher_is_better else ref / ours
    return f"{factor:.1f}x {better}" if factor >= 1 else f"{1 / factor:.1f}x {worse}"


def compare_text(figure: Figure, ours: Optional[float], ref: Optional[float]) -> str:
    text = f"ours {_format_value(ours, figure.unit)}, ref {_format_value(ref, figure.unit)}"
    return f"{text}, {ratio_text(figure, ours, ref)}" if figure.compared else text


def print_summary(workloads: Sequence[Workload], outcomes: Dict[str, Dict[str, Outcome]]
                  ) -> None:
    rows = [("figure", "ours", "ref", "ours vs ref")]
    for workload in workloads:
        for figure in workload.figures:
            ours, ref = _values(outcomes[workload.name], figure)
            rows.append((figure.name, _format_value(ours, figure.unit),
                         _format_value(ref, figure.unit), ratio_text(figure, ours, ref)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    log("== Summary")
    for n, row in enumerate(rows):
        log("   " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if n == 0:
            log("   " + "  ".join("-" * width for width in widths))
    log()
    log("== Targets (informational)")
    by_name = {w.name: w for w in workloads}
    for target in TARGETS:
        if target.workload not in by_name:
            continue
        headline = by_name[target.workload].figures[0]
        ours, ref = _values(outcomes[target.workload], headline)
        met = target.check(ours, ref) if ours is not None else None
        verdict = {True: "PASS", False: "FAIL", None: "N/A "}[met]
        log(f"   {verdict}  {target.text:44}  ({compare_text(headline, ours, ref)})")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    names = [w.name for w in build_workloads(quick=False)]
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds and smaller sizes, for a smoke run")
    parser.add_argument("--only", choices=names, action="append", metavar="NAME",
                        help=f"run only this workload (repeatable; one of {', '.join(names)})")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    workloads = [w for w in build_workloads(args.quick) if not args.only or w.name in args.only]

    ours = Implementation(OURS, OURS_PYTHON)
    impls = [ours]
    if not OURS_PYTHON.exists():
        log(f"{OURS_PYTHON} is missing: run `make .venv/.installed` first.")
        return 1
    problem = probe_version(ours)
    if problem:
        log(f"FAILED: {problem}")
        return 1
    problem = ensure_reference_venv()
    if problem is None:
        ref = Implementation(REF, REFERENCE_PYTHON)
        problem = probe_version(ref)
        if problem is None:
            impls.append(ref)
    if problem:
        log(f"Reference unavailable, measuring ours only. FAILED: {problem}")

    log(f"Machine: {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f} "
        f"(wall times are only comparable on an idle machine; CPU times much less affected), "
        f"Python {sys.version.split()[0]}, {'quick' if args.quick else 'full'} run")
    for impl in impls:
        log(f"  {impl.label:4} psij {impl.version}")
    log()

    outcomes = {w.name: run_workload(w, impls) for w in workloads}
    print_summary(workloads, outcomes)

    failed = [f"{name}/{label}" for name, by_impl in outcomes.items()
              for label, outcome in by_impl.items() if outcome.errors]
    if failed or len(impls) < 2:
        log()
        log("Measurements that failed: " + (", ".join(failed) or "reference setup"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
