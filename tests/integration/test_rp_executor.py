"""The ``rp`` executor (jobs as RADICAL-Pilot tasks).

Without RADICAL-Pilot (this repository's test environment): no ``rp`` plugin is declared, the
module imports, its checks of jobs and configuration hold, and a submit says what is missing.
With it: RADICAL-Pilot 1.103 is installed from the package index into a side venv under the
test cache (``support.reference_venv``; psij-python, which it requires, is removed there and
this repository's ``src`` comes first on the path), and one session on the ``local.localhost``
resource runs a job that completes and one that fails (a pilot takes tens of seconds to start,
so both share it).
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from psij import InvalidJobException, Job, JobExecutor, JobSpec, SubmitException
from psij.executors.rp import RPExecutorConfig, RPJobExecutor
from support.reference_venv import REPO, side_venv


def _has_rp() -> bool:
    try:
        import radical.pilot  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(_has_rp(), reason="RADICAL-Pilot is installed in this environment")
def test_without_radical_pilot_no_rp_plugin_and_a_clear_submit_error() -> None:
    with pytest.raises(ValueError, match="rp"):
        JobExecutor.get_instance("rp")
    ex = RPJobExecutor()
    job = Job(JobSpec("/bin/true"))
    with pytest.raises(SubmitException, match="radical.pilot"):
        ex.submit(job)
    assert job.executor is None and job.status.state.name == "NEW"


@pytest.mark.parametrize("field,value", [("stdin_path", "/dev/null"),
                                         ("inherit_environment", False),
                                         ("executable", None)])
def test_jobs_a_task_cannot_run_are_refused_naming_the_field(field: str, value: object) -> None:
    spec = JobSpec("/bin/true")
    setattr(spec, field, value)
    job = Job(spec)
    with pytest.raises(InvalidJobException, match=field):
        RPJobExecutor().submit(job)
    assert job.executor is None


@pytest.mark.parametrize("kwargs", [{"cores": 0}, {"cores": -1}, {"cores": True},
                                    {"runtime": float("nan")}, {"runtime": 2**40},
                                    {"resource": ""}, {"resource": "a\nb"}, {"resource": 3}])
def test_config_refuses_bad_values(kwargs: Dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError), match="RPExecutorConfig"):
        RPExecutorConfig(**kwargs)


CHILD = r"""
import json, sys
from datetime import timedelta
from psij import Job, JobExecutor, JobSpec, JobState
from psij.executors.rp import RPExecutorConfig
out = sys.argv[1]
ex = JobExecutor.get_instance("rp", config=RPExecutorConfig(cores=2, runtime=10))
seen = []
ok = Job(JobSpec("/bin/sh", ["-c", 'echo "hello $WHO"'], environment={"WHO": "rp"},
                 stdout_path=out))
ok.set_job_status_callback(lambda j, s: seen.append(s.state.name))
bad = Job(JobSpec("/bin/sh", ["-c", "exit 3"]))
ex.submit(ok)
ex.submit(bad)
listed = ex.list()
st_ok = ok.wait(timeout=timedelta(seconds=240))
st_bad = bad.wait(timeout=timedelta(seconds=240))
ex.close()
print(json.dumps({"ok": str(st_ok and st_ok.state), "ok_code": st_ok and st_ok.exit_code,
                  "bad": str(st_bad and st_bad.state), "bad_code": st_bad and st_bad.exit_code,
                  "seen": seen, "native": ok.native_id, "listed": listed,
                  "plugin": type(ex).__module__}))
"""


def test_a_job_runs_as_a_radical_pilot_task_on_the_local_resource(tmp_path: Path) -> None:
    python = side_venv("radical-pilot-1.103", ["radical.pilot==1.103.*"],
                       then=[["uninstall", "--yes", "--quiet", "psij-python"],
                             ["install", "--quiet", "pystache>=0.6.0", "filelock>=3.20.3",
                              "typeguard>=4.0", "packaging>=21.0", "tqdm>=4.66",
                              "cloudpickle>=2.0"]])
    venv = python.parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # RADICAL-Pilot's local agent runs in the client's virtual environment, found through
    # VIRTUAL_ENV, with its commands (radical-pilot-agent_0, ...) on PATH.
    # Its session and sandbox folders go to the current directory, which it reads from PWD.
    env.update(HOME=str(tmp_path), PWD=str(tmp_path), VIRTUAL_ENV=str(venv),
               PYTHONPATH=str(REPO / "src"),
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out.txt"
    done = subprocess.run([str(python), "-c", CHILD, str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["plugin"] == "psij.executors.rp"
    assert report["ok"] == "COMPLETED" and report["ok_code"] == 0, report
    assert report["bad"] == "FAILED" and report["bad_code"] == 3, report
    assert report["seen"][0] == "QUEUED" and report["seen"][-2:] == ["ACTIVE", "COMPLETED"]
    assert report["native"] in report["listed"]
    assert out.read_text() == "hello rp\n"
    assert sys.executable != str(python)
