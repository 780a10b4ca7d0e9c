"""The runs of a recorded job read back (:func:`psij.registry.runs`): :class:`RunRecord`, one
per row of the registry's ``runs`` table (:mod:`psij._registry.runs`), each value checked as
when it was written (a file another program wrote is not trusted)."""

from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Tuple

from psij._record import Record
from psij._registry import runs as _runs
from psij._registry.accounting import USE_KEYS, use_of

__all__ = ["RunRecord", "run_records"]

_TIMES = ("queued_at", "started_at", "ended_at", "held_from", "held_to")


class RunRecord(Record):
    """One run of a recorded job: its first, or one after a requeue or retry."""

    job_id: str
    run: int
    """Its number, 1 for the job's first run, 2 for the one after it, and so on."""
    native_id: Optional[str]
    """The scheduler's id of the run (a requeued run keeps the id of the one before)."""
    state: str
    """The run's last state recorded (a JobState name). A run followed by another ended
    FAILED, its ``cause`` saying why it was run again (``requeued``, ``time_limit``...)."""
    exit_code: Optional[int]
    cause: Optional[str]
    message: Optional[str]
    updated: float
    """When the run's row was last written (seconds since the epoch)."""
    queued_at: Optional[float] = None
    """When its scheduler accepted the run; psij's time of giving it to the scheduler when
    the scheduler did not say."""
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    cpu_seconds: Optional[float] = None
    max_rss_bytes: Optional[int] = None
    nodes: Optional[str] = None
    cores: Optional[int] = None
    requested_memory_bytes: Optional[int] = None
    requested_seconds: Optional[float] = None
    held_from: Optional[float] = None
    """When psij began to hold the job back before this run (in a client process)."""
    held_to: Optional[float] = None
    stdout_path: Optional[str] = None
    """Where the run's standard output is (``<path>.<run>`` for an earlier run whose output a
    later one moved aside, on the batch executors)."""
    stderr_path: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """The JSON form ``psij status --runs ID --json`` prints (times as ISO 8601 texts)."""
        view: Dict[str, Any] = {name: getattr(self, name) for name in self._fields}
        for name in _TIMES:
            value = view[name]
            view[name] = None if value is None else _iso(value)
        view["updated"] = _iso(self.updated)
        return view


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def _time(value: Any) -> Optional[float]:
    return use_of({"queued_at": value}, True)[4]  # type: ignore[no-any-return]


def _word(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def record_of(row: Tuple[Any, ...]) -> Optional[RunRecord]:
    """A row of :data:`psij._registry.runs.COLUMNS` as a record (None when it is not one of
    ours: no run number, no state)."""
    found = dict(zip(_runs.COLUMNS, row))
    run = _int(found["run"])
    state = _word(found["state"])
    if run is None or run < 1 or state is None:
        return None
    figures = dict(zip(USE_KEYS, use_of(found, True)))
    updated = _time(found["updated"])
    return RunRecord(str(found["job_id"]), run, _word(found["native_id"]), state,
                     _int(found["exit_code"]), _word(found["cause"]), _word(found["message"]),
                     0.0 if updated is None else updated, **figures,
                     held_from=_time(found["held_from"]), held_to=_time(found["held_to"]),
                     stdout_path=_word(found["stdout_path"]),
                     stderr_path=_word(found["stderr_path"]))


def run_records(store: Any, job_id: str) -> List[RunRecord]:
    """The runs of ``job_id`` in the registry ``store``, first run first."""
    made = (record_of(row) for row in store.runs(job_id))
    return [r for r in made if r is not None]
