"""``psij pilot run`` behaving as qcg-pilotjob does on request files shaped like its own
examples and tests: QCG's own serialization, iterative jobs' report entries, requests answered
one by one, maximum-iters and split-into shares, the report written as jobs end, a million
iterations, and the SLURM_* variables."""

import itertools
import json
import os
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List

import pytest

from psij.executors.pilot.qcg._plan import PlannedSubmit, maximum_iters, plan_requests
from psij.executors.pilot.qcg._requests import parse_requests
from psij.executors.pilot.qcg._schema import BadRequest
from psij.executors.pilot.resources import ResourcePool
from test_pilot_qcg import PSIJ_SCRIPT, pilot_run, read_report, responses


def iterative(name: str, stop: int, execution: Dict[str, Any],
              cores: Any = None) -> Dict[str, Any]:
    """A job as QCG's examples write one: ``iteration`` with ``stop``."""
    job: Dict[str, Any] = {"name": name, "iteration": {"stop": stop}, "execution": execution}
    if cores is not None:
        job["resources"] = {"numCores": cores}
    return job


def submit(*jobs: Dict[str, Any]) -> Dict[str, Any]:
    return {"request": "submit", "jobs": list(jobs)}


FINISH_AFTER_ALL = {"request": "control", "command": "finishAfterAllTasksDone"}


def wait_for(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


# -- 1. QCG's own serialization -------------------------------------------------------------------


def test_a_script_job_as_qcg_serializes_it_runs(tmp_path: Path) -> None:
    # What qcg-pilotjob's Job.to_dict() writes for a script job: "args": [] and "env": {}.
    job = {"name": "script", "execution": {"script": "echo from-script > script.txt",
                                           "args": [], "env": {}},
           "resources": {"numCores": {"exact": 1}}}
    done = pilot_run(tmp_path, [submit(job), FINISH_AFTER_ALL])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "script.txt").read_text() == "from-script\n"
    # Arguments next to a script are still refused, naming the field.
    bad = {"name": "bad", "execution": {"script": "true", "args": ["x"]}}
    (answer,) = [r for k, r in _run_responses(tmp_path / "b", [submit(bad)]) if k == "submit"]
    assert answer["code"] == 1 and "requests[0].jobs[0].execution.args" in answer["message"]


def _run_responses(wd: Path, requests: List[Dict[str, Any]]) -> List[Any]:
    wd.mkdir()
    done = pilot_run(wd, requests)
    assert done.returncode == 0, done.stderr
    return responses(wd / "service.log")


# -- 2. the iterative job's own report entry ------------------------------------------------------


def test_an_iterative_job_has_its_own_report_entry(tmp_path: Path) -> None:
    # As QCG's own tests check: len(report) == iterations + 1.
    requests = [
        submit(iterative("ok", 4, {"exec": "/bin/true"}),
               iterative("mixed", 3, {"exec": "/bin/sh", "args": ["-c", "exit $((${it} % 2))"]})),
        {"request": "jobStatus", "jobNames": ["ok"]},
        FINISH_AFTER_ALL,
    ]
    done = pilot_run(tmp_path, requests)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "jobs.report").read_text()
    entries = [line for line in text.splitlines() if not line.startswith(" ")]
    assert len(entries) == 4 + 3 + 2
    report = read_report(tmp_path / "jobs.report")
    assert report["ok"]["state"] == "SUCCEED"
    assert report["mixed"]["state"] == "FAILED" and report["mixed:1"]["state"] == "FAILED"
    assert report["ok"]["history"] == ["QUEUED", "EXECUTING", "SUCCEED"]
    # The parent's entry comes after every one of its iterations.
    assert entries.index("ok (SUCCEED)") > max(entries.index(f"ok:{i} (SUCCEED)")
                                               for i in range(4))
    status = dict(responses(tmp_path / "service.log"))["jobStatus"]
    assert status["data"]["jobs"]["ok"]["data"]["status"] in ("QUEUED", "EXECUTING")


def test_list_and_status_answer_for_an_iterative_job(tmp_path: Path) -> None:
    requests: List[Dict[str, Any]] = [
        submit(iterative("quick", 2, {"exec": "/bin/true"})),
        submit({"name": "gate", "execution": {"exec": "/bin/true"},
                "dependencies": {"after": ["quick"]}}),
        {"request": "jobStatus", "jobNames": ["quick", "quick:1"]},
        {"request": "listJobs"},
        FINISH_AFTER_ALL,
    ]
    answered = dict(_run_responses(tmp_path / "w", requests))
    jobs = answered["jobStatus"]["data"]["jobs"]
    assert set(jobs) == {"quick", "quick:1"} and all(j["status"] == 0 for j in jobs.values())
    assert set(answered["listJobs"]["data"]["jobs"]) == {"quick", "gate"}


# -- 3. requests answered one by one --------------------------------------------------------------


def test_bad_requests_get_error_responses_and_the_others_run(tmp_path: Path) -> None:
    requests = [
        submit({"name": "first", "execution": {"exec": "/bin/true"}}),
        {"request": "bogus"},
        submit({"name": "first", "execution": {"exec": "/bin/true"}}),  # duplicate name
        submit({"name": "x", "execution": {"exec": "/bin/true"}, "dependencies": {"after": ["y"]}},
               {"name": "y", "execution": {"exec": "/bin/true"}, "dependencies": {"after": ["x"]}}),
        submit({"name": "bad_cores", "execution": {"exec": "/bin/true"},
                "resources": {"numCores": {"exact": "two"}}}),
        submit({"name": "orphan", "execution": {"exec": "/bin/true"},
                "dependencies": {"after": ["no_such_job"]}},
               {"name": "orphan_child", "execution": {"exec": "/bin/true"},
                "dependencies": {"after": ["orphan"]}},
               {"name": "last", "execution": {"exec": "/bin/true"}}),
        FINISH_AFTER_ALL,
    ]
    done = pilot_run(tmp_path, requests)
    assert done.returncode == 0, done.stderr
    answered = responses(tmp_path / "service.log")
    codes = [r["code"] for _, r in answered]
    assert codes == [0, 1, 1, 1, 1, 0, 0]
    messages = [r.get("message", "") for _, r in answered]
    assert "'bogus'" in messages[1] and "requests[2].jobs[0].name" in messages[2]
    assert "dependency cycle" in messages[3]
    assert "requests[4].jobs[0].resources.numCores.exact" in messages[4]
    report = read_report(tmp_path / "jobs.report")
    assert report["first"]["state"] == report["last"]["state"] == "SUCCEED"
    assert report["orphan"]["state"] == report["orphan_child"]["state"] == "OMITTED"
    assert "no_such_job" in report["orphan"]["message"]
    assert "x" not in report and "bad_cores" not in report


# -- 4. maximum-iters -----------------------------------------------------------------------------


@pytest.mark.parametrize("total, iterations, minimum, shares", [
    (8, 5, 1, [1, 1, 2, 2, 2]),
    (16, 5, 1, [3, 3, 3, 3, 4]),  # what qcg-pilotjob 0.14.2 gives on 16 cores
    # The vectors of qcg-pilotjob's own test_iterschedulers.py.
    (10, 10, 1, [1] * 10), (10, 20, 1, [1] * 20), (10, 5, 1, [2] * 5), (10, 3, 1, [3, 3, 4]),
    (11, 3, 3, [3, 4, 4]), (11, 3, 5, [5, 6, 11]), (11, 4, 5, [5, 6, 5, 6]),
    (11, 4, 6, [11, 11, 11, 11]),
])
def test_maximum_iters_shares_out_every_core(total: int, iterations: int, minimum: int,
                                             shares: List[int]) -> None:
    assert list(maximum_iters(total, iterations, minimum)) == shares


@pytest.mark.parametrize("scheduler", [{"name": "maximum-iters"}, "maximum-iters"],
                         ids=["current", "qcg-0.4-string"])
def test_maximum_iters_iterations_get_every_core(tmp_path: Path, scheduler: Any) -> None:
    job = iterative("mi", 5, {"exec": "/bin/sh", "args": ["-c", "echo $QCG_PM_NPROCS"],
                              "stdout": "mi.${it}.out"},
                    cores={"min": 1, "scheduler": scheduler})
    done = pilot_run(tmp_path, [submit(job), FINISH_AFTER_ALL], "--cores", "8")
    assert done.returncode == 0, done.stderr
    cores = [int((tmp_path / f"mi.{i}.out").read_text()) for i in range(5)]
    assert cores == [1, 1, 2, 2, 2]


# -- 5. split-into resolving to zero --------------------------------------------------------------


def test_a_split_into_of_zero_cores_is_refused_with_qcgs_reason(tmp_path: Path) -> None:
    zero = iterative("zero", 4, {"exec": "/bin/true"},
                     cores={"min": 1, "scheduler": {"name": "split-into",
                                                    "params": {"parts": 4}}})
    seed = {"name": "seed_zero", "iterate": [0, 3], "execution": {"exec": "/bin/true"},
            "resources": {"numCores": {"min": 1, "split-into": 3}}}
    fine = iterative("fine", 2, {"exec": "/bin/true"},
                     cores={"min": 1, "scheduler": {"name": "split-into",
                                                    "params": {"parts": 2}}})
    done = pilot_run(tmp_path, [submit(zero), submit(seed), submit(fine), FINISH_AFTER_ALL])
    assert done.returncode == 0, done.stderr
    answered = [r for k, r in responses(tmp_path / "service.log") if k == "submit"]
    assert [r["code"] for r in answered] == [1, 1, 0]
    for refused in answered[:2]:
        assert "split-into resolved to zero" in refused["message"]
        assert "numCores" in refused["message"]
    report = read_report(tmp_path / "jobs.report")
    assert not any(name.startswith("zero") or name.startswith("seed_zero") for name in report)
    assert report["fine"]["state"] == "SUCCEED"


# -- 6. the report as jobs end --------------------------------------------------------------------


def _start(tmp_path: Path, requests: List[Dict[str, Any]], *options: str
           ) -> "subprocess.Popen[bytes]":
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests))
    return subprocess.Popen([PSIJ_SCRIPT, "pilot", "run", str(path), "--cores", "2",
                             *options], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _entries(path: Path) -> List[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if not line.startswith(" ")]


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_the_report_is_written_as_jobs_end(tmp_path: Path, signum: int) -> None:
    requests = [submit(iterative("quick", 3, {"exec": "/bin/true"}),
                       {"name": "slow", "execution": {"exec": "/bin/sleep", "args": ["60"]}},
                       {"name": "waiting", "execution": {"exec": "/bin/true"},
                        "dependencies": {"after": ["slow"]}}),
                FINISH_AFTER_ALL]
    proc = _start(tmp_path, requests)
    report = tmp_path / "jobs.report"
    try:
        wait_for(lambda: "quick (SUCCEED)" in _entries(report), "the quick iterations")
        proc.send_signal(signum)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    entries = _entries(report)
    assert {f"quick:{i} (SUCCEED)" for i in range(3)} <= set(entries)
    if signum == signal.SIGTERM:
        # Every job gets its line, the running one included.
        assert "slow (CANCELED)" in entries and "waiting (CANCELED)" in entries
    else:
        # The pilot could not stop its task: end it, by the pid its journal recorded.
        for line in (tmp_path / "psij-pilot.journal").read_text().splitlines():
            record = json.loads(line)
            if record.get("e") == "start" and record.get("id") == "slow":
                try:
                    os.killpg(record["pid"], signal.SIGKILL)
                except OSError:
                    pass


# -- 7. a million iterations ----------------------------------------------------------------------


def test_planning_a_huge_iterative_job_makes_no_task_before_it_is_asked_for() -> None:
    counter = itertools.count()
    (planned,) = plan_requests(
        parse_requests([submit(iterative("huge", 10 ** 9, {"exec": "/bin/true"},
                                         cores={"min": 1,
                                                "scheduler": {"name": "maximum-iters"}}))]),
        datetime(2024, 1, 1), lambda: f"u{next(counter)}",
        ResourcePool.uniform(1, 2))
    assert isinstance(planned, PlannedSubmit) and not isinstance(planned, BadRequest)
    (job,) = planned.jobs
    assert job.count == 10 ** 9 and planned.job_names == ("huge",)
    first = list(itertools.islice(job.tasks(), 3))
    assert [t.name for t in first] == ["huge:0", "huge:1", "huge:2"]
    assert next(counter) < 5  # no unique id was drawn per iteration


def test_a_million_iterations_start_at_once_and_stop_on_sigterm(tmp_path: Path) -> None:
    # Structural, not timed: the first iterations end while most of the million have not
    # been handed to the engine (the journal records each one handed over), and a SIGTERM
    # then ends the run with a report line for every iteration handed over.
    requests = [submit(iterative("million", 10 ** 6, {"exec": "/bin/true"})), FINISH_AFTER_ALL]
    proc = _start(tmp_path, requests)
    report = tmp_path / "jobs.report"
    journal = tmp_path / "psij-pilot.journal"
    try:
        wait_for(lambda: len(_entries(report)) >= 10, "the first iterations", timeout=120)
        recorded = journal.read_text().count('"e":"submit"')
        assert recorded < 10 ** 5, f"{recorded} iterations recorded before the 10th ended"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    submitted = journal.read_text().count('"e":"submit"')
    entries = _entries(report)
    assert submitted < 10 ** 5 and len(entries) == submitted
    assert "million (" not in "\n".join(entries)  # the job as a whole never ended


# -- 8. SLURM_* variables -------------------------------------------------------------------------


@pytest.mark.skipif(bool(os.environ.get("SLURM_JOB_NODELIST")),
                    reason="this test runs outside a Slurm allocation")
@pytest.mark.parametrize("emulate", [False, True])
def test_slurm_variables_only_inside_slurm_or_when_emulated(tmp_path: Path,
                                                           emulate: bool) -> None:
    job = {"name": "env", "execution": {"script": "env | sort > env.txt"},
           "resources": {"numCores": {"exact": 2}}}
    options = ["--emulate-slurm"] if emulate else []
    done = pilot_run(tmp_path, [submit(job), FINISH_AFTER_ALL], *options)
    assert done.returncode == 0, done.stderr
    env = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().splitlines()
               if "=" in line)
    assert env["QCG_PM_NPROCS"] == "2" and env["QCG_PM_STEP_ID"] == "env"
    slurm = {k: v for k, v in env.items() if k.startswith("SLURM_")}
    if emulate:
        assert slurm["SLURM_NTASKS"] == "2" and slurm["SLURM_NNODES"] == "1"
    else:
        assert slurm == {}


# -- hostile values -------------------------------------------------------------------------------


def test_hostile_values_refuse_their_request_only(tmp_path: Path) -> None:
    text = json.dumps([
        submit({"name": "a\ud800", "execution": {"exec": "/bin/true"}}),
        submit({"name": "b", "iteration": {"stop": float("inf")},
                "execution": {"exec": "/bin/true"}}),
        submit({"name": "d", "execution": {"exec": "/bin/true", "env": {"X": "\ud800"}}}),
        submit(iterative("neg", 0, {"exec": "/bin/true"})),
        submit({"name": "c", "iteration": {"start": -2, "stop": 0},
                "execution": {"exec": "/bin/true"}}),
        FINISH_AFTER_ALL])
    done = pilot_run(tmp_path, text)
    assert done.returncode == 0, done.stderr
    answered = [r for k, r in responses(tmp_path / "service.log") if k == "submit"]
    assert [r["code"] for r in answered] == [1, 1, 1, 1, 0]
    assert "requests[0].jobs[0].name" in answered[0]["message"]
    assert "lone surrogate" in answered[0]["message"]
    assert "requests[1].jobs[0].iteration.stop: expected an integer" in answered[1]["message"]
    assert "requests[2].jobs[0].execution.env.X" in answered[2]["message"]
    assert "requests[3].jobs[0].iteration" in answered[3]["message"]
    # Negative iteration indices are sub-tasks of their job, which ends as a whole.
    assert set(_entries(tmp_path / "jobs.report")) == {"c:-2 (SUCCEED)", "c:-1 (SUCCEED)",
                                                       "c (SUCCEED)"}
