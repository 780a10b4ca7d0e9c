"""The worker half of ``bench/batch.py``: the measurements themselves, run in a child
interpreter of each package's venv (``python bench/batch.py worker ...``). Nothing here imports
``psij`` at module level: each venv imports its own."""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

# Both packages' default queue_polling_interval: end times spread over it cover every phase.
DEFAULT_POLLING_INTERVAL_S = 30.0


def _status_window(starts: List[Tuple[float, int]], ready: float, interval: float,
                   intervals: int) -> Dict[str, Any]:
    """How many status commands each poll issued, over ``intervals`` poll intervals after a
    settling interval.

    ``starts`` holds (start time, job ids asked for, -1 for "all of the user's jobs"). Commands
    started less than half an interval after the previous one belong to the same poll: an
    executor polling job by job shows up as polls of many commands. Each poll comes an interval
    after the previous one *ended* (in both packages), so the polls are counted rather than
    the interval divided into the window.
    """
    begin = ready + interval
    end = begin + intervals * interval
    inside = sorted((t, n) for t, n in starts if begin <= t < end)
    polls: List[List[float]] = []
    for t, _ in inside:
        if polls and t - polls[-1][-1] < interval / 2:
            polls[-1].append(t)
        else:
            polls.append([t])
    period = (polls[-1][0] - polls[0][0]) / (len(polls) - 1) if len(polls) > 1 else None
    return {
        "status_commands": len(inside),
        "polls": len(polls),
        "window_s": intervals * interval,
        "interval_s": interval,
        "per_interval": len(inside) / len(polls) if polls else None,
        "max_per_interval": max((len(p) for p in polls), default=None),
        "poll_period_s": period,
        "ids_per_command": sorted({n for _, n in inside}),
        "status_commands_total": len(starts),
    }


def _write_fake_slurm(folder: Path) -> Path:
    """Fake ``sbatch`` (new ids, remembered) and ``squeue`` (logs each call with the number of
    ids asked for; every known job PENDING, in the format each package asks for).

    Several fake sbatch may run at once (spare submit commands are started ahead of need), so
    a new id is taken under a lock: without it two jobs could get one id."""
    fake_bin = folder / "bin"
    fake_bin.mkdir(parents=True)
    state = folder / "state"
    state.mkdir()
    (fake_bin / "sbatch").write_text(f"""#!/bin/sh
exec 9>>"{state}/lock"
flock 9
n=$(( $(cat "{state}/next" 2>/dev/null || echo 1000) + 1 ))
echo "$n" >"{state}/next"
echo "$n" >>"{state}/ids"
flock -u 9
echo "Submitted batch job $n"
""")
    (fake_bin / "squeue").write_text(f"""#!/bin/sh
asked=-1
for a in "$@"; do
    case $a in --jobs=*) asked=$(printf '%s\\n' "${{a#--jobs=}}" | tr ',' '\\n' | wc -l) ;; esac
done
echo "$(date +%s.%N) $asked" >>"{state}/squeue-calls"
case " $* " in
    *" -O "*) echo "JOBID STATE REASON"; sed 's/$/ PD Priority/' "{state}/ids" ;;
    *) sed 's/$/|PENDING|Priority/' "{state}/ids" ;;
esac
""")
    for tool in ("sbatch", "squeue"):
        (fake_bin / tool).chmod(0o755)
    os.environ["PATH"] = f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    return state / "squeue-calls"


def _states(jobs: Sequence[Any]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for job in jobs:
        name = str(job.status.state)
        counts[name] = counts.get(name, 0) + 1
    return counts


def status_count_slurm_fake(n_jobs: int, interval: float, intervals: int,
                            work: Path) -> Dict[str, Any]:
    """Either package's slurm executor with fake sbatch/squeue: status commands per interval."""
    calls = _write_fake_slurm(work / "fake")
    import psij
    from psij.executors.batch.slurm import SlurmExecutorConfig

    config = SlurmExecutorConfig(work_directory=work / "work",
                                 queue_polling_interval=interval,
                                 initial_queue_polling_delay=interval)
    executor = psij.JobExecutor.get_instance("slurm", config=config)
    jobs = []
    for _ in range(n_jobs):
        job = psij.Job(psij.JobSpec("/bin/true"))
        executor.submit(job)
        jobs.append(job)
    # A poll made while the last jobs were being submitted names fewer of them, and the fake
    # stamps it only once its shell runs (late on a busy machine): the window starts after
    # the first command naming them all (or all the user's jobs), when the earlier ones are over.
    deadline = time.time() + 20 * interval
    while time.time() < deadline and not any(
            asked in (n_jobs, -1) for _, asked in _squeue_calls(calls)):
        time.sleep(interval / 10)
    ready = time.time()
    time.sleep(interval * (intervals + 1.5))
    return {"workload": "status-slurm-fake", "jobs": n_jobs, "states": _states(jobs),
            **_status_window(_squeue_calls(calls), ready, interval, intervals)}


def _squeue_calls(calls: Path) -> List[Tuple[float, int]]:
    """(start time, job ids asked for) of each fake squeue run so far."""
    if not calls.exists():
        return []
    starts = []
    for line in calls.read_text().splitlines():
        when, _, asked = line.partition(" ")
        if asked:  # a line being written is complete once it has both fields
            starts.append((float(when), int(asked)))
    return starts


def status_count_batch_test(n_jobs: int, interval: float, intervals: int,
                            work: Path) -> Dict[str, Any]:
    """This package's batch-test executor: status commands per interval, counted in its runner.

    The jobs are put PENDING into the fake scheduler's queue through its own spool API and then
    attached, rather than submitted: each submitted batch-test job has a watcher process, and a
    thousand of them would measure this machine rather than the executor.
    """
    import psij
    from psij.executors.batch import batch_test_tool
    from psij.executors.batch.batch_test import BatchTestExecutorConfig

    config = BatchTestExecutorConfig(work_directory=work, queue_polling_interval=interval,
                                     initial_queue_polling_delay=interval)
    executor = psij.JobExecutor.get_instance("batch-test", config=config)
    starts: List[Tuple[float, int]] = []
    inner = executor._runner  # type: ignore[attr-defined]

    class CountingRunner:
        def run(self, argv: Sequence[str], timeout: float,
                stdin: Optional[str] = None) -> Any:
            if "status" in argv:
                starts.append((time.time(), sum(1 for a in argv if a.isdigit())))
            return inner.run(argv, timeout, stdin)

    executor._runner = CountingRunner()  # type: ignore[attr-defined]
    spool = batch_test_tool.Spool(config.spool_directory)
    jobs = []
    for number in range(1, n_jobs + 1):
        native_id = str(number)
        spool.job_dir(native_id).mkdir()
        spool.set_state(native_id, "PENDING")
        job = psij.Job()
        executor.attach(job, native_id)
        jobs.append(job)
    ready = time.time()
    time.sleep(interval * (intervals + 1.5))
    executor.close()  # type: ignore[attr-defined]
    return {"workload": "status-batch-test", "jobs": n_jobs, "states": _states(jobs),
            **_status_window(starts, ready, interval, intervals)}


def _slurm_config(work: Path, interval: Optional[float], initial_delay: float,
                  sbatch_only: bool = False) -> Any:
    from psij.executors.batch.slurm import SlurmExecutorConfig

    if sbatch_only:  # ours only: no slurmrestd child (rest_submit)
        return SlurmExecutorConfig(work_directory=work, rest_submit=False)
    if interval is None:
        return SlurmExecutorConfig(work_directory=work)
    return SlurmExecutorConfig(work_directory=work, queue_polling_interval=interval,
                               initial_queue_polling_delay=initial_delay)


def submit_throughput(n_jobs: int, work: Path, defer: bool = False,
                      sbatch_only: bool = False) -> Dict[str, Any]:
    """Submit ``n_jobs`` /bin/true jobs (1-minute limit) to Slurm; time the submit calls only.
    With ``defer`` the jobs may start only in an hour (``--begin``; cancelled by the driver);
    with ``sbatch_only`` (ours) every job goes through sbatch."""
    import psij

    executor = psij.JobExecutor.get_instance(
        "slurm", config=_slurm_config(work, None, 0, sbatch_only))
    submit_s: List[float] = []
    native_ids: List[str] = []
    custom = {"slurm.begin": "now+1hour"} if defer else {}
    cpu_start = time.process_time()
    for _ in range(n_jobs):
        job = psij.Job(psij.JobSpec("/bin/true", attributes=psij.JobAttributes(
            duration=timedelta(minutes=1), custom_attributes=custom)))
        start = time.perf_counter()
        executor.submit(job)
        submit_s.append(time.perf_counter() - start)
        native_ids.append(str(job.native_id))
    # This process only (all its threads; sbatch itself not counted): the library's own cost,
    # which competing load on the machine hardly changes, unlike the wall time.
    cpu_s = time.process_time() - cpu_start
    total = sum(submit_s)
    rest = getattr(executor, "_rest", None)  # ours: the slurmrestd child, if one served
    via = "slurmrestd" if rest is not None and rest.child_pid is not None else "sbatch"
    return {"workload": "slurm-submit", "jobs": n_jobs, "submit_s": total, "via": via,
            "jobs_per_s": n_jobs / total, "median_submit_ms": statistics.median(submit_s) * 1e3,
            "cpu_ms_per_submit": cpu_s * 1e3 / n_jobs, "native_ids": native_ids}


def submit_many_throughput(n_jobs: int, work: Path) -> Dict[str, Any]:
    """Give ``n_jobs`` /bin/true jobs (1-minute limit, each with its own argument and
    environment value) to one ``submit_many`` call; time that call."""
    import psij

    executor = psij.JobExecutor.get_instance("slurm", config=_slurm_config(work, None, 0))
    jobs = [psij.Job(psij.JobSpec("/bin/true", [str(i)], environment={"ELEMENT": str(i)},
                                  attributes=psij.JobAttributes(duration=timedelta(minutes=1))))
            for i in range(n_jobs)]
    cpu_start = time.process_time()
    start = time.perf_counter()
    executor.submit_many(jobs)
    total = time.perf_counter() - start
    cpu_s = time.process_time() - cpu_start
    native_ids = [str(job.native_id) for job in jobs]
    return {"workload": "slurm-submit-many", "jobs": n_jobs, "submit_s": total,
            "jobs_per_s": n_jobs / total, "cpu_ms_per_submit": cpu_s * 1e3 / n_jobs,
            "arrays": len({nid.split("_")[0] for nid in native_ids}),
            "native_ids": native_ids}


def end_to_seen(n_jobs: int, spread: float, interval: Optional[float], initial_delay: float,
                work: Path, wait_limit: float) -> Dict[str, Any]:
    """Seconds from a job's last action (writing a timestamp) to its COMPLETED status seen by
    the status callback. Job i sleeps ``spread * i / n_jobs`` s first, so that the jobs end at
    different points of the polling period."""
    import psij

    config = _slurm_config(work, interval, initial_delay)
    executor = psij.JobExecutor.get_instance("slurm", config=config)
    # A script file keeps the job's arguments plain words, which any launcher passes intact.
    stamp_script = work / "stamp.sh"
    stamp_script.write_text('sleep "$1"\ndate +%s.%N >"$2.tmp" && mv "$2.tmp" "$2"\n')
    seen: Dict[str, float] = {}

    def note(job: Any, status: Any) -> None:
        if status.state == psij.JobState.COMPLETED and job.id not in seen:
            seen[job.id] = time.time()

    jobs: List[Tuple[Any, Path]] = []
    for i in range(n_jobs):
        stamp = work / f"end-{i}"
        spec = psij.JobSpec("/bin/sh", [str(stamp_script), f"{spread * i / n_jobs:.3f}",
                                        str(stamp)],
                            attributes=psij.JobAttributes(duration=timedelta(minutes=5)))
        job = psij.Job(spec)
        job.set_job_status_callback(note)
        executor.submit(job)
        jobs.append((job, stamp))
    samples: List[float] = []
    problems: List[str] = []
    deadline = time.monotonic() + wait_limit
    for job, stamp in jobs:
        status = job.wait(timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())))
        # A callback may run just after wait() returns in some implementations.
        grace = time.monotonic() + 2
        while job.id not in seen and time.monotonic() < grace \
                and status is not None and status.state == psij.JobState.COMPLETED:
            time.sleep(0.01)
        if job.id not in seen or not stamp.exists():
            problems.append(f"{job.native_id}: {status}")
            continue
        samples.append(seen[job.id] - float(stamp.read_text()))
    return {"workload": "slurm-end-to-seen", "jobs": n_jobs,
            "interval_s": config.queue_polling_interval,
            "initial_delay_s": config.initial_queue_polling_delay, "samples_s": samples,
            "not_completed": len(problems), "problems": problems[:3],
            "native_ids": [str(job.native_id) for job, _ in jobs]}


def worker_main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="batch.py worker")
    sub = parser.add_subparsers(dest="measure", required=True)
    p = sub.add_parser("status-batch-test")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--intervals", type=int, default=10)
    p = sub.add_parser("status-slurm-fake")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--intervals", type=int, default=10)
    p = sub.add_parser("slurm-submit")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--defer", action="store_true")
    p.add_argument("--sbatch-only", action="store_true", help="ours: rest_submit=False")
    p = sub.add_parser("slurm-submit-many")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--work", type=Path, required=True)
    p = sub.add_parser("slurm-end-to-seen")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--spread", type=float, required=True)
    p.add_argument("--interval", type=float, help="polling interval (default: the package's)")
    p.add_argument("--initial-delay", type=float, default=1.0)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--wait-limit", type=float, default=240.0)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="psij-bench-batch-"))
    if args.measure == "status-batch-test":
        result = status_count_batch_test(args.jobs, args.interval, args.intervals, scratch)
    elif args.measure == "status-slurm-fake":
        result = status_count_slurm_fake(args.jobs, args.interval, args.intervals, scratch)
    elif args.measure == "slurm-submit":
        result = submit_throughput(args.jobs, args.work, args.defer, args.sbatch_only)
    elif args.measure == "slurm-submit-many":
        result = submit_many_throughput(args.jobs, args.work)
    else:
        result = end_to_seen(args.jobs, args.spread, args.interval, args.initial_delay,
                             args.work, args.wait_limit)
    # Flushed at once: the driver keeps this line even if the process then fails to exit.
    print(json.dumps(result), flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    # Polling threads of either package may still be running a command; the measurement is
    # over, so the process ends without waiting for them.
    os._exit(0)


