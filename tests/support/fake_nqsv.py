"""Fake NEC NQSV commands (``qsub``, ``qstat``, ``qdel``) for the tests of the ``nqsv``
executor, in the manner of ``fake_site_scheduler.py`` (whose job spool it shares).

Invoked as ``python -S fake_nqsv.py SPOOL COMMAND ARGS...`` through wrapper scripts named like
the tools. What each prints, in NQSV's forms:

- ``qsub SCRIPT``: ``Request N.fakebsv submitted to queue: Q.``; the script runs with bash in
  the background once per job of the request (``#PBS -b H``: H jobs), each with
  ``PBS_JOBID=<job number>:N.fakebsv`` and ``PBS_NODEFILE`` naming the request's hosts; a
  request is done when all its jobs ended. The queue ``nosuchqueue`` is refused
  (``qsub: ERROR: ...``, exit 1);
- ``qstat -F rid,stt -n -l [IDS]``: one line ``N.fakebsv STT`` per request still in the system
  (``QUE``, ``HLD`` for the queue ``held``, ``RUN``); ended requests are not shown; unknown ids
  are skipped, as qstat shows only what it has; ``-F rid`` prints the ids alone;
- ``qdel ID``: ``Request N.fakebsv was deleted.``; for a request that is not (any more) in the
  system, ``qdel: ERROR: Request N.fakebsv does not exist.`` on stderr, exit 1.

Standard library only.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

# Run as a script: the tests folder goes on the path for the support package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.fake_site_scheduler import Spool, directives, option

HOST = "fakebsv"
DIRECTIVE_FLAVOUR = "pbs"  # NQSV's directive lines start with #PBS too


def request_id(number: int) -> str:
    return f"{number}.{HOST}"


def by_id(spool: Spool, text: str) -> Optional[Dict[str, Any]]:
    digits = text.split(".", 1)[0]
    return spool.load(int(digits)) if digits.isdigit() else None


def qsub(spool: Spool, script_path: str) -> int:
    script = Path(script_path).read_text()
    words = directives(DIRECTIVE_FLAVOUR, script)
    queue = option(words, "-q") or "batch"
    if queue == "nosuchqueue":
        sys.stderr.write(f"qsub: ERROR: Queue {queue} does not exist.\n")
        return 1
    hosts = int(option(words, "-b") or "1")
    with spool:
        number = spool.new_number()
        saved = spool.path / f"script.{number}"
        saved.write_text(script)
        spool.save({"number": number, "queue": queue, "state": "queued", "hosts": hosts,
                    "script": str(saved), "cancelled": False, "pgids": [], "ended": None})
    subprocess.Popen([sys.executable, "-S", __file__, str(spool.path), "_run", str(number)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    print(f"Request {request_id(number)} submitted to queue: {queue}.")
    return 0


def run(spool: Spool, number: int) -> int:
    """The life of one request (runs detached)."""
    with spool:
        job = spool.load(number)
    assert job is not None
    give_up = time.time() + 120
    while job["queue"] == "held" and not job["cancelled"] and time.time() < give_up:
        time.sleep(0.05)
        with spool:
            job = spool.load(number)
            assert job is not None
    nodefile = spool.path / f"nodefile.{number}"
    nodefile.write_text(f"{socket.gethostname()}\n" * job["hosts"])
    with spool:
        job = spool.load(number)
        assert job is not None
        if job["cancelled"] or job["queue"] == "held":
            job.update(state="done", ended=time.time())
            spool.save(job)
            return 0
        procs = []
        for index in range(job["hosts"]):
            env = dict(os.environ, PBS_JOBID=f"{index}:{request_id(number)}",
                       PBS_NODEFILE=str(nodefile))
            procs.append(subprocess.Popen(
                ["bash", job["script"]], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                cwd=os.path.expanduser("~")))
        job.update(state="running", pgids=[p.pid for p in procs])
        spool.save(job)
    for proc in procs:
        proc.wait()
    with spool:
        job = spool.load(number)
        assert job is not None
        job.update(state="done", ended=time.time())
        spool.save(job)
    return 0


def qstat(spool: Spool, args: List[str]) -> int:
    fields = option(args, "-F") or "rid,stt"
    ids = [a for a in args if not a.startswith("-") and a != fields]
    user = option(args, "-u")
    ids = [a for a in ids if a != user]
    with spool:
        jobs = [j for j in spool.all() if j["state"] != "done"]
    for job in jobs:
        rid = request_id(job["number"])
        if ids and not any(by_id_matches(text, job["number"]) for text in ids):
            continue
        state = {"queued": "HLD" if job["queue"] == "held" else "QUE", "running": "RUN"}
        print(rid if fields == "rid" else f"{rid} {state[job['state']]}")
    return 0


def by_id_matches(text: str, number: int) -> bool:
    return text.split(".", 1)[0] == str(number)


def qdel(spool: Spool, text: str) -> int:
    with spool:
        job = by_id(spool, text)
        if job is None or job["state"] == "done":
            shown = request_id(job["number"]) if job else text
            sys.stderr.write(f"qdel: ERROR: Request {shown} does not exist.\n")
            return 1
        job["cancelled"] = True
        spool.save(job)
        for pgid in job["pgids"]:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    print(f"Request {request_id(job['number'])} was deleted.")
    return 0


def main(argv: List[str]) -> int:
    spool = Spool(argv[0])
    command, args = argv[1], argv[2:]
    if command == "_run":
        return run(spool, int(args[0]))
    if command == "qsub":
        return qsub(spool, [a for a in args if not a.startswith("-")][-1])
    if command == "qstat":
        return qstat(spool, args)
    if command == "qdel":
        return qdel(spool, args[-1])
    sys.stderr.write(f"{command}: not faked\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
