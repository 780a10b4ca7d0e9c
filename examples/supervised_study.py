"""A supervised study: a server asks for client jobs in waves, each client writes a result
file, and the server combines the results.

    python examples/supervised_study.py config RESULTS > study.json   # options: --help
    psij supervise study.json

The same file is the server (``server``) and the client (``client``) the configuration names.
A restarted server (after its predecessor died) asks only for the clients whose result file is
missing, so the study finishes whatever the number of restarts. A client that fails is asked
for again, up to three times; with fault tolerance off (``--no-fault-tolerance``: nothing
replaces a server that dies) the server ends the study at once, failing, as Melissa's does.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = os.path.abspath(__file__)


def config(args: argparse.Namespace) -> Dict[str, object]:
    """The ``psij supervise`` configuration of a study writing into ``args.results``."""
    results = os.path.abspath(args.results)
    python = sys.executable
    server_args = [HERE, "server", results, str(args.clients), str(args.wave)]
    return {
        "executor": args.executor,
        **({"executor_url": args.executor_url} if args.executor_url else {}),
        "output_dir": os.path.join(results, "supervise"),
        "server": {"executable": python, "arguments": server_args, "name": "study-server",
                   "directory": results},
        "client_template": {"executable": python,
                            "arguments": [HERE, "client", results, str(args.client_sleep)],
                            "directory": results},
        "timer_delay": args.timer_delay,
        "job_update_interval": args.job_update_interval,
        "fault_tolerance": not args.no_fault_tolerance,
        "max_server_restarts": args.max_server_restarts,
        "job_limit": args.job_limit,
    }


def client(results: str, sleep: float, index: str) -> int:
    """One client: compute (here: a square) and write the result file. It first sleeps
    ``sleep`` seconds, or the seconds written in ``RESULTS/sleep`` when that file exists
    (so that a running study can be slowed down or sped up); it fails (exit code 3) when
    ``RESULTS/fail.<index>`` exists."""
    if (Path(results) / f"fail.{int(index)}").exists():
        print(f"client {index}: told to fail", file=sys.stderr)
        return 3
    override = Path(results) / "sleep"
    if override.exists():
        sleep = float(override.read_text())
    if sleep > 0:
        time.sleep(sleep)
    value = int(index) ** 2
    final = Path(results) / f"result.{int(index)}.txt"
    partial = final.with_suffix(f".tmp{os.getpid()}")
    partial.write_text(f"{value}\n")
    os.replace(partial, final)
    return 0


def server(results: str, count: int, wave: int) -> int:
    """The server: clients in waves of ``wave``, retried when they fail (with fault
    tolerance on), then the sum."""
    from psij.supervise.client import connect

    folder = Path(results)
    with connect() as supervisor:
        (folder / f"server.{supervisor.generation}.pid").write_text(f"{os.getpid()}\n")
        todo: List[int] = [i for i in range(count)
                           if not (folder / f"result.{i}.txt").exists()]
        attempts: Dict[int, int] = {}
        while todo:
            current, todo = todo[:wave], todo[wave:]
            for i in current:
                attempts[i] = attempts.get(i, 0) + 1
                supervisor.submit(f"c{i}", arguments=[str(i)])
            for update in supervisor.updates():
                if update.final and update.state != "COMPLETED":
                    if not supervisor.fault_tolerance:  # the study fails with its first client
                        print(f"client {update.client} ended {update.state}; fault tolerance "
                              f"is off: the study ends", file=sys.stderr)
                        return 1
                    i = int(update.client[1:])
                    if attempts[i] < 3:
                        todo.append(i)
        total = sum(int((folder / f"result.{i}.txt").read_text()) for i in range(count))
        (folder / "combined.txt").write_text(f"{total}\n")
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("config", help="print the configuration of a study")
    make.add_argument("results", help="the folder of the result files (created)")
    make.add_argument("--executor", default="local")
    make.add_argument("--executor-url", default=None)
    make.add_argument("--clients", type=int, default=50)
    make.add_argument("--wave", type=int, default=10)
    make.add_argument("--client-sleep", type=float, default=0.0)
    make.add_argument("--timer-delay", type=float, default=1.0)
    make.add_argument("--job-update-interval", type=float, default=1.0)
    make.add_argument("--job-limit", type=int, default=1000)
    make.add_argument("--max-server-restarts", type=int, default=3)
    make.add_argument("--no-fault-tolerance", action="store_true")
    serve = commands.add_parser("server")
    serve.add_argument("results")
    serve.add_argument("count", type=int)
    serve.add_argument("wave", type=int)
    run = commands.add_parser("client")
    run.add_argument("results")
    run.add_argument("sleep", type=float)
    run.add_argument("index")
    args = parser.parse_args(argv)
    if args.command == "config":
        os.makedirs(args.results, mode=0o700, exist_ok=True)
        print(json.dumps(config(args), indent=2))
        return 0
    if args.command == "server":
        return server(args.results, args.count, args.wave)
    return client(args.results, args.sleep, args.index)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
