"""The package's one process-spawning layer (``psij._spawn``), run for real: what a started
program gets (its own group or session, default signal actions, descriptors 0-2 only, its
directory and environment), the words and codes of a failure to start, the keeper loading the
layer from its file, and that no module starts a process any other way."""

import ast
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Set, Tuple

import pytest

import psij
from psij import Job, JobExecutor, JobSpec, JobState
from psij._spawn import (
    LaunchError,
    launch_error,
    on_path,
    popen,
    posix_spawn_is_safe,
    spawn,
    start,
)
from psij.executors._process import LaunchError as ProcessLaunchError
from psij.executors.local import LocalJobExecutorConfig, _keeper, _keeper_client
from support.process_checks import without_inheritable_descriptors

LIMIT = 60.0  # only against a hang: no result depends on it
# What the program itself sees: its ids, its open descriptors (the one ``listdir`` used is
# closed again, so it is left out), its directory, and what its standard input is.
PROBE = ("import json, os\n"
         "fds = [int(n) for n in os.listdir('/proc/self/fd')]\n"
         "def is_open(fd):\n"
         "    try:\n"
         "        os.fstat(fd)\n"
         "        return True\n"
         "    except OSError:\n"
         "        return False\n"
         "print(json.dumps({'pid': os.getpid(), 'pgid': os.getpgid(0), 'sid': os.getsid(0),\n"
         "                  'fds': sorted(fd for fd in fds if is_open(fd)),\n"
         "                  'cwd': os.getcwd(), 'stdin': os.readlink('/proc/self/fd/0')}))\n")
MODES = ["posix_spawn", "posix_spawn_chdir", "popen"]


def reap(pid: int) -> int:
    """Wait for our child ``pid``; its exit code."""
    deadline = time.monotonic() + LIMIT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        assert time.monotonic() < deadline, f"{pid} did not end"
        time.sleep(0.01)


@pytest.fixture
def leaked() -> Iterator[int]:
    """An inheritable descriptor of this process, which no started program may get."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    yield w
    os.close(r)
    os.close(w)


@pytest.fixture
def no_inheritable_descriptors() -> Iterator[None]:
    with without_inheritable_descriptors():
        assert posix_spawn_is_safe()
        yield


def run_in(mode: str, tmp_path: Path, argv: List[str], env: Dict[str, str],
           monkeypatch: pytest.MonkeyPatch, **options: Any) -> Tuple[bytes, int]:
    """Start ``argv`` in ``tmp_path/work`` the way ``mode`` names; its stdout and the number
    of posix_spawn calls made."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    calls = []
    real = os.posix_spawn

    def counted(*args: Any, **kwargs: Any) -> int:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "posix_spawn", counted)
    if mode == "posix_spawn":
        monkeypatch.chdir(work)
    else:
        monkeypatch.chdir(tmp_path)  # a change of directory is undone after the test
    out = tmp_path / "out"
    with open(out, "wb") as f, open(os.devnull, "rb") as devnull:
        pid = start(argv, str(work), env, (devnull.fileno(), f.fileno(), 2),
                    posix_spawn=mode != "popen", may_chdir=mode == "posix_spawn_chdir",
                    **options)
    assert reap(pid) == 0
    return out.read_bytes(), len(calls)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("session", [False, True], ids=["group", "session"])
@pytest.mark.usefixtures("no_inheritable_descriptors")
def test_a_started_program_leads_its_group_with_only_its_streams(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, session: bool,
        leaked: int) -> None:
    if mode != "popen":  # posix_spawn cannot close it: the caller vouches there is none
        os.set_inheritable(leaked, False)
        assert posix_spawn_is_safe()
    else:
        assert not posix_spawn_is_safe()
    out, spawns = run_in(mode, tmp_path, [sys.executable, "-I", "-S", "-c", PROBE],
                         {"PATH": os.environ["PATH"]}, monkeypatch, session=session)
    seen = json.loads(out)
    assert seen["pgid"] == seen["pid"]
    if session or sys.version_info < (3, 11):  # before 3.11 a new group is a new session
        assert seen["sid"] == seen["pid"]
    else:
        assert seen["sid"] == os.getsid(0)
    assert seen["fds"] == [0, 1, 2]
    assert seen["cwd"] == str(tmp_path / "work")
    assert seen["stdin"] == "/dev/null"
    assert spawns == (0 if mode == "popen" else 1)


def ignored_signals(status: bytes) -> Set[int]:
    """The signals a ``/proc/<pid>/status`` says are ignored."""
    for line in status.decode().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    raise AssertionError(f"no SigIgn in {status!r}")


@pytest.mark.parametrize("mode", MODES)
def test_signals_python_ignores_have_their_default_action_in_the_program(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    # cat changes no signal: its status shows what it was started with. USR1 is ignored here
    # after this process started (on purpose, as a caller would), not inherited.
    before = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        out, _ = run_in(mode, tmp_path, ["cat", "/proc/self/status"],
                        {"PATH": os.environ["PATH"]}, monkeypatch)
        out_restored, _ = run_in(mode, tmp_path, ["cat", "/proc/self/status"],
                                 {"PATH": os.environ["PATH"]}, monkeypatch,
                                 restore=(signal.SIGUSR1,))
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # Python's own
    ignored = ignored_signals(out)
    assert signal.SIGPIPE not in ignored and signal.SIGXFSZ not in ignored
    assert signal.SIGUSR1 in ignored  # kept, unless asked: ignored on purpose by the caller
    assert signal.SIGUSR1 not in ignored_signals(out_restored)


@pytest.mark.parametrize("posix_spawn", [True, False])
def test_signals_ignored_when_this_process_started_have_their_default_action_in_a_job(
        tmp_path: Path, posix_spawn: bool) -> None:
    # A process started in the background of a script ignores INT and QUIT, under nohup HUP:
    # a job it starts gets them back, as a scheduler would start it.
    code = ("import os, sys; from psij import _spawn\n"
            "r, w = os.pipe()\n"
            "pid = _spawn.start(['cat', '/proc/self/status'], os.getcwd(), dict(os.environ), "
            f"(0, w, 2), posix_spawn={posix_spawn})\n"
            "os.close(w); os.waitpid(pid, 0)\n"
            "sys.stdout.buffer.write(os.read(r, 65536))\n")
    done = subprocess.run(["bash", "-c", 'trap "" INT QUIT HUP; exec "$0" -c "$1"',
                           sys.executable, code], capture_output=True, timeout=LIMIT,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ignored = ignored_signals(done.stdout)
    assert not ignored & {signal.SIGINT, signal.SIGQUIT, signal.SIGHUP}, ignored


@pytest.mark.parametrize("mode", MODES)
def test_the_program_gets_exactly_the_environment_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    env = {"PATH": os.environ["PATH"], "ONLY": "this one", "EMPTY": ""}
    monkeypatch.setenv("NOT_GIVEN", "x")
    out, _ = run_in(mode, tmp_path, ["env", "-0"], env, monkeypatch)
    assert dict(item.split("=", 1) for item in out.decode().split("\0") if item) == env


@pytest.mark.parametrize("mode", MODES)
def test_a_failure_to_start_has_the_shells_code_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.chdir(tmp_path)
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    folder = tmp_path / "folder"
    folder.mkdir()
    env = {"PATH": str(tmp_path)}
    options = {"posix_spawn": mode != "popen", "may_chdir": mode == "posix_spawn_chdir"}
    where = str(tmp_path if mode == "posix_spawn" else folder)

    def fails(argv: List[str], env: Dict[str, str] = env) -> LaunchError:
        with pytest.raises(LaunchError) as caught:
            spawn(argv, where, env, (0, 1, 2), **options)
        return caught.value

    for missing in ([str(tmp_path / "absent")], ["psij-no-such-program"]):
        error = fails(missing)
        assert error.exit_code == 127
        assert str(error) == (f"executable {missing[0]!r} was not found (no such file, or "
                              "not on PATH)")
        assert isinstance(error.__cause__, FileNotFoundError)
    for not_executable in (str(plain), str(folder)):
        error = fails([not_executable])
        assert error.exit_code == 126 and str(error).startswith(
            f"executable {not_executable!r} cannot be executed (")
    error = fails(["/bin/true", "fine", "a\ud800"])
    assert error.exit_code is None
    assert str(error) == ("argument 2 ('a\\ud800'): it holds a lone surrogate, which no file "
                          "name or program can receive")
    assert isinstance(error.__cause__, UnicodeEncodeError)
    error = fails(["/bin/true"], {"PATH": "/bin", "BAD": "\udcff\ud800"})
    assert error.exit_code is None and str(error).startswith(
        "environment variable 'BAD' ('\\udcff\\ud800'): it holds a lone surrogate")
    assert ProcessLaunchError is LaunchError  # the one the executors catch


def test_a_keepers_errno_reads_as_the_same_failure() -> None:
    # The keeper reports an OSError by its errno: the words and codes are the layer's.
    argv = ["tool"]
    assert launch_error(OSError(2, "No such file or directory"), argv, {}).exit_code == 127
    assert launch_error(OSError(20, "Not a directory"), argv, {}).exit_code == 127
    assert launch_error(OSError(13, "Permission denied"), argv, {}).exit_code == 126
    assert str(launch_error(OSError(7, "Argument list too long"), argv, {})).startswith(
        "could not start 'tool': Argument list too long (the environment and arguments are")


def test_a_program_is_found_on_its_own_path_and_found_again_when_it_goes(
        tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "tool").write_text("#!/bin/sh\n")
        (folder / "tool").chmod(0o755)
    (first / "dir-tool").mkdir()
    env = {"PATH": f"{first}:{second}"}
    assert on_path("tool", env) == str(first / "tool")
    (first / "tool").unlink()  # the cached one is checked at each use
    assert on_path("tool", env) == str(second / "tool")
    with pytest.raises(FileNotFoundError):
        on_path("dir-tool", {"PATH": str(first)})  # a directory is no program


def test_the_popen_way_leaves_the_reaping_to_the_caller(tmp_path: Path) -> None:
    pid = start(["/bin/true"], str(tmp_path), {}, (0, 1, 2), posix_spawn=False)
    gc.collect()  # a Popen collected while it thinks its child runs would reap it itself
    assert reap(pid) == 0


def test_a_removed_working_directory_does_not_read_as_a_program_not_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert reap(start(["/bin/true"], str(tmp_path), {}, (0, 1, 2))) == 0


# -- helpers talked to through pipes ------------------------------------------------------------


def test_a_helper_gets_the_uniform_defaults(tmp_path: Path, leaked: int) -> None:
    passed_r, passed_w = os.pipe()
    try:
        proc = popen([sys.executable, "-I", "-S", "-c", PROBE], env={"PATH": "/bin"},
                     stdout=subprocess.PIPE, cwd=str(tmp_path), pass_fds=(passed_w,))
        out, _ = proc.communicate(timeout=LIMIT)
    finally:
        os.close(passed_r)
        os.close(passed_w)
    seen = json.loads(out)
    assert seen["sid"] == seen["pgid"] == seen["pid"] == proc.pid  # a session of its own
    assert seen["fds"] == [0, 1, 2, passed_w]  # not the inheritable one this process has
    assert seen["stdin"] == "/dev/null" and seen["cwd"] == str(tmp_path)
    status = popen(["cat", "/proc/self/status"], env=None, stdout=subprocess.PIPE)
    ignored = ignored_signals(status.communicate(timeout=LIMIT)[0])
    assert signal.SIGPIPE not in ignored and signal.SIGXFSZ not in ignored
    env = popen(["env", "-0"], env={"ONLY": "x"}, stdout=subprocess.PIPE, session=False)
    assert env.communicate(timeout=LIMIT)[0] == b"ONLY=x\0"


def test_a_helpers_wait_with_a_timeout_times_out_then_reaps(tmp_path: Path) -> None:
    proc = popen(["sleep", "60"], env=None)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.05)
    assert proc.returncode is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=LIMIT) == -signal.SIGKILL


def test_a_helper_that_cannot_start_raises_what_the_system_said() -> None:
    with pytest.raises(FileNotFoundError):
        popen(["/no/such/helper"], env=None)


# -- the keeper ---------------------------------------------------------------------------------


def test_a_keeper_started_job_is_the_keepers_child_and_runs(tmp_path: Path) -> None:
    ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
        work_directory=tmp_path / "work", keeper=True))
    job = Job(JobSpec("/bin/sh", ["-c", "echo $PPID"],
                      stdout_path=tmp_path / "out", directory=tmp_path))
    ex.submit(job)
    status = job.wait(timeout=LIMIT)
    assert status is not None and status.state is JobState.COMPLETED, status
    parent = int((tmp_path / "out").read_text().split()[0])
    assert parent != os.getpid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[:4] == [sys.executable.encode(), b"-I", b"-S",
                                             _keeper.__file__.encode()]
    missing = tmp_path / "missing"
    bad = Job(JobSpec(str(missing)))
    ex.submit(bad)
    status = bad.wait(timeout=LIMIT)
    assert status is not None and status.exit_code == 127


def keeper_copy(tmp_path: Path, link: bool) -> Path:
    """The keeper's file in ``tmp_path/executors/local``, a link to it or a copy (with its
    parts, ``_keeper_rows.py`` and ``_keeper_kills.py``, which it loads from beside its real
    file); without
    ``_spawn.py`` in ``tmp_path``, where the keeper looks for it."""
    folder = tmp_path / "executors" / "local"
    folder.mkdir(parents=True)
    path = folder / "_keeper.py"
    if link:
        path.symlink_to(_keeper.__file__)
    else:
        shutil.copy(_keeper.__file__, path)
        for part in ("_keeper_rows.py", "_keeper_kills.py"):
            shutil.copy(Path(_keeper.__file__).with_name(part), folder)
    return path


def run_keeper(path: Path) -> "subprocess.CompletedProcess[bytes]":
    ours, theirs = socket.socketpair()
    events_r, events_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(path), str(theirs.fileno()),
                                 str(events_w), "5"], pass_fds=(theirs.fileno(), events_w),
                                stderr=subprocess.PIPE)
        theirs.close()
        os.close(events_w)
        ours.close()  # the requester is gone: a keeper with no job ends
        _, err = proc.communicate(timeout=LIMIT)
    finally:
        os.close(events_r)
    return subprocess.CompletedProcess(proc.args, proc.returncode, b"", err)


def test_a_keeper_finds_the_layer_through_a_link_to_its_file(tmp_path: Path) -> None:
    done = run_keeper(keeper_copy(tmp_path, link=True))
    assert (done.returncode, done.stderr) == (0, b"")


def test_a_keeper_that_cannot_load_the_layer_ends_at_once_saying_so(tmp_path: Path) -> None:
    done = run_keeper(keeper_copy(tmp_path, link=False))
    assert done.returncode == _keeper.LAYER_FAILED
    assert b"keeper: cannot load the process layer" in done.stderr
    assert str(tmp_path / "_spawn.py").encode() in done.stderr


FALLBACK = """
import os, sys
from psij.executors.local import _keeper_client
_keeper_client._PROGRAM = sys.argv[1]  # a keeper whose process layer is not beside it
from psij import Job, JobExecutor, JobSpec
from psij.executors.local import LocalJobExecutorConfig
ex = JobExecutor.get_instance("local", config=LocalJobExecutorConfig(
    work_directory=sys.argv[2], keeper=True))
for out in sys.argv[3:]:
    job = Job(JobSpec("/bin/sh", ["-c", "echo $PPID"], stdout_path=out))
    ex.submit(job)
    status = job.wait(timeout=60)
    print(status.state, status.exit_code, os.getpid())
"""


def test_jobs_run_when_the_keeper_cannot_load_the_layer(tmp_path: Path) -> None:
    outs = [tmp_path / "first", tmp_path / "second"]
    done = subprocess.run([sys.executable, "-c", FALLBACK, str(keeper_copy(tmp_path, False)),
                           str(tmp_path / "work"), *map(str, outs)], capture_output=True,
                          text=True, timeout=LIMIT)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert [line[:2] for line in lines] == [["COMPLETED", "0"]] * 2
    for out, line in zip(outs, lines):
        assert out.read_text().strip() == line[2]  # started by the submitter itself
    # Said once, and no keeper is tried for the second job.
    assert done.stderr.count("the local jobs' keeper cannot load") == 1, done.stderr
    assert done.stderr.count("starting it here") == 1, done.stderr
    assert _keeper_client._LAYER_FAILED == _keeper.LAYER_FAILED


# -- no other way -------------------------------------------------------------------------------

SRC = Path(psij.__file__).parent
# Calls that start a process, by module and name.
STARTERS = {("subprocess", name) for name in ("Popen", "run", "call", "check_call",
                                              "check_output", "getoutput",
                                              "getstatusoutput")} | {
    ("os", name) for name in ("posix_spawn", "posix_spawnp", "fork", "forkpty", "system",
                              "popen", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl",
                              "spawnle", "spawnlp", "spawnlpe", "execv", "execve", "execvp",
                              "execvpe", "execl", "execle", "execlp", "execlpe")}
# Module (relative to the package) -> the starters it may still use, and why.
ALLOWED = {
    "_spawn.py": {f"{module}.{name}" for module, name in STARTERS},  # the layer itself
}


def starters_in(path: Path) -> Set[str]:
    """The process-starting names a module uses (calls, subclasses, passes on, imports by
    name), its type annotations left out."""
    tree = ast.parse(path.read_text(), str(path))
    annotations: Set[int] = set()
    for node in ast.walk(tree):
        for note in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if note is not None:
                annotations |= {id(part) for part in ast.walk(note)}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and (node.value.id, node.attr) in STARTERS and id(node) not in annotations:
            found.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os"):
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if (node.module, a.name) in STARTERS}
    return found


def test_no_module_starts_a_process_outside_the_layer() -> None:
    offenders = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        used = starters_in(path) - ALLOWED.get(rel, set())
        if used:
            offenders[rel] = sorted(used)
    assert offenders == {}, "start processes through psij._spawn (start/spawn or popen)"


def test_the_scan_sees_each_way_of_reaching_a_starter(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os, subprocess\nfrom subprocess import run\n"
                     "class P(subprocess.Popen): pass\n"
                     "def f(p: subprocess.Popen[bytes]) -> subprocess.Popen[str]:\n"
                     "    return os.fork or os.posix_spawn\n")
    assert starters_in(probe) == {"subprocess.run", "subprocess.Popen", "os.fork",
                                  "os.posix_spawn"}
