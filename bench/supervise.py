"""The supervisor's costs: the machine's time per event over 100 000 client status updates, and
the wall time a study of 1000 ``/bin/true`` clients on ``local`` takes beyond what the same
jobs need through the local executor alone (goal: under 3 s).

Prints figures only. Run: ``.venv/bin/python bench/supervise.py [--updates N] [--clients N]``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _help import description

from psij import Job, JobExecutor, JobSpec, JobState, JobStatus
from psij.controller import (
    ActionDone,
    ActionKind,
    Connected,
    JobStatusChanged,
    MessageReceived,
    Peer,
    Started,
)
from psij.supervise import Settings, Supervisor


def machine_cost(updates: int) -> float:
    """Microseconds per client status update given to the machine."""
    machine = Supervisor(Settings({"executable": "/bin/server"}, {"executable": "/bin/true"},
                                  "/out", "unix:/s", 10 ** 7, 5.0, True, 3, True, 60.0, 30.0),
                         new_token=lambda: "t")
    machine.step(Started(), 0.0)
    machine.step(Connected(1, Peer(-1, -1, -1, ""), "unix"), 0.0)
    machine.step(MessageReceived(1, {"type": "hello", "token": "t"}), 0.0)
    clients = updates // 3 + 1
    for i in range(clients):
        machine.step(MessageReceived(1, {"type": "submit", "client": f"c{i}",
                                         "arguments": []}), 0.0)
        machine.step(ActionDone(i + 1, ActionKind.SUBMIT, str(i)), 0.0)
    statuses = [JobStatus(JobState.QUEUED), JobStatus(JobState.ACTIVE),
                JobStatus(JobState.COMPLETED, exit_code=0)]
    events = [JobStatusChanged(uid, status) for status in statuses
              for uid in range(1, clients + 1)][:updates]
    step = machine.step
    begin = time.perf_counter()
    for event in events:
        step(event, 1.0)
    return (time.perf_counter() - begin) / len(events) * 1e6


SERVER = textwrap.dedent("""
    import sys
    from psij.supervise.client import connect
    with connect() as supervisor:
        for i in range(int(sys.argv[1])):
            supervisor.submit(f"c{i}", spec={"executable": "/bin/true"})
        for update in supervisor.updates():
            pass
""")


def study_seconds(clients: int, folder: Path, std_output: bool) -> float:
    """Wall time of ``psij supervise`` running a server that asks for ``clients`` jobs of
    /bin/true at once and waits for them."""
    server = folder / "server.py"
    server.write_text(SERVER)
    config = folder / f"study-{std_output}.json"
    config.write_text(json.dumps({
        "server": {"executable": sys.executable, "arguments": [str(server), str(clients)]},
        "output_dir": str(folder / f"out-{std_output}"), "std_output": std_output,
        "timer_delay": 1}))
    begin = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "psij", "supervise", str(config)],
                          capture_output=True, text=True)
    seconds = time.monotonic() - begin
    if done.returncode != 0:
        raise SystemExit(f"the study failed ({done.returncode}): {done.stderr}")
    return seconds


def jobs_alone_seconds(clients: int) -> float:
    """Wall time of the same jobs through the local executor, submitted at once and waited
    for, plus starting one Python process (the supervisor's server is one)."""
    begin = time.monotonic()
    subprocess.run([sys.executable, "-c", "import psij"], check=True)
    executor = JobExecutor.get_instance("local")
    jobs = [Job(JobSpec("/bin/true")) for _ in range(clients)]
    for job in jobs:
        executor.submit(job)
    for job in jobs:
        job.wait()
    return time.monotonic() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=1000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    print(f"machine: {machine_cost(args.updates):.2f} µs per client status update "
          f"({args.updates} updates)")
    with tempfile.TemporaryDirectory() as folder:
        alone = jobs_alone_seconds(args.clients)
        for std_output in (True, False):
            seconds = study_seconds(args.clients, Path(folder), std_output)
            print(f"study of {args.clients} /bin/true clients on local "
                  f"(std_output {str(std_output).lower()}): {seconds:.2f} s; the jobs alone "
                  f"{alone:.2f} s; beyond the jobs' need: {seconds - alone:.2f} s "
                  f"(goal < 3 s)")


if __name__ == "__main__":
    main()
