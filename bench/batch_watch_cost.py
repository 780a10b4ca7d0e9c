"""What following many batch jobs costs while nothing happens to them: a status poller (the
batch executors' one thread, with the look at the jobs' start and end files and, where the
kernel gives them, file events) follows ``--jobs`` jobs (10,000 by default) whose files do not
change, for ``--seconds`` seconds; the figures are the poller's own counts (directory looks,
listings, status commands) and, where ``strace`` is installed, every system call the process's
threads made meanwhile (the main thread only sleeps), per second.

The jobs are those of a stand-in scheduler that shows them queued forever (no scheduler
command runs); the work directory holds an output file for each and a start file for a third
of them, as a busy work directory would.

Usage: ``python bench/batch_watch_cost.py [--jobs N] [--seconds S]``.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

from _help import description

REPO = Path(__file__).resolve().parent.parent


def child(jobs: int, seconds: float, ready: str) -> None:
    from psij import Job, JobSpec, JobState
    from psij._clock import MonotonicClock
    from psij.executors.batch._poller import StatusPoller, TrackInputs
    from psij.executors.batch._tracking import (
        MissingResolved,
        Observation,
        PollSucceeded,
        Settings,
    )
    from psij.job_status import JobStatus

    work = Path(tempfile.mkdtemp(prefix="psij-watch-cost-"))
    ids = [str(1000000 + i) for i in range(jobs)]
    for i, nid in enumerate(ids):
        (work / f"{nid}.out").write_text("")
        if i % 3 == 0:
            (work / f"{nid}.starts").write_text("1 1.0\n")
    old = time.time() - 60
    os.utime(work, (old, old))
    polls: List[int] = []

    def poll(native_ids: Sequence[str]) -> PollSucceeded:
        polls.append(len(native_ids))
        return PollSucceeded({n: Observation(JobState.QUEUED) for n in native_ids})

    def final(jobs: Sequence[Job], nid: str, obs: Observation, cancel: bool) -> JobStatus:
        return JobStatus(obs.state)

    def set_status(job: Job, status: JobStatus) -> None:
        job._set_status(status)

    poller = StatusPoller(TrackInputs(
        name="cost", poll_status=poll, resolve_missing=lambda ids: MissingResolved({}),
        withdraw=lambda nid: None, final_status=final,
        aux_path=lambda nid, suffix: work / f"{nid}{suffix}",
        job_ended=lambda js, nid: None, set_status=set_status,
        restate=lambda job, status: None, job_files=work), Settings(), MonotonicClock())
    for nid in ids:
        job = Job(JobSpec("/bin/true"))
        job._native_id = nid
        poller.add(job, nid, attach=False)
    time.sleep(3.0)  # the first look lists the directory and reads the start files
    files = poller._files
    assert files is not None
    before = (files.looks, files.listings, len(polls))
    Path(ready).write_text("ready")
    time.sleep(seconds)
    looks, listings, commands = (files.looks - before[0], files.listings - before[1],
                                 len(polls) - before[2])
    print(f"{jobs} jobs followed for {seconds:.0f} s: {looks} directory looks "
          f"({looks / seconds:.1f}/s), {listings} listings, {commands} status commands; "
          f"file events {'on' if poller._events is not None and poller._events._thread else 'off'}",
          flush=True)
    poller.stop(wait=True)


def _summary(path: Path) -> Dict[str, int]:
    calls: Dict[str, int] = {}
    for line in path.read_text().splitlines():
        words = line.split()
        if len(words) >= 5 and words[-1] not in ("syscall", "total") and words[3].isdigit():
            calls[words[-1]] = int(words[3])
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ready", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jobs < 1 or not 1 <= args.seconds <= 3600:
        parser.error("--jobs: at least 1; --seconds: 1 to 3600")
    if args.child:
        child(args.jobs, args.seconds, args.ready)
        return 0
    print(f"bench/batch_watch_cost.py --jobs {args.jobs} --seconds {args.seconds:g}; "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        proc = subprocess.Popen([sys.executable, __file__, "--child", "--jobs", str(args.jobs),
                                 "--seconds", str(args.seconds), "--ready", str(ready)])
        while not ready.exists():
            if proc.poll() is not None:
                return 1
            time.sleep(0.05)
        strace = None
        out = Path(tmp) / "strace"
        try:
            tids = os.listdir(f"/proc/{proc.pid}/task")
            strace = subprocess.Popen(["strace", "-c", "-o", str(out),
                                       *[f"-p{t}" for t in tids]],
                                      stderr=subprocess.DEVNULL)
        except (OSError, FileNotFoundError):
            print("strace is not installed: the poller's own counts only")
        time.sleep(args.seconds - 1.0)
        if strace is not None:
            strace.send_signal(signal.SIGINT)
            strace.wait(timeout=60)
        rc = proc.wait(timeout=120)
        if strace is not None and out.exists():
            calls = _summary(out)
            total = sum(calls.values())
            shown = ", ".join(f"{name} {n}" for name, n in
                              sorted(calls.items(), key=lambda kv: -kv[1])[:8])
            print(f"system calls of all the process's threads over {args.seconds - 1.0:.0f} s: "
                  f"{total} ({total / (args.seconds - 1.0):.1f}/s): {shown}")
        return rc


if __name__ == "__main__":
    sys.exit(main())
