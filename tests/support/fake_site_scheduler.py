"""Fake command-line tools of PBS Pro, Torque, LSF, Cobalt and Flux, for the tests of their
executors on a machine that has none of them.

Invoked as ``python -S fake_site_scheduler.py SPOOL FLAVOUR COMMAND ARGS...`` through small
wrapper scripts named like the real tools (``qsub``, ``qstat``, ``qdel``, ``qselect``,
``bsub``, ``bjobs``, ``bkill``, ``flux``) put first on PATH by the tests. It keeps one JSON
record per job in SPOOL, runs each submitted script for real with bash in the background (so
the job's exit-code file is written by the real template code, with the environment variables
the real scheduler sets), and prints status in the documented output format of each tool:

- PBS Pro: ``qstat -f -F json -x ID...`` (``{"timestamp", "pbs_version", "pbs_server",
  "Jobs": {ID: {"job_state", "substate", "Exit_status", "comment", ...}}}``; unknown ids on
  stderr as ``qstat: Unknown Job Id ID``, exit 153);
- Torque: ``qstat -f ID...`` (``Job Id: ID`` blocks of indented ``name = value`` lines, long
  values continued on tab-indented lines; ``qstat: Unknown Job Id Error ID``);
- LSF: ``bjobs -a -o "FIELDS" -json ID...`` (``{"COMMAND": "bjobs", "JOBS": n, "RECORDS":
  [...]}``, string values, ``ERROR`` records for unknown ids; with
  ``LSB_BJOBS_CONSISTENT_EXIT_CODE=Y`` in the environment, exit 255 and a message on stderr when
  none of the jobs is found); ``bsub`` reads the script on stdin and answers ``Job <ID> is
  submitted to queue <Q>.``;
- Cobalt: ``qstat -l --header JobID:State ID...`` (vertical blocks; ended jobs are gone; exit 1
  without output when no id is known);
- Flux: ``flux batch`` (prints an F58 id ``ƒ...``), ``flux jobs -a -n -o FORMAT ID...``,
  ``flux cancel``, and inside jobs ``flux getattr jobid``, ``flux job id --to=dec``,
  ``flux exec -r all hostname``.

Job arrays: ``qsub`` with ``#PBS -J a-b`` prints ``N[].fakepbs`` and runs each subjob with
``PBS_JOBID=N[i].fakepbs`` and ``PBS_ARRAY_INDEX=i``; ``qstat -t`` adds the subjobs of an array
(a finished subjob is ``X``, the array ``B`` once one has started, ``F`` when all ended);
``bsub`` with ``#BSUB -J "name[a-b]"`` runs each element with ``LSB_JOBID=N`` and
``LSB_JOBINDEX=i``, and ``bjobs N`` shows each element (``JOBID`` N, ``JOBINDEX`` i). Elements
are cancelled by their own ids (``qdel N[i].fakepbs``, ``bkill "N[i]"``).

A job sent to the queue ``held`` stays queued, shown as each tool shows a job on hold (PBS and
Torque ``H``, LSF ``PSUSP``, Cobalt ``user_hold``, Flux urgency 0), until it is cancelled;
submitting to the queue ``nosuchqueue`` fails with the tool's own error message. Standard
library only.
"""

import fcntl
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

try:
    from support import fake_site_usage as usage
except ImportError:  # run as a script: its folder is on the path
    import fake_site_usage as usage  # type: ignore[no-redef]

F58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
DIRECTIVE = {"pbs": "#PBS", "torque": "#PBS", "lsf": "#BSUB", "cobalt": "#COBALT",
             "flux": "# flux:"}


class Spool:
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        (self.path / "jobs").mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.path / "lock", "a+")

    def __enter__(self) -> "Spool":
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._lock_file, fcntl.LOCK_UN)

    def new_number(self) -> int:
        counter = self.path / "counter"
        n = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(n))
        return n

    def load(self, number: int) -> Optional[Dict[str, Any]]:
        try:
            data: Dict[str, Any] = json.loads((self.path / "jobs" / f"{number}.json").read_text())
            return data
        except FileNotFoundError:
            return None

    def save(self, job: Dict[str, Any]) -> None:
        target = self.path / "jobs" / f"{job['number']}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(job))
        os.replace(tmp, target)

    def all(self) -> List[Dict[str, Any]]:
        jobs = []
        for p in sorted(self.path.glob("jobs/*.json"), key=lambda p: int(p.stem)):
            jobs.append(json.loads(p.read_text()))
        return jobs


# ---------------------------------------------------------------------------------- job ids

def f58(n: int) -> str:
    digits = ""
    while True:
        n, r = divmod(n, 58)
        digits = F58[r] + digits
        if n == 0:
            return "\u0192" + digits


def from_f58(text: str) -> int:
    n = 0
    for c in text[1:]:
        n = n * 58 + F58.index(c)
    return n


def native_id(flavour: str, number: int) -> str:
    if flavour == "pbs":
        return f"{number}.fakepbs"
    if flavour == "torque":
        return f"{number}.fakehost"
    if flavour == "flux":
        return str(flux_number(number))
    return str(number)


def flux_number(number: int) -> int:
    # Flux ids are large numbers (a timestamp and a broker rank are encoded in them).
    return 81985529216 + number * 1048576


def number_of(flavour: str, text: str) -> Optional[int]:
    text = text.strip()
    if flavour == "flux":
        try:
            value = from_f58(text) if text[:1] in ("\u0192", "f") else int(text)
        except ValueError:
            return None
        offset = value - flux_number(0)
        return offset // 1048576 if offset > 0 and offset % 1048576 == 0 else None
    match = re.match(r"(\d+)", text)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------------------------- submit

def directives(flavour: str, script: str) -> List[str]:
    words: List[str] = []
    prefix = DIRECTIVE[flavour]
    for line in script.splitlines():
        if line.startswith(prefix):
            words.extend(shlex.split(line[len(prefix):]))
    return words


def option(words: List[str], *names: str) -> Optional[str]:
    found = None
    for i, w in enumerate(words):
        for name in names:
            if name.startswith("--") and w.startswith(name + "="):
                found = w[len(name) + 1:]
            elif w == name and i + 1 < len(words):
                found = words[i + 1]
    return found


def process_slots(flavour: str, words: List[str]) -> Tuple[int, int]:
    """(lines of the scheduler's node file, nodes) the job gets."""
    if flavour in ("pbs", "torque"):
        for i, w in enumerate(words):
            if w == "-l" and i + 1 < len(words):
                spec = words[i + 1]
                m = re.match(r"select=(\d+):.*mpiprocs=(\d+)", spec)
                if m and flavour == "pbs":
                    return int(m.group(1)) * int(m.group(2)), int(m.group(1))
                m = re.match(r"nodes=(\d+):ppn=(\d+)", spec)
                if m and flavour == "torque":
                    return int(m.group(1)) * int(m.group(2)), int(m.group(1))
        return 1, 1
    if flavour == "lsf":
        return int(option(words, "-n") or 1), 1
    if flavour == "cobalt":
        nodes = int(option(words, "-n") or 1)
        return nodes, nodes
    nodes = int(option(words, "-N") or 1)
    return nodes, nodes


QUEUE_ERRORS = {
    "pbs": ("qsub: Unknown queue\n", 170),
    "torque": ("qsub: submit error (Unknown queue MSG=cannot locate queue)\n", 1),
    "lsf": ("nosuchqueue: No such queue. Job not submitted.\n", 255),
    "cobalt": ("'nosuchqueue' is not a valid queue name\n", 1),
    "flux": ("flux-batch: ERROR: Invalid queue 'nosuchqueue' specified\n", 1),
}


def array_indices(flavour: str, words: List[str]) -> List[int]:
    """The indices of a job array asked for by the directives (none for a single job)."""
    if flavour == "pbs":
        text = option(words, "-J")
    elif flavour == "lsf":
        name = option(words, "-J") or ""
        text = name[name.index("[") + 1:-1] if name.endswith("]") and "[" in name else None
    else:
        return []
    if text is None:
        return []
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def load_by_id(spool: Spool, flavour: str, text: str) -> Optional[Dict[str, Any]]:
    """The record of a job, an array, or an array's element (``N[i]...``)."""
    match = re.match(r"(\d+)\[(\d+)\]", text.strip())
    if match is None:
        number = number_of(flavour, text)
        return spool.load(number) if number is not None else None
    parent = spool.load(int(match.group(1)))
    if parent is None or not parent.get("elements"):
        return None
    element = parent["elements"].get(match.group(2))
    return spool.load(element) if element is not None else None


def elements_of(spool: Spool, job: Dict[str, Any]) -> List[Dict[str, Any]]:
    found = [spool.load(n) for n in (job.get("elements") or {}).values()]
    return [e for e in found if e is not None]


def submit(spool: Spool, flavour: str, script_path: Optional[str]) -> int:
    if script_path is None:
        script = sys.stdin.read()
    else:
        script = Path(script_path).read_text()
        if flavour == "cobalt" and not os.access(script_path, os.X_OK):
            sys.stderr.write(f"Script {script_path} is not executable\n")
            return 1
    words = directives(flavour, script)
    queue = option(words, "-q", "--queue")
    if queue == "nosuchqueue":
        message, code = QUEUE_ERRORS[flavour]
        sys.stderr.write(message)
        return code
    slots, nodes = process_slots(flavour, words)
    indices = array_indices(flavour, words)
    with spool:
        number = spool.new_number()
        saved = spool.path / f"script.{number}"
        saved.write_text(script)
        job = {"number": number, "id": native_id(flavour, number), "flavour": flavour,
               "script": str(saved), "queue": queue or "workq", "state": "queued",
               "name": option(words, "-N", "-J", "--jobname", "--job-name") or "STDIN",
               "slots": slots, "nodes": nodes, "exit": None, "signal": None,
               "cancelled": False, "pgid": None, "submitted": time.time(), "ended": None}
        to_run = [number]
        if indices:
            job.update({"id": f"{number}[].fakepbs" if flavour == "pbs" else str(number),
                        "state": "array", "elements": {}})
            to_run = []
            for index in indices:
                element = dict(job, number=spool.new_number(), state="queued", parent=number,
                               index=index, elements=None)
                if flavour == "pbs":
                    element["id"] = f"{number}[{index}].fakepbs"
                    element["env"] = {"PBS_ARRAY_INDEX": str(index)}
                else:
                    element["id"] = f"{number}[{index}]"
                    element["env"] = {"LSB_JOBID": str(number), "LSB_JOBINDEX": str(index)}
                job["elements"][str(index)] = element["number"]
                spool.save(element)
                to_run.append(element["number"])
        spool.save(job)
    for run_number in to_run:
        subprocess.Popen([sys.executable, "-S", __file__, str(spool.path), flavour, "_run",
                          str(run_number)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    if flavour == "lsf":
        print(f"Job <{number}> is submitted to {'default ' if queue is None else ''}queue "
              f"<{queue or 'normal'}>.")
    elif flavour == "flux":
        print(f58(flux_number(number)))
    else:
        print(job["id"])
    return 0


def run(spool: Spool, flavour: str, number: int) -> int:
    """The life of one job (runs detached)."""
    with spool:
        job = spool.load(number)
    assert job is not None
    if job["queue"] == "held":
        give_up = time.time() + 120
        while time.time() < give_up:
            time.sleep(0.05)
            with spool:
                job = spool.load(number)
                assert job is not None
                if job["cancelled"]:
                    job["state"] = "done"
                    job["ended"] = time.time()
                    spool.save(job)
                    return 0
        with spool:
            job = spool.load(number)
            assert job is not None
            job.update({"state": "done", "ended": time.time(), "cancelled": True})
            spool.save(job)
        return 0
    host = socket.gethostname()
    nodefile = spool.path / f"nodefile.{number}"
    nodefile.write_text(f"{host}\n" * job["slots"])
    env = dict(os.environ)
    env.update({"PBS_JOBID": job["id"], "PBS_NODEFILE": str(nodefile),
                "LSB_JOBID": job["id"], "LSB_DJOB_HOSTFILE": str(nodefile),
                "COBALT_JOBID": job["id"], "FAKE_FLUX_JOBID": f58(int(job["id"]))
                if flavour == "flux" else ""})
    if flavour == "cobalt":
        (spool.path / f"cobalt_nodes.{number}").write_text(f"{host}\n" * job["nodes"])
        env["COBALT_NODEFILE"] = str(spool.path / f"cobalt_nodes.{number}")
    env["FAKE_FLUX_NODES"] = str(job["nodes"])
    env.update(job.get("env") or {})
    with spool:
        job = spool.load(number)
        assert job is not None
        if job["cancelled"]:
            job["state"] = "done"
            job["ended"] = time.time()
            spool.save(job)
            return 0
        proc = subprocess.Popen(["bash", job["script"]], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd=os.path.expanduser("~"))
        job["state"] = "running"
        job["pgid"] = proc.pid
        job["started"] = time.time()
        spool.save(job)
    _, wait_status, used = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(wait_status)
    with spool:
        job = spool.load(number)
        assert job is not None
        job.update({"state": "done", "ended": time.time()})
        usage.record_usage(job, used)
        if code < 0:
            job["signal"] = -code
        else:
            job["exit"] = code
        spool.save(job)
    return 0


def cancel(spool: Spool, flavour: str, text: str) -> str:
    """'gone', 'unknown' or 'ok'."""
    with spool:
        job = load_by_id(spool, flavour, text)
        if job is None:
            return "unknown"
        if job["state"] == "done":
            return "gone"
        job["cancelled"] = True
        spool.save(job)
        if job["state"] == "running" and job["pgid"]:
            try:
                os.killpg(job["pgid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
    return "ok"


# ---------------------------------------------------------------------------------- status

def pbs_fields(job: Dict[str, Any]) -> Dict[str, Any]:
    state = {"queued": "H" if job["queue"] == "held" else "Q", "running": "R",
             "done": "F"}[job["state"]]
    fields: Dict[str, Any] = {
        "Job_Name": job["name"], "Job_Owner": "user@fakehost", "job_state": state,
        "queue": job["queue"], "server": "fakepbs",
        "Resource_List": {"walltime": "00:10:00", "nodect": job["nodes"]},
        "substate": {"Q": 10, "H": 20, "R": 42}.get(state, 92),
        "Variable_List": "PBS_O_HOME=/root,PBS_O_WORKDIR=/tmp",
    }
    if job["state"] == "done":
        fields["resources_used"] = {"walltime": "00:00:01"}
        usage.pbs_usage(fields, job)
        if job["cancelled"]:
            fields["substate"] = 91
        ran = job.get("started") is not None
        if ran:
            fields["Exit_status"] = (256 + job["signal"]) if job["signal"] else job["exit"]
            fields["comment"] = ("Job run at Mon Jan 01 at 00:00 on (fakehost:ncpus=1) and "
                                 + ("terminated" if job["cancelled"] else "finished"))
        else:
            fields["comment"] = "Job deleted before it ran"
    elif job["state"] == "running":
        fields["comment"] = "Job run at Mon Jan 01 at 00:00 on (fakehost:ncpus=1)"
    return fields


def pbs_array_fields(job: Dict[str, Any], elements: List[Dict[str, Any]]) -> Dict[str, Any]:
    states = {e["state"] for e in elements}
    letter = "F" if states == {"done"} else "Q" if states == {"queued"} else "B"
    return {"Job_Name": job["name"], "Job_Owner": "user@fakehost", "job_state": letter,
            "queue": job["queue"], "server": "fakepbs", "array": "True",
            "array_indices_submitted": f"{elements[0]['index']}-{elements[-1]['index']}"}


def qstat_pbs(spool: Spool, ids: List[str], subjobs: bool) -> int:
    jobs: Dict[str, Any] = {}
    code = 0
    for text in ids:
        job = load_by_id(spool, "pbs", text)
        if job is None:
            sys.stderr.write(f"qstat: Unknown Job Id {text}\n")
            code = 153
            continue
        if job.get("elements"):
            elements = elements_of(spool, job)
            jobs[job["id"]] = pbs_array_fields(job, elements)
            for element in elements if subjobs else []:
                fields = pbs_fields(element)
                if element["state"] == "done":
                    fields["job_state"] = "X"  # a subjob that ended
                jobs[element["id"]] = fields
            continue
        jobs[job["id"]] = pbs_fields(job)
    if jobs or code == 0:
        print(json.dumps({"timestamp": int(time.time()), "pbs_version": "19.1.3",
                          "pbs_server": "fakepbs", "Jobs": jobs}, indent=4))
    return code


def qstat_torque(spool: Spool, ids: List[str]) -> int:
    code = 0
    for text in ids:
        number = number_of("torque", text)
        job = spool.load(number) if number is not None else None
        if job is None:
            sys.stderr.write(f"qstat: Unknown Job Id Error {text}\n")
            code = 153
            continue
        state = {"queued": "H" if job["queue"] == "held" else "Q", "running": "R",
                 "done": "C"}[job["state"]]
        lines = [f"Job Id: {job['id']}", f"    Job_Name = {job['name']}",
                 "    Job_Owner = user@fakehost", f"    job_state = {state}",
                 f"    queue = {job['queue']}", "    Resource_List.walltime = 00:10:00",
                 # A long value, wrapped the way qstat wraps it.
                 "    Variable_List = PBS_O_QUEUE=batch,PBS_O_HOME=/root,PBS_O_LOGNAME=root,",
                 "\tPBS_O_PATH=/usr/bin:/bin,PBS_O_SHELL=/bin/bash,PBS_O_WORKDIR=/tmp"]
        if job["state"] == "done" and job.get("started") is not None:
            status = 271 if job["cancelled"] else job["exit"] if job["exit"] is not None \
                else 256 + job["signal"]
            lines += [f"    exit_status = {status}", *usage.torque_lines(job)]
        print("\n".join(lines) + "\n")
    return code


def bjobs(spool: Spool, args: List[str]) -> int:
    fields = ["jobid"]
    ids: List[str] = []
    as_json = False
    no_header = False
    name = None  # -J NAME: the unfinished jobs of that name
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-o":
            fields = args[i + 1].split()
            i += 1
        elif a == "-J":
            name = args[i + 1]
            i += 1
        elif a == "-json":
            as_json = True
        elif a == "-noheader":
            no_header = True
        elif not a.startswith("-"):
            ids.append(a)
        i += 1
    selected: List[Optional[Dict[str, Any]]] = []
    asked: List[str] = []
    for text in ids:
        job = load_by_id(spool, "lsf", text)
        # An array's id stands for each of its elements.
        for one in elements_of(spool, job) if job is not None and job.get("elements") \
                else [job]:
            selected.append(one)
            asked.append(text)
    ids = asked
    if name is not None:
        selected = [j for j in spool.all() if not j.get("elements") and j["name"] == name
                    and j["state"] != "done"]
        if not selected:
            sys.stderr.write(f"Job <{name}> is not found\n")
            return 255
        ids = [str(j["number"]) for j in selected]
    elif not ids:
        selected = [j for j in spool.all() if not j.get("elements")]
        ids = [str(j["number"]) for j in selected if j is not None]
    if os.environ.get("LSB_BJOBS_CONSISTENT_EXIT_CODE") == "Y" \
            and all(job is None for job in selected):
        # With this lsf.conf setting bjobs exits 255 when it finds none of the jobs.
        sys.stderr.write("".join(f"Job <{text}> is not found\n" for text in ids)
                         or "No job found\n")
        return 255
    records = []
    for text, job in zip(ids, selected):
        if job is None:
            records.append({"ERROR": f"Job <{text}> is not found"})
            continue
        if job["state"] == "queued":
            stat = "PSUSP" if job["queue"] == "held" else "PEND"
        elif job["state"] == "running":
            stat = "RUN"
        else:
            stat = "DONE" if job["exit"] == 0 and not job["cancelled"] else "EXIT"
        code = ""
        if job["state"] == "done":
            value = job["exit"] if job["exit"] is not None else 128 + (job["signal"] or 2)
            code = "" if value == 0 else str(value)
        values = {"JOBID": str(job.get("parent") or job["number"]),
                  "JOBINDEX": str(job.get("index") or 0), "STAT": stat, "EXIT_CODE": code,
                  "EXIT_REASON": "TERM_OWNER: job killed by owner" if job["cancelled"] else "",
                  **(usage.lsf_usage(job) if job["state"] == "done" else {})}
        records.append({f.upper(): values.get(f.upper(), "") for f in fields})
    if as_json:
        print(json.dumps({"COMMAND": "bjobs", "JOBS": len(records), "RECORDS": records},
                         indent=2))
        return 0
    if not no_header:
        print(" ".join(f.upper() for f in fields))
    for r in records:
        if "ERROR" in r:
            sys.stderr.write(r["ERROR"] + "\n")
        else:
            print(" ".join(r[f.upper()] for f in fields))
    return 0


def qstat_cobalt(spool: Spool, args: List[str]) -> int:
    if "-u" in args:
        print("JobID\n=====")
        for job in spool.all():
            if job["state"] not in ("done", "array"):
                print(job["number"])
        return 0
    ids = [a for a in args if a.isdigit()]
    blocks = []
    for text in ids:
        found = spool.load(int(text))
        if found is None or found["state"] == "done":
            continue  # Cobalt forgets a job as soon as it has ended
        state = {"queued": "user_hold" if found["queue"] == "held" else "queued",
                 "running": "running"}[found["state"]]
        blocks.append(f"JobID: {found['number']}\n    State : {state}\n")
    if not blocks:
        return 1
    print("\n".join(blocks))
    return 0


def flux_fields(job: Dict[str, Any]) -> Dict[str, str]:
    values = {"id.f58": f58(int(job["id"])), "id": job["id"], "exception.type": "",
              "exception.note": "", "result": "", "returncode": "", "urgency": "16",
              **usage.flux_usage(job)}
    if job["state"] == "queued":
        values["state"] = "SCHED"
        if job["queue"] == "held":  # as `flux job urgency ID hold` leaves a job
            values["urgency"] = "0"
    elif job["state"] == "running":
        values["state"] = "RUN"
    else:
        values["state"] = "INACTIVE"
        ran = job.get("started") is not None
        if job["cancelled"]:
            values.update({"result": "CANCELED", "exception.type": "cancel",
                           "returncode": str(-(job["signal"] or 15)) if ran else "-128"})
        elif job["signal"]:
            values.update({"result": "FAILED", "returncode": str(-job["signal"])})
        else:
            values.update({"result": "COMPLETED" if job["exit"] == 0 else "FAILED",
                           "returncode": str(job["exit"])})
    return values


def render_format(fmt: str, values: Dict[str, str]) -> str:
    return re.sub(r"\{([\w.]+)\}", lambda m: values[m.group(1)], fmt)


def flux(spool: Spool, args: List[str]) -> int:
    command, rest = args[0], args[1:]
    if command == "batch":
        return submit(spool, "flux", rest[-1])
    if command == "getattr" and rest == ["jobid"]:
        print(os.environ["FAKE_FLUX_JOBID"])
        return 0
    if command == "job" and rest[:2] == ["id", "--to=dec"]:
        text = rest[2]
        print(from_f58(text) if text[:1] in ("\u0192", "f") else int(text))
        return 0
    if command == "exec" and rest[:2] == ["-r", "all"]:
        for _ in range(int(os.environ.get("FAKE_FLUX_NODES", "1"))):
            subprocess.run(rest[2:], check=False)
        return 0
    if command == "cancel":
        outcome = cancel(spool, "flux", rest[0])
        if outcome != "ok":
            sys.stderr.write(f"flux-cancel: ERROR: {rest[0]}: "
                             f"{'job is inactive' if outcome == 'gone' else 'unknown job'}\n")
            return 1
        return 0
    if command == "jobs":
        fmt = "{id.f58}"
        ids = []
        name = option(rest, "--name")  # the active jobs of that name
        i = 0
        while i < len(rest):
            if rest[i] == "-o":
                fmt = rest[i + 1]
                i += 1
            elif not rest[i].startswith("-"):
                ids.append(rest[i])
            i += 1
        selected = []
        for text in ids:
            number = number_of("flux", text)
            job = spool.load(number) if number is not None else None
            if job is None:
                sys.stderr.write(f"{text}: not found\n")
            else:
                selected.append(job)
        if not ids:
            selected = spool.all()
        if name is not None:
            selected = [j for j in selected if j["name"] == name and j["state"] != "done"]
        for job in selected:
            print(render_format(fmt, flux_fields(job)))
        return 0
    sys.stderr.write(f"flux: unknown command {command}\n")
    return 1


# ---------------------------------------------------------------------------------- main

def main(argv: List[str]) -> int:
    spool = Spool(argv[0])
    flavour, command, args = argv[1], argv[2], argv[3:]
    if command == "_run":
        return run(spool, flavour, int(args[0]))
    if flavour == "flux":
        return flux(spool, [command, *args])
    if command == "qsub":
        script = [a for a in args if not a.startswith("-") and a != "script"]
        return submit(spool, flavour, script[-1])
    if command == "bsub":
        return submit(spool, flavour, None)
    if command == "qstat":
        if flavour == "pbs":
            return qstat_pbs(spool, [a for a in args if not a.startswith("-")
                                     and a not in ("json",)], "-t" in args)
        if flavour == "torque":
            return qstat_torque(spool, [a for a in args if not a.startswith("-")])
        return qstat_cobalt(spool, args)
    if command == "bjobs":
        return bjobs(spool, args)
    if command in ("qdel", "bkill"):
        outcome = cancel(spool, flavour, args[-1])
        messages = {
            ("pbs", "gone"): (f"qdel: Job has finished {args[-1]}", 35),
            ("pbs", "unknown"): (f"qdel: Unknown Job Id {args[-1]}", 153),
            ("torque", "gone"): ("qdel: Request invalid for state of job MSG=invalid state for "
                                 f"job - COMPLETE {args[-1]}", 168),
            ("torque", "unknown"): (f"qdel: Unknown Job Id Error {args[-1]}", 153),
            ("lsf", "gone"): (f"Job <{args[-1]}>: Job has already finished", 255),
            ("lsf", "unknown"): (f"Job <{args[-1]}>: No matching job found", 255),
            ("cobalt", "unknown"): (f"job {args[-1]} not found", 1),
        }
        if outcome != "ok" and (flavour, outcome) in messages:
            text, code = messages[(flavour, outcome)]
            sys.stderr.write(text + "\n")
            return code
        if flavour == "lsf":
            print(f"Job <{args[-1]}> is being terminated")
        return 0
    if command == "qselect":
        name = option(args, "-N")
        for job in spool.all():
            if job["state"] not in ("done", "array") and name in (None, job["name"]):
                print(job["id"])
        return 0
    sys.stderr.write(f"{command}: not faked\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
