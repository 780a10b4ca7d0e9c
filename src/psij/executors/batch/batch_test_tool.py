"""``batch-test``: a small fake batch scheduler on this machine, for tests of the batch layer.

It has the parts of a real scheduler that the batch layer depends on, so that the whole code
path (submit script, submit, status polling, cancel, accounting, exit-code files) runs for real:

    python batch_test_tool.py --spool DIR submit SCRIPT        prints the new job id
    python batch_test_tool.py --spool DIR status [--keep-finished S] ID...
                                                              one "ID|STATE|REASON" line per
                                                              job still in the queue
    python batch_test_tool.py --spool DIR cancel ID
    python batch_test_tool.py --spool DIR hold ID             keep a pending job HELD
    python batch_test_tool.py --spool DIR release ID          let a HELD job go on
    python batch_test_tool.py --spool DIR signal N ID        sends signal N to the job's script
    python batch_test_tool.py --spool DIR list
    python batch_test_tool.py --spool DIR acct ID...          "ID|STATE|EXIT|REASON" of jobs
                                                              that ended
    python batch_test_tool.py --spool DIR show ID             the job's parsed directives (JSON)

Directives are ``#BATCH_TEST --option=value`` lines, parsed the way sbatch parses ``#SBATCH``
lines (quotes group, backslash escapes the next character, ``#`` outside quotes ends the line).
Options: ``--job-name``, ``--time`` (h:mm:ss), ``--queue-delay`` (seconds the job stays QUEUED),
``--hold`` (the job waits in the state HELD until ``release``, as ``sbatch --hold`` does),
``--export=NONE`` (the script starts with only a login's basic variables, as sbatch's option does)
and any other ``--name[=value]`` (recorded only). Each job runs detached, with
``BATCH_TEST_JOB_ID`` in its environment, under a watcher process that enforces the time limit and
records the end state. As Slurm does, ``cancel`` sends TERM to the job's script alone (not its
process group) and KILL to the whole group five seconds later, so that a script can pass the
TERM on and the job can clean up; ``signal`` (as ``scancel --batch --signal``) sends a signal
to the script alone. A finished job stays in the queue for
``--keep-finished`` seconds (default 5), then only accounting knows it.

A ``faults`` file in the spool folder makes ``status`` misbehave on purpose: its words
(``ok``, ``nonzero``, ``hang``, ``garbage``) are used in turn, one per status call.

The spool holds the jobs' scripts, and so their environment: it must be a private directory
(see ``psij/_private_dirs.py``, loaded from its file since ``python -S`` has no site-packages),
and what the tool writes in it is 0700 (folders) or 0600 (files).

Standard library only, so that it starts fast with ``python -S``. It is a test double: it never
talks to a real scheduler.
"""

import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Tuple

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
CANCEL_GRACE = 5.0  # seconds between the TERM and the KILL of a cancelled job


def _private_dirs() -> ModuleType:
    """psij's ``_private_dirs`` module, loaded from its file (no import of the package)."""
    return _psij_module("_private_dirs")


def _spawn() -> ModuleType:
    """psij's process layer (``_spawn``), by which this tool starts every process."""
    return _psij_module("_spawn")


def _psij_module(name: str) -> ModuleType:
    """A standard-library-only module of psij, loaded from its file (``python -S`` has no
    site-packages, so no import of the package)."""
    loaded = sys.modules.get(f"psij.{name}")
    if loaded is not None:
        return loaded
    path = Path(__file__).resolve().parents[2] / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"psij.{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _create(path: Path, text: str, append: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    with open(os.open(path, flags, 0o600), "w", encoding="utf-8",
              errors="surrogateescape") as f:
        f.write(text)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    _create(tmp, text)
    os.replace(tmp, path)


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


class _Locked:
    """An exclusive lock on a file of the spool (for counters)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def __enter__(self) -> int:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self.fd

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _next_number(path: Path) -> int:
    with _Locked(path) as fd:
        data = os.pread(fd, 64, 0).decode().strip()
        n = int(data) + 1 if data else 1
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(n).encode(), 0)
        return n


def parse_directive_line(line: str) -> List[str]:
    """The words of a directive line after its prefix, split the way sbatch does."""
    words: List[str] = []
    current: List[str] = []
    in_word = False
    quote = ""
    escaped = False
    for ch in line:
        if escaped:
            current.append(ch)
            escaped = False
            in_word = True
            continue
        if ch == "\\":
            escaped = True
            in_word = True
            continue
        if quote:
            if ch == quote:
                quote = ""
            else:
                current.append(ch)
            continue
        if ch in "\"'":
            quote = ch
            in_word = True
            continue
        if ch == "#":
            break
        if ch.isspace():
            if in_word:
                words.append("".join(current))
                current = []
                in_word = False
            continue
        current.append(ch)
        in_word = True
    if in_word:
        words.append("".join(current))
    return words


def parse_directives(script: str) -> Dict[str, Optional[str]]:
    options: Dict[str, Optional[str]] = {}
    for line in script.splitlines():
        if not line.startswith("#BATCH_TEST"):
            continue
        for word in parse_directive_line(line[len("#BATCH_TEST"):]):
            if not word.startswith("--"):
                raise ValueError(f"directive word {word!r} is not an --option")
            name, sep, value = word[2:].partition("=")
            options[name] = value if sep else None
    return options


def _seconds(hms: str) -> float:
    parts = [float(p) for p in hms.split(":")]
    total = 0.0
    for p in parts:
        total = total * 60 + p
    return total


class Spool:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.jobs = root / "jobs"
        _private_dirs().ensure_private_dir(self.jobs, "batch-test spool", within=root)

    def job_dir(self, job_id: str) -> Path:
        if not job_id.isdigit():
            raise ValueError(f"invalid job id {job_id!r}")
        return self.jobs / job_id

    def state(self, job_id: str) -> Optional[Tuple[str, str, str, float]]:
        """(state, exit code, reason, time of the last change) or None for unknown jobs."""
        text = _read(self.job_dir(job_id) / "state")
        if text is None:
            return None
        state, code, reason, when = text.strip().split("|")
        return state, code, reason, float(when)

    def set_state(self, job_id: str, state: str, code: str = "", reason: str = "None") -> None:
        _write(self.job_dir(job_id) / "state", f"{state}|{code}|{reason}|{time.time()}\n")
        if state in FINAL:
            with _Locked(self.root / "accounting.lock"):
                _create(self.root / "accounting", f"{job_id}|{state}|{code}|{reason}\n",
                        append=True)


def cmd_submit(spool: Spool, script_path: str) -> int:
    # Bytes, as a real scheduler takes a script (a name may hold any byte but NUL and "/").
    text = Path(script_path).read_bytes().decode("utf-8", "surrogateescape")
    try:
        options = parse_directives(text)
    except ValueError as e:
        print(f"batch-test: error: {e}", file=sys.stderr)
        return 1
    job_id = str(_next_number(spool.root / "next_id"))
    d = spool.job_dir(job_id)
    d.mkdir(0o700)
    _create(d / "script", text)
    _create(d / "options.json", json.dumps(options))
    held = "hold" in options and options["hold"] not in ("False", "false", "0")
    if held:
        _create(d / "hold", "")
    spool.set_state(job_id, "HELD" if held else "PENDING")
    watcher = _spawn().popen([sys.executable, "-S", os.path.abspath(__file__), "--spool",
                              str(spool.root), "_watch", job_id], env=None)
    watcher.returncode = 0  # it outlives this command, which never waits for it
    print(job_id)
    return 0


_LOGIN_VARIABLES = ("HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ")


def _job_environment(options: Dict[str, Optional[str]]) -> Dict[str, str]:
    """The submitter's environment, or with ``--export=NONE`` only what a login would set."""
    if options.get("export") != "NONE":
        return dict(os.environ)
    env = {k: os.environ[k] for k in _LOGIN_VARIABLES if k in os.environ}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return env


def cmd_watch(spool: Spool, job_id: str) -> int:
    d = spool.job_dir(job_id)
    options = json.loads((d / "options.json").read_text())
    delay = float(options.get("queue-delay") or 0)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline or (d / "hold").exists():
        if (d / "cancel").exists():
            spool.set_state(job_id, "CANCELLED", "", "CancelledWhilePending")
            return 0
        if not (d / "hold").exists() and (spool.state(job_id) or ("",))[0] == "HELD":
            spool.set_state(job_id, "PENDING")  # released
        time.sleep(0.05)
    if (d / "cancel").exists():
        spool.set_state(job_id, "CANCELLED", "", "CancelledWhilePending")
        return 0
    env = _job_environment(options)
    env["BATCH_TEST_JOB_ID"] = job_id
    proc = _spawn().popen(["/bin/bash", str(d / "script")], cwd=str(d), env=env)
    _write(d / "pgid", str(proc.pid))
    spool.set_state(job_id, "RUNNING")
    limit = _seconds(options["time"]) if options.get("time") else None
    started = time.monotonic()
    timed_out = False
    kill_at: Optional[float] = None
    while True:
        try:
            code = proc.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            pass
        if kill_at is None and (d / "cancel").exists():
            # As Slurm does: TERM to the script (unless cmd_cancel could), KILL after the grace
            # period.
            if _read(d / "cancel") != "signalled":
                _signal_script(proc.pid, signal.SIGTERM)
            kill_at = time.monotonic() + CANCEL_GRACE
        if kill_at is not None and time.monotonic() >= kill_at:
            _kill(proc.pid)
        if limit is not None and time.monotonic() - started > limit and not timed_out:
            timed_out = True
            _kill(proc.pid)
    _kill(proc.pid)  # whatever the job left running in its group
    if (d / "cancel").exists():
        spool.set_state(job_id, "CANCELLED", str(_status(code)), "CancelledByUser")
    elif timed_out:
        spool.set_state(job_id, "TIMEOUT", str(_status(code)), "TimeLimit")
    elif code == 0:
        spool.set_state(job_id, "COMPLETED", "0")
    else:
        spool.set_state(job_id, "FAILED", str(_status(code)), "NonZeroExitCode")
    return 0


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def _kill(pgid: int, signum: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, signum)
    except OSError:
        pass


def _signal_script(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except OSError:
        return False


def _fault(spool: Spool) -> str:
    text = _read(spool.root / "faults")
    if not text or not text.split():
        return "ok"
    words = text.split()
    n = _next_number(spool.root / "faults.count")
    return words[(n - 1) % len(words)]


def cmd_status(spool: Spool, ids: List[str], keep_finished: float) -> int:
    fault = _fault(spool)
    if fault == "nonzero":
        print("batch-test: error: the scheduler is not answering (injected fault)",
              file=sys.stderr)
        return 1
    if fault == "hang":
        time.sleep(3600)
        return 1
    if fault == "garbage":
        print("\x1b[31m%%% core dumped %%%\x00 ~~~ batch-test garbage ~~~")
        for job_id in ids[:3]:
            print(f"{job_id}|RUNNING|")  # incomplete: a valid line amid garbage
        print("Segmentation fault (garbage injected)")
        return 0
    now = time.time()
    for job_id in ids:
        st = spool.state(job_id)
        if st is None:
            continue
        state, _code, reason, when = st
        if state in FINAL and now - when > keep_finished:
            continue  # purged from the queue
        print(f"{job_id}|{state}|{reason}")
    return 0


def cmd_cancel(spool: Spool, job_id: str) -> int:
    st = spool.state(job_id)
    if st is None:
        print(f"batch-test: error: invalid job id {job_id}", file=sys.stderr)
        return 1
    if st[0] in FINAL:
        print(f"batch-test: error: job {job_id} has already finished", file=sys.stderr)
        return 2
    d = spool.job_dir(job_id)
    pid = _read(d / "pgid")
    # "signalled": the watcher need not send the TERM (it does when the job had not started).
    _create(d / "cancel", "signalled" if pid else "")
    if pid:
        _signal_script(int(pid), signal.SIGTERM)
    return 0


def cmd_signal(spool: Spool, signum: str, job_id: str) -> int:
    st = spool.state(job_id)
    if st is None:
        print(f"batch-test: error: invalid job id {job_id}", file=sys.stderr)
        return 1
    pid = _read(spool.job_dir(job_id) / "pgid")
    if st[0] in FINAL or not signum.isdigit():
        print(f"batch-test: error: job {job_id} has already finished" if st[0] in FINAL
              else f"batch-test: error: invalid signal {signum!r}", file=sys.stderr)
        return 2
    if st[0] != "RUNNING" or not pid or not _signal_script(int(pid), int(signum)):
        print(f"batch-test: error: job {job_id} is not running", file=sys.stderr)
        return 1
    return 0


def cmd_hold(spool: Spool, job_id: str, hold: bool) -> int:
    st = spool.state(job_id)
    if st is None or st[0] not in ("PENDING", "HELD"):
        print(f"batch-test: error: job {job_id} is not pending", file=sys.stderr)
        return 1
    d = spool.job_dir(job_id)
    if hold:
        _create(d / "hold", "")
        spool.set_state(job_id, "HELD")
    else:
        try:
            os.unlink(d / "hold")
        except FileNotFoundError:
            pass
    return 0


def cmd_acct(spool: Spool, ids: List[str]) -> int:
    wanted = set(ids)
    text = _read(spool.root / "accounting") or ""
    for line in text.splitlines():
        if line.split("|", 1)[0] in wanted:
            print(line)
    return 0


def main(argv: List[str]) -> int:
    if len(argv) < 3 or argv[0] != "--spool":
        print(__doc__, file=sys.stderr)
        return 2
    try:
        spool = Spool(Path(argv[1]))
    except OSError as e:  # an unsafe spool (UnsafePathError) included
        print(f"batch-test: error: {e}", file=sys.stderr)
        return 2
    command, args = argv[2], argv[3:]
    if command == "submit" and len(args) == 1:
        return cmd_submit(spool, args[0])
    if command == "_watch" and len(args) == 1:
        return cmd_watch(spool, args[0])
    if command == "status":
        keep = 5.0
        if args[:1] == ["--keep-finished"]:
            keep = float(args[1])
            args = args[2:]
        return cmd_status(spool, args, keep)
    if command == "cancel" and len(args) == 1:
        return cmd_cancel(spool, args[0])
    if command in ("hold", "release") and len(args) == 1:
        return cmd_hold(spool, args[0], command == "hold")
    if command == "signal" and len(args) == 2:
        return cmd_signal(spool, args[0], args[1])
    if command == "list":
        for d in sorted(spool.jobs.iterdir(), key=lambda p: int(p.name)):
            print(d.name)
        return 0
    if command == "acct":
        return cmd_acct(spool, args)
    if command == "show" and len(args) == 1:
        print((spool.job_dir(args[0]) / "options.json").read_text())
        return 0
    print(f"batch-test: error: unknown command {' '.join(argv[2:])!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
