"""``psij.futures.reattach``: the futures of function jobs made again, from the job registry,
by a process other than the one that submitted them (killed with SIGKILL meanwhile)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from psij import Job, JobExecutor, JobExecutorConfig, JobSpec
from psij.futures import FunctionFuture, reattach

TESTS = Path(__file__).resolve().parent
WAIT = 60

CLIENT = textwrap.dedent("""
    import json, sys, time
    import psij.registry
    from psij import JobExecutorConfig
    from psij.futures import FunctionExecutor
    from support import futures_functions as ff

    ex = FunctionExecutor("local", config=JobExecutorConfig(work_directory=sys.argv[1]))
    futures = [ex.submit(ff.sleep_then, 1.0, i) for i in range(4)]
    futures += [ex.submit(ff.fail, "from the dead client")]
    ids = []
    for future in futures:
        if future.job_id not in ids:
            ids.append(future.job_id)
    psij.registry.flush()
    print(json.dumps(ids), flush=True)
    time.sleep(600)
""")


def test_futures_come_back_after_the_client_was_killed(tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS),
                                                       os.environ.get("PYTHONPATH", "")]))
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(work)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        ids = json.loads(client.stdout.readline())
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait(WAIT)
        if client.stdout is not None:
            client.stdout.close()
    assert client.returncode == -signal.SIGKILL
    futures = reattach(ids, work_directory=str(work))
    assert all(isinstance(f, FunctionFuture) for f in futures)
    assert len(futures) == 5 and [f.function_name for f in futures][-1] == "fail"
    assert [f.result(WAIT) for f in futures[:4]] == [0, 1, 2, 3]
    with pytest.raises(Exception, match="from the dead client") as raised:
        futures[4].result(WAIT)
    assert type(raised.value).__name__ == "Oops"
    # Collected: the call directories are gone.
    assert [p for p in (work / "functions").iterdir() if p.is_dir()] == []


def test_reattach_refuses_unknown_ids_and_other_jobs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    with pytest.raises(ValueError, match="no job 'nope'"):
        reattach(["nope"], work_directory=str(work))
    with pytest.raises(TypeError, match=r"reattach ids\[0\]"):
        reattach([1], work_directory=str(work))  # type: ignore[list-item]
    with JobExecutor.get_instance("local",
                                  config=JobExecutorConfig(work_directory=work)) as ex:
        job = Job(JobSpec("/bin/true"))
        ex.submit(job)
        job.wait()
    import psij.registry

    psij.registry.flush()
    with pytest.raises(ValueError, match="is not a function job"):
        reattach(job.id, work_directory=str(work))


def test_a_finished_job_reattached_gives_its_result_and_a_public_directory_is_refused(
        tmp_path: Path) -> None:
    from psij.futures import FunctionExecutor
    from support import futures_functions as ff

    work = tmp_path / "work"
    with FunctionExecutor("local", config=JobExecutorConfig(work_directory=work),
                          keep_files=True) as ex:
        future = ex.submit(ff.square, 11)
        assert future.result(WAIT) == 121
        job_id = future.job_id
    import psij.registry

    psij.registry.flush()
    [again] = reattach(job_id, work_directory=str(work), keep_files=True)
    assert again.result(WAIT) == 121  # read again: keep_files kept the directory
    directory = Path(future.job.spec.arguments[-1])  # type: ignore[union-attr]
    directory.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by group or others"):
        reattach(job_id, work_directory=str(work))
