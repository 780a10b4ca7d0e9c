"""An elastic pilot's allocations: asked for through any PSI/J executor, joined, given back.

The engine's side of an :class:`~psij.executors.pilot.allocation_policy.AllocationPolicy`.
The decisions are :class:`~psij.executors.pilot._elastic_machine.ElasticMachine`'s; this
module carries them out and feeds it what happened. It runs on the engine thread: the engine
calls :meth:`ElasticAllocations.turn` once per turn of its loop (after its scheduling pass,
so the backlog is what that pass could not place) and asks :meth:`ElasticAllocations.due_in`
for its next timer. What may block (an executor's submit or cancel: an ``sbatch`` that hangs)
runs on a thread of its own, whose outcome comes back to the engine thread as a posted call;
so do the allocation jobs' status changes.

An allocation is one job of the policy's executor that runs one agent per node
(``python -m psij.executors.pilot.agent --allocation NAME --connect ADDRESS --token-file
PATH``). Its agents connect back to the engine's agent listener (see
:class:`~psij.executors.pilot._remote_nodes.RemoteNodes`; its address is set by
``EngineConfig.agent_transport`` and ``agent_host``) and say hello with the allocation's
token, which is read from a file (0600, in a folder of the pilot's work directory made 0700
for this run: ``.psij-allocations-<pid>-<random>``, where each allocation's output is kept
too). The token is never on a command line or in the tasks' environment. A node that joins
is added to the scheduler's pool (``NodeAdded``); a node given back is sent ``stop`` and
taken out of the pool first (``NodeLost``), and its job is then cancelled.

What it counts for the machine: the backlog is the number of QUEUED tasks after a pass; an
allocation's running tasks are those sent to its nodes' agents that have not ended.
"""

import os
import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set

from psij._lazylog import LazyLogger
from psij.executors.pilot._elastic_machine import (
    DRAINING,
    PENDING,
    RUNNING,
    SUBMITTING,
    Action,
    AllocationEnded,
    AllocationStarted,
    BacklogChanged,
    Closing,
    ElasticMachine,
    Event,
    GiveBack,
    StopAsking,
    SubmitAllocation,
    SubmitFailed,
    Submitted,
    TasksChanged,
    Tick,
)
from psij.executors.pilot._token_file import write_token_file
from psij.executors.pilot.allocation_policy import AllocationPolicy
from psij.executors.pilot.resources import NodeSpec
from psij.executors.pilot.scheduler import NodeAdded, NodeLost, TaskState

if TYPE_CHECKING:
    from psij.executors.pilot._remote_nodes import RemoteNodes
    from psij.executors.pilot.engine import PilotEngine
    from psij.job import Job
    from psij.job_executor import JobExecutor
    from psij.job_spec import JobSpec

__all__ = ["ElasticAllocations", "allocation_spec"]

logger = LazyLogger(__name__)

_SHUTDOWN_WAIT = 10.0


def allocation_spec(policy: AllocationPolicy, name: str, address: str, token_file: Path,
                    python: str, folder: Path) -> "JobSpec":
    """The job of allocation ``name``: one agent per node, joining the pilot at ``address``."""
    from datetime import timedelta

    from psij.job_attributes import JobAttributes
    from psij.job_spec import JobSpec
    from psij.resource_spec import ResourceSpecV1

    arguments = ["-m", "psij.executors.pilot.agent", "--connect", address, "--token-file",
                 str(token_file), "--allocation", name]
    if policy.cores_per_node is not None:
        arguments += ["--cores", str(policy.cores_per_node)]
    if policy.gpus_per_node:
        arguments += ["--gpus", str(policy.gpus_per_node)]
    resources = ResourceSpecV1(
        node_count=policy.nodes, processes_per_node=1,
        cpu_cores_per_process=policy.cores_per_node,
        gpu_cores_per_process=policy.gpus_per_node or None)
    attributes = JobAttributes(
        duration=timedelta(seconds=policy.duration), queue_name=policy.queue,
        account=policy.account,
        custom_attributes=dict(policy.custom_attributes) if policy.custom_attributes
        else None)
    # One agent per node: a single process for one node, else the scheduler's launcher.
    launcher = "single" if policy.nodes == 1 else (
        "srun" if policy.executor == "slurm" else "mpirun")
    return JobSpec(executable=python, arguments=arguments, directory=folder,
                   name=f"psij-pilot-{name}", resources=resources, attributes=attributes,
                   stdout_path=folder / f"{name}.out", stderr_path=folder / f"{name}.err",
                   launcher=launcher)


class ElasticAllocations:
    """The allocations of one engine (see the module documentation)."""

    def __init__(self, engine: "PilotEngine", policy: AllocationPolicy,
                 agents: "RemoteNodes", post: Callable[[Callable[[], None]], None]) -> None:
        self._engine = engine
        self.policy = policy
        self._machine = ElasticMachine(policy)
        self._agents = agents
        self._post = post  # runs a call on the engine thread
        self._lock = threading.Lock()  # around the machine: status() is read from anywhere
        self._jobs: Dict[str, Job] = {}
        self._nodes: Dict[str, List[str]] = {}
        self._early_start: Set[str] = set()  # joined before the submission was answered
        self._early_end: Dict[str, str] = {}  # ended before it was answered
        self._executor: Optional[JobExecutor] = None
        self._executor_lock = threading.Lock()
        self._closed = False
        self._ticked = False
        self._threads: List[threading.Thread] = []  # submits and cancels under way
        self.folder = _make_folder(engine.config.work_directory)
        self._token_file = self.folder / "token"
        token = os.urandom(16).hex()
        write_token_file(self._token_file, token)
        agents.join_token = token
        agents.joiner = self._joined

    # -- queries (any thread) ---------------------------------------------------------------

    def status(self) -> Dict[str, Any]:
        """The allocations (each with its state, native id, why it was asked for and why it
        ended or was given back, its nodes and how many tasks run there), the backlog, and
        why the pilot stopped asking, if it did."""
        with self._lock:
            views = self._machine.allocations()
            return {
                "backlog": self._machine.backlog, "stopped": self._machine.stopped,
                "folder": str(self.folder),
                "allocations": [{
                    "name": v.allocation, "state": v.state, "native_id": v.native_id,
                    "asked_because": v.asked_because, "ended_because": v.ended_because,
                    "nodes": list(self._nodes.get(v.allocation, ())),
                    "running_tasks": v.running_tasks} for v in views]}

    # -- the engine thread ------------------------------------------------------------------

    def due_in(self, now: float) -> Optional[float]:
        with self._lock:
            wake = self._machine.next_wake()
        return None if wake is None else wake - now

    def turn(self) -> None:
        """Tell the machine the backlog and the allocations' use, and act on what it says."""
        engine = self._engine
        with engine._lock:
            queued = engine._scheduler.counts()[TaskState.QUEUED]
        agents = self._agents
        busy = {name: sum(agents.running_on(node) for node in nodes)
                for name, nodes in self._nodes.items()}
        with self._lock:
            machine = self._machine
            if queued != machine.backlog:
                self._step(BacklogChanged(queued))
            for view in machine.allocations():
                if view.state in (RUNNING, DRAINING):
                    count = busy.get(view.allocation, 0)
                    if count != view.running_tasks:
                        self._step(TasksChanged(view.allocation, count))
            wake = machine.next_wake()
            if not self._ticked or (wake is not None and wake <= engine._clock.now()):
                self._ticked = True  # the first: min_allocations are asked for at start
                self._step(Tick())

    def close(self) -> None:
        """The pilot closes: every allocation is given back."""
        with self._lock:
            self._closed = True
            self._step(Closing())

    def shutdown(self) -> None:
        """The engine stopped: the cancels under way are waited for (10 s at most), and
        the token goes (the allocations' output stays)."""
        clock = self._engine._clock
        deadline = clock.now() + _SHUTDOWN_WAIT
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - clock.now()))
        try:
            os.unlink(self._token_file)
        except OSError:
            pass

    def _step(self, event: Event) -> None:
        # With self._lock held, on the engine thread.
        for action in self._machine.step(event, self._engine._clock.now()):
            self._act(action)

    def _act(self, action: Action) -> None:
        if isinstance(action, SubmitAllocation):
            logger.info("pilot: asking for allocation %s (%s)", action.allocation, action.why)
            self._spawn(partial(self._submit, action.allocation))
        elif isinstance(action, GiveBack):
            logger.info("pilot: giving back allocation %s (%s)", action.allocation, action.why)
            self._release_nodes(action.allocation, action.why)
            job = self._jobs.get(action.allocation)
            if job is not None:
                self._spawn(partial(self._cancel, job))
        elif isinstance(action, StopAsking):
            logger.error("pilot: %s", action.why)

    def _release_nodes(self, allocation: str, why: str) -> None:
        engine = self._engine
        for node in self._nodes.get(allocation, ()):
            self._agents.release(node, why)
            with engine._lock:
                if node not in engine._scheduler.pool.lost_nodes:
                    transitions = engine._scheduler.step(NodeLost(node, why))
                    if transitions:
                        engine._ended(transitions)
                    engine._dirty = True

    def _joined(self, node: str, allocation: str, cores: int, gpus: int) -> Optional[str]:
        """RemoteNodes: a node of ``allocation`` says hello; why it is refused, or None."""
        with self._lock:
            try:
                view = self._machine.allocation(allocation)
            except Exception:
                return "not an allocation of this pilot"
            if view.state not in (SUBMITTING, PENDING, RUNNING):
                return f"allocation {allocation} is {view.state}"
            nodes = self._nodes.setdefault(allocation, [])
            if len(nodes) >= self.policy.nodes:
                return f"allocation {allocation} has {len(nodes)} nodes already"
            engine = self._engine
            with engine._lock:
                engine._scheduler.step(NodeAdded(NodeSpec(node, cores, gpus=gpus)))
                engine._dirty = True
            nodes.append(node)
            if view.state == SUBMITTING:
                self._early_start.add(allocation)
            elif view.state == PENDING:
                self._step(AllocationStarted(allocation))
        logger.info("pilot: node %s of allocation %s joined (%d cores, %d GPUs)", node,
                    allocation, cores, gpus)
        return None

    def _answered(self, allocation: str, job: "Optional[Job]", why: Optional[str]) -> None:
        with self._lock:
            if job is None:
                self._step(SubmitFailed(allocation, why or "unknown error"))
                logger.warning("pilot: allocation %s could not be submitted: %s",
                               allocation, why)
                return
            self._jobs[allocation] = job
            self._step(Submitted(allocation, job.native_id or "?"))
            if allocation in self._early_start:
                self._early_start.discard(allocation)
                if self._machine.allocation(allocation).state == PENDING:
                    self._step(AllocationStarted(allocation))
            ended = self._early_end.pop(allocation, None)
        if ended is not None:
            self._job_ended(allocation, ended)

    def _job_ended(self, allocation: str, why: str) -> None:
        with self._lock:
            state = self._machine.allocation(allocation).state
            if state == SUBMITTING:
                self._early_end[allocation] = why
                return
            if state not in (PENDING, RUNNING, DRAINING):
                return
        # Its nodes are gone: nothing more is placed there (RemoteNodes fails their tasks
        # when their connections close).
        self._release_nodes(allocation, f"allocation {allocation} ended: {why}")
        with self._lock:
            self._step(AllocationEnded(allocation, why))

    # -- other threads ----------------------------------------------------------------------

    def _spawn(self, work: Callable[[], None]) -> None:
        thread = threading.Thread(target=work, name="psij-pilot-allocations", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _submit(self, allocation: str) -> None:
        from psij.job import Job

        try:
            executor = self._get_executor()
            spec = allocation_spec(self.policy, allocation, self._agents.address,
                                   self._token_file, self._engine.config.agent_python,
                                   self.folder)
            job = Job(spec)
            job.set_job_status_callback(partial(self._status_changed, allocation))
            executor.submit(job)
            if self._closed:  # the pilot closed meanwhile: its loop may be gone
                self._cancel(job)
        except Exception as ex:
            self._post(partial(self._answered, allocation, None, f"{ex}"))
            return
        self._post(partial(self._answered, allocation, job, None))

    def _status_changed(self, allocation: str, job: "Job", status: Any) -> None:
        if not status.final:
            return
        why = status.state.name
        if status.message:
            why += f": {status.message}"
        elif status.exit_code is not None:
            why += f" (exit code {status.exit_code})"
        if status.state.name == "FAILED":
            why += f"; its output: {self.folder / allocation}.out and .err"
        self._post(partial(self._job_ended, allocation, why))

    def _cancel(self, job: "Job") -> None:
        try:
            if job.executor is not None:
                job.cancel()
        except Exception as ex:
            logger.warning("pilot: cancelling allocation job %s failed: %s", job.native_id, ex)

    def _get_executor(self) -> "JobExecutor":
        with self._executor_lock:
            if self._executor is None:
                from psij.job_executor import JobExecutor

                policy = self.policy
                self._executor = JobExecutor.get_instance(
                    policy.executor, url=policy.executor_url, config=policy.executor_config)
            return self._executor


def _make_folder(base: Path) -> Path:
    while True:
        path = Path(base) / f".psij-allocations-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
