"""QCG-PilotJob request files: parsing, checks, variables, report format, and ``psij pilot run``
end to end on a request file of each form."""

import itertools
import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

import pytest

from psij.executors.pilot.journal import read_journal, task_runs
from psij.executors.pilot.qcg._plan import (
    PlannedSubmit,
    StartContext,
    TaskTemplate,
    plan_requests,
    start_variables,
)
from psij.executors.pilot.qcg._report import TaskReport, format_report_entry, qcg_state
from psij.executors.pilot.qcg._requests import RequestFileError, load_request_file, parse_requests
from psij.executors.pilot.qcg._schema import (
    CURRENT,
    SEED,
    BadRequest,
    CancelJob,
    Control,
    FinishRequest,
    JobStatusRequest,
    ListJobs,
    RemoveJob,
    Request,
    ResourcesInfo,
    Submit,
    expand_variables,
)
from psij.executors.pilot.resources import Amount, ResourcePool, ResourceRequest
from psij.executors.pilot.scheduler import TaskState

RECEIVED = datetime(2024, 5, 6, 7, 8, 9, 123456)


def job(name: str = "j", **fields: Any) -> Dict[str, Any]:
    description: Dict[str, Any] = {"name": name, "execution": {"exec": "/bin/true"}}
    description.update(fields)
    return description


def submit(*jobs: Dict[str, Any]) -> Dict[str, Any]:
    return {"request": "submit", "jobs": list(jobs)}


def plan(data: List[Dict[str, Any]], cores: int = 8
         ) -> List[Union[PlannedSubmit, Request]]:
    counter = itertools.count()
    return plan_requests(parse_requests(data), RECEIVED, lambda: f"u{next(counter)}",
                         ResourcePool.uniform(1, cores))


def tasks_of(data: List[Dict[str, Any]], cores: int = 8) -> Dict[str, TaskTemplate]:
    return {t.name: t for p in plan(data, cores) if isinstance(p, PlannedSubmit)
            for t in p.tasks()}


def file_error(data: Any) -> str:
    """The message of the first request that cannot run (a file that is no list raises)."""
    if not isinstance(data, list):
        with pytest.raises(RequestFileError) as caught:
            plan(data)
        return str(caught.value)
    bad = [p for p in plan(data) if isinstance(p, BadRequest)]
    assert bad, "every request was accepted"
    return bad[0].message


# -- variables ------------------------------------------------------------------------------


def test_variables_are_replaced_with_or_without_spaces_and_unknown_ones_stay() -> None:
    values = {"it": "3", "jname": "a"}
    assert expand_variables("x${it}-${ it }-${jname}", values) == "x3-3-a"
    assert expand_variables("$HOME ${HOME} ${ncores}", values) == "$HOME ${HOME} ${ncores}"
    assert expand_variables("no variables", values) == "no variables"


def test_start_variables_name_the_placed_resources() -> None:
    context = StartContext(root_wd="/w", ncores=4, nnodes=2, nodes=("n1", "n2"))
    assert start_variables(context) == {"root_wd": "/w", "ncores": "4", "nnodes": "2",
                                        "nlist": "n1,n2"}


def test_submit_time_variables_of_the_seed_form() -> None:
    data = [submit(job("first")),
            submit(job("sim_${it}", iterate=[2, 4], execution={
                "exec": "echo",
                "args": ["${rcnt}", "${uniq}", "${sname}", "${it}", "${its}", "${it_start}",
                         "${it_stop}", "${jname}", "${date}", "${time}", "${dateTime}",
                         "${ncores}"],
                "stdout": "logs/${jname}.out"}))]
    tasks = tasks_of(data)
    assert list(tasks) == ["first", "sim_2", "sim_3"]
    sim = tasks["sim_3"]
    assert sim.group is None and sim.iteration == 3
    args = list(sim.execution.args)
    # ${uniq} is one of the ids the planner drew (from a counter here: u0, u1, ...).
    assert args[1].startswith("u") and args[1][1:].isdigit()
    assert args[:1] + args[2:] == [
        "2", "local", "3", "2", "2", "4", "sim_3", "2024-05-06", "07:08:09.123456",
        "2024-05-06 07:08:09.123456", "${ncores}"]
    assert sim.execution.stdout == "logs/sim_3.out"
    # Each sub-task has its own unique id; the request counter is shared.
    assert tasks["sim_2"].execution.args[1] != sim.execution.args[1]
    assert tasks["sim_2"].execution.args[0] == sim.execution.args[0]


def test_current_iterations_are_sub_tasks_of_a_group() -> None:
    tasks = tasks_of([submit(job("scan", iteration={"start": 1, "stop": 3},
                                 execution={"script": "echo ${it} ${jname} $HOME",
                                            "stdout": "out.${it}"}))])
    assert list(tasks) == ["scan:1", "scan:2"]
    assert tasks["scan:2"].group == "scan"
    assert tasks["scan:2"].execution.command() == ["bash", "-c", "echo 2 scan $HOME"]
    assert tasks["scan:2"].execution.stdout == "out.2"


def test_iteration_values_give_itval() -> None:
    tasks = tasks_of([submit(job("v", iteration={"values": ["a", 7]},
                                 execution={"exec": "echo", "args": ["${it}=${itval}"]}))])
    assert [t.execution.args for t in tasks.values()] == [("0=a",), ("1=7",)]
    assert list(tasks) == ["v:0", "v:1"]


def test_iteration_start_defaults_to_zero() -> None:
    assert list(tasks_of([submit(job("z", iteration={"stop": 2}))])) == ["z:0", "z:1"]


# -- dependencies -----------------------------------------------------------------------------


def test_dependencies_across_iterations_and_on_groups() -> None:
    tasks = tasks_of([submit(
        job("prep", iteration={"stop": 2}),
        job("sim", iteration={"stop": 2}, dependencies={"after": ["prep:${it}"]}),
        job("namd_${it}", iterate=[0, 2]),
        job("amber_${it}", iterate=[0, 2], dependencies={"after": ["namd_${it}"]}),
        job("summary", dependencies={"after": ["sim", "amber_1"]}))])
    assert tasks["sim:1"].after == ("prep:1",)
    assert tasks["amber_0"].after == ("namd_0",)
    assert tasks["summary"].after == ("sim", "amber_1")


def test_jobs_of_one_request_may_name_later_ones_and_unknown_ones_are_missing() -> None:
    tasks = tasks_of([submit(job("a", dependencies={"after": ["b"]}), job("b"),
                             job("c", dependencies={"after": ["nosuch"]}))])
    assert list(tasks) == ["b", "a", "c"]  # dependencies first
    assert tasks["a"].missing is None and tasks["c"].missing == "nosuch"


def test_a_dependency_cycle_refuses_its_request_only() -> None:
    planned = plan([submit(job("x", dependencies={"after": ["y"]}),
                           job("y", dependencies={"after": ["x"]})),
                    submit(job("z"))])
    assert isinstance(planned[0], BadRequest) and isinstance(planned[1], PlannedSubmit)
    assert "dependency cycle" in planned[0].message and "'x'" in planned[0].message


def test_duplicate_names_are_refused_unless_removed_in_between() -> None:
    message = file_error([submit(job("a")), submit(job("a"))])
    assert "requests[1].jobs[0].name" in message and "unique" in message
    message = file_error([submit(job("g", iteration={"stop": 2})), submit(job("g"))])
    assert "requests[1].jobs[0].name" in message
    planned = plan([submit(job("a")), {"request": "removeJob", "jobName": "a"},
                    submit(job("a"))])
    assert [type(p) for p in planned] == [PlannedSubmit, RemoveJob, PlannedSubmit]


# -- resources ----------------------------------------------------------------------------------


def test_resources_of_both_forms() -> None:
    tasks = tasks_of([submit(
        job("default"),
        job("exact", resources={"numCores": {"exact": 2}}),
        job("range", resources={"numCores": {"min": 1, "max": 4}}),
        job("seed_split", resources={"numCores": {"min": 1, "split-into": 2}}),
        job("current_split", iteration={"stop": 4}, resources={"numCores": {
            "min": 1, "scheduler": {"name": "split-into", "params": {"parts": 2}}}}),
        job("maxiters", iteration={"stop": 3}, resources={"numCores": {
            "min": 1, "scheduler": {"name": "maximum-iters"}}}),
        job("nodes", resources={"numNodes": {"exact": 2}, "numCores": {"exact": 3}}),
        job("walltime", resources={"numCores": {"exact": 1}, "wt": "1h2m3s"}))])
    assert tasks["default"].resources == ResourceRequest(processes=Amount.exact(1))
    assert tasks["exact"].resources.processes == Amount.exact(2)
    assert tasks["range"].resources.processes == Amount(1, 4)
    assert tasks["seed_split"].resources.processes == Amount(1, None, 2)
    assert tasks["current_split:0"].resources.processes == Amount(1, None, 2)
    # 8 cores over 3 iterations, as qcg-pilotjob 0.14 shares them: 2, 3, 3.
    assert [tasks[f"maxiters:{i}"].resources.processes for i in range(3)] == [
        Amount.exact(2), Amount.exact(3), Amount.exact(3)]
    assert tasks["nodes"].resources.nodes == Amount.exact(2)
    assert tasks["nodes"].resources.processes_per_node == Amount.exact(3)
    assert tasks["walltime"].walltime == timedelta(hours=1, minutes=2, seconds=3)


@pytest.mark.parametrize("resources, where, words", [
    ({"numCores": {"exact": 2, "min": 1}}, "resources.numCores", "exact"),
    ({"numCores": {"min": 3, "max": 2}}, "resources.numCores", "less than min"),
    ({"numCores": {"exact": 0}}, "resources.numCores.exact", "positive integer"),
    ({"numCores": {"exact": "2"}}, "resources.numCores.exact", "positive integer"),
    ({"numCores": {"most": 2}}, "resources.numCores", "unknown key 'most'"),
    ({"numCores": 2}, "resources.numCores", "expected an object"),
    ({"numCPUs": {"exact": 2}}, "resources", "unknown key 'numCPUs'"),
    ({"numCores": {"min": 1, "scheduler": {"name": "round-robin"}}},
     "resources.numCores.scheduler", "split-into"),
    ({"numCores": {"exact": 1}, "wt": "ten minutes"}, "resources.wt", "1h30m"),
])
def test_bad_resources_name_request_job_and_field(resources: Dict[str, Any], where: str,
                                                    words: str) -> None:
    message = file_error([{"request": "listJobs"}, submit(job("ok"), job(resources=resources))])
    assert message.startswith(f"requests[1].jobs[1].{where}"), message
    assert words in message


# -- structure ---------------------------------------------------------------------------------


@pytest.mark.parametrize("data, start, words", [
    ({"request": "submit"}, "requests:", "list of requests"),
    ([42], "requests[0]:", "JSON object"),
    ([{"request": "sumbit"}], "requests[0].request", "'sumbit'"),
    ([{"jobs": []}], "requests[0].request", "no 'request' key"),
    ([{"request": "submit", "jobs": []}], "requests[0].jobs", "non-empty list"),
    ([submit({"execution": {"exec": "x"}})], "requests[0].jobs[0].name", "non-empty job name"),
    ([submit({"name": "a"})], "requests[0].jobs[0].execution", "missing"),
    ([submit(job(execution={}))], "requests[0].jobs[0].execution", "exactly one of 'exec'"),
    ([submit(job(execution={"exec": "a", "script": "b"}))], "requests[0].jobs[0].execution",
     "exactly one"),
    ([submit(job(execution={"script": "b", "args": ["x"]}))],
     "requests[0].jobs[0].execution.args", "with 'exec'"),
    ([submit(job(execution={"exec": "a", "args": "x y"}))],
     "requests[0].jobs[0].execution.args", "list of strings"),
    ([submit(job(execution={"exec": "a", "args": [True]}))],
     "requests[0].jobs[0].execution.args[0]", "string or number"),
    ([submit(job(execution={"exec": "a", "env": {"A": []}}))],
     "requests[0].jobs[0].execution.env['A']", "expected a string"),
    ([submit(job(execution={"exec": "a", "model": "intelmpi"}))],
     "requests[0].jobs[0].execution.model", "default, threads"),
    ([submit(job(execution={"exec": "a", "stdout": ""}))],
     "requests[0].jobs[0].execution.stdout", "non-empty string"),
    ([submit(job(iterate=[3, 3]))], "requests[0].jobs[0].iterate", "greater than start"),
    ([submit(job(iterate=[1]))], "requests[0].jobs[0].iterate", "[start, stop]"),
    ([submit(job(iteration={"start": 1}))], "requests[0].jobs[0].iteration", "'stop'"),
    ([submit(job(iteration={"values": [1], "stop": 2}))], "requests[0].jobs[0].iteration",
     "'values'"),
    ([submit(job(iterate=[0, 1], iteration={"stop": 1}))], "requests[0].jobs[0]:", "not both"),
    ([submit(job(dependencies={"before": []}))], "requests[0].jobs[0].dependencies",
     "unknown key 'before'"),
    ([submit(job(dependencies={"after": ["a", ""]}))],
     "requests[0].jobs[0].dependencies.after[1]", "non-empty string"),
    ([submit(job(nmae="x"))], "requests[0].jobs[0]:", "unknown key 'nmae'"),
    ([{"request": "control", "command": "stop"}], "requests[0].command", "'stop'"),
    ([{"request": "jobStatus"}], "requests[0]:", "'jobName' or 'jobNames'"),
    ([{"request": "jobStatus", "jobNames": []}], "requests[0].jobNames", "non-empty list"),
    ([{"request": "jobStatus", "jobName": 3}], "requests[0].jobName", "job name"),
    ([{"request": "jobInfo", "jobName": "a"}], "requests[0]:", "unknown key 'jobName'"),
    ([{"request": "listJobs", "all": True}], "requests[0]:", "unknown key 'all'"),
])
def test_malformed_files_name_the_request_and_field(data: Any, start: str, words: str) -> None:
    message = file_error(data)
    assert message.startswith(start), message
    assert words in message, message


@pytest.mark.parametrize("name, words", [
    ("a b", "contains ' '"),
    ("a:1", "contains ':'"),
    ("x_${nope}", "unknown variable(s) nope"),
    ("x_${it}", "unknown variable(s) it"),
])
def test_bad_final_names_are_refused(name: str, words: str) -> None:
    message = file_error([submit(job(name))])
    assert message.startswith("requests[0].jobs[0].name"), message
    assert words in message


def test_it_in_a_name_needs_the_seed_form() -> None:
    message = file_error([submit(job("x_${it}", iteration={"stop": 2}))])
    assert "requests[0].jobs[0].name" in message and "x_${it}:N" in message


def test_requests_of_every_kind_and_the_dialect() -> None:
    seed = parse_requests([
        submit(job("a", iterate=[0, 2])),
        {"request": "control", "command": "finishAfterAllTasksDone"},
        {"request": "jobStatus", "jobName": "a"},
        {"request": "cancelJob", "jobName": "a"},
        {"request": "removeJob", "jobName": "a"},
        {"request": "listJobs"},
        {"request": "resourcesInfo"},
        {"request": "finish"},
    ])
    assert seed.dialect == SEED
    assert [type(r) for r in seed.requests] == [Submit, Control, JobStatusRequest,
                                                CancelJob, RemoveJob, ListJobs, ResourcesInfo,
                                                FinishRequest]
    status = seed.requests[2]
    assert isinstance(status, JobStatusRequest) and status.names == ("a",) and not status.listed
    current = parse_requests([{"request": "jobStatus", "jobNames": ["a", "b"]},
                              submit(job("a", iterate=[0, 1]))])
    assert current.dialect == CURRENT
    assert parse_requests([submit(job("a"))]).dialect == SEED


def test_load_request_file_reports_json_errors_with_the_position(tmp_path: Any) -> None:
    path = tmp_path / "reqs.json"
    path.write_text('[{"request": "listJobs"},\n {"request": }]')
    with pytest.raises(RequestFileError, match=r"reqs.json: not valid JSON: .* line 2"):
        load_request_file(path)
    with pytest.raises(RequestFileError, match="cannot read"):
        load_request_file(tmp_path / "missing.json")
    path.write_text(json.dumps([{"request": "listJobs"}]))
    assert isinstance(load_request_file(path).requests[0], ListJobs)


# -- execution ----------------------------------------------------------------------------------


def test_commands_of_exec_script_modules_and_venv() -> None:
    tasks = tasks_of([submit(
        job("plain", execution={"exec": "echo", "args": ["a b", 2, 1.5]}),
        job("venv", execution={"exec": "python", "args": ["-V"], "venv": "/v'x"}),
        job("mods", execution={"script": "run", "modules": ["gcc/12", "mpi"]}))])
    assert tasks["plain"].execution.command() == ["echo", "a b", "2", "1.5"]
    assert tasks["venv"].execution.command() == [
        "bash", "-c", "source '/v'\"'\"'x/bin/activate' && exec \"$@\"", "bash", "python", "-V"]
    assert tasks["mods"].execution.command() == [
        "bash", "-c", "source /etc/profile && module load 'gcc/12' 'mpi' && run"]


# -- report and states -------------------------------------------------------------------------


def test_report_entry_has_the_seed_layout() -> None:
    history = ((datetime(2018, 1, 11, 16, 2, 27, 740711), "QUEUED"),
               (datetime(2018, 1, 11, 16, 2, 27, 741276), "EXECUTING"),
               (datetime(2018, 1, 11, 16, 2, 33, 832568), "SUCCEED"))
    entry = format_report_entry(TaskReport(
        name="msleep2", state="SUCCEED", history=history, allocation="e0003:2",
        wd="/home/u/sleep2.sandbox", runtime=timedelta(seconds=6, microseconds=82136),
        exit_code=0))
    assert entry == (
        "msleep2 (SUCCEED)\n"
        "    2018-01-11 16:02:27.740711: QUEUED\n"
        "    2018-01-11 16:02:27.741276: EXECUTING\n"
        "    2018-01-11 16:02:33.832568: SUCCEED\n"
        "    allocation: e0003:2\n"
        "    wd: /home/u/sleep2.sandbox\n"
        "    rtime: 0:00:06.082136\n"
        "    exit_code: 0\n")
    failed = format_report_entry(TaskReport(name="big", state="FAILED",
                                            message="asks for 8 cores,\n too many"))
    assert failed == "big (FAILED)\n    message: asks for 8 cores, too many\n"


def test_every_task_state_has_its_qcg_name() -> None:
    assert {s: qcg_state(s) for s in TaskState} == {
        TaskState.WAITING: "QUEUED", TaskState.QUEUED: "QUEUED",
        TaskState.RUNNING: "EXECUTING", TaskState.SUCCEEDED: "SUCCEED",
        TaskState.FAILED: "FAILED", TaskState.CANCELED: "CANCELED",
        TaskState.OMITTED: "OMITTED"}


# -- psij pilot run, end to end ------------------------------------------------------------------

PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")


def pilot_run(tmp_path: Path, requests: Any, *options: str,
              timeout: float = 60) -> "subprocess.CompletedProcess[str]":
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests) if not isinstance(requests, str) else requests)
    return subprocess.run([PSIJ_SCRIPT, "pilot", "run", str(path), "--cores", "2", *options],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


def test_pilot_run_loads_only_what_a_local_run_needs(tmp_path: Path) -> None:
    # What `psij pilot run` imports is most of its start-up time: agents, sockets, logging,
    # generated classes and the other executors stay out unless used.
    path = tmp_path / "requests.json"
    path.write_text(json.dumps([submit(job("one", execution={"exec": "/bin/true"}))]))
    code = ("import sys, psij.cli; "
            f"status = psij.cli.main(['pilot', 'run', {str(path)!r}, '--cores', '1']); "
            "print(status, ' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    status, _, modules = done.stdout.partition(" ")
    assert status == "0", done.stderr
    loaded = set(modules.split())
    unwanted = {"secrets", "hmac", "socket", "logging", "inspect", "dataclasses", "tempfile",
                "subprocess", "argparse", "psij.executors.local", "psij.executors.batch",
                "psij.executors.pilot.agent", "psij.executors.pilot.service"}
    assert loaded & unwanted == set()
    assert read_report(tmp_path / "jobs.report")["one"]["state"] == "SUCCEED"


def read_report(path: Path) -> Dict[str, Dict[str, Any]]:
    """jobs.report as {name: {"state", "history": [states], "allocation", "message", ...}}."""
    entries: Dict[str, Dict[str, Any]] = {}
    current: Dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("    "):
            name, _, state = line.rpartition(" (")
            # A name is reported twice only when removeJob freed it for a new job.
            current = entries[name] = {"state": state.rstrip(")"), "history": []}
            continue
        key, _, value = line.strip().partition(": ")
        if key[:1].isdigit():  # a dated history line: "<date> <time>: STATE"
            current["history"].append(line.strip().rpartition(": ")[2])
        else:
            current[key] = value
    return entries


def responses(path: Path) -> List[Tuple[str, Dict[str, Any]]]:
    """(request kind, JSON response) of every response line of service.log, in order."""
    found = []
    for line in path.read_text().splitlines():
        head, marker, text = line.partition("): {")
        if marker and " response to requests[" in head:
            found.append((head.rpartition("(")[2], json.loads("{" + text)))
    return found


def write(name: str, text: str) -> Dict[str, Any]:
    return {"exec": "bash", "args": ["-c", f"echo {text} > {name}"]}


ACCEPTANCE_SEED = [
    {"request": "submit", "jobs": [
        # Everything else waits for it, so it runs alone and gets the most the range allows.
        {"name": "wide", "execution": write("wide.txt", "${ncores} $QCG_PM_NPROCS"),
         "resources": {"numCores": {"min": 1, "max": 2}}},
        {"name": "prep_${it}", "iterate": [0, 3],
         "execution": {"exec": "bash", "args": ["-c", "echo prep ${it} of ${its}"],
                       "wd": "sandbox", "stdout": "logs/${jname}.out"},
         "resources": {"numCores": {"exact": 1}}, "dependencies": {"after": ["wide"]}},
        {"name": "sim_${it}", "iterate": [0, 3],
         "execution": {"exec": "bash", "args": ["-c", "cat logs/prep_${it}.out; echo ${ncores}"],
                       "wd": "sandbox", "stdout": "out/${jname}.txt"},
         "dependencies": {"after": ["prep_${it}"]}},
        {"name": "broken", "execution": {"exec": "false"}, "dependencies": {"after": ["wide"]}},
        {"name": "after_broken", "execution": write("after_broken.txt", "ran"),
         "dependencies": {"after": ["broken"]}},
        {"name": "huge", "execution": write("huge.txt", "ran"),
         "resources": {"numCores": {"exact": 3}}},
    ]},
    {"request": "jobStatus", "jobName": "huge"},
    {"request": "listJobs"},
    {"request": "resourcesInfo"},
    {"request": "control", "command": "finishAfterAllTasksDone"},
]

ACCEPTANCE_CURRENT = [
    {"request": "submit", "jobs": [
        {"name": "wide", "execution": write("wide.txt", "${ncores} $QCG_PM_NPROCS"),
         "resources": {"numCores": {"min": 1, "max": 2}}},
        {"name": "prep", "iteration": {"start": 0, "stop": 3},
         "execution": {"script": "echo prep ${it} of ${its}", "wd": "sandbox",
                       "stdout": "logs/prep_${it}.out"},
         "dependencies": {"after": ["wide"]}},
        {"name": "sim", "iteration": {"stop": 3},
         "execution": {"script": "cat logs/prep_${it}.out; echo ${ncores}", "wd": "sandbox",
                       "stdout": "out/sim_${it}.txt"},
         "dependencies": {"after": ["prep:${it}"]}},
        {"name": "broken", "execution": {"exec": "false"}, "dependencies": {"after": ["wide"]}},
        {"name": "after_broken", "execution": write("after_broken.txt", "ran"),
         "dependencies": {"after": ["broken"]}},
        {"name": "huge", "execution": write("huge.txt", "ran"),
         "resources": {"numCores": {"exact": 3}}},
        # A whole iteration group as a dependency.
        {"name": "summary", "execution": {"script": "cat out/sim_*.txt > all.txt",
                                          "wd": "sandbox"},
         "dependencies": {"after": ["sim"]}},
    ]},
    {"request": "jobStatus", "jobNames": ["huge", "prep"]},
    {"request": "listJobs"},
    {"request": "resourcesInfo"},
    {"request": "control", "command": "finishAfterAllTasksDone"},
]


@pytest.mark.parametrize("form", ["seed", "current"])
def test_acceptance_request_file_states_and_files(tmp_path: Path, form: str) -> None:
    requests = ACCEPTANCE_SEED if form == "seed" else ACCEPTANCE_CURRENT
    sub = "_" if form == "seed" else ":"
    done = pilot_run(tmp_path, requests)
    assert done.returncode == 0, done.stderr
    report = read_report(tmp_path / "jobs.report")
    expected = {"wide": "SUCCEED", "broken": "FAILED", "after_broken": "OMITTED",
                "huge": "FAILED"}
    for i in range(3):
        expected[f"prep{sub}{i}"] = expected[f"sim{sub}{i}"] = "SUCCEED"
    if form == "current":
        # The iterative jobs have their own entries once all their iterations ended.
        expected["summary"] = expected["prep"] = expected["sim"] = "SUCCEED"
    assert {name: entry["state"] for name, entry in report.items()} == expected

    # The min/max task ran alone and got both cores; the variables and QCG_PM_* agree.
    assert (tmp_path / "wide.txt").read_text() == "2 2\n"
    assert report["wide"]["allocation"].endswith(":2")
    # Its cores by id (QCG's later allocation form) and what its process used.
    node = report["wide"]["allocation"].partition(":")[0]
    assert report["wide"]["core_ids"] in (f"{node}[0:1]", f"{node}[1:0]")
    assert float(report["wide"]["cpu_seconds"]) >= 0 and int(report["wide"]["max_rss_bytes"]) > 0
    assert "cpu_seconds" not in report["huge"]  # it never ran
    # The run's journal tells the same, one row per run of a task.
    runs = {row["id"]: row for row in task_runs(read_journal(tmp_path / "psij-pilot.journal"))}
    assert runs["wide"]["core_ids"] == report["wide"]["core_ids"] and runs["wide"]["cores"] == 2
    assert f"{runs['wide']['cpu_seconds']:.3f}" == report["wide"]["cpu_seconds"]
    assert runs["huge"]["state"] == "FAILED" and "started_at" not in runs["huge"]
    sandbox = tmp_path / "sandbox"
    for i in range(3):
        # Each sim read the output of its own prep (dependency across iterations), in the
        # directories created for the task's wd and stdout.
        assert (sandbox / "logs" / f"prep_{i}.out").read_text() == f"prep {i} of 3\n"
        assert (sandbox / "out" / f"sim_{i}.txt").read_text() == f"prep {i} of 3\n1\n"
        assert report[f"sim{sub}{i}"]["wd"] == str(sandbox)
        assert report[f"sim{sub}{i}"]["history"] == ["QUEUED", "EXECUTING", "SUCCEED"]
    if form == "current":
        assert (sandbox / "all.txt").read_text() == "".join(
            f"prep {i} of 3\n1\n" for i in range(3))
    assert report["broken"]["exit_code"] == "1"
    assert "dependency 'broken' ended FAILED" in report["after_broken"]["message"]
    assert "can never fit" in report["huge"]["message"]
    assert not (tmp_path / "after_broken.txt").exists()
    assert not (tmp_path / "huge.txt").exists()

    answered = responses(tmp_path / "service.log")
    kinds = [kind for kind, _ in answered]
    assert kinds == ["submit", "jobStatus", "listJobs", "resourcesInfo", "control"]
    submitted, status, listing, resources, control = (r for _, r in answered)
    assert submitted["code"] == 0 and control["code"] == 0
    if form == "seed":
        assert submitted["data"]["jobs"] == [
            "wide", "prep_0", "prep_1", "prep_2", "sim_0", "sim_1", "sim_2", "broken",
            "after_broken", "huge"]
        assert status["data"]["jobName"] == "huge" and status["data"]["status"] == "FAILED"
        assert listing["data"]["length"] == 10
        assert resources["data"]["totalCores"] == 2 and resources["data"]["totalNodes"] == 1
    else:
        assert submitted["data"]["jobs"] == ["wide", "prep", "sim", "broken",
                                             "after_broken", "huge", "summary"]
        assert status["data"]["jobs"]["huge"] == {
            "status": 0, "data": {"jobName": "huge", "status": "FAILED"}}
        # Read right after the submit: prep waits for wide, which may already have ended.
        assert status["data"]["jobs"]["prep"]["data"]["status"] in (
            "QUEUED", "EXECUTING", "SUCCEED")
        assert set(listing["data"]["jobs"]) == {"wide", "prep", "sim", "broken",
                                                "after_broken", "huge", "summary"}
        assert resources["data"]["total_cores"] == 2


def test_check_lists_every_bad_request_exits_2_and_runs_nothing(tmp_path: Path) -> None:
    requests = [{"request": "submit", "jobs": [job("ok", execution=write("ok.txt", "ran"))]},
                {"request": "submit", "jobs": [job("bad", resources={"numCores": {"min": 0}})]},
                {"request": "nonsense"},
                {"request": "submit", "jobs": [job("ok")]}]
    done = pilot_run(tmp_path, requests, "--check", "--wd", str(tmp_path / "wd"))
    assert done.returncode == 2
    assert "requests[1].jobs[0].resources.numCores.min" in done.stderr
    assert "requests[2].request: 'nonsense'" in done.stderr
    assert "requests[3].jobs[0].name: job 'ok' is already submitted" in done.stderr
    assert "3 of 4 request(s) cannot run" in done.stderr
    assert not (tmp_path / "wd").exists() and not (tmp_path / "ok.txt").exists()
    good = pilot_run(tmp_path, requests[:1], "--check")
    assert good.returncode == 0 and "no errors" in good.stdout
    assert not (tmp_path / "ok.txt").exists()
    done = pilot_run(tmp_path, "[{]")
    assert done.returncode == 2 and "not valid JSON" in done.stderr


def test_control_requests_cancel_remove_and_finish(tmp_path: Path) -> None:
    requests = [
        {"request": "submit", "jobs": [
            job("quick", execution=write("quick.txt", "1")),
            job("blocker", execution={"exec": "sleep", "args": ["30"]},
                resources={"numCores": {"exact": 2}}),
            job("queued", execution=write("queued.txt", "ran"),
                resources={"numCores": {"exact": 2}}),
            job("later", execution={"exec": "true"}, dependencies={"after": ["queued"]})]},
        {"request": "cancelJob", "jobName": "queued"},
        {"request": "jobStatus", "jobNames": ["queued", "later", "nope"]},
        {"request": "removeJob", "jobName": "later"},
        {"request": "submit", "jobs": [job("later", execution=write("later.txt", "again"))]},
        {"request": "finish"},
        {"request": "listJobs"},
    ]
    start = time.monotonic()
    done = pilot_run(tmp_path, requests)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 20, "finish must not wait for the sleeping task"
    answered = responses(tmp_path / "service.log")
    assert [kind for kind, _ in answered] == ["submit", "cancelJob", "jobStatus", "removeJob",
                                              "submit", "finish"]
    cancel, status, removal, resubmit = (r for _, r in answered[1:5])
    assert cancel["data"]["canceled"] == 1
    jobs = status["data"]["jobs"]
    assert jobs["queued"]["data"]["status"] == "CANCELED"
    assert jobs["later"]["data"]["status"] == "OMITTED"
    assert jobs["nope"]["status"] == 1 and "doesn't exist" in jobs["nope"]["message"]
    assert removal["data"] == {"removed": 1}
    assert resubmit["code"] == 0
    assert "the 1 request(s) after requests[5] are ignored" in \
        (tmp_path / "service.log").read_text()
    report = read_report(tmp_path / "jobs.report")
    assert report["blocker"]["state"] == "CANCELED"
    assert report["queued"]["state"] == "CANCELED"
    assert not (tmp_path / "queued.txt").exists()


def test_resume_does_not_rerun_succeeded_tasks(tmp_path: Path) -> None:
    count = tmp_path / "count"
    requests = [{"request": "submit", "jobs": [
        job("first", execution={"exec": "bash", "args": ["-c", f"echo first >> {count}"]}),
        # Kills the pilot once, as a crash would, after "first" succeeded: the first
        # process above the task running `psij pilot run` (its parent on a small node, its
        # worker's parent on a larger one).
        job("crash", execution={"exec": "bash", "args": [
            "-c", f"if [ ! -e {tmp_path}/crashed ]; then touch {tmp_path}/crashed; p=$PPID; "
                  "until [ \"$p\" -le 1 ] || "
                  "tr '\\0' ' ' < /proc/$p/cmdline | grep -q 'pilot run '; do "
                  "p=$(ps -o ppid= -p $p); done; "
                  f"kill -9 $p; sleep 5; fi; echo crash >> {count}"]},
            dependencies={"after": ["first"]}),
        job("last", execution={"exec": "bash", "args": ["-c", f"echo last >> {count}"]},
            dependencies={"after": ["crash"]})]},
        {"request": "control", "command": "finishAfterAllTasksDone"}]
    crashed = pilot_run(tmp_path, requests)
    assert crashed.returncode == -signal.SIGKILL
    assert count.read_text() == "first\n"
    resumed = pilot_run(tmp_path, requests, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert count.read_text() == "first\ncrash\nlast\n"
    report = read_report(tmp_path / "jobs.report")
    assert {name: e["state"] for name, e in report.items()} == {
        "first": "SUCCEED", "crash": "SUCCEED", "last": "SUCCEED"}


def test_resume_without_a_journal_is_refused(tmp_path: Path) -> None:
    done = pilot_run(tmp_path, [{"request": "listJobs"}], "--resume")
    assert done.returncode == 2 and "no journal" in done.stderr


def test_virtual_nodes_spread_tasks_and_a_two_node_task_gets_both(tmp_path: Path) -> None:
    requests = [{"request": "submit", "jobs": [
        job("pair", execution={"exec": "bash", "args": [
            "-c", "echo ${nnodes} ${nlist} $QCG_PM_NODELIST; cat $PSIJ_NODEFILE"],
            "stdout": "pair.out"},
            resources={"numNodes": {"exact": 2}, "numCores": {"exact": 1}}),
        job("spread", iteration={"stop": 2},
            execution={"script": "echo ${nlist} > spread.${it}; sleep 0.5"},
            dependencies={"after": ["pair"]})]}]
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(requests))
    done = subprocess.run([PSIJ_SCRIPT, "pilot", "run", str(path), "--nodes", "vn1:1,vn2:1"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pair.out").read_text() == "2 vn1,vn2 vn1,vn2\nvn1\nvn2\n"
    # One core per node: the two iterations run at once, one on each node.
    assert sorted((tmp_path / f"spread.{i}").read_text() for i in range(2)) == ["vn1\n",
                                                                                "vn2\n"]
    report = read_report(tmp_path / "jobs.report")
    assert report["pair"]["allocation"] == "vn1:1,vn2:1"
    assert report["pair"]["core_ids"] == "vn1[0],vn2[0]"
    # Run by the agent of vn1, which reaped its process and sent what it used.
    assert float(report["pair"]["cpu_seconds"]) >= 0 and int(report["pair"]["max_rss_bytes"]) > 0


def test_threads_model_and_wall_time(tmp_path: Path) -> None:
    requests = [{"request": "submit", "jobs": [
        job("omp", execution={"script": "echo $OMP_NUM_THREADS > omp.txt", "model": "threads"},
            resources={"numCores": {"exact": 2}}),
        job("overdue", execution={"exec": "sleep", "args": ["30"]},
            resources={"numCores": {"exact": 1}, "wt": "1s"})]}]
    start = time.monotonic()
    done = pilot_run(tmp_path, requests)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 20
    assert (tmp_path / "omp.txt").read_text() == "2\n"
    report = read_report(tmp_path / "jobs.report")
    assert report["omp"]["state"] == "SUCCEED"
    assert report["overdue"]["state"] == "FAILED"
