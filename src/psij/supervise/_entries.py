"""The supervisor's records: its settings, one journaled job, a journal entry, a waiting client
request, and the small readings of events the machine makes. Pure data, no I/O; the machine
that uses them is :mod:`psij.supervise._machine`.
"""

from enum import Enum
from typing import Any, Dict, Optional

from psij._record import Record

__all__ = ["EntryKind", "EntryState", "JobEntry", "Journal", "Settings", "outcome_unknown"]

_STOP_TIMER = ("psij.supervise", "stop")  # stop_grace, while cancelled jobs are ending
_LOOKUP = "lookup"  # the key of a look-up by name is (_LOOKUP, uid)

# What a submit command's failure says when it may have queued its job all the same
# (psij.executors.batch._runner.outcome_unknown, not imported: it loads the batch layer).
_UNKNOWN_OUTCOME = ("may have been submitted", "did not finish within")


def outcome_unknown(message: str) -> bool:
    """Whether a failed submission may have submitted its job all the same."""
    return any(words in message for words in _UNKNOWN_OUTCOME)


class EntryKind(str, Enum):
    """What a job of the supervisor is for. The values are the words of the journal's
    ``"kind"`` (written as plain strings, so that journals read the same before and after)."""

    SERVER = "server"
    CLIENT = "client"
    LEFTOVER = "leftover"  # a job an earlier supervisor of this output directory left behind


class EntryState(Enum):
    """Where a job of the supervisor is while it is not final: its submission under way, or
    submitted, or the last state its executor reported (the PSI/J names, which are also what
    the server is told). Never journaled: the journal says a job was submitted and how it
    ended (``"final"``: a PSI/J final state, ``UNKNOWN`` or ``NOT_SUBMITTED``)."""

    SUBMITTING = "SUBMITTING"
    SUBMITTED = "SUBMITTED"
    QUEUED = "QUEUED"
    STAGE_IN = "STAGE_IN"
    ACTIVE = "ACTIVE"
    STAGE_OUT = "STAGE_OUT"
    CLEANUP = "CLEANUP"


# The non-final PSI/J states an executor reports, by name (NEW, the state before submission,
# is not taken: a job of the supervisor is submitted already).
_REPORTED = {state.value: state for state in EntryState
             if state not in (EntryState.SUBMITTING, EntryState.SUBMITTED)}


class Settings(Record):
    """What the machine is told once: see :mod:`psij.supervise` for the meaning of each."""

    server: Dict[str, Any]
    client_template: Optional[Dict[str, Any]]
    output_dir: str
    address: str
    job_limit: int
    tick: float
    fault_tolerance: bool
    max_server_restarts: int
    std_output: bool
    connect_timeout: float
    stop_grace: float


class JobEntry(Record):
    """One job submitted and not final: the server of a generation or a client (``name``:
    its job name, by which it is found if its submission is interrupted)."""

    uid: int
    kind: EntryKind
    client: Optional[str]
    generation: int
    state: EntryState
    native_id: Optional[str]
    cancel: bool
    name: Optional[str] = None


class Journal(Record):
    """An action of this machine: append ``entry`` (a JSON object) to the output directory's
    journal, from which a later supervisor learns which jobs this one left behind."""

    entry: Dict[str, Any]


class _Pending(Record):
    """A client request accepted and waiting for a free place under ``job_limit``."""

    uid: int
    client: str
    spec: Any


def _state_name(status: Any) -> str:
    state = getattr(status, "state", None)
    return str(getattr(state, "name", state))


def _plain(value: Any) -> Any:
    """A request's ``ref`` sent back only when it is a plain JSON scalar."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return value
    return None


def _peer(peer: Any) -> str:
    address = getattr(peer, "address", "")
    if address:
        return str(address)
    return f"pid {getattr(peer, 'pid', -1)}, uid {getattr(peer, 'uid', -1)}"

