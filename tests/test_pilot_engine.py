"""The pilot engine running real processes: task environment, node file and TMPDIR life cycle,
cancel, dependencies, priorities, time limits, the journal and resume, and two virtual nodes
served by agents. Each test runs twice: with the tasks of the engine's node started by the
engine itself (what a node of three cores or fewer does by default) and through one worker."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

from psij._machine import IllegalEvent
from psij.executors.pilot._local_workers import WORKERS_VARIABLE
from psij.executors.pilot.allocation import configured_allocation, local_allocation
from psij.executors.pilot.engine import (
    EngineConfig,
    PilotEngine,
    TaskEvent,
    TaskShare,
    TaskSpec,
    TaskStatus,
    read_journal,
)
from psij.executors.pilot.resources import NodeSpec, ResourceRequest
from psij.executors.pilot.scheduler import TaskState
from support.hostile_lines import hostile_lines
from support.process_checks import without_inheritable_descriptors

SUCCEEDED, FAILED, CANCELED = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED
OMITTED, QUEUED, WAITING, RUNNING = (TaskState.OMITTED, TaskState.QUEUED, TaskState.WAITING,
                                     TaskState.RUNNING)
WAIT = 20.0


@pytest.fixture(autouse=True, params=["engine-starts-tasks", "one-worker"])
def task_starter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which process starts the tasks of the engine's node in this module's tests."""
    if request.param == "one-worker":
        monkeypatch.setenv(WORKERS_VARIABLE, "1")
    else:
        monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    return str(request.param)


class Recorder:
    """A listener keeping every event, and the thread it came on."""

    def __init__(self) -> None:
        self.events: List[TaskEvent] = []
        self.threads = set()

    def __call__(self, event: TaskEvent) -> None:
        self.events.append(event)
        self.threads.add(threading.current_thread().name)

    def states(self, task_id: str) -> List[TaskState]:
        return [e.state for e in self.events if e.task_id == task_id]


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Any]:
    engines: List[PilotEngine] = []

    def make(cores: int = 2, nodes: Optional[Sequence[Any]] = None, **config: Any
             ) -> PilotEngine:
        allocation = local_allocation(cores) if nodes is None else configured_allocation(nodes)
        config.setdefault("work_directory", tmp_path)
        config.setdefault("tmp_root", tmp_path)
        engine = PilotEngine(allocation, EngineConfig(**config))
        engine.add_listener(Recorder())
        engines.append(engine)
        engine.start()
        return engine

    yield make
    for engine in engines:
        engine.close()


def recorder(engine: PilotEngine) -> Recorder:
    return engine._listeners[0]  # type: ignore[return-value]


def sh(name: str, script: str, **kwargs: Any) -> TaskSpec:
    return TaskSpec(name, "/bin/sh", ["-c", script], **kwargs)


def finished(engine: PilotEngine, *names: str) -> Dict[str, TaskStatus]:
    assert engine.wait(list(names) or None, timeout=WAIT), "tasks did not end in time"
    return {n: engine.status(n) for n in (names or engine.task_ids())}


def wait_for(predicate: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- environment of a task --------------------------------------------------------------------


def test_task_gets_its_share_in_env_nodefile_and_a_fresh_tmpdir(make_engine: Any,
                                                                  tmp_path: Path) -> None:
    engine = make_engine(cores=2)
    dump = ("import json, os, sys; t = os.environ['TMPDIR']; "
            "print(json.dumps({'env': dict(os.environ), 'tmp_listing': os.listdir(t), "
            "'tmp_is_dir': os.path.isdir(t), 'cwd': os.getcwd(), "
            "'nodes': open(os.environ['PSIJ_NODEFILE']).read()}))")
    (tmp_path / "wd").mkdir()
    engine.submit(TaskSpec("two", sys.executable, ["-c", dump], directory="wd",
                           stdout="out.json", environment={"MINE": "x y"},
                           resources=ResourceRequest.from_qcg({"exact": 2})))
    status = finished(engine, "two")["two"]
    assert status.state is SUCCEEDED and status.exit_code == 0
    data = json.loads((tmp_path / "wd" / "out.json").read_text())
    env = data["env"]
    host = engine.allocation.local_node
    assert data["nodes"] == f"{host}\n{host}\n"
    assert data["cwd"] == str(tmp_path / "wd") and env["MINE"] == "x y"
    assert data["tmp_is_dir"] and data["tmp_listing"] == []
    expected = {"QCG_PM_NNODES": "1", "QCG_PM_NODELIST": host, "QCG_PM_NPROCS": "2",
                "QCG_PM_NTASKS": "2", "QCG_PM_STEP_ID": "two", "QCG_PM_TASKS_PER_NODE": "2",
                "SLURM_NNODES": "1", "SLURM_NODELIST": host, "SLURM_NPROCS": "2",
                "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": host, "SLURM_JOB_NUM_NODES": "1",
                "SLURM_STEP_NODELIST": host, "SLURM_STEP_NUM_NODES": "1",
                "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS_PER_NODE": "2",
                "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2",
                "SLURM_DISTRIBUTION": "arbitrary", "SLURM_HOSTFILE": env["PSIJ_NODEFILE"]}
    assert {k: env.get(k) for k in expected} == expected
    # Created before, removed after: neither the TMPDIR nor the node file is left.
    assert not os.path.exists(env["PSIJ_NODEFILE"])
    wait_for(lambda: not os.path.exists(env["TMPDIR"]), "the TMPDIR to be removed")
    assert status.share == TaskShare((host,), (2,), ((0, 1),), ((),))
    assert [s for _, s in status.history] == [QUEUED, RUNNING, SUCCEEDED]


def test_a_leftover_tmpdir_is_removed_and_each_task_gets_its_own(make_engine: Any,
                                                                  tmp_path: Path) -> None:
    engine = make_engine(cores=2)
    count = 12
    for i in range(count):
        engine.submit(sh(f"t{i}", 'test -z "$(ls -A "$TMPDIR")" || exit 3; '
                                  'mkdir -p "$TMPDIR/a/b"; echo x > "$TMPDIR/a/b/f"; '
                                  'echo "$TMPDIR"', stdout=f"t{i}.out"))
    statuses = finished(engine)
    assert {s.state for s in statuses.values()} == {SUCCEEDED}  # each found its TMPDIR empty
    paths = {(tmp_path / f"t{i}.out").read_text().strip() for i in range(count)}
    assert len(paths) == count
    # Removed with what the task left in it, shortly after the task ended.
    wait_for(lambda: not any(os.path.exists(p) for p in paths), "the TMPDIRs to be removed")
    tmp_root = Path(next(iter(paths))).parent
    engine.close()
    assert not tmp_root.exists()


def test_inherit_environment_false_gives_only_the_pilot_and_task_variables(
        make_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PILOT_SECRET", "leak")
    engine = make_engine(cores=1)
    engine.submit(TaskSpec("bare", "/usr/bin/env", inherit_environment=False,
                           environment={"ONLY": "1"}, stdout="env.txt"))
    finished(engine, "bare")
    names = {line.split("=", 1)[0] for line in (tmp_path / "env.txt").read_text().splitlines()}
    assert "ONLY" in names and "TMPDIR" in names and "QCG_PM_STEP_ID" in names
    assert "PILOT_SECRET" not in names and "PATH" not in names


def test_stdin_and_shared_stdout_stderr_and_created_directories(make_engine: Any,
                                                               tmp_path: Path) -> None:
    engine = make_engine(cores=1)
    (tmp_path / "in.txt").write_text("from stdin\n")
    engine.submit(sh("io", "cat; echo err >&2", stdin=str(tmp_path / "in.txt"),
                     directory="made/here", stdout="logs/both", stderr="logs/both",
                     create_directories=True))
    assert finished(engine, "io")["io"].state is SUCCEEDED
    assert (tmp_path / "made/here/logs/both").read_text() == "from stdin\nerr\n"


def test_tasks_that_cannot_start_fail_with_a_reason_and_free_their_cores(
        make_engine: Any) -> None:
    engine = make_engine(cores=1)
    engine.submit(TaskSpec("missing", "/no/such/program"))
    engine.submit(TaskSpec("nodir", "/bin/true", directory="absent"))
    engine.submit(TaskSpec("after", "/bin/true"))
    out = finished(engine, "missing", "nodir", "after")
    assert out["missing"].state is FAILED and out["missing"].exit_code == 127
    assert "'/no/such/program' was not found" in (out["missing"].message or "")
    assert "does not exist" in (out["nodir"].message or "")
    assert out["after"].state is SUCCEEDED
    assert RUNNING not in recorder(engine).states("missing")


def test_a_failing_task_reports_its_exit_code_and_stderr(make_engine: Any) -> None:
    engine = make_engine(cores=1)
    engine.submit(sh("bad", "echo 'no input.dat' >&2; exit 3", stderr="bad.err"))
    status = finished(engine, "bad")["bad"]
    assert status.state is FAILED and status.exit_code == 3
    assert "exited with code 3" in (status.message or "")
    assert "no input.dat" in (status.message or "")


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_a_queued_task_and_a_running_one(make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(cores=1, cancel_grace_period=5)
    engine.submit(sh("running", "touch started; exec sleep 60"))
    engine.submit(sh("queued", "touch queued-ran"))
    wait_for(lambda: (tmp_path / "started").exists(), "the first task to start")
    engine.cancel("queued")
    assert engine.status("queued").state is CANCELED
    began = time.monotonic()
    engine.cancel("running")
    out = finished(engine, "running", "queued")
    assert time.monotonic() - began < 3  # TERM was enough: no wait for the grace period
    assert out["running"].state is CANCELED and out["running"].exit_code == 143
    assert not (tmp_path / "queued-ran").exists()
    engine.cancel("running")  # already ended: nothing happens
    assert engine.usage().free_cores == 1


def test_a_task_ignoring_term_is_killed_after_the_grace_period(make_engine: Any,
                                                                tmp_path: Path) -> None:
    engine = make_engine(cores=1, cancel_grace_period=0.3)
    engine.submit(sh("stubborn", "trap '' TERM; touch started; while :; do sleep 0.05; done"))
    wait_for(lambda: (tmp_path / "started").exists(), "the task to start")
    engine.cancel("stubborn")
    status = finished(engine, "stubborn")["stubborn"]
    assert status.state is CANCELED and status.exit_code == 137


def test_a_time_limit_kills_the_task_and_fails_it(make_engine: Any) -> None:
    engine = make_engine(cores=1, cancel_grace_period=1)
    engine.submit(TaskSpec("slow", "/bin/sleep", ["30"], time_limit=0.2))
    status = finished(engine, "slow")["slow"]
    assert status.state is FAILED and status.exit_code == 143
    assert "exceeded its time limit of 0.2 s" in (status.message or "")


# -- dependencies and order -------------------------------------------------------------------


def test_dependencies_wait_then_omit_the_chain_of_a_failed_task(make_engine: Any) -> None:
    engine = make_engine(cores=2)
    engine.submit_many([
        sh("first", "sleep 0.1"), sh("second", "exit 0", after=["first"]),
        sh("broken", "exit 1"), sh("child", "exit 0", after=["broken"]),
        sh("grandchild", "exit 0", after=["child", "second"]),
    ])
    out = finished(engine)
    assert out["second"].state is SUCCEEDED and out["broken"].state is FAILED
    assert out["child"].state is OMITTED and out["grandchild"].state is OMITTED
    assert "dependency 'broken' ended FAILED" in (out["child"].message or "")
    rec = recorder(engine)
    assert rec.states("second") == [WAITING, QUEUED, RUNNING, SUCCEEDED]
    assert rec.states("child") == [WAITING, OMITTED]
    assert rec.threads == {"psij-pilot-engine"}


def test_iteration_groups_as_dependencies(make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(cores=2)
    engine.submit_many([sh(f"prep:{i}", f"echo {i} >> prep.log", group="prep")
                        for i in range(3)])
    engine.submit(sh("merge", "wc -l < prep.log > merged", after=["prep"]))
    finished(engine)
    assert (tmp_path / "merged").read_text().strip() == "3"


def test_priority_order_on_a_one_core_pool(make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(cores=1)
    gate = tmp_path / "gate"
    engine.submit(sh("blocker", f"while [ ! -e {gate} ]; do sleep 0.02; done"))
    order = [("low", 0), ("high", 5), ("mid", 2), ("high2", 5), ("low2", 0)]
    engine.submit_many([sh(name, f"echo {name} >> order.log", priority=priority)
                        for name, priority in order])
    gate.touch()
    finished(engine)
    assert (tmp_path / "order.log").read_text().split() == ["high", "high2", "mid", "low",
                                                            "low2"]


# -- bad input and listeners ------------------------------------------------------------------


def test_bad_submissions_raise_naming_the_field_and_add_nothing(make_engine: Any) -> None:
    engine = make_engine(cores=1)
    engine.submit(TaskSpec("a", "/bin/true"))
    with pytest.raises(ValueError, match=r"tasks\[1\].name: 'a' is already a task"):
        engine.submit_many([TaskSpec("b", "/bin/true"), TaskSpec("a", "/bin/true")])
    with pytest.raises(ValueError, match=r"tasks\[0\].after: 'nope' is neither a task"):
        engine.submit(TaskSpec("c", "/bin/true", after=["nope"]))
    assert engine.task_ids() == ["a"]
    engine.submit_many([TaskSpec("b", "/bin/true"), TaskSpec("c", "/bin/true", after=["b"])])
    with pytest.raises(TypeError, match="TaskSpec.arguments: expected a list"):
        TaskSpec("x", "/bin/true", arguments="-l")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="TaskSpec.time_limit: expected a number of seconds ab"):
        TaskSpec("x", "/bin/true", time_limit=0)
    with pytest.raises(ValueError, match="task_id: 'zz' is not a task of this pilot"):
        engine.status("zz")
    finished(engine)


def test_a_task_too_big_for_the_pool_fails_at_once(make_engine: Any) -> None:
    engine = make_engine(cores=2)
    engine.submit(TaskSpec("huge", "/bin/true", resources=ResourceRequest.from_qcg(
        {"exact": 3})))
    status = finished(engine, "huge")["huge"]
    assert status.state is FAILED and "can never fit" in (status.message or "")


def test_a_raising_listener_does_not_stop_others_or_the_engine(make_engine: Any) -> None:
    engine = make_engine(cores=1)

    def explode(event: TaskEvent) -> None:
        raise RuntimeError("listener bug")

    engine.add_listener(explode)
    late = Recorder()
    engine.add_listener(late)
    engine.submit(TaskSpec("t", "/bin/true"))
    assert finished(engine, "t")["t"].state is SUCCEEDED
    assert late.states("t") == [QUEUED, RUNNING, SUCCEEDED]


def test_prepare_hook_can_rewrite_a_task_once_its_share_is_known(make_engine: Any,
                                                                  tmp_path: Path) -> None:
    def prepare(spec: TaskSpec, share: TaskShare) -> TaskSpec:
        return TaskSpec(spec.name, spec.executable,
                        [a.replace("${ncores}", str(share.core_count)) for a in spec.arguments],
                        stdout=spec.stdout)

    engine = make_engine(cores=2, prepare=prepare)
    engine.submit(TaskSpec("p", "/bin/echo", ["${ncores}"], stdout="p.out",
                           resources=ResourceRequest.from_qcg({"min": 1, "max": 2})))
    finished(engine, "p")
    assert (tmp_path / "p.out").read_text() == "2\n"


# -- journal and resume -----------------------------------------------------------------------


def test_resume_does_not_rerun_succeeded_tasks(make_engine: Any, tmp_path: Path) -> None:
    journal = tmp_path / "pilot.journal"
    first = make_engine(cores=2, journal=journal)
    first.submit_many([
        sh("ok", "echo run >> ok.count"),
        sh("fails", "echo run >> fails.count; [ -e fixed ]"),
        sh("after-fails", "echo run >> after.count", after=["fails"]),
        sh("after-ok", "echo run >> after-ok.count", after=["ok"]),
        sh("dropped", "exec sleep 60"),
    ])
    wait_for(lambda: first.status("after-ok").state is SUCCEEDED, "after-ok")
    first.cancel("dropped")
    finished(first)
    first.close()
    records = read_journal(journal)
    assert [r["e"] for r in records].count("submit") == 5
    (tmp_path / "fixed").touch()
    second = make_engine(cores=2, journal=journal, resume=True)
    out = finished(second)
    assert {n: s.state for n, s in out.items()} == {
        "ok": SUCCEEDED, "fails": SUCCEEDED, "after-fails": SUCCEEDED, "after-ok": SUCCEEDED,
        "dropped": CANCELED}
    assert (tmp_path / "ok.count").read_text() == "run\n"
    assert (tmp_path / "after-ok.count").read_text() == "run\n"
    assert (tmp_path / "fails.count").read_text() == "run\nrun\n"
    assert "earlier run" in (out["ok"].message or "")
    # Restored as ended: no share, no state but its last, and no core ever taken for it.
    assert out["ok"].share is None and [s for _, s in out["ok"].history] == [SUCCEEDED]
    assert second.usage().free_cores == 2


def test_a_cut_last_journal_line_is_ignored(tmp_path: Path) -> None:
    journal = tmp_path / "j"
    journal.write_text('{"e": "submit", "task": {"name": "a", "executable": "x"}}\n{"e": "en')
    assert read_journal(journal) == [{"e": "submit",
                                      "task": {"name": "a", "executable": "x"}}]


# -- agents on virtual nodes ------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_two_virtual_nodes_through_agents(make_engine: Any, tmp_path: Path,
                                          transport: str) -> None:
    engine = make_engine(nodes=[("vnode1", 1), ("vnode2", 1)], agent_transport=transport)
    names = [f"t{i}" for i in range(6)]
    engine.submit_many([sh(n, 'echo "$QCG_PM_NODELIST $TMPDIR"; sleep 0.1', stdout=f"{n}.out")
                        for n in names])
    engine.submit(sh("both", 'cat "$PSIJ_NODEFILE"; echo "$SLURM_NODELIST $SLURM_NNODES"',
                     stdout="both.out", resources=ResourceRequest.from_qcg({"exact": 2})))
    out = finished(engine)
    assert all(s.state is SUCCEEDED for s in out.values()), out
    seen = [(tmp_path / f"{n}.out").read_text().split() for n in names]
    assert {node for node, _ in seen} == {"vnode1", "vnode2"}
    assert all(out[n].share is not None and out[n].share.nodes[0] == node  # type: ignore
               for n, (node, _) in zip(names, seen))
    assert not any(os.path.exists(tmp) for _, tmp in seen)
    assert (tmp_path / "both.out").read_text() == "vnode1\nvnode2\nvnode1,vnode2 2\n"
    # Each agent reaped its tasks and sent what their processes used.
    for status in out.values():
        assert status.use is not None and status.share is not None
        assert status.use.cpu_seconds is not None and status.use.max_rss_bytes
        assert status.use.cores == len(status.share.nodes)  # a core on each


def test_a_share_of_different_counts_per_node_is_told_as_slurm_tells_it(
        make_engine: Any, tmp_path: Path) -> None:
    # srun inside the task reads these: the counts in Slurm's form, no per-node count where
    # the nodes differ (srun refuses "2,1" there), and the node file as its host file.
    engine = make_engine(nodes=[("vnode1", 2), ("vnode2", 2), ("vnode3", 1)])
    show = ('echo "$SLURM_TASKS_PER_NODE $SLURM_STEP_TASKS_PER_NODE '
            '${SLURM_NTASKS_PER_NODE-unset} $SLURM_DISTRIBUTION"; '
            'test "$SLURM_HOSTFILE" = "$PSIJ_NODEFILE" && cat "$SLURM_HOSTFILE"')
    engine.submit(sh("uneven", show, stdout="uneven.out",
                     resources=ResourceRequest.from_qcg({"exact": 5})))
    engine.submit(sh("even", show, stdout="even.out",
                     resources=ResourceRequest.from_qcg({"exact": 4})))
    out = finished(engine)
    assert all(s.state is SUCCEEDED for s in out.values()), out
    assert (tmp_path / "uneven.out").read_text().split() == [
        "2(x2),1", "2(x2),1", "unset", "arbitrary", "vnode1", "vnode1", "vnode2", "vnode2",
        "vnode3"]
    assert (tmp_path / "even.out").read_text().split() == [
        "2(x2)", "2(x2)", "2", "arbitrary", "vnode1", "vnode1", "vnode2", "vnode2"]


def test_cancel_and_failures_on_an_agent_node(make_engine: Any, tmp_path: Path) -> None:
    engine = make_engine(nodes=[("vnode1", 1)], cancel_grace_period=5)
    engine.submit(sh("long", "touch started; exec sleep 60"))
    engine.submit(TaskSpec("missing", "/no/such/program"))
    wait_for(lambda: (tmp_path / "started").exists(), "the task on the agent")
    engine.cancel("long")
    out = finished(engine, "long", "missing")
    assert out["long"].state is CANCELED and out["long"].exit_code == 143
    assert out["missing"].state is FAILED and "was not found" in (out["missing"].message or "")
    assert out["missing"].exit_code == 127  # as on the pilot's own node
    # RUNNING once the agent reports the start, as on the pilot's own node: never for a task
    # that could not start.
    assert [state for _, state in out["missing"].history] == [QUEUED, FAILED]
    assert [state for _, state in out["long"].history] == [QUEUED, RUNNING, CANCELED]


def test_hostile_lines_on_the_agents_socket_leave_the_agents_served(
        make_engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    # Agents of other nodes connect over TCP, where anyone on the cluster can: a stranger's
    # line that cannot be read, is not a hello or is too long closes that connection only.
    engine = make_engine(nodes=[("vnode1", 1)], agent_transport="tcp")
    host, port = engine._agents.address[len("tcp:"):].rsplit(":", 1)
    engine.submit(sh("first", "true"))
    finished(engine, "first")  # the agent is connected
    lines = [
        *hostile_lines(),
        ("a token that is not ASCII", b'{"op": "hello", "node": "vnode1", "token": "\xc3\xa9"}'),
        ("a hello of a node taken", b'{"op": "hello", "node": "vnode1", "token": "x"}'),
    ]
    for number, (name, line) in enumerate(lines):
        engine.submit(sh(f"t{number}", "true"))  # served by the agent meanwhile
        with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
            try:
                sock.sendall(line + b"\n")
            except OSError:
                pass  # closed before the end of a line too long
            try:
                assert sock.recv(1) == b"", name  # then closed, without a word
            except ConnectionResetError:
                pass
    out = finished(engine)
    assert all(s.state is SUCCEEDED for s in out.values()), out
    assert engine.failure is None
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


def test_a_node_whose_agent_dies_fails_its_tasks_with_the_reason(tmp_path: Path) -> None:
    # The launcher prefix runs a shell that exits instead of starting the agent.
    broken = PilotEngine(configured_allocation(
        [NodeSpec("dead", 1)], agent_launcher=["/bin/sh", "-c", "echo no route; exit 3"]),
        EngineConfig(agent_transport="unix", tmp_root=tmp_path))
    broken.start()
    try:
        broken.submit(TaskSpec("t", "/bin/true"))
        assert broken.wait(["t"], timeout=WAIT)
        status = broken.status("t")
        assert status.state is FAILED
        assert "node dead is lost: its agent exited with code 3" in (status.message or "")
        assert "no route" in (status.message or "")
    finally:
        broken.close()


def test_a_node_whose_agent_is_killed_gets_no_more_tasks(make_engine: Any,
                                                         tmp_path: Path) -> None:
    engine = make_engine(nodes=[("vnode1", 1), ("vnode2", 1)], agent_transport="unix")
    engine.submit(sh("on1", "touch on1.started; sleep 2"))
    engine.submit(sh("on2", "touch on2.started; sleep 2"))
    engine.submit(sh("queued", "echo $QCG_PM_NODELIST", stdout="queued.out"))
    engine.submit(TaskSpec("pair", "/bin/true", resources=ResourceRequest.from_qcg(
        {"exact": 2})))
    wait_for(lambda: (tmp_path / "on1.started").exists() and (tmp_path / "on2.started")
             .exists(), "both tasks to start")
    assert engine.status("on2").share.nodes == ("vnode2",)  # type: ignore[union-attr]
    os.kill(engine._agents._agents["vnode2"].launcher.pid, 9)
    out = finished(engine, "on1", "on2", "queued", "pair")
    assert out["on1"].state is SUCCEEDED
    assert out["on2"].state is FAILED
    assert (out["on2"].message or "").startswith("node vnode2 is lost: its agent")
    # Queued behind on1, never placed on vnode2; the two-node task can no longer fit.
    assert out["queued"].state is SUCCEEDED
    assert (tmp_path / "queued.out").read_text() == "vnode1\n"
    assert out["pair"].state is FAILED and "can no longer fit" in (out["pair"].message or "")
    assert "node vnode2 is lost" in (out["pair"].message or "")
    later = [f"later{i}" for i in range(3)]
    engine.submit_many([TaskSpec(n, "/bin/true") for n in later])
    out = finished(engine, *later)
    assert [(s.state, s.share.nodes) for s in out.values()] == \
        [(SUCCEEDED, ("vnode1",))] * 3  # type: ignore[union-attr]
    assert engine.usage().free_cores == 1


class RecordingSocket:
    """Stands for an agent's connection: keeps each write."""

    def __init__(self) -> None:
        self.writes: List[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(data)


def test_requests_to_an_agent_go_in_one_write_per_turn_in_order(tmp_path: Path) -> None:
    import selectors

    from psij._clock import ManualClock
    from psij.executors.pilot._remote_nodes import RemoteNodes, _Agent
    from psij.executors.pilot._task_process import Launch

    nodes = RemoteNodes(configured_allocation([("vnode1", 4)]), EngineConfig(), ManualClock(),
                        selectors.DefaultSelector(), lambda e: None, lambda *a: None,
                        lambda *a: None, lambda *a: None)
    agent = _Agent("vnode1", tmp_path / "vnode1.log")
    agent.sock = RecordingSocket()  # type: ignore[assignment]
    nodes._agents["vnode1"] = agent
    for i in range(3):
        assert nodes.spawn("vnode1", Launch(f"t{i}", ["/bin/true"], str(tmp_path))) is None
    assert nodes.signal("vnode1", "t1", 2.0) is False
    assert agent.sock.writes == []  # type: ignore[attr-defined]
    nodes.flush()
    writes = agent.sock.writes  # type: ignore[attr-defined]
    assert len(writes) == 1
    lines = [json.loads(line) for line in writes[0].splitlines()]
    assert [(m["op"], m.get("id") or m["launch"]["task_id"]) for m in lines] == [
        ("spawn", "t0"), ("spawn", "t1"), ("spawn", "t2"), ("signal", "t1")]
    nodes.flush()
    assert len(writes) == 1  # nothing new, nothing sent


def test_forget_frees_the_name_of_an_ended_task(make_engine: Any) -> None:
    engine = make_engine(cores=1)
    engine.submit(sh("a", "sleep 0.2; exit 1"))
    with pytest.raises(IllegalEvent, match="forget: task 'a' is"):
        engine.forget("a")
    finished(engine, "a")
    engine.forget("a")
    assert engine.task_ids() == [] and engine.wait(timeout=0)
    engine.submit(TaskSpec("a", "/bin/true"))
    assert finished(engine, "a")["a"].state is SUCCEEDED
    assert engine.usage().free_cores == 1


def test_run_folders_of_killed_pilots_are_removed_once_started(make_engine: Any,
                                                                tmp_path: Path) -> None:
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    stale = tmp_path / f"psij-pilot-{dead.pid}-abc"
    (stale / "tmp" / "t1").mkdir(parents=True)
    live = tmp_path / f"psij-pilot-{os.getpid()}-def"
    live.mkdir()
    not_a_run = tmp_path / f"psij-pilot-{dead.pid}"
    not_a_run.mkdir()
    engine = make_engine(cores=1)
    # Swept by the engine thread once it has nothing more urgent to do.
    wait_for(lambda: not stale.exists(), "the stale run folder to be removed")
    assert live.exists() and not_a_run.exists()
    own = [p for p in tmp_path.iterdir() if p.name.startswith(f"psij-pilot-{os.getpid()}-")
           and p != live]
    assert len(own) == 1 and own[0].stat().st_mode & 0o777 == 0o700
    engine.close()
    assert not own[0].exists()


# -- how tasks are started ----------------------------------------------------------------------

PROBE = ("import json, os; "
         "print(json.dumps({'own_group': os.getpgrp() == os.getpid(), 'cwd': os.getcwd(), "
         "'fds': sorted(int(f) for f in os.listdir('/proc/self/fd')), "
         "'tmp': os.environ['TMPDIR'], 'step': os.environ['QCG_PM_STEP_ID']}))")
SIGPIPE_BIT = 1 << 12  # SIGPIPE (13) in the SigIgn mask of /proc/<pid>/status


@pytest.fixture
def no_inherited_descriptors() -> Iterator[None]:
    with without_inheritable_descriptors():
        yield


@pytest.mark.parametrize("posix_spawn", [True, False], ids=["posix_spawn", "popen"])
@pytest.mark.usefixtures("no_inherited_descriptors")
def test_tasks_in_the_pilots_own_directory_start_as_any_other(
        make_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        posix_spawn: bool) -> None:
    # Tasks running in the working directory of the pilot (and so of its workers) are started
    # the cheap way (posix_spawn), others through Popen; what they get must not differ.
    monkeypatch.chdir(tmp_path)
    if not posix_spawn:
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho tool $1\n")
    (tools / "mytool").chmod(0o755)
    (tools / "noexec").write_text("#!/bin/sh\n")
    engine = make_engine(cores=2)
    path = f"{tools}:{os.environ['PATH']}"
    engine.submit_many([
        TaskSpec("probe", sys.executable, ["-c", PROBE], stdout="probe.out"),
        TaskSpec("on-path", "mytool", ["x"], environment={"PATH": path}, stdout="tool.out"),
        TaskSpec("missing", "no-such-tool-here", environment={"PATH": path}),
        TaskSpec("not-executable", str(tools / "noexec")),
        # grep reports the signals it was started with ignored (Python, unlike a task,
        # ignores SIGPIPE itself).
        TaskSpec("signals", "grep", ["^SigIgn", "/proc/self/status"], stdout="sig.out"),
    ])
    out = finished(engine)
    assert out["probe"].state is SUCCEEDED and out["on-path"].state is SUCCEEDED
    ignored = int((tmp_path / "sig.out").read_text().split()[1], 16)
    assert not ignored & SIGPIPE_BIT
    data = json.loads((tmp_path / "probe.out").read_text())
    assert data["own_group"]
    assert data["cwd"] == str(tmp_path) and data["step"] == "probe"
    assert data["fds"] == [0, 1, 2, 3]  # 3: the listing's own descriptor
    assert (tmp_path / "tool.out").read_text() == "tool x\n"
    assert out["missing"].state is FAILED and "was not found" in (out["missing"].message or "")
    assert out["not-executable"].state is FAILED
    assert "cannot be executed" in (out["not-executable"].message or "")


@pytest.mark.usefixtures("no_inherited_descriptors")
def test_descriptors_the_pilot_inherited_are_not_passed_to_tasks(make_engine: Any,
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    monkeypatch.chdir(tmp_path)
    read, write = os.pipe()
    try:
        os.set_inheritable(write, True)
        engine = make_engine(cores=1)
        engine.submit(TaskSpec("probe", sys.executable, ["-c", PROBE], stdout="probe.out"))
        assert finished(engine, "probe")["probe"].state is SUCCEEDED
    finally:
        os.close(read)
        os.close(write)
    assert json.loads((tmp_path / "probe.out").read_text())["fds"] == [0, 1, 2, 3]


def test_the_loop_watch_reaps_signals_and_runs_timed_actions_on_its_thread() -> None:
    import selectors
    import signal

    from psij.executors.pilot._task_process import HAS_PIDFD, LoopWatch

    if not HAS_PIDFD:
        pytest.skip("this system cannot watch processes through pidfds (Linux 5.3+)")
    selector = selectors.DefaultSelector()
    watch = LoopWatch(selector)
    assert watch.next_timeout() is None
    child = subprocess.Popen(["sleep", "60"], process_group=0)
    exits: List[Any] = []
    order: List[str] = []
    watch.watch(child.pid, lambda pid, status: exits.append((pid, status)))
    watch.call_later(0.02, lambda: order.append("second"))
    watch.call_later(0.01, lambda: order.append("first"))
    watch.signal_later(child.pid, signal.SIGTERM, 0.05)
    deadline = time.monotonic() + WAIT
    while not exits and time.monotonic() < deadline:
        for key, mask in selector.select(watch.next_timeout()):
            key.data(mask)
        watch.run_due()
    child.returncode = -signal.SIGTERM  # reaped by the watch, not by Popen
    assert exits and exits[0][0] == child.pid and os.WTERMSIG(exits[0][1]) == signal.SIGTERM
    assert order == ["first", "second"]
    # Reaped: its id may be reused, so it is never signalled again.
    assert not watch.signal_group(child.pid, signal.SIGKILL)
    assert not selector.get_map()
    watch.close()
    selector.close()
