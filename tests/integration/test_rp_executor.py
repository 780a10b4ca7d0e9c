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
import signal
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
    # Its own session, so that RADICAL-Pilot's helper processes go with it if it hangs.
    child = subprocess.Popen([str(python), "-c", CHILD, str(out)], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=420)
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
    assert child.returncode == 0, stdout[-3000:] + stderr[-3000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["plugin"] == "psij.executors.rp"
    assert report["ok"] == "COMPLETED" and report["ok_code"] == 0, report
    assert report["bad"] == "FAILED" and report["bad_code"] == 3, report
    assert report["seen"][0] == "QUEUED" and report["seen"][-2:] == ["ACTIVE", "COMPLETED"]
    assert report["native"] in report["listed"]
    assert out.read_text() == "hello rp\n"
    assert sys.executable != str(python)


class _FakeTask:
    def __init__(self, uid: str, description: Dict[str, Any]) -> None:
        self.uid, self.name, self.description = uid, description["name"], description
        self.state, self.exit_code, self.stderr = "TMGR_SCHEDULING_PENDING", None, ""


class _FakeRP:
    """The part of radical.pilot's API the executor uses, run by hand by the test."""

    def __init__(self) -> None:
        self.tasks: Dict[str, _FakeTask] = {}
        self.cancelled: list = []
        self.callbacks: list = []
        self.pilots: list = []
        self.closed = False
        fake = self

        class Session:
            def close(self, download: bool = True) -> None:
                fake.closed = True

        class PilotManager:
            def __init__(self, session: Any) -> None:
                pass

            def submit_pilots(self, description: Dict[str, Any]) -> str:
                fake.pilots.append(description)
                return "pilot.0000"

        class TaskManager:
            def __init__(self, session: Any) -> None:
                pass

            def register_callback(self, cb: Any) -> None:
                fake.callbacks.append(cb)

            def add_pilots(self, pilot: str) -> None:
                pass

            def submit_tasks(self, description: Dict[str, Any]) -> _FakeTask:
                task = _FakeTask(f"task.{len(fake.tasks):06d}", description)
                fake.tasks[task.uid] = task
                return task

            def cancel_tasks(self, uids: Any) -> None:
                fake.cancelled.extend(uids)

            def list_tasks(self) -> list:
                return list(fake.tasks)

            def get_tasks(self, uids: Any) -> list:
                return [fake.tasks.get(u) for u in uids]

        self.Session, self.PilotManager, self.TaskManager = Session, PilotManager, TaskManager
        self.PilotDescription = self.TaskDescription = dict

    def move(self, task: _FakeTask, state: str, exit_code: Any = None, stderr: str = "") -> None:
        task.state, task.exit_code, task.stderr = state, exit_code, stderr
        for cb in self.callbacks:
            cb(task, state)


@pytest.fixture
def fake_rp(monkeypatch: pytest.MonkeyPatch) -> _FakeRP:
    import types
    fake = _FakeRP()
    package = types.ModuleType("radical")
    module = types.ModuleType("radical.pilot")
    module.__dict__.update({k: getattr(fake, k) for k in ("Session", "PilotManager",
                                                         "TaskManager", "PilotDescription",
                                                         "TaskDescription")})
    package.pilot = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "radical", package)
    monkeypatch.setitem(sys.modules, "radical.pilot", module)
    return fake


def test_states_of_a_task_become_the_jobs(fake_rp: _FakeRP, tmp_path: Path) -> None:
    from psij import JobState, ResourceSpecV1
    ex = RPJobExecutor(config=RPExecutorConfig(cores=3, runtime=7, resource="local.localhost"))
    seen: list = []
    pre = tmp_path / "pre it's.sh"
    job = Job(JobSpec("/bin/echo", ["a b"], environment={"N": "4"}, directory=tmp_path,
                      stdout_path=tmp_path / "o", pre_launch=pre,
                      resources=ResourceSpecV1(process_count=2, cpu_cores_per_process=3)))
    job.set_job_status_callback(lambda j, s: seen.append(s.state))
    ex.submit(job)
    assert fake_rp.pilots == [{"resource": "local.localhost", "cores": 3, "runtime": 7}]
    task = fake_rp.tasks[job.native_id or ""]
    d = task.description
    assert (d["name"], d["executable"], d["arguments"], d["environment"]) == \
        (job.id, "/bin/echo", ["a b"], {"N": "4"})
    assert (d["ranks"], d["cores_per_rank"], d["sandbox"], d["stdout"]) == \
        (2, 3, str(tmp_path), str(tmp_path / "o"))
    assert d["pre_exec"] == [". '" + str(pre).replace("'", "'\"'\"'") + "'"]
    assert job.status.state is JobState.QUEUED
    fake_rp.move(task, "AGENT_STAGING_INPUT")  # not a change of the job's state
    fake_rp.move(task, "AGENT_EXECUTING")
    fake_rp.move(task, "DONE", exit_code=0)
    assert seen == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert job.status.exit_code == 0

    failing = Job(JobSpec("/bin/false"))
    ex.submit(failing)
    fake_rp.move(fake_rp.tasks[failing.native_id or ""], "FAILED", exit_code=1,
                 stderr="it broke\n")
    st = failing.status
    assert st.state is JobState.FAILED and st.exit_code == 1 and "it broke" in (st.message or "")
    assert sorted(ex.list()) == sorted(fake_rp.tasks)
    ex.close()
    assert fake_rp.closed


def test_cancel_and_attach(fake_rp: _FakeRP) -> None:
    from psij import JobState
    ex = RPJobExecutor()
    assert Job().status.state is JobState.NEW
    waiting = Job(JobSpec("/bin/sleep", ["9"]))
    ex.submit(waiting)
    waiting.cancel()
    assert fake_rp.cancelled == [waiting.native_id]
    fake_rp.move(fake_rp.tasks[waiting.native_id or ""], "CANCELED")
    assert waiting.status.state is JobState.CANCELED

    other = RPJobExecutor()
    task = fake_rp.tasks[waiting.native_id or ""]
    task.state = "AGENT_EXECUTING"
    fake_rp.tasks["task.x"] = _FakeTask("task.x", {"name": "elsewhere"})
    fake_rp.tasks["task.x"].state = "AGENT_EXECUTING"
    attached = Job()
    other.attach(attached, "task.x")
    assert attached.native_id == "task.x" and attached.status.state is JobState.ACTIVE
    with pytest.raises(InvalidJobException, match="no RADICAL-Pilot task"):
        other.attach(Job(), "task.none")


def test_a_callback_error_does_not_reach_radical_pilot(fake_rp: _FakeRP) -> None:
    ex = RPJobExecutor()
    job = Job(JobSpec("/bin/true"))
    ex.submit(job)
    task = fake_rp.tasks[job.native_id or ""]
    # An exit code JobStatus refuses: the error is logged in RADICAL-Pilot's callback thread,
    # never raised into it, and the job keeps its state.
    fake_rp.move(task, "DONE", exit_code=object())
    assert job.status.state.name == "QUEUED"
    fake_rp.move(task, "DONE", exit_code=0)
    assert job.status.state.name == "COMPLETED"
