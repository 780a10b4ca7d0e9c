"""Pilot across nodes: tasks/s per allocated core of ``psij pilot run`` inside a Slurm job of
several nodes against a job of one node, on many short tasks (``/bin/true``).

Each round runs the same request file (N one-core ``/bin/true`` tasks in one submit request)
as users run it on a cluster: ``psij pilot run REQS.json --wd DIR`` as the script of an
``sbatch --wait`` job, in three shapes: ``--nodes`` nodes with C cores each (the pilot's own node
and the others reached through one agent per node, started with ``srun``), one node with C
cores, and one node with as many cores as the nodes together. Throughput is read from the
pilot's ``jobs.report``: whole (first submit to last end, as ``bench/pilot.py`` does, which
includes the agents' start through ``srun``) and steady (from the moment every node has started
a task to the last end: the tasks started in that time over its length), with the node of
each task from its ``allocation:`` line. Rounds alternate the shapes; figures are medians, and
the goal is judged on steady figures.

Goal, printed and never asserted: over four nodes, at least 0.8x the tasks/s per allocated core
of one node. Where the Slurm nodes are all one machine (the test cluster's ``slurmd -N``),
every node shares that machine's cores, so the allocated cores are not real ones: the line
"same machine" compares the steady tasks/s of the several-node job with the one-node job of
as many cores, which is what the agents cost per task there. Exit status 1 means a
measurement could not be taken. Run: ``.venv/bin/python bench/pilot_nodes.py [--nodes 4]
[--cores-per-node 2] [--tasks 2000] [--rounds 3] [--partition P] [--quick]``.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pilot
from _help import description
from run import REPO, log

OURS_PSIJ = REPO / ".venv" / "bin" / "psij"
GOAL = 0.8  # four nodes' tasks/s per allocated core, against one node's
JOB_LIMIT_S = 600.0


class Shape:
    """One way to run the pilot: its Slurm job's nodes and cores per node."""

    def __init__(self, nodes: int, cores: int) -> None:
        self.nodes = nodes
        self.cores = cores

    @property
    def total(self) -> int:
        return self.nodes * self.cores

    @property
    def label(self) -> str:
        return f"{self.nodes} node(s) x {self.cores} core(s)"


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))


def slurm_nodes(partition: Optional[str]) -> List[str]:
    """The usable nodes Slurm reports (of ``partition``, if given)."""
    argv = ["sinfo", "-h", "-N", "-o", "%N %T"] + (["-p", partition] if partition else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr}")
    usable = ("idle", "mixed", "allocated", "completing", "planned")
    return sorted({line.split()[0] for line in done.stdout.splitlines()
                   if len(line.split()) == 2
                   and line.split()[1].rstrip("*~#$!%@^-") in usable})


def one_run(shape: Shape, requests: Path, work: Path, partition: Optional[str]
            ) -> Dict[str, float]:
    """Run the pilot in one Slurm job of ``shape``; its tasks/s and tasks per node."""
    wd = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    script = wd / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {OURS_PSIJ} pilot run {requests} --wd {wd}\n")
    argv = ["sbatch", "--wait", "--parsable", f"--nodes={shape.nodes}",
            f"--ntasks-per-node={shape.cores}", "--time=10", f"--chdir={wd}",
            f"--output={wd / 'job.out'}", "--job-name=psij-bench-nodes", str(script)]
    if partition:
        argv.insert(1, f"--partition={partition}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=JOB_LIMIT_S)
    if done.returncode != 0:
        output = (wd / "job.out").read_text() if (wd / "job.out").exists() else ""
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: "
                           f"{done.stdout}{done.stderr}{output[-2000:]}")
    report = (wd / "jobs.report").read_text()
    tasks = report.count(" (SUCCEED)")
    times = pilot.measure(pilot.ours_history(wd), tasks)
    records = task_records(report)
    shutil.rmtree(wd, ignore_errors=True)
    firsts: Dict[str, float] = {}
    for node, start, _ in records:
        firsts[node] = min(start, firsts.get(node, start))
    # Steady: from the moment every node has started a task (its agent is there) to the end.
    ready = max(firsts.values())
    last_end = max(end for _, _, end in records)
    steady = sum(1 for _, start, _ in records if start >= ready)
    result = {"tasks_per_s": tasks / (times["last_end"] - times["first_submit"]),
              "steady_per_s": steady / max(last_end - ready, 1e-6),
              "ready_s": ready - times["first_submit"],
              "nodes_used": float(len(firsts))}
    result["per_core"] = result["steady_per_s"] / shape.total
    return result


def task_records(report: str) -> List[Tuple[str, float, float]]:
    """(node, start, end) of each task in a ``jobs.report``: the node it started on, when it
    started (EXECUTING) and its last time, as epoch seconds."""
    records: List[Tuple[str, float, float]] = []
    node: Optional[str] = None
    start: Optional[float] = None
    end: Optional[float] = None
    for line in [*report.splitlines(), ""]:
        if not line.startswith(" "):
            if node is not None and start is not None and end is not None:
                records.append((node, start, end))
            node = start = end = None
            continue
        text = line.strip()
        if text.startswith("allocation: "):
            node = text[len("allocation: "):].split(":", 1)[0]
        elif line[4:5].isdigit():
            when, _, state = text.rpartition(": ")
            end = datetime.fromisoformat(when).timestamp()
            if state == "EXECUTING":
                start = end
    return records


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description(__doc__ or ""))
    parser.add_argument("--nodes", type=int, default=4,
                        help="nodes of the several-node job (default 4)")
    parser.add_argument("--cores-per-node", type=int, default=2,
                        help="cores the pilot takes on each node (default 2)")
    parser.add_argument("--tasks", type=int, default=2000,
                        help="tasks of /bin/true per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--partition", help="Slurm partition (default: the default one)")
    parser.add_argument("--quick", action="store_true",
                        help="200 tasks, one round: a check that every figure is printed")
    parser.add_argument("--json", action="store_true", help="also print the medians as JSON")
    args = parser.parse_args(argv)
    for name in ("nodes", "cores_per_node", "tasks", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: a whole number of at least 1 is "
                         f"accepted, got {getattr(args, name)}")
    if args.quick:
        args.tasks, args.rounds = min(args.tasks, 200), 1
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if shutil.which("sbatch") is None:
        print("sbatch not found: this benchmark runs the pilot inside Slurm jobs",
              file=sys.stderr)
        return 1
    try:
        found = slurm_nodes(args.partition)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as ex:
        print(f"cannot list Slurm's nodes: {ex}", file=sys.stderr)
        return 1
    if len(found) < args.nodes:
        print(f"--nodes {args.nodes}: Slurm has only {len(found)} usable node(s) "
              f"({', '.join(found) or 'none'})", file=sys.stderr)
        return 1
    many = Shape(args.nodes, args.cores_per_node)
    shapes = [many, Shape(1, args.cores_per_node), Shape(1, many.total)]
    work = Path(tempfile.mkdtemp(prefix="psij-bench-nodes-"))
    work.chmod(0o755)
    requests = work / "requests.json"
    pilot.request_file(requests, args.tasks)
    results: Dict[str, List[Dict[str, float]]] = {s.label: [] for s in shapes}
    load = os.getloadavg()[0]
    try:
        for round_number in range(args.rounds):
            for shape in shapes:
                log(f"round {round_number + 1}/{args.rounds}: {shape.label}, "
                    f"{args.tasks} tasks ...")
                try:
                    results[shape.label].append(one_run(shape, requests, work,
                                                        args.partition))
                except (OSError, RuntimeError, ValueError,
                        subprocess.TimeoutExpired) as ex:
                    print(f"{shape.label}: the run failed: {ex}", file=sys.stderr)
                    return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {label: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
               for label, runs in results.items()}
    for label, runs in results.items():
        medians[label]["lowest"] = min(r["steady_per_s"] for r in runs)
        medians[label]["highest"] = max(r["steady_per_s"] for r in runs)
    report(args, shapes, medians, load)
    if args.json:
        print(json.dumps(medians, sort_keys=True))
    return 0


def report(args: argparse.Namespace, shapes: List[Shape],
           medians: Dict[str, Dict[str, float]], load: float) -> None:
    real = machine_cores()
    print(f"== Pilot across nodes: {args.tasks} tasks of /bin/true, median of {args.rounds} "
          f"round(s)")
    print(f"Machine: {real} core(s) usable here (os.sched_getaffinity); load average "
          f"{load:.2f} before the runs, {os.getloadavg()[0]:.2f} after")
    print("  steady: from the moment every node of the job has started a task to the last end; "
          "whole: from the first submission")
    print(f"  {'job':<24} {'steady tasks/s':>14} {'range':>13} {'per allocated core':>19} "
          f"{'whole tasks/s':>14} {'all nodes in':>12} {'nodes used':>11}")
    for shape in shapes:
        m = medians[shape.label]
        spread = f"{m['lowest']:.0f} - {m['highest']:.0f}"
        print(f"  {shape.label:<24} {m['steady_per_s']:>14.1f} {spread:>13} "
              f"{m['per_core']:>13.1f} /core {m['tasks_per_s']:>14.1f} "
              f"{m['ready_s']:>10.3f} s {int(m['nodes_used']):>11d}")
    many, one, one_wide = (medians[s.label] for s in shapes)
    ratio = many["per_core"] / one["per_core"]
    same = many["steady_per_s"] / one_wide["steady_per_s"]
    print("== Goal")
    verdict = "PASS" if ratio >= GOAL else "FAIL"
    print(f"  {verdict:<5} per allocated core, {shapes[0].label} vs {shapes[1].label}: "
          f"{ratio:.2f}x (goal >= {GOAL}x)")
    print(f"  {'INFO':<5} same machine, {shapes[0].label} vs {shapes[2].label}: {same:.2f}x "
          f"the steady tasks/s")
    print(f"Caveat: Slurm's nodes here may all be this machine ({real} real core(s)); then "
          f"the {shapes[0].total} cores of {shapes[0].label} are {real} real ones shared by "
          f"the pilot, its agents and the tasks, and the per-core ratio says more about this "
          f"machine than about the pilot. The same-machine line compares equal allocations "
          f"on the same real cores. Other jobs on the machine (see the load average) move "
          f"every figure; compare the rows of one run only.")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
