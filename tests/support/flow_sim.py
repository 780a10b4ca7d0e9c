"""A driver for the pure flow machine in tests and the benchmark: a manual clock, the one
timer, a journal kept as a dict, and a scripted executor that answers submissions."""

from typing import Any, Dict, List, Optional, Tuple

from psij import JobState, JobStatus
from psij._clock import ManualClock
from psij.controller import (
    ActionDone,
    ActionFailed,
    Attach,
    Cancel,
    CancelTimer,
    Connected,
    JobStatusChanged,
    MessageReceived,
    Peer,
    Send,
    SetTimer,
    Started,
    Submit,
    TimerFired,
)
from psij.flows.machine import (
    WAKE,
    FlowConfig,
    FlowMachine,
    JournalDelete,
    JournalPut,
    SignalJob,
)

SPEC = {"executable": "/bin/sleep", "arguments": ["1000"]}


class Sim:
    """Feeds a :class:`FlowMachine` and keeps what it asked for."""

    def __init__(self, config: Optional[FlowConfig] = None, start: float = 1_700_000_000.0,
                 machine: Optional[FlowMachine] = None) -> None:
        self.clock = ManualClock(start)
        self.machine = machine or FlowMachine(config or FlowConfig("/sb"))
        self.actions: List[Any] = []
        self.journal: Dict[Tuple[str, str], Any] = {}
        self.timer: Optional[float] = None
        self.submits: List[Submit] = []        # every Submit, in order
        self.unanswered: List[str] = []        # Submit keys not answered yet
        self.cancels: List[str] = []
        self.signals: List[Tuple[str, int]] = []
        self.attaches: List[Attach] = []
        self.native: Dict[str, str] = {}
        self.next_native = 5000
        self.answers: List[Tuple[int, Any]] = []
        self.conns: Dict[int, int] = {}
        self.next_id = 0

    @property
    def now(self) -> float:
        return self.clock.now()

    def step(self, event: Any) -> List[Any]:
        actions = self.machine.step(event, self.now)
        self.apply(actions)
        return actions

    def apply(self, actions: List[Any]) -> None:
        for action in actions:
            self.actions.append(action)
            kind = type(action)
            if kind is JournalPut:
                self.journal[(action.kind, action.key)] = action.value
            elif kind is JournalDelete:
                self.journal.pop((action.kind, action.key), None)
            elif kind is Submit:
                self.submits.append(action)
                self.unanswered.append(action.key)
            elif kind is SetTimer:
                assert action.name == WAKE
                self.timer = self.now + action.delay
            elif kind is CancelTimer:
                self.timer = None
            elif kind is Cancel:
                self.cancels.append(action.key)
            elif kind is SignalJob:
                self.signals.append((action.key, action.signum))
            elif kind is Attach:
                self.attaches.append(action)
            elif kind is Send:
                self.answers.append((action.conn, action.message))

    # -- clients ------------------------------------------------------------------------------

    def connect(self, uid: int = 1000) -> int:
        conn = len(self.conns) + 1
        self.conns[conn] = uid
        self.step(Connected(conn, Peer(4000 + conn, uid, uid, ""), "unix"))
        return conn

    def conn_of(self, uid: int) -> int:
        for conn, owner in self.conns.items():
            if owner == uid:
                return conn
        return self.connect(uid)

    def send(self, conn: int, message: Any) -> Any:
        before = len(self.answers)
        self.step(MessageReceived(conn, message))
        mine = [m for c, m in self.answers[before:] if c == conn]
        return mine[-1] if mine else None

    def call(self, op: str, uid: int = 1000, **fields: Any) -> Any:
        self.next_id += 1
        message = {"id": self.next_id, "op": op}
        message.update(fields)
        answer = self.send(self.conn_of(uid), message)
        assert answer is None or answer["id"] == self.next_id
        return answer

    def create(self, count: int, uid: int = 1000, **fields: Any) -> str:
        fields.setdefault("spec", SPEC)
        fields.setdefault("executor", "local")
        answer = self.call("create", uid, count=count, **fields)
        assert answer["ok"], answer
        return str(answer["handle"])

    # -- the executor -------------------------------------------------------------------------

    def accept(self, state: JobState = JobState.QUEUED, keys: Optional[List[str]] = None
               ) -> List[str]:
        """Answer the submissions not answered yet with a native id, then report ``state``."""
        keys = list(self.unanswered) if keys is None else keys
        for key in keys:
            self.unanswered.remove(key)
            self.next_native += 1
            self.native[key] = str(self.next_native)
            self.step(ActionDone(key, "submit", str(self.next_native)))
            if state is not None:
                self.status(key, state)
        return keys

    def reject(self, message: str = "sbatch: error: invalid partition") -> List[str]:
        keys = list(self.unanswered)
        self.unanswered.clear()
        for key in keys:
            self.step(ActionFailed(key, "submit", message, None))
        return keys

    def status(self, key: str, state: JobState, exit_code: Optional[int] = None,
               metadata: Optional[Dict[str, Any]] = None) -> None:
        self.step(JobStatusChanged(key, JobStatus(state, exit_code=exit_code,
                                                  metadata=metadata)))

    def run(self, keys: Optional[List[str]] = None) -> List[str]:
        """Accept and start the submissions not answered yet."""
        return self.accept(JobState.ACTIVE, keys)

    def finish(self, key: str, exit_code: Optional[int] = 0) -> None:
        state = JobState.COMPLETED if exit_code == 0 else JobState.FAILED
        self.status(key, state, exit_code)

    # -- time ---------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the clock, firing the machine's timer each time it comes due on the way."""
        target = self.now + seconds
        while self.timer is not None and self.timer <= target:
            if self.timer > self.now:
                self.clock.advance(self.timer - self.now)
            self.timer = None
            self.step(TimerFired(WAKE))
        if target > self.now:
            self.clock.advance(target - self.now)

    def restart(self, config: Optional[FlowConfig] = None) -> "Sim":
        """A new machine given this one's journal, as a restarted service would be."""
        fresh = Sim(config or self.machine.config, machine=FlowMachine(
            config or self.machine.config))
        fresh.clock = ManualClock(self.now)
        fresh.next_native = self.next_native + 1000
        records = [(kind, key, value) for (kind, key), value in self.journal.items()]
        fresh.restored = fresh.machine.restore(records, self.now)
        fresh.journal = dict(self.journal)
        fresh.step(Started())
        fresh.native = dict(self.native)
        return fresh

    restored: List[Any]

    def live(self, handle: str) -> List[str]:
        return sorted(self.machine.handles[handle].live)
