"""What dropped executors leave behind: for each kind, ``--count`` executors made, given one
``/bin/true`` job each and dropped without ``close()``, in a child process of their own; then
the threads, open descriptors, child processes and files of that process against what it had
before the first executor, and the seconds from the last drop until only what psij keeps once
per process on purpose is left (goal: under 1 s).

Kinds: the in-process ``pilot``, ``local``, the ``batch-test`` fake scheduler, ``flow`` (a
``psij flow serve`` started for the run), ``remote`` (``local`` behind an ``ssh://`` URL
whose ssh is a stand-in that runs ``psij remote serve`` on this machine), ``served-pilot``
(``pilot`` with the URL of a ``psij pilot serve`` started for the run), and
``futures-local`` and ``futures-pilot`` (a ``psij.futures.FunctionExecutor`` over ``local``
or an in-process ``pilot``, given one call of a function instead of a job). The child is
``tests/support/leak_probe.py``; what it counts as kept on purpose (the registry writer and
its files; the local jobs' keeper, process watch and worker threads) is listed there and in
the architecture guide.

Usage: ``python bench/leaks.py [--count N] [--kinds pilot,local,...] [--wait SECONDS]
[--json]``. Exit status 1 when a kind leaves something behind after ``--wait`` seconds (10 by
default); a missed 1 s goal alone never fails the run.
"""

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from _help import description

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the probe and the flow service's helper

from support.flow_helpers import Service  # noqa: E402
from support.leak_probe import remote_url, run_probe, served_pilot  # noqa: E402

KINDS = ("pilot", "local", "batch-test", "flow", "remote", "served-pilot", "futures-local",
         "futures-pilot")
GOAL_S = 1.0


def _flow_service(folder: Path) -> Service:
    return Service(folder / "state", str(folder / "flow.sock"), [
        'default_intervals={"no_problem": 0, "unknown": 0, "failed_init": 0, '
        '"failed_after_work": 0, "never_claimed": 0, "no_work": 0}',
        "aggregate_problem_interval=0"]).start()


def measure(kind: str, count: int, folder: Path, wait: float) -> Dict[str, Any]:
    service = None
    url, env = None, None
    with contextlib.ExitStack() as stack:
        try:
            if kind == "flow":
                (folder / "flow").mkdir(parents=True)
                service = _flow_service(folder / "flow")
                url = f"unix://{service.socket}"
            elif kind == "remote":
                url, env = remote_url(folder / "ssh")
            elif kind == "served-pilot":
                url = stack.enter_context(served_pilot(folder / "served"))
            began = time.monotonic()
            report = run_probe(kind, count, folder / "probe", url=url, env=env, wait=wait)
            report["wall_seconds"] = round(time.monotonic() - began, 3)
            return report
        finally:
            if service is not None:
                service.destroy_all()
                service.stop()


def _line(report: Dict[str, Any]) -> str:
    start, end = report["start"], report["end"]
    figures = "  ".join(f"{key} {start[key]}->{end[key]}"
                        for key in ("threads", "descriptors", "children", "paths"))
    leaked = sum(len(v) for v in report["leaked"].values())
    kept = sum(len(v) for v in report["shared"].values())
    met = "met" if not leaked and report["seconds"] <= GOAL_S else "MISSED"
    return (f"{report['kind']:<13} {report['count']:>4} executors in {report['run_seconds']:6.2f} s"
            f"  {figures}  kept on purpose {kept}, left {leaked}; back in "
            f"{report['seconds']:.2f} s (one look {report['look_seconds']:.2f} s; goal "
            f"{GOAL_S:g} s: {met})")


def main() -> int:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--wait", type=float, default=10.0,
                        help="seconds the probe waits for what is left to go")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    kinds: List[str] = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or args.count < 1:
        parser.error(f"--kinds: accepted {', '.join(KINDS)}; --count: 1 or more")
    reports = []
    with tempfile.TemporaryDirectory(prefix="psij-bench-leaks-") as tmp:
        for kind in kinds:
            report = measure(kind, args.count, Path(tmp) / kind, args.wait)
            reports.append(report)
            if not args.json:
                print(_line(report), flush=True)
                for key, values in report["leaked"].items():
                    if values:
                        print(f"    left {key}: {values[:5]}{' ...' if len(values) > 5 else ''}")
    if args.json:
        print(json.dumps(reports, indent=1))
    return 1 if any(any(r["leaked"].values()) for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
