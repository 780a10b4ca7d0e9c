"""A fake Slurm that only queues: ``sbatch``, ``squeue`` and ``scancel`` over a folder of job
records, for the tests of a submission interrupted by the supervisor's stop
(tests/test_supervise_interrupted.py). Jobs never run.

Invoked as ``python -S fake_slurm.py SPOOL COMMAND ARGS...`` through wrappers named like the
tools (:func:`install`). ``sbatch`` reads the script on its standard input, takes the job name
from ``#SBATCH --job-name="..."`` and, when the file ``SPOOL/slow`` holds ``before N`` or
``after N``, sleeps N seconds before it queues the job (a slow controller that has not taken it
yet) or after (one that took it and has not answered yet); it touches ``SPOOL/sbatch.started``
first. ``squeue --name=NAME --format=%i`` lists the pending jobs of that name; with
``--jobs=ID,...`` it prints ``ID|STATE|REASON`` lines. ``scancel ID`` cancels. Standard
library only.
"""

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import List

_NAME = re.compile(r'^#SBATCH --job-name="(.*)"$', re.MULTILINE)


def install(bin_dir: Path, spool: Path) -> None:
    """Wrappers for sbatch, squeue and scancel in ``bin_dir`` (to put first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    spool.mkdir(parents=True, exist_ok=True)
    for tool in ("sbatch", "squeue", "scancel"):
        args = [sys.executable, "-S", str(Path(__file__).resolve()), str(spool), tool]
        wrapper = bin_dir / tool
        wrapper.write_text(f"#!/bin/sh\nexec {' '.join(map(shlex.quote, args))} \"$@\"\n")
        wrapper.chmod(0o755)


def jobs(spool: Path) -> List[dict]:
    """Every job record, in submission order."""
    found = [json.loads(p.read_text()) for p in spool.glob("job.*.json")]
    return sorted(found, key=lambda j: int(j["id"]))


def _queue(spool: Path, name: str) -> str:
    number = 1 + len(list(spool.glob("job.*.json")))
    path = spool / f"job.{number}.json"
    while True:  # one number per job, even with sbatch running at once
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            number += 1
            path = spool / f"job.{number}.json"
    with os.fdopen(fd, "w") as f:
        json.dump({"id": str(number), "name": name, "state": "PENDING"}, f)
    return str(number)


def main(argv: List[str]) -> int:
    spool, command, args = Path(argv[0]), argv[1], argv[2:]
    if command == "sbatch":
        (spool / "sbatch.started").touch()
        match = _NAME.search(sys.stdin.read())
        name = match.group(1) if match else "sbatch"
        slow = (spool / "slow").read_text().split() if (spool / "slow").exists() else []
        when, seconds = (slow[0], float(slow[1])) if slow else ("", 0.0)
        if when == "before":
            time.sleep(seconds)
        number = _queue(spool, name)
        if when == "after":
            time.sleep(seconds)
        print(number)
        return 0
    if command == "squeue":
        names = [a.split("=", 1)[1] for a in args if a.startswith("--name=")]
        ids = [i for a in args if a.startswith("--jobs=") for i in a[7:].split(",")]
        for job in jobs(spool):
            if names and job["name"] in names and job["state"] == "PENDING":
                print(job["id"])
            elif ids and job["id"] in ids:
                print(f"{job['id']}|{job['state']}|None")
        return 0
    if command == "scancel":
        path = spool / f"job.{args[-1]}.json"
        if not path.exists():
            sys.stderr.write(f"scancel: error: Invalid job id specified {args[-1]}\n")
            return 1
        job = json.loads(path.read_text())
        job["state"] = "CANCELLED"
        path.write_text(json.dumps(job))
        return 0
    sys.stderr.write(f"{command}: not faked\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
