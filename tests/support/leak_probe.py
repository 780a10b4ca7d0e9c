"""Creates, uses and drops executors of one kind in this process, and says what was left.

Run as ``python leak_probe.py KIND COUNT [URL]`` in a fresh directory, with ``TMPDIR`` and
``HOME`` folders of its own (:func:`run_probe` makes them and runs it). For each of COUNT
executors: made with ``JobExecutor.get_instance``, one ``/bin/true`` job submitted and waited
for, then executor and job dropped without ``close()``. Then, for up to ``PROBE_WAIT`` seconds
(1 by default, after a ``gc.collect()`` each time), the process's threads, open descriptors,
child processes and the files under the current directory, ``TMPDIR`` and ``~/.psij`` are
read again until nothing is left beyond what was there before the first executor but what
psij keeps once per process on purpose. One JSON object on stdout says what was found:
``start``/``end`` (the figures), ``shared`` and ``leaked`` (what is there beyond the start: what
psij keeps once per process on purpose, listed below, and the rest: thread names, descriptor
targets, child processes with their state and command, paths), ``seconds`` (from the last
drop to the end figures), ``look_seconds`` (what reading the figures once took: all of
``/proc`` is read for the children) and ``run_seconds`` (the time the executors took).

KIND: ``pilot``, ``local``, ``batch-test`` (the fake scheduler), ``flow`` (URL: the socket
of a running flow service), ``remote`` (URL: an ``ssh://`` URL; ``local`` on its other
side), ``served-pilot`` (URL: the socket of a running ``psij pilot serve``),
``futures-local`` or ``futures-pilot`` (a ``psij.futures.FunctionExecutor`` over ``local`` or
an in-process ``pilot``, given one call of a function instead of a job and dropped without
``shutdown()``).
"""

import contextlib
import gc
import json
import os
import re
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

WAIT = timedelta(seconds=120)


# What psij keeps once per process on purpose, whatever the number of executors (see the
# "What an executor leaves behind" section of docs/architecture.rst): the registry writer
# thread (it ends after 2 s without writes) and the registry files it keeps open; for local
# jobs the keeper (a child process), the process watch thread and the two worker threads
# (and the spares of the starts, see below),
# with their pipes, sockets and epoll descriptor; the launcher scripts written once per work
# directory and the local executor's node files; the fake scheduler's own spool (its state,
# as a real scheduler's); the work directories themselves (``~/.psij/work`` and one folder
# in it per executor kind); the remote side's lock of submissions (the stand-in ssh runs it
# here, as this user: one file per user, kept); the signing key of function calls, made once
# per work directory (``functions/key``: results are checked with it, by ``reattach`` too).
SHARED_THREADS = {"psij-registry-writer", "psij-local-starts", "psij-local-worker",
                  "psij-process-watch"}
# The spare threads of the local starts (16 at most, started while the others are all in a
# task, each ending after a second without one): counted neither as kept nor as leaked
# (tests/test_local_starts.py checks that they end).
SPARE_THREADS = re.compile(r"^psij-local-starts-\d+$")
LOCAL_KINDS = ("local", "futures-local")  # the kinds whose jobs run on local
REGISTRY = re.compile(r"/jobs\.sqlite(-wal|-shm|-journal)?$")
LOCAL_DESCRIPTORS = re.compile(r"^(/dev/null|anon_inode:\[eventpoll\]|pipe:\[\d+\]|"
                               r"socket:\[\d+\])$")
SHARED_PATHS = re.compile(r"/(jobs\.sqlite(-wal|-shm|-journal)?|launchers(/.*)?|"
                          r"batch-test-spool(/.*)?|local/nodefile-\d+|\.psij|\.psij/work|"
                          r"work|work/[\w-]+|work/remote/submit\.lock|work/functions/key)$")


def threads() -> List[str]:
    return sorted(t.name for t in threading.enumerate())


def descriptors() -> Dict[str, str]:
    found: Dict[str, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed already
    return found


def children() -> Dict[int, str]:
    """This process's child processes (zombies included), with their state and command."""
    me = os.getpid()
    found: Dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == me:
            found[int(name)] = f"[{fields[0]}] {command or stat[:stat.rfind(')') + 1]}"
    return found


def paths(roots: List[Path]) -> Set[str]:
    found: Set[str] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                found.add(os.path.join(dirpath, name))
    return found


def figures(roots: List[Path]) -> Dict[str, Any]:
    return {"threads": threads(), "descriptors": descriptors(), "children": children(),
            "paths": sorted(paths(roots))}


def beyond(start: Dict[str, Any], now: Dict[str, Any], kind: str) -> Tuple[Dict[str, Any],
                                                                         Dict[str, Any]]:
    """What ``now`` has beyond ``start``: (what psij keeps per process on purpose, the rest)."""
    shared: Dict[str, List[str]] = {"threads": [], "descriptors": [], "children": [],
                                    "paths": []}
    leaked: Dict[str, List[str]] = {"threads": [], "descriptors": [], "children": [],
                                    "paths": []}
    extra = list(now["threads"])
    for name in start["threads"]:
        if name in extra:
            extra.remove(name)
    for name in extra:
        if SPARE_THREADS.match(name):
            continue  # there for a second after a busy moment, whatever the executors
        ok = name in SHARED_THREADS and name not in shared["threads"]
        (shared if ok else leaked)["threads"].append(name)
    for fd, target in sorted(now["descriptors"].items()):
        if start["descriptors"].get(fd) == target:
            continue
        ok = bool(REGISTRY.search(target)) or (
            kind in LOCAL_KINDS and bool(LOCAL_DESCRIPTORS.match(target)))
        # Pipes and sockets named without their inode: the same shared ones in every run.
        (shared if ok else leaked)["descriptors"].append(re.sub(r"\[\d+\]", "", target))
    for pid, command in sorted(now["children"].items()):
        if pid in start["children"]:
            continue
        ok = kind in LOCAL_KINDS and "/local/_keeper.py" in command \
            and not shared["children"] and not command.startswith("[Z]")
        (shared if ok else leaked)["children"].append("keeper" if ok else command)
    for path in sorted(set(now["paths"]) - set(start["paths"])):
        (shared if SHARED_PATHS.search(path) else leaked)["paths"].append(path)
    for found in (shared, leaked):
        for key in found:
            found[key].sort()
    return shared, leaked


def make(kind: str, url: Optional[str], work: Path) -> Any:
    from psij import JobExecutor, JobExecutorConfig

    if kind == "pilot":
        return JobExecutor.get_instance("pilot")
    if kind == "served-pilot":
        return JobExecutor.get_instance("pilot", url=url)
    if kind == "local":
        return JobExecutor.get_instance("local")
    if kind == "batch-test":
        from psij.executors.batch.batch_test import BatchTestExecutorConfig
        return JobExecutor.get_instance("batch-test", config=BatchTestExecutorConfig(
            work_directory=work, queue_polling_interval=0.05,
            initial_queue_polling_delay=0.01))
    if kind == "flow":
        from psij.flows.executor import FlowJobExecutorConfig
        return JobExecutor.get_instance("flow", url=url, config=FlowJobExecutorConfig(
            poll_interval=0.05, lease=60, provisioning_lease=30))
    if kind == "remote":
        return JobExecutor.get_instance("local", url=url,
                                        config=JobExecutorConfig(work_directory=work))
    raise SystemExit(f"unknown kind {kind!r}")


def use(kind: str, url: Optional[str], work: Path) -> None:
    """One executor made, given one job (or call), and dropped (by returning)."""
    from psij import Job, JobSpec, JobState

    if kind.startswith("futures-"):
        from psij.futures import FunctionExecutor

        functions = FunctionExecutor(kind[len("futures-"):])
        if functions.submit(os.getpid).result(WAIT.total_seconds()) == os.getpid():
            raise SystemExit(f"{kind}: the call ran in this process")
        return
    executor = make(kind, url, work)
    job = Job(JobSpec("/bin/true"))
    executor.submit(job)
    status = job.wait(WAIT)
    if status is None or status.state is not JobState.COMPLETED:
        raise SystemExit(f"{kind}: a job ended {status!r}")


def main() -> None:
    kind, count = sys.argv[1], int(sys.argv[2])
    url = sys.argv[3] if len(sys.argv) > 3 else None
    wait = float(os.environ.get("PROBE_WAIT", "1"))
    here = Path.cwd()
    roots = [here, Path(os.environ["TMPDIR"]), Path.home() / ".psij"]
    work = here / "work"
    import psij  # noqa: F401  (imported before the start figures)

    gc.collect()
    start = figures(roots)
    began = time.monotonic()
    for _ in range(count):
        use(kind, url, work)
    dropped = time.monotonic()
    while True:
        gc.collect()
        looked = time.monotonic()
        now = figures(roots)
        shared, leaked = beyond(start, now, kind)
        seconds = time.monotonic() - dropped
        look = time.monotonic() - looked
        if not any(leaked.values()) or seconds > wait:
            break
        time.sleep(0.02)
    names = [(str(Path(os.environ["TMPDIR"])), "$TMPDIR"), (str(Path.home()), "~"),
             (str(here), ".")]

    def shown(found: Dict[str, List[str]]) -> Dict[str, List[str]]:
        """Paths named from the folders of the run (the same in every run)."""
        for key in ("descriptors", "paths"):
            for i, value in enumerate(found[key]):
                for root, name in names:
                    if value == root or value.startswith(root + "/"):
                        found[key][i] = name + value[len(root):]
                        break
        return found

    print(json.dumps({
        "kind": kind, "count": count,
        "start": {key: len(value) for key, value in start.items()},
        "end": {key: len(value) for key, value in now.items()},
        "shared": shown(shared), "leaked": shown(leaked), "seconds": round(seconds, 3),
        "look_seconds": round(look, 3),
        "run_seconds": round(dropped - began, 3)}))


# -- the parent's side ----------------------------------------------------------------------

# A stand-in for ssh: runs the command given after "-- HOST" on this machine, so that a remote
# executor's connection is a real child process running ``psij remote serve``.
_FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift 2
exec /bin/sh -c "$1"
"""
_PSIJ = """#!/bin/sh
exec {python} -m psij "$@"
"""


@contextlib.contextmanager
def served_pilot(folder: Path) -> Iterator[str]:
    """A ``psij pilot serve`` on 2 cores, its socket in a short-named folder (a socket's path
    has at most about 100 bytes), its work directory in ``folder``: its URL, while in the
    ``with``; stopped (SIGTERM) after."""
    import shutil
    import subprocess
    import tempfile

    from psij.executors.pilot.service import answering

    folder.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp(prefix="pj"))
    socket = str(short / "pilot.sock")
    with open(folder / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "psij", "pilot", "serve", "--socket",
                                 socket, "--cores", "2", "--wd", str(folder / "wd")],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not answering(socket, timeout=1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"psij pilot serve did not start: "
                                   f"{(folder / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.02)
        yield f"unix://{socket}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(short, ignore_errors=True)


def remote_url(folder: Path) -> Tuple[str, Dict[str, str]]:
    """An ``ssh://`` URL reaching ``psij remote serve`` on this machine through the stand-in
    ssh made in ``folder``, and the environment that makes the remote executor use it."""
    folder.mkdir(parents=True, exist_ok=True)
    ssh, psij = folder / "ssh", folder / "psij"
    ssh.write_text(_FAKE_SSH)
    psij.write_text(_PSIJ.format(python=sys.executable))
    for made in (ssh, psij):
        made.chmod(0o700)
    return f"ssh://localhost?psij={psij}", {"PSIJ_SSH_COMMAND": str(ssh)}


def run_probe(kind: str, count: int, folder: Path, url: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, wait: float = 1.0,
              timeout: float = 600.0) -> Dict[str, Any]:
    """Run this probe in a child process, in ``folder`` (made, with its own ``TMPDIR`` and
    ``HOME``), for up to ``wait`` seconds after the last executor was dropped; its report."""
    import subprocess

    home, tmp = folder / "home", folder / "tmp"
    for made in (home, tmp):
        made.mkdir(parents=True)
    child_env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp),
                 "PROBE_WAIT": str(wait), **(env or {})}
    argv = [sys.executable, str(Path(__file__).resolve()), kind, str(count)]
    done = subprocess.run(argv + ([url] if url is not None else []), cwd=folder,
                          env=child_env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} probe exited with {done.returncode}:\n"
                           f"{done.stderr[-3000:]}")
    report: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


if __name__ == "__main__":
    main()
