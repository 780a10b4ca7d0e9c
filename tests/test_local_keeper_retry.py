"""A start the system refuses for now (EAGAIN, ENOMEM: no process or memory to spare) is tried
again by the keeper, with a growing wait, and runs once when the system lets it; refused so for
the keeper's bound, the job fails saying why; meanwhile the keeper goes on reaping, answering and
signalling, and a job it holds so still runs after its submitter was killed.

The keeper runs from a copy whose process layer (``psij/_spawn.py``, which it loads from two
folders above its file) is the real one behind a stand-in ``start``: a job whose environment
has ``REFUSE`` is refused (``N`` times, ``always``, or ``while:PATH`` exists), with the errno
in ``REFUSE_ERRNO`` (EAGAIN by default), each refusal a line in the file ``REFUSE_LOG``.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

import psij
from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors._process_watch import ProcessWatch
from psij.executors.local import _keeper, _keeper_client
from psij.job_executor_config import JobExecutorConfig
from support.process_checks import alive, keepers_with

TIMEOUT = 120.0
REAL_LAYER = Path(psij.__file__).parent / "_spawn.py"
BOUND_LINE = "_RETRY_SECONDS = 60.0\n"

LAYER = '''"""The process layer, refusing the starts of the jobs that ask for it."""
import errno, importlib.util, os

_spec = importlib.util.spec_from_file_location("psij_real_spawn", {real!r})
_real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
_refused = {{}}


def start(argv, directory, env, streams, **options):
    how = env.get("REFUSE")
    if how is not None:
        key = env["REFUSE_KEY"]
        count = _refused[key] = _refused.get(key, 0) + 1
        if how == "always" or (how.startswith("while:") and os.path.exists(how[6:])) \\
                or (how.isdigit() and count <= int(how)):
            with open(env["REFUSE_LOG"], "a") as f:
                f.write(key + "\\n")
            code = int(env.get("REFUSE_ERRNO", errno.EAGAIN))
            raise OSError(code, os.strerror(code))
    return _real.start(argv, directory, env, streams, **options)
'''


def refusing_keeper(root: Path, bound: Optional[float] = None) -> Path:
    """A copy of the keeper under ``root/psij`` with the refusing process layer (and the given
    bound on refusals, in seconds); its file."""
    folder = root / "psij" / "executors" / "local"
    folder.mkdir(parents=True)
    text = Path(_keeper.__file__).read_text()
    assert text.count(BOUND_LINE) == 1
    if bound is not None:
        text = text.replace(BOUND_LINE, f"_RETRY_SECONDS = {bound!r}\n")
    (folder / "_keeper.py").write_text(text)
    for part in ("_keeper_rows.py", "_keeper_kills.py"):
        (folder / part).write_text(Path(_keeper.__file__).with_name(part).read_text())
    (root / "psij" / "_spawn.py").write_text(LAYER.format(real=str(REAL_LAYER)))
    return folder / "_keeper.py"


def executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             bound: Optional[float] = None) -> JobExecutor:
    """A local executor whose jobs go to one refusing keeper of its own (its own watch)."""
    monkeypatch.setattr(_keeper_client, "_PROGRAM", str(refusing_keeper(tmp_path, bound)))
    monkeypatch.setenv("PSIJ_LOCAL_KEEPERS", "1")
    ex = JobExecutor.get_instance("local", config=JobExecutorConfig(
        work_directory=tmp_path / "work"))
    ex._watch = ProcessWatch()  # type: ignore[attr-defined]
    return ex


def job(tmp_path: Path, key: str, refuse: Optional[str] = None, script: str = "",
        code: int = errno.EAGAIN) -> Job:
    """A job appending its key to ``tmp_path/ran`` (then running ``script``), refused as
    ``refuse`` says."""
    env: Dict[str, str] = {}
    if refuse is not None:
        env = {"REFUSE": refuse, "REFUSE_KEY": key, "REFUSE_LOG": str(tmp_path / "refused"),
               "REFUSE_ERRNO": str(code)}
    return Job(JobSpec("/bin/sh", ["-c", f"echo {key} >> {tmp_path / 'ran'}; {script}"],
                       environment=env))


def lines(path: Path) -> List[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("code", [errno.EAGAIN, errno.ENOMEM])
def test_a_start_refused_for_now_is_tried_again_and_runs_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        code: int) -> None:
    ex = executor(tmp_path, monkeypatch)
    jobs = [job(tmp_path, "first", "3", code=code), job(tmp_path, "second"),
            job(tmp_path, "third", "2", code=code)]
    ex.submit_many(jobs)
    for one in jobs:
        status = one.wait(timeout=TIMEOUT)
        assert status is not None and (status.state, status.exit_code) == \
            (JobState.COMPLETED, 0), status
        assert one.native_id is not None and one.native_id.isdigit()
    assert sorted(lines(tmp_path / "ran")) == ["first", "second", "third"]
    assert sorted(lines(tmp_path / "refused")) == ["first"] * 3 + ["third"] * 2


def test_the_wait_before_each_try_doubles_from_10_ms_up_to_1_s_until_the_bound() -> None:
    import types

    state = types.SimpleNamespace(refused_since=0.0, retry_at=0.0, retry_wait=0.0)
    waits, since = [], []
    for _ in range(10):
        before = time.monotonic()
        assert _keeper.Keeper.refused_for_now(state, errno.EAGAIN)
        waits.append(state.retry_wait)
        since.append(state.refused_since)
        assert state.retry_at > before
    assert since == [since[0]] * 10  # counted from the first refusal
    # The wait of each try is the one before it: 10 ms, 20 ms, ... then 1 s.
    assert waits == [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0, 1.0, 1.0]
    assert not _keeper.Keeper.refused_for_now(state, errno.EPERM)  # not a refusal for now
    state.refused_since -= _keeper._RETRY_SECONDS  # refused so for the whole bound
    assert not _keeper.Keeper.refused_for_now(state, errno.ENOMEM)


def test_a_start_refused_otherwise_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = executor(tmp_path, monkeypatch)
    refused = job(tmp_path, "refused", "always", code=errno.E2BIG)
    ex.submit(refused)
    status = refused.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.FAILED
    assert status.message is not None and status.message.startswith(
        "could not start '/bin/sh': Argument list too long")
    assert lines(tmp_path / "refused") == ["refused"]  # not tried again
    assert lines(tmp_path / "ran") == []


def test_starts_refused_past_the_bound_fail_saying_why_and_the_next_jobs_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = executor(tmp_path, monkeypatch, bound=1.0)
    refused, after = job(tmp_path, "refused", "always"), job(tmp_path, "after")
    ex.submit_many([refused, after])
    status = refused.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.FAILED
    assert status.message == (
        "could not start '/bin/sh': Resource temporarily unavailable (starts were refused so "
        "for 1 s: the system's limit on processes, ulimit -u, or its memory was reached)")
    assert len(lines(tmp_path / "refused")) > 1  # tried again before failing
    status = after.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.COMPLETED
    assert lines(tmp_path / "ran") == ["after"]


def test_while_a_start_waits_the_keeper_reaps_answers_and_signals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = executor(tmp_path, monkeypatch)
    gate, busy = tmp_path / "gate", tmp_path / "busy"
    busy.touch()
    running = job(tmp_path, "running", script=f"while [ ! -e {gate} ]; do sleep 0.05; done")
    canceled = job(tmp_path, "canceled", script="sleep 600")
    ex.submit_many([running, canceled])
    assert running.native_id is not None and canceled.native_id is not None  # started
    waiting = job(tmp_path, "waiting", f"while:{busy}")
    ex.submit(waiting)
    deadline = time.monotonic() + TIMEOUT
    while not (tmp_path / "refused").exists():
        assert time.monotonic() < deadline, "the start was never tried"
        time.sleep(0.01)
    # Exit reports, signals and other requests are answered while it waits.
    gate.touch()
    status = running.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.COMPLETED
    canceled.cancel()
    status = canceled.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.CANCELED
    [keeper] = _keeper_client._KEEPERS[(_keeper_client._PID[0], id(ex._watch))]  # type: ignore
    keeper.flush()  # answered, without waiting for the start
    assert keeper.alive and not waiting.status.state.final
    refusals = len(lines(tmp_path / "refused"))
    assert refusals >= 1
    busy.unlink()
    status = waiting.wait(timeout=TIMEOUT)
    assert status is not None and status.state is JobState.COMPLETED
    assert sorted(lines(tmp_path / "ran")) == ["canceled", "running", "waiting"]


KILLED = r"""
import os, signal, sys, time
from psij.executors.local import _keeper_client
_keeper_client._PROGRAM = sys.argv[1]
import psij
base, busy = sys.argv[2], sys.argv[3]
ex = psij.JobExecutor.get_instance("local")
env = {"REFUSE": "while:" + busy, "REFUSE_KEY": "held", "REFUSE_LOG": base + "/refused"}
job = psij.Job(psij.JobSpec("/bin/sh", ["-c", f"echo held >> {base}/ran"], environment=env))
ex.submit(job)
print(job.id, flush=True)
while not os.path.exists(base + "/refused"):
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("runs", [True, False])
def test_a_start_waiting_when_its_submitter_is_killed_runs_or_fails_and_is_recorded(
        tmp_path: Path, runs: bool) -> None:
    home, busy = tmp_path / "home", tmp_path / "busy"
    home.mkdir()
    busy.touch()
    env = dict(os.environ, HOME=str(home), PSIJ_LOCAL_KEEPERS="1")
    program = refusing_keeper(tmp_path, None if runs else 1.0)
    with subprocess.Popen([sys.executable, "-c", KILLED, str(program), str(tmp_path),
                           str(busy)], env=env, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        job_id = child.stdout.readline().strip()
        assert child.wait(timeout=TIMEOUT) == -signal.SIGKILL
    keepers = _keepers_with(f"HOME={home}")
    assert keepers, "the keeper ended with a job to start"
    if runs:
        busy.unlink()
    deadline = time.monotonic() + TIMEOUT
    while any(alive(pid) for pid in keepers):
        assert time.monotonic() < deadline, "the keeper did not end"
        time.sleep(0.05)
    assert lines(tmp_path / "ran") == (["held"] if runs else [])
    done = subprocess.run([str(Path(sys.executable).parent / "psij"), "status", "--json",
                           job_id], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)
    if runs:
        assert (row["state"], row["exit_code"]) == ("COMPLETED", 0)
        assert row["native_id"].isdigit()
    else:
        assert (row["state"], row["final"]) == ("FAILED", True)
        assert row["message"] == (
            "could not start the job: spawn: Resource temporarily unavailable (starts were "
            "refused so for 1 s: the system's limit on processes, ulimit -u, or its memory "
            "was reached)")


def _keepers_with(mark: str) -> List[int]:
    """The keepers whose environment holds ``mark`` (NAME=value)."""
    return keepers_with(mark)
