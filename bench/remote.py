"""Remote executors benchmark: what a submission over SSH (``JobExecutor.get_instance(name,
url="ssh://...")``) costs beside the same submission made on the remote host itself.

The remote host is this machine reached through a real OpenSSH login: the test sshd of
``tests/setup/start-sshd.sh`` (127.0.0.1) and a local user made for the run with a key of its
own, removed at the end (``tests/support/ssh_server.py``). The remote side runs this checkout's
psij as that user.

Figures:

- connect: ``get_instance("local", url=...)`` until the executor is connected (ssh, login, the
  remote ``psij remote serve`` started and its hello read), median of ``--connects``;
- one ``ssh HOST psij status --all`` (a new ssh process and a new remote psij each time)
  against one request (``ping``) on the open connection, medians;
- ``local``, one by one: ``--jobs`` ``/bin/true`` jobs submitted one at a time over SSH, against
  the same submitted directly through the ``local`` executor on the remote side (a Python run
  there, as that user, started over ssh); ms per submit (median and mean), the overhead of the
  connection per submit (the difference of the means), and the time from the first submit until
  all jobs are final. Goal: an overhead under 5 ms per submit once connected;
- ``submit_many`` of ``--jobs`` over SSH, and the time until all of them are final;
- ``slurm``, one by one: ``--slurm-jobs`` jobs on the real Slurm over SSH against directly on
  the remote side, ms per submit (the jobs are cancelled once submitted).

Every side first submits one job that is not timed (the remote executor is made then).

Usage: ``python bench/remote.py [--quick] [--jobs N] [--slurm-jobs N] [--no-slurm] [--json]``
(``make bench-remote``). Without root or without the test sshd the benchmark says why and exits
0; the Slurm figures need a running Slurm (never started here) and are skipped with the reason
without it. The shared scheduler lock is held, as a test run holds it, while the run uses the
sshd and Slurm. Missed goals never fail the run; exit status 1 means a measurement could not be
taken.
"""

import argparse
import fcntl
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from _help import description

from psij import Job, JobExecutor, JobSpec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test sshd's helpers (support.ssh_server)

from support.ssh_server import (  # noqa: E402
    SshUser,
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    remote_python,
    sshd_reason,
)

SCHEDULERS_LOCK = Path(os.environ.get("SCHEDULERS_LOCK", "/tmp/psij-test-schedulers.lock"))
OVERHEAD_GOAL_MS = 5.0
WAIT_LIMIT_S = 300.0
PINGS = 100

# Run by the user's remote python (its text on standard input): the same submissions made
# directly on the remote side; prints one JSON line.
DIRECT = r"""
import json, sys, time
from psij import Job, JobExecutor, JobSpec
name, n = sys.argv[1], int(sys.argv[2])
ex = JobExecutor.get_instance(name)
warm = Job(JobSpec("/bin/true"))
ex.submit(warm)
if name == "local":
    warm.wait()
jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
times = []
t0 = time.perf_counter()
for job in jobs:
    t = time.perf_counter()
    ex.submit(job)
    times.append(time.perf_counter() - t)
final = None
if name == "local":
    for job in jobs:
        job.wait()
    final = time.perf_counter() - t0
    bad = sum(1 for job in jobs if job.status.state.name != "COMPLETED")
else:
    for job in [warm, *jobs]:
        ex.cancel(job)
    bad = 0
ex.close()
print(json.dumps({"submit_s": times, "final_s": final, "not_completed": bad}))
"""


def log(text: str = "") -> None:
    print(text, flush=True)


def ms(seconds: Sequence[float]) -> Tuple[float, float]:
    """(median, mean) of ``seconds`` in ms."""
    return statistics.median(seconds) * 1e3, statistics.fmean(seconds) * 1e3


def slurm_problem() -> Optional[str]:
    """Why the Slurm figures cannot be taken (None when they can)."""
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"scontrol ping: {exc} (tests/setup/start-slurm.sh starts Slurm)"
    if "is UP" not in ping.stdout:
        return "Slurm is not running (tests/setup/start-slurm.sh starts it)"
    return None


def direct(user: SshUser, name: str, n: int) -> Dict[str, Any]:
    """The submissions made on the remote side by the user's own python, started over ssh."""
    argv = user.ssh_argv(shlex.join([remote_python(), "-", name, str(n)]))
    done = subprocess.run(argv, input=DIRECT, capture_output=True, text=True,
                          timeout=WAIT_LIMIT_S + 60)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the remote run of {name} ended with {done.returncode}: "
                           f"{done.stderr.strip()[-600:]}")
    result: Dict[str, Any] = json.loads(lines[-1])
    return result


def wait_all(jobs: List[Job]) -> int:
    """Wait for every job; the number that did not complete."""
    end = time.monotonic() + WAIT_LIMIT_S
    for job in jobs:
        job.wait(timeout=max(0.0, end - time.monotonic()))
    return sum(1 for job in jobs if job.status.state.name != "COMPLETED")


def one_by_one(ex: JobExecutor, n: int, wait: bool) -> Dict[str, Any]:
    """``n`` jobs submitted one at a time (and waited for when ``wait``)."""
    warm = Job(JobSpec("/bin/true"))
    ex.submit(warm)
    if wait:
        wait_all([warm])
    jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
    times = []
    t0 = time.perf_counter()
    for job in jobs:
        t = time.perf_counter()
        ex.submit(job)
        times.append(time.perf_counter() - t)
    result: Dict[str, Any] = {"submit_s": times, "final_s": None, "not_completed": 0}
    if wait:
        result["not_completed"] = wait_all(jobs)
        result["final_s"] = time.perf_counter() - t0
    else:
        for job in [warm, *jobs]:
            ex.cancel(job)
    return result


def many(ex: JobExecutor, n: int) -> Dict[str, Any]:
    jobs = [Job(JobSpec("/bin/true")) for _ in range(n)]
    t0 = time.perf_counter()
    ex.submit_many(jobs)
    submitted = time.perf_counter() - t0
    bad = wait_all(jobs)
    return {"submit_many_s": submitted, "final_s": time.perf_counter() - t0, "not_completed": bad}


def measure(args: argparse.Namespace, user: SshUser, rows: List[Tuple[str, Optional[float],
                                                                      str]],
            errors: List[str]) -> Dict[str, Optional[float]]:
    url = f"ssh://{user.alias}?ssh_config={user.config}&psij={remote_psij_command()}"
    figures: Dict[str, Optional[float]] = {}

    log(f"== connect: get_instance('local', url=...) x {args.connects}")
    connects = []
    for _ in range(args.connects):
        t0 = time.perf_counter()
        ex = JobExecutor.get_instance("local", url=url)
        connects.append(time.perf_counter() - t0)
        ex.close()
    figures["connect_ms"] = statistics.median(connects) * 1e3
    log(f"   {', '.join(f'{c * 1e3:.0f}' for c in connects)} ms")

    log(f"== one 'ssh HOST psij status --all' x {args.connects} against one request on the "
        f"open connection x {PINGS}")
    trips = []
    for _ in range(args.connects):
        t0 = time.perf_counter()
        done = user.run(shlex.join([remote_psij_command(), "status", "--all"]))
        trips.append(time.perf_counter() - t0)
        if done.returncode != 0:
            errors.append(f"ssh HOST psij status --all: {done.returncode} "
                          f"{done.stderr.strip()[-300:]}")
    figures["ssh_status_ms"] = statistics.median(trips) * 1e3

    ex = JobExecutor.get_instance("local", url=url)
    try:
        pings = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            ex.connection.call("ping", {})
            pings.append(time.perf_counter() - t0)
        figures["request_ms"] = statistics.median(pings) * 1e3
        log(f"   ssh round trip {figures['ssh_status_ms']:.0f} ms, request "
            f"{figures['request_ms']:.2f} ms")
        log(f"   (remote psij {ex.connection.hello.get('version')}, "
            f"python {ex.connection.hello.get('python')})")

        log(f"== local: {args.jobs} jobs submitted one by one, over SSH and directly on the "
            f"remote side")
        over = one_by_one(ex, args.jobs, wait=True)
        there = direct(user, "local", args.jobs)
        for label, result in (("over SSH", over), ("direct", there)):
            med, mean = ms(result["submit_s"])
            log(f"   {label:9} {med:.2f} ms median, {mean:.2f} ms mean per submit; all final "
                f"after {result['final_s']:.2f} s ({result['not_completed']} not completed)")
            if result["not_completed"]:
                errors.append(f"local {label}: {result['not_completed']} jobs not completed")
        figures["ssh_submit_ms"], figures["ssh_submit_mean_ms"] = ms(over["submit_s"])
        figures["direct_submit_ms"], figures["direct_submit_mean_ms"] = ms(there["submit_s"])
        figures["overhead_ms"] = figures["ssh_submit_mean_ms"] - figures["direct_submit_mean_ms"]
        figures["ssh_final_s"] = over["final_s"]
        figures["direct_final_s"] = there["final_s"]

        log(f"== submit_many of {args.jobs} over SSH")
        batch = many(ex, args.jobs)
        log(f"   {batch['submit_many_s'] * 1e3:.0f} ms, all final after {batch['final_s']:.2f} "
            f"s ({batch['not_completed']} not completed)")
        if batch["not_completed"]:
            errors.append(f"submit_many: {batch['not_completed']} jobs not completed")
        figures["submit_many_ms"] = batch["submit_many_s"] * 1e3
        figures["submit_many_final_s"] = batch["final_s"]
    finally:
        ex.close()

    problem = "--no-slurm" if args.no_slurm else slurm_problem()
    if problem is not None:
        log(f"== Slurm figures skipped: {problem}")
    else:
        log(f"== slurm: {args.slurm_jobs} jobs submitted one by one, over SSH and directly on "
            f"the remote side (cancelled after)")
        slurm = JobExecutor.get_instance("slurm", url=url)
        try:
            over = one_by_one(slurm, args.slurm_jobs, wait=False)
        finally:
            slurm.close()
        there = direct(user, "slurm", args.slurm_jobs)
        figures["slurm_ssh_submit_ms"], _ = ms(over["submit_s"])
        figures["slurm_direct_submit_ms"], _ = ms(there["submit_s"])
        figures["slurm_overhead_ms"] = (statistics.fmean(over["submit_s"])
                                        - statistics.fmean(there["submit_s"])) * 1e3
        log(f"   over SSH {figures['slurm_ssh_submit_ms']:.1f} ms, direct "
            f"{figures['slurm_direct_submit_ms']:.1f} ms per submit (medians)")
    log()

    n, s = args.jobs, args.slurm_jobs
    rows += [
        ("connect (get_instance with url)", figures["connect_ms"], "ms"),
        ("one 'ssh HOST psij status --all'", figures["ssh_status_ms"], "ms"),
        ("one request on the open connection", figures["request_ms"], "ms"),
        (f"local submit over SSH ({n} one by one)", figures["ssh_submit_ms"], "ms"),
        (f"local submit direct ({n} one by one)", figures["direct_submit_ms"], "ms"),
        ("overhead per submit (difference of means)", figures["overhead_ms"], "ms"),
        (f"{n} over SSH: all final after", figures["ssh_final_s"], "s"),
        (f"{n} direct: all final after", figures["direct_final_s"], "s"),
        (f"submit_many of {n} over SSH", figures["submit_many_ms"], "ms"),
        (f"submit_many of {n}: all final after", figures["submit_many_final_s"], "s"),
        (f"slurm submit over SSH ({s} one by one)", figures.get("slurm_ssh_submit_ms"), "ms"),
        (f"slurm submit direct ({s} one by one)", figures.get("slurm_direct_submit_ms"), "ms"),
        ("slurm overhead per submit", figures.get("slurm_overhead_ms"), "ms"),
    ]
    return figures


def print_summary(rows: List[Tuple[str, Optional[float], str]],
                  figures: Dict[str, Optional[float]]) -> None:
    log("== Summary (medians; the overheads are differences of means)")
    table = [("figure", "value")] + [
        (name, "-" if value is None else (f"{value:.2f} {unit}" if unit == "ms"
                                          else f"{value:.2f} s")) for name, value, unit in rows]
    width = max(len(name) for name, _ in table)
    for i, (name, value) in enumerate(table):
        log(f"   {name.ljust(width)}  {value}")
        if i == 0:
            log(f"   {'-' * width}  {'-' * 12}")
    log()
    log("== Goals (informational)")
    overhead = figures.get("overhead_ms")
    verdict = "N/A " if overhead is None else ("PASS" if overhead < OVERHEAD_GOAL_MS else "FAIL")
    log(f"   {verdict}  the connection adds under {OVERHEAD_GOAL_MS:g} ms per submit once "
        f"connected" + ("" if overhead is None else f"  ({overhead:.2f} ms)"))


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--quick", action="store_true",
                        help="20 local jobs, 5 Slurm jobs, 2 connections, for a smoke run")
    parser.add_argument("--jobs", type=int, help="local jobs per figure (default 100)")
    parser.add_argument("--slurm-jobs", type=int, help="Slurm jobs per side (default 20)")
    parser.add_argument("--connects", type=int, help="connections timed (default 5)")
    parser.add_argument("--no-slurm", action="store_true", help="skip the real-Slurm figures")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object on the last line too")
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (20 if args.quick else 100)
    args.slurm_jobs = args.slurm_jobs or (5 if args.quick else 20)
    args.connects = args.connects or (2 if args.quick else 5)
    for option in ("jobs", "slurm_jobs", "connects"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')}: expected a whole number of at least 1")

    reason = sshd_reason() or remote_psij_reason()
    if reason is not None:
        log(f"Remote executors benchmark: not run here: {reason}")
        log("NOTE: no figure taken (the benchmark needs root and the test sshd)")
        if args.json:
            print(json.dumps({"skipped": reason}))
        return 0
    log(f"Remote executors benchmark. Machine: {os.cpu_count()} CPU(s), load average "
        f"{os.getloadavg()[0]:.1f} (wall times are only comparable on an idle machine), "
        f"{'quick' if args.quick else 'full'} run")
    log()
    lock = os.open(SCHEDULERS_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    rows: List[Tuple[str, Optional[float], str]] = []
    errors: List[str] = []
    figures: Dict[str, Optional[float]] = {}
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        user = make_ssh_user("psijbench")
        try:
            figures = measure(args, user, rows, errors)
        except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            user.remove()
    finally:
        os.close(lock)
    if rows:
        print_summary(rows, figures)
    if args.json:
        print(json.dumps(figures))
    if errors:
        log()
        log("Measurements that failed:")
        for error in errors:
            log("   " + error.splitlines()[0])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
