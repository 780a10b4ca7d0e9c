"""The engine's side of its agents: one agent per node other than the pilot's own.

It starts each agent through the allocation's launcher, accepts their connections on one
listening socket (``unix:`` or ``tcp:``), checks each agent's hello and token, sends spawn,
signal and stop requests (held per agent and sent together once per turn of the engine's loop,
by :meth:`RemoteNodes.flush`, so that a burst of tasks costs one write per agent rather than
one per task), and turns what agents report into calls on the engine: a task's start
(``on_started``), its end (``on_exit``) and a node lost with the tasks it had (``on_lost``).
Lines both ways are framed by :mod:`psij._line_framing`; the protocol is described in
:mod:`psij.executors.pilot.agent`.

It runs on the engine thread only (its sockets are registered in the engine's selector) and
decides nothing about tasks: which task runs where is the scheduler's, what an end means is
the engine's. Connect deadlines are measured on the engine's :class:`~psij._clock.Clock`.
"""

import os
import selectors
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Set

from psij._clock import Clock
from psij._lazylog import LazyLogger
from psij._line_framing import BadLine, LineFramer, decode_line, encode_line
from psij._spawn import popen
from psij.executors._process_watch import WATCH, exit_code_of
from psij.executors.pilot._engine_events import AgentLauncherExited, EngineEvent
from psij.executors.pilot._task_process import Launch
from psij.executors.pilot.allocation import Allocation
from psij.executors.pilot.engine_config import EngineConfig
from psij.executors.pilot.tasks import ReportedUse, reported_use

if TYPE_CHECKING:
    import socket

__all__ = ["RemoteNodes"]

logger = LazyLogger(__name__)

_RECV_SIZE = 65536
_MAX_LINE = 1024 * 1024  # an agent's lines are a hello and task ends: far less

ExitHandler = Callable[[str, Optional[int], Optional[str], Optional[ReportedUse]], None]
LostHandler = Callable[[str, List[str], str], None]
StartHandler = Callable[[str], None]
# An elastic pilot's node joining: (node, allocation, cores, gpus) -> why it is refused, or None.
JoinHandler = Callable[[str, str, int, int], Optional[str]]


class _Agent:
    """What the engine knows of one node's agent."""

    __slots__ = ("connected_at", "launcher", "log", "lost", "node", "outbox", "pending", "sock",
                 "tasks")

    def __init__(self, node: str, log: Path) -> None:
        self.node = node
        self.log = log
        self.launcher: Optional[Any] = None
        self.sock: Optional[socket.socket] = None
        self.pending: List[Dict[str, Any]] = []  # spawn messages waiting for the connection
        self.outbox: List[bytes] = []  # lines for the connected agent, sent by flush()
        self.tasks: Set[str] = set()  # tasks started there and not yet ended
        self.lost: Optional[str] = None
        self.connected_at: Optional[float] = None


class _Connection:
    """An accepted connection: its framing, and its agent once the hello was accepted."""

    __slots__ = ("agent", "framer", "sock")

    def __init__(self, sock: "socket.socket") -> None:
        self.sock = sock
        self.framer = LineFramer(_MAX_LINE)
        self.agent: Optional[_Agent] = None


class RemoteNodes:
    """The agents of an allocation's remote nodes (see the module documentation)."""

    def __init__(self, allocation: Allocation, config: EngineConfig, clock: Clock,
                 selector: selectors.BaseSelector, post: Callable[[EngineEvent], None],
                 on_exit: ExitHandler, on_lost: LostHandler, on_started: StartHandler
                 ) -> None:
        self._allocation = allocation
        self._config = config
        self._clock = clock
        self._selector = selector
        self._post = post
        self._on_exit = on_exit
        self._on_lost = on_lost
        self._on_started = on_started
        self._agents: Dict[str, _Agent] = {}
        self._unsent: List[_Agent] = []  # agents with lines in their outbox
        self._accepted: Set[socket.socket] = set()  # connections not dropped: closed at stop
        self._listener: Optional[socket.socket] = None
        self._token = ""
        self.address = ""
        self.closing = False  # lost nodes are then expected, and not logged as errors
        # An elastic pilot's: the token its allocations' agents give, and who takes them in.
        self.join_token: Optional[str] = None
        self.joiner: Optional[JoinHandler] = None
        self._logs: Optional[Path] = None

    def __bool__(self) -> bool:
        return bool(self._agents)

    def start(self, run_dir: Path) -> None:
        """Listen, and start one agent per remote node (its log in ``run_dir/agents``)."""
        import socket

        allocation, config = self._allocation, self._config
        transport = config.agent_transport
        policy = config.allocation_policy
        remote = bool(allocation.agent_launcher) or (policy is not None
                                                     and policy.executor != "local")
        if transport == "auto":
            transport = "tcp" if remote else "unix"
        if transport == "unix":
            path = str(run_dir / "agents.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            os.chmod(path, 0o600)
            self.address = f"unix:{path}"
        else:
            # Agents started on this machine connect to the loopback address; agents on other
            # nodes to this node's name.
            host = config.agent_host or (socket.gethostname() if remote else "127.0.0.1")
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((host, 0))
            self.address = f"tcp:{host}:{listener.getsockname()[1]}"
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, self._accept)
        self._token = os.urandom(16).hex()
        logs = self._logs = run_dir / "agents"
        logs.mkdir()
        for node in allocation.remote_nodes:
            agent = _Agent(node, logs / f"{node}.log")
            self._agents[node] = agent
            self._launch(agent)

    def _launch(self, agent: _Agent) -> None:
        import subprocess

        node = agent.node
        argv = [a.replace("{node}", node) for a in self._allocation.agent_launcher]
        argv += [self._config.agent_python, "-m", "psij.executors.pilot.agent",
                 "--connect", self.address, "--node", node]
        agent.connected_at = self._clock.now()
        try:
            with open(agent.log, "wb") as log:
                proc = popen(argv, stdin=subprocess.PIPE, stdout=log,
                             stderr=subprocess.STDOUT, env=None)
        except OSError as ex:
            agent.lost = f"its agent could not be started ({' '.join(argv)}): {ex}"
            logger.error("pilot: node %s: %s", node, agent.lost)
            return
        agent.launcher = proc
        assert proc.stdin is not None
        try:
            # The token goes through stdin, never on a command line others can read.
            proc.stdin.write((self._token + "\n").encode())
            proc.stdin.close()
        except BrokenPipeError:
            # It exited already: the watch below reports how.
            try:
                proc.stdin.close()
            except OSError:
                pass
        WATCH.watch(proc.pid, lambda pid, status: self._launcher_exited(node, proc, status))

    def _launcher_exited(self, node: str, proc: Any, status: Optional[int]) -> None:
        # On the ProcessWatch thread: queue only.
        code = exit_code_of(status)
        proc.returncode = code if code is not None else -1
        self._post(AgentLauncherExited(node, code))

    # -- requests from the engine -------------------------------------------------------------

    def spawn(self, node: str, launch: Launch) -> Optional[str]:
        """Have ``node``'s agent start ``launch``; why the node is lost if it is, else None."""
        agent = self._agents[node]
        if agent.lost is not None:
            return agent.lost
        agent.tasks.add(launch.task_id)
        message = {"op": "spawn", "launch": launch.to_json()}
        if agent.sock is None:
            agent.pending.append(message)
        else:
            self._send(agent, message)
        return None

    def signal(self, node: str, task_id: str, grace: float) -> bool:
        """Stop ``task_id`` on ``node`` (TERM, KILL after ``grace``); True if it had not been
        sent to the agent yet, and so never started."""
        agent = self._agents[node]
        waiting = [m for m in agent.pending if m["launch"]["task_id"] == task_id]
        if waiting:
            agent.pending.remove(waiting[0])
            agent.tasks.discard(task_id)
            return True
        if agent.sock is not None:
            self._send(agent, {"op": "signal", "id": task_id, "grace": grace})
        return False

    def send(self, node: str, task_id: str, signum: int) -> None:
        """Send ``signum`` alone to ``task_id``'s group on ``node``."""
        agent = self._agents[node]
        if agent.sock is not None:
            self._send(agent, {"op": "signal", "id": task_id, "signum": signum})

    def task_ended(self, node: Optional[str], task_id: str) -> None:
        agent = self._agents.get(node or "")
        if agent is not None:
            agent.tasks.discard(task_id)

    def launcher_exited(self, event: AgentLauncherExited) -> None:
        self._lose(event.node, event.code)

    def flush(self) -> None:
        """Send what each agent's outbox holds, in one write per agent."""
        unsent, self._unsent = self._unsent, []
        for agent in unsent:
            lines, agent.outbox = agent.outbox, []
            if agent.sock is None or not lines:
                continue
            try:
                agent.sock.sendall(b"".join(lines))
            except OSError as ex:
                self._lose(agent.node, None, f"sending to its agent failed: {ex}")

    def running_on(self, node: str) -> int:
        """How many tasks were sent to ``node``'s agent and have not ended (0 for a node
        this does not know)."""
        agent = self._agents.get(node)
        return 0 if agent is None else len(agent.tasks) + len(agent.pending)

    def release(self, node: str, why: str) -> None:
        """An elastic pilot gives ``node`` back: its agent is asked to stop, and the node is
        lost (``why``) without an error logged."""
        agent = self._agents.get(node)
        if agent is None or agent.lost is not None:
            return
        if agent.sock is not None:
            self.flush()
            try:
                agent.sock.sendall(encode_line({"op": "stop"}))
            except OSError:
                pass  # gone already
        closing, self.closing = self.closing, True
        try:
            self._lose(node, None, why)
        finally:
            self.closing = closing

    def stop(self) -> None:
        """Ask every connected agent to stop, and close every socket."""
        self.flush()
        for agent in self._agents.values():
            if agent.sock is not None:
                try:
                    agent.sock.sendall(encode_line({"op": "stop"}))
                except OSError:
                    pass  # the agent is gone already: its socket is closed all the same
                agent.sock.close()
                agent.sock = None
        if self._listener is not None:
            self._listener.close()
        for sock in self._accepted:  # those without a hello yet, or whose agent is lost
            sock.close()
        self._accepted.clear()

    # -- connect deadlines ----------------------------------------------------------------------

    def _waiting(self) -> Iterator[_Agent]:
        for agent in self._agents.values():
            if agent.sock is None and agent.lost is None and agent.connected_at is not None:
                yield agent

    def next_deadline_in(self) -> Optional[float]:
        """Seconds until the next agent that has not connected yet is given up (may be < 0)."""
        waiting = [a.connected_at for a in self._waiting() if a.connected_at is not None]
        if not waiting:
            return None
        return min(waiting) + self._config.agent_connect_timeout - self._clock.now()

    def check_deadlines(self) -> None:
        limit = self._config.agent_connect_timeout
        now = self._clock.now()
        for agent in list(self._waiting()):
            assert agent.connected_at is not None
            if now - agent.connected_at > limit:
                self._lose(agent.node, None, f"its agent did not connect within {limit:g} s")

    # -- connections ------------------------------------------------------------------------

    def _accept(self, mask: int) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        self._accepted.add(sock)
        conn = _Connection(sock)
        self._selector.register(sock, selectors.EVENT_READ, lambda m: self._read(conn))

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(_RECV_SIZE)
        except OSError:
            data = b""
        agent = conn.agent
        if not data:
            self._drop_connection(conn.sock)
            if agent is not None and agent.sock is conn.sock:
                agent.sock = None
                self._lose(agent.node, None, "its agent's connection closed")
            return
        for line in conn.framer.feed(data):
            try:
                message = decode_line(line, surrogates=True)
                if not isinstance(message, dict):
                    raise BadLine("expected a JSON object")
            except BadLine as bad:
                logger.warning("pilot: a message from %s cannot be read (%s): %r",
                               f"node {agent.node}'s agent" if agent is not None
                               else "a connection without hello", bad, line[:200])
                if agent is None:
                    self._drop_connection(conn.sock)
                    return
                continue
            if agent is None:
                agent = self._hello(conn.sock, message)
                if agent is None:
                    self._drop_connection(conn.sock)
                    return
                conn.agent = agent
            elif message.get("op") == "exited":
                self._on_exit(str(message.get("id")), message.get("code"),
                              message.get("message"), reported_use(
                                  message.get("cpu_seconds"), message.get("max_rss_bytes")))
            elif message.get("op") == "started":
                self._on_started(str(message.get("id")))
            elif message.get("op") == "leaving" and agent.lost is None:
                # Nothing more goes there; its tasks' ends still come, or its loss fails them.
                self._on_lost(agent.node, [], str(message.get("why"))[:200])
        if conn.framer.too_long:  # no agent says that much: whoever it is goes
            logger.warning("pilot: a line longer than %d bytes from %s; closing that "
                           "connection", _MAX_LINE, f"node {agent.node}'s agent"
                           if agent is not None else "a connection without hello")
            self._drop_connection(conn.sock)
            if agent is not None and agent.sock is conn.sock:
                agent.sock = None
                self._lose(agent.node, None, "its agent sent a line too long")

    def _hello(self, sock: "socket.socket", message: Dict[str, Any]) -> Optional[_Agent]:
        from hmac import compare_digest

        node = str(message.get("node"))
        agent = self._agents.get(node)
        # As bytes: compare_digest raises on text that is not ASCII.
        token = str(message.get("token")).encode("utf-8", "surrogatepass")
        if message.get("op") == "hello" and "allocation" in message and agent is None:
            return self._join(sock, node, message, token)
        if message.get("op") != "hello" or agent is None \
                or not compare_digest(token, self._token.encode()) \
                or agent.sock is not None or agent.lost is not None:
            logger.warning("pilot: refused an agent connection (bad hello)")
            return None
        agent.sock = sock
        pending, agent.pending = agent.pending, []
        for spawn in pending:
            self._send(agent, spawn)
        return agent

    def _join(self, sock: "socket.socket", node: str, message: Dict[str, Any], token: bytes
              ) -> Optional[_Agent]:
        """An elastic pilot's allocation's agent says hello: a new node, if its token is the
        allocations' and the pilot takes it in."""
        from hmac import compare_digest

        joiner, expected = self.joiner, self.join_token
        allocation, cores, gpus = message.get("allocation"), message.get("cores"), \
            message.get("gpus", 0)
        if joiner is None or expected is None \
                or not compare_digest(token, expected.encode()):
            logger.warning("pilot: refused an agent connection (bad hello)")
            return None
        if not isinstance(allocation, str) or not node or "\x00" in node \
                or type(cores) is not int or type(gpus) is not int or cores < 1 or gpus < 0:
            logger.warning("pilot: refused a joining agent of node %r: its hello lacks an "
                           "allocation name, or a count of cores (1 or more) or GPUs", node)
            return None
        refused = joiner(node, allocation, cores, gpus)
        if refused is not None:
            logger.warning("pilot: refused node %s of allocation %s: %s", node, allocation,
                           refused)
            return None
        assert self._logs is not None
        agent = _Agent(node, self._logs / "joined.log")  # its output is its allocation's
        agent.sock = sock
        agent.connected_at = self._clock.now()
        self._agents[node] = agent
        return agent

    def _drop_connection(self, sock: "socket.socket") -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()
        self._accepted.discard(sock)

    def _send(self, agent: _Agent, message: Dict[str, Any]) -> None:
        """Queue ``message`` for the connected agent: :meth:`flush` sends it, after what was
        queued before it (a signal never overtakes its task's spawn)."""
        assert agent.sock is not None
        if not agent.outbox:
            self._unsent.append(agent)
        agent.outbox.append(encode_line(message))

    def _lose(self, node: str, code: Optional[int], why: Optional[str] = None) -> None:
        """The node's agent is gone (``why``), or its launcher exited (``code``)."""
        agent = self._agents[node]
        if agent.lost is not None:
            return
        if why is None:
            if agent.sock is not None:
                return  # still connected: the connection's end will tell
            why = f"its agent exited with code {code}{_log_tail(agent.log)}"
        agent.lost = why
        if agent.sock is not None:
            self._drop_connection(agent.sock)
            agent.sock = None
        if not self.closing:
            logger.error("pilot: node %s is lost: %s", node, why)
        names = list(agent.tasks) + [m["launch"]["task_id"] for m in agent.pending]
        agent.pending = []
        agent.tasks.clear()
        self._on_lost(node, list(dict.fromkeys(names)), why)


def _log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 1024))
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return ""
    return f"; its output ends with:\n{text}" if text else ""
