"""``psij.futures`` on the real Slurm and Grid Engine started by tests/setup (run under
``flock -s /tmp/psij-test-schedulers.lock``): a value and an exception come back from a job; a
call whose job is removed from the queue, killed, or stopped at its time limit fails with
:class:`FunctionJobError` saying how the job ended; ``map`` of 500 goes as one array and gives
its results in order; the futures of a client killed with SIGKILL (while its calls ran, or
as soon as the job registry had their jobs) are re-attached.

All the calls of both schedulers are submitted together by a module fixture, so that the slow
ones (the time limit needs a minute on Slurm, the 500 calls of ``map`` most of the run) go on
alongside the others; each test then checks its own. Every job goes ahead of other work on the
shared schedulers (nice -10000, priority 1000). Without a running scheduler the tests skip,
saying why.
"""

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import types
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import cloudpickle
import pytest

from psij import JobAttributes, JobExecutor
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.futures import (
    FunctionExecutor,
    FunctionFuture,
    FunctionJobError,
    RemoteTraceback,
    reattach,
)
from real.test_batch_real import _need, _scheduler_problem
from support.campaigns import Campaigns

# The functions below travel to the jobs whole: the jobs need not import this module (and
# pytest with it).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SCHEDULERS = [pytest.param("slurm", marks=pytest.mark.slurm),
              pytest.param("sge", marks=pytest.mark.sge)]
PRIORITY = {"slurm.nice": -10000, "sge.p": 1000}
# Slurm counts time limits in minutes; Grid Engine in seconds.
LIMIT = {"slurm": timedelta(minutes=1), "sge": timedelta(seconds=5)}
SHOWN_LIMIT = {"slurm": "0:01:00", "sge": "0:00:05"}
N_MAP = 500
WAIT_S = 240.0
REMOVE = {"slurm": "scancel", "sge": "qdel"}


# -- what the jobs run ------------------------------------------------------------------------


def job_of_call(x: int) -> Dict[str, Any]:
    """``x`` squared, and the scheduler's id of the job it ran in."""
    return {"square": x * x, "slurm": os.environ.get("SLURM_JOB_ID"),
            "sge": os.environ.get("JOB_ID")}


def _check_value(x: int) -> None:
    if x > 5:
        raise ValueError(f"no value for {x}: over 5")


def fails(x: int) -> int:
    _check_value(x)
    return x


def marks_then_sleeps(marker: str, seconds: float) -> str:
    """Writes its process id to ``marker`` (once running), then sleeps."""
    with open(marker + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    time.sleep(seconds)
    return "slept"


def gated_square(x: int, gate: str) -> int:
    """``x`` squared, once ``gate`` exists."""
    while not os.path.exists(gate):
        time.sleep(0.2)
    return x * x


def mapped(x: int) -> int:
    return 3 * x + 1


def renamed(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A copy of ``fn`` called ``name``."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__,
                              fn.__closure__)
    copy.__qualname__ = name
    return copy


# -- the calls of one scheduler -----------------------------------------------------------------


class Campaign:
    """The calls given to one scheduler at the start of the module."""

    def __init__(self, name: str, work: Path) -> None:
        self.name = name
        self.work = work
        config = BatchSchedulerExecutorConfig(work_directory=work / "psij",
                                              queue_polling_interval=1,
                                              initial_queue_polling_delay=0.5)
        self.jobs = JobExecutor.get_instance(name, config=config)
        attributes = JobAttributes(duration=timedelta(minutes=10), custom_attributes=PRIORITY)
        self.ex = FunctionExecutor(self.jobs, attributes=attributes)
        self.limited = FunctionExecutor(self.jobs, attributes=JobAttributes(
            duration=LIMIT[name], custom_attributes=PRIORITY))
        self.futures: Dict[str, FunctionFuture] = {
            "value": self.ex.submit(job_of_call, 12),
            "raised": self.ex.submit(fails, 7),
            "removed": self.ex.submit(marks_then_sleeps, str(work / "removed.pid"), 300),
            "killed": self.ex.submit(marks_then_sleeps, str(work / "killed.pid"), 300),
            "time limit": self.limited.submit(marks_then_sleeps, str(work / "limit.pid"), 600),
        }
        # A name of its own, so that the scheduler's records of the array are told apart
        # from any other run's (a function job is named after its function).
        self.map_name = f"mapped_{secrets.token_hex(4)}"
        self.mapped = renamed(mapped, self.map_name)
        self.map_results: Optional[List[int]] = None
        self.map_error: Optional[BaseException] = None
        self.map_done = threading.Event()
        threading.Thread(target=self._map, daemon=True).start()

    def _map(self) -> None:
        try:
            self.map_results = list(self.ex.map(self.mapped, range(N_MAP), timeout=WAIT_S * 2))
        except BaseException as ex:
            self.map_error = ex
        finally:
            self.map_done.set()

    def wait_for_marker(self, key: str) -> int:
        """The process id the call ``key`` wrote once running."""
        path = self.work / {"removed": "removed.pid", "killed": "killed.pid"}[key]
        deadline = time.monotonic() + WAIT_S
        while not path.exists():
            future = self.futures[key]
            assert not future.done(), future.exception()
            assert time.monotonic() < deadline, f"{self.name}: call {key} never started"
            time.sleep(0.2)
        return int(path.read_text())

    def close(self) -> None:
        for future in self.futures.values():
            if not future.done():
                try:
                    future.job.cancel()
                except Exception:
                    pass
        if not self.map_done.is_set():
            # The whole array at once, by its name.
            argv = (["scancel", f"--name=fn:{self.map_name}"] if self.name == "slurm"
                    else ["qdel", f"fn_{self.map_name}"])
            subprocess.run(argv, capture_output=True, timeout=60)
        self.ex.shutdown(wait=False, cancel_futures=True)
        self.limited.shutdown(wait=False, cancel_futures=True)
        self.jobs.close()


_campaigns = Campaigns(Campaign, lambda name: _scheduler_problem(name) is None)


@pytest.fixture(scope="module")
def campaign_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("futures")
    _campaigns.close_all(Campaign.close)


def campaign(name: str, root: Path) -> Campaign:
    """The scheduler's campaign (the other scheduler's calls are submitted too, so both run
    at the same time)."""
    _need(name)
    return _campaigns.get(name, root)


def job_error(future: FunctionFuture) -> FunctionJobError:
    error = future.exception(WAIT_S)
    assert isinstance(error, FunctionJobError), repr(error)
    return error


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULERS)
def test_value_comes_back_from_a_job_of_the_scheduler(name: str, campaign_root: Path) -> None:
    future = campaign(name, campaign_root).futures["value"]
    value = future.result(WAIT_S)
    assert value["square"] == 144
    # It ran in the job the future names, on that scheduler.
    native = str(future.job.native_id)
    assert value[name] == (native if name == "slurm" else native.split(".")[0]), value


@pytest.mark.parametrize("name", SCHEDULERS)
def test_exception_comes_back_with_type_message_and_remote_traceback(
        name: str, campaign_root: Path) -> None:
    future = campaign(name, campaign_root).futures["raised"]
    error = future.exception(WAIT_S)
    assert type(error) is ValueError, repr(error)
    assert str(error) == "no value for 7: over 5"
    cause = error.__cause__
    assert isinstance(cause, RemoteTraceback), repr(cause)
    # The compute side's frames, from the function down to the one that raised.
    assert re.search(r"^Traceback \(most recent call last\):\n.*, in fails\n(.*\n)?.*, in "
                     r"_check_value\n", cause.text, re.M), cause.text
    assert re.search(r"^ValueError: no value for 7: over 5$", cause.text, re.M), cause.text


@pytest.mark.parametrize("name", SCHEDULERS)
def test_job_removed_from_the_queue_fails_its_call_saying_so(
        name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    c.wait_for_marker("removed")
    future = c.futures["removed"]
    subprocess.run([REMOVE[name], str(future.job.native_id)], check=True,
                   capture_output=True, timeout=60)
    error = job_error(future)
    assert error.native_id == future.job.native_id
    # Slurm says the job was cancelled; Grid Engine's qdel ends it with SIGTERM, which the
    # job's exit code file shows.
    ended = {"slurm": "CANCELED", "sge": "FAILED"}[name]
    assert f"the job ended {ended} after the call had started without a result" in str(error)
    if name == "sge":
        assert "SIGTERM" in str(error) and "exit code 143" in str(error), error


@pytest.mark.parametrize("name", SCHEDULERS)
def test_job_whose_process_is_killed_fails_its_call_with_the_signal(
        name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    os.kill(c.wait_for_marker("killed"), signal.SIGKILL)
    error = job_error(c.futures["killed"])
    assert "the job ended FAILED after the call had started without a result" in str(error)
    assert "exit code 137" in str(error), error


@pytest.mark.parametrize("name", SCHEDULERS)
def test_time_limit_fails_the_call_with_the_schedulers_reason(
        name: str, campaign_root: Path) -> None:
    error = job_error(campaign(name, campaign_root).futures["time limit"])
    assert "the job ended FAILED after the call had started without a result" in str(error)
    assert "time limit" in str(error) and SHOWN_LIMIT[name] in str(error), error


@pytest.mark.parametrize("name", SCHEDULERS)
def test_map_of_500_is_one_array_with_results_in_order(name: str, campaign_root: Path) -> None:
    c = campaign(name, campaign_root)
    assert c.map_done.wait(WAIT_S * 2), f"{name}: map of {N_MAP} not done"
    assert c.map_error is None, repr(c.map_error)
    assert c.map_results == [3 * x + 1 for x in range(N_MAP)]
    # A function job is named fn:<function> (fn_<function> on Grid Engine, which takes no
    # colon in a name).
    job_name = f"fn{':' if name == 'slurm' else '_'}{c.map_name}"
    # The accounting records a job a moment after it ended.
    deadline = time.monotonic() + 30
    elements = scheduler_records(name, job_name)
    while len(elements) < N_MAP and time.monotonic() < deadline:
        time.sleep(0.5)
        elements = scheduler_records(name, job_name)
    assert len({element for _, element in elements}) == len(elements) == N_MAP, elements[:5]
    assert len({array for array, _ in elements}) == 1, sorted(elements)[:5]


def scheduler_records(name: str, job_name: str) -> List[Tuple[str, ...]]:
    """(array id, element) of every job named ``job_name`` in the scheduler's accounting."""
    if name == "slurm":
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-S", "now-1hours",
                              f"--name={job_name}", "-o", "JobID"], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return [tuple(line.split("_", 1)) for line in out.split()]
    # qacct exits 1 while it has no record of the job.
    out = subprocess.run(["qacct", "-j", job_name], capture_output=True, text=True,
                         timeout=60).stdout
    numbers = re.findall(r"^jobnumber\s+(\d+)", out, re.M)
    tasks = re.findall(r"^taskid\s+(\S+)", out, re.M)
    return list(zip(numbers, tasks))


CLIENT = """
import sys, time
from datetime import timedelta
from psij import JobAttributes
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig
from psij.futures import FunctionExecutor

name, work, gate, flush = sys.argv[1:]

def gated_square(x, gate):
    import os, time
    open(f"{gate}.{x}", "w").close()
    while not os.path.exists(gate):
        time.sleep(0.2)
    return x * x

config = BatchSchedulerExecutorConfig(work_directory=work, queue_polling_interval=1,
                                      initial_queue_polling_delay=0.5)
ex = FunctionExecutor(name, config=config, attributes=JobAttributes(
    duration=timedelta(minutes=10), custom_attributes=PRIORITY))
futures = [ex.submit(gated_square, x, gate) for x in range(3)]
if flush == "flush":  # the registry's records written, as docs/futures.rst asks
    import psij.registry
    psij.registry.flush()
print(" ".join(f.job_id for f in futures), flush=True)
time.sleep(600)
"""


def reattach_after_sigkill(name: str, tmp_path: Path, calls_started: bool) -> None:
    """A client submits three calls, says their jobs' ids and is killed with SIGKILL (once
    its calls run, or as soon as it said the ids, which it then says once the job registry
    wrote their records); the calls' futures are re-attached here and give their results."""
    _need(name)
    work, gate = tmp_path / "work", tmp_path / "gate"
    script = CLIENT.replace("PRIORITY", repr(PRIORITY))
    client = subprocess.Popen([sys.executable, "-c", script, name, str(work), str(gate),
                               "" if calls_started else "flush"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert client.stdout is not None
        ids = client.stdout.readline().split()
        assert len(ids) == 3, ids
        deadline = time.monotonic() + WAIT_S
        # Each call waits for the gate once started.
        while calls_started and not all(Path(f"{gate}.{x}").exists() for x in range(3)):
            assert client.poll() is None and time.monotonic() < deadline, "calls not started"
            time.sleep(0.2)
        os.kill(client.pid, signal.SIGKILL)
        client.wait()
        futures = reattach(ids, work_directory=str(work))
        assert [f.job_id for f in futures] == ids
        # Nothing could have come yet: every call waits for the gate.
        assert not any(f.done() for f in futures)
        gate.touch()
        assert [f.result(WAIT_S) for f in futures] == [0, 1, 4]
    finally:
        gate.touch()  # whatever runs ends
        if client.poll() is None:
            client.kill()
            client.wait()
        if client.stdout is not None:
            client.stdout.close()


@pytest.mark.parametrize("name", SCHEDULERS)
def test_futures_of_a_client_killed_with_sigkill_while_they_run_are_reattached(
        name: str, tmp_path: Path) -> None:
    reattach_after_sigkill(name, tmp_path, calls_started=True)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_futures_of_a_client_killed_once_the_registry_has_their_jobs_are_reattached(
        name: str, tmp_path: Path) -> None:
    reattach_after_sigkill(name, tmp_path, calls_started=False)
