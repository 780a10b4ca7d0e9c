"""The pilot's journal on disk: appending records, reading them back, and what a resume learns.

One JSON object per line, its kind in ``e``; the line builders below are the only writers and
:class:`ReplayPlan` the only reader of these records:

=========  =====================================================================================
``e``      other fields
=========  =====================================================================================
submit     ``task``: the task as :meth:`TaskSpec.to_json <psij.executors.pilot.tasks.TaskSpec>`;
           ``t``: when the pilot accepted it
start      ``id``, ``node``; for a task of the pilot's own node also ``pid`` and ``run`` (the
           run marker, see :data:`RUN_VARIABLE`); ``t``: when it started; ``share``: what it
           was given (:meth:`TaskShare.to_json <psij.executors.pilot.tasks.TaskShare>`: its
           nodes and, per node, its process count, core ids and GPU ids)
end        ``id``, ``state`` (a final state's name), ``code`` (exit code or null); ``t``: when
           it ended; ``cpu_seconds`` and ``max_rss_bytes``: the use of its process, when known
cancel     ``id``: a user cancelled the task
forget     ``id``: the task was dropped; its name may be used again
=========  =====================================================================================

Times (``t``) are epoch seconds of the pilot's clock; journals written before they were
recorded lack them, and the readers do without. The engine decides what to write and when;
this module only builds and writes lines, fsyncs them at most once a second (measured on a
:class:`~psij._clock.Clock`), and reads a journal back: for a resume (:class:`ReplayPlan`) or
for a report of the run (:func:`task_runs`, one row per run of a task).

Reading never trusts the file: a line that is not JSON, a record that is not an object, a
field of the wrong type, a pid written with other digits than ASCII ones: each is skipped with
a warning naming the line, and reading goes on. A journal can therefore never stop a resume.

It does not schedule, start or signal anything, apart from killing the process groups a
crashed run left behind (:func:`kill_leftovers`), and only those it can prove are that run's.
"""

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from psij._clock import Clock, MonotonicClock
from psij._lazylog import LazyLogger
from psij._private_dirs import ensure_private_dir
from psij.executors.pilot.tasks import TaskShare, sound_count, sound_seconds

__all__ = [
    "RUN_VARIABLE",
    "Journal",
    "ReplayPlan",
    "cancel_line",
    "end_line",
    "forget_line",
    "is_task_process",
    "kill_leftovers",
    "read_journal",
    "start_line",
    "submit_lines",
    "task_runs",
]

logger = LazyLogger(__name__)

_FSYNC_INTERVAL = 1.0
RUN_VARIABLE = "PSIJ_PILOT_RUN"
"""The environment variable that marks a task process with its pilot run's id."""


class Journal:
    """The append-only journal: one write per batch of lines, fsync'd now and then."""

    def __init__(self, path: Path, clock: Optional[Clock] = None) -> None:
        ensure_private_dir(path.parent, "pilot journal directory")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._dirty = False
        self._synced = self._clock.now()

    def write(self, lines: Iterable[str]) -> None:
        """Append lines (each ends with a newline) in one write."""
        data = "".join(lines)
        if not data:
            return
        try:
            # surrogatepass: a lone surrogate that reached a line (json escapes them, so only
            # a hand-made line can hold one) must not stop the engine; the reader skips it.
            os.write(self._fd, data.encode("utf-8", "surrogatepass"))
            self._dirty = True
        except OSError as ex:
            logger.error("could not write the pilot journal: %s", ex)

    def due(self) -> Optional[float]:
        """Seconds until the next fsync is due, or None when nothing waits for one."""
        if not self._dirty:
            return None
        return max(0.0, self._synced + _FSYNC_INTERVAL - self._clock.now())

    def sync(self, force: bool = False) -> None:
        if self._dirty and (force or self._clock.now() - self._synced >= _FSYNC_INTERVAL):
            try:
                os.fsync(self._fd)
            except OSError as ex:
                logger.error("could not fsync the pilot journal: %s", ex)
            self._dirty = False
            self._synced = self._clock.now()

    def close(self) -> None:
        self.sync(force=True)
        os.close(self._fd)


# One encoder for every line: ``json.dumps`` with separators would build one per call.
_encode_compact = json.JSONEncoder(separators=(",", ":")).encode


def submit_lines(tasks: Sequence[Dict[str, Any]],
                 times: Optional[Sequence[float]] = None) -> List[str]:
    """The ``submit`` lines of tasks given in their JSON form, each accepted at its time in
    ``times`` when given."""
    if times is None:
        return [_encode_compact({"e": "submit", "task": task}) + "\n" for task in tasks]
    return [_encode_compact({"e": "submit", "task": task, "t": at}) + "\n"
            for task, at in zip(tasks, times)]


# ``start`` and ``end`` are written once per task run: formatted directly, with only the
# strings going through the encoder.
def start_line(task_id: str, node: str, pid: Optional[int] = None, run: Optional[str] = None,
               at: Optional[float] = None, share: Optional[TaskShare] = None) -> str:
    """The ``start`` line; ``pid`` and ``run`` for a task of the pilot's own node; ``at``
    when it started and ``share`` what it was given, when known."""
    line = f'{{"e":"start","id":{_encode_compact(task_id)},"node":{_encode_compact(node)}'
    if pid is not None:
        line += f',"pid":{int(pid)},"run":{_encode_compact(run)}'
    if at is not None:
        line += f',"t":{float(at)!r}'
    if share is not None:
        text = _SHARE_TEXTS.get(share)
        if text is None:  # tasks of one shape on one node get the same few shares
            if len(_SHARE_TEXTS) >= _SHARE_TEXTS_KEPT:
                _SHARE_TEXTS.clear()
            text = _SHARE_TEXTS[share] = _encode_compact(share.to_json())
        line += f',"share":{text}'
    return line + "}\n"


_SHARE_TEXTS: Dict[TaskShare, str] = {}
_SHARE_TEXTS_KEPT = 4096


def end_line(task_id: str, state: str, code: Optional[int], at: Optional[float] = None,
             use: Optional[Tuple[Optional[float], Optional[int]]] = None) -> str:
    """The ``end`` line: ``state`` is a final state's name, ``code`` the exit code or None;
    ``at`` when it ended and ``use`` its process's CPU seconds and peak bytes, when known."""
    line = (f'{{"e":"end","id":{_encode_compact(task_id)},"state":"{state}","code":'
            f'{"null" if code is None else int(code)}')
    if at is not None:
        line += f',"t":{float(at)!r}'
    if use is not None:
        cpu, rss = use
        if cpu is not None:
            line += f',"cpu_seconds":{float(cpu)!r}'
        if rss is not None:
            line += f',"max_rss_bytes":{int(rss)}'
    return line + "}\n"


def cancel_line(task_id: str) -> str:
    return _encode_compact({"e": "cancel", "id": task_id}) + "\n"


def forget_line(task_id: str) -> str:
    return _encode_compact({"e": "forget", "id": task_id}) + "\n"


def read_journal(path: Path) -> List[Dict[str, Any]]:
    """The records of a journal; a last line cut short by a crash is ignored, any other line
    that is not a JSON object is skipped with a warning."""
    records: List[Dict[str, Any]] = []
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return records
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            if number < len(lines):
                logger.warning("pilot journal %s: line %d is not JSON; skipped", path, number)
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            logger.warning("pilot journal %s: line %d is not a record; skipped", path, number)
    return records


class ReplayPlan:
    """What a journal says about the previous runs of a pilot.

    ``submitted``: the raw task of each submission still known, in submission order;
    ``final``: the final state of each task that ended; ``canceled``: tasks a user cancelled;
    ``leftovers``: task -> (pid, run marker) of local processes whose end was not recorded.
    """

    def __init__(self, records: List[Dict[str, Any]]) -> None:
        self.submitted: Dict[str, Any] = {}
        self.final: Dict[str, str] = {}
        self.canceled: Set[str] = set()
        self.leftovers: Dict[str, Tuple[int, str]] = {}
        for number, record in enumerate(records, 1):
            try:
                self._read(record)
            except (KeyError, TypeError, ValueError) as ex:
                logger.warning("pilot journal: record %d cannot be used (%s); skipped",
                               number, ex)

    def _read(self, record: Dict[str, Any]) -> None:
        kind = record.get("e")
        name = record.get("id")
        if kind == "submit":
            task = record["task"]
            task_name = task.get("name") if isinstance(task, dict) else None
            if not isinstance(task_name, str):
                raise ValueError("a submission without a task name")
            self.submitted[task_name] = task
            self.final.pop(task_name, None)
            self.canceled.discard(task_name)
            return
        if not isinstance(name, str):
            raise ValueError(f"{kind!r} record without a task id")
        if kind == "end":
            self.final[name] = str(record.get("state"))
            self.leftovers.pop(name, None)
        elif kind == "start" and record.get("pid"):
            self.leftovers[name] = (_pid(record["pid"]), str(record.get("run")))
        elif kind == "cancel":
            self.canceled.add(name)
        elif kind == "forget":
            self.submitted.pop(name, None)
            self.final.pop(name, None)


def task_runs(records: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per run of a task in journal ``records`` (:func:`read_journal`), in the order
    the runs started (then the tasks that never started, in submission order), for a report
    of the pilot's run.

    Each row holds ``id`` and ``run`` (1 for the task's first start in the journal, 2 after a
    resume ran it again, ...) and, when the journal knows them, the keys of the ``pilot``
    executor's final status metadata: ``queued_at``, ``started_at``, ``ended_at``, ``nodes``
    (comma-separated), ``cores``, ``cpu_seconds``, ``max_rss_bytes``, ``requested_seconds``,
    ``requested_memory_bytes``;
    ``core_ids`` (per node, as :attr:`TaskShare.cores_text <psij.executors.pilot.tasks.
    TaskShare.cores_text>` writes them: ``n1[0:1]``), ``state`` (the final state's name) and
    ``exit_code``. A value that is not sound (a time that is not a finite, non-negative number,
    a share that cannot be read, ...) is left out, never guessed; a record of the wrong shape
    is skipped.
    """
    rows: List[Dict[str, Any]] = []
    starts: Dict[str, int] = {}  # task id -> how many times it started
    running: Dict[str, Dict[str, Any]] = {}  # task id -> the row of its run not ended yet
    queued: Dict[str, Dict[str, Any]] = {}  # submitted, never started (ended or not)
    asked: Dict[str, Dict[str, Any]] = {}  # task id -> what its submission asked
    for record in records:
        if not isinstance(record, dict):
            continue
        kind, name, at = record.get("e"), record.get("id"), sound_seconds(record.get("t"))
        if kind == "submit":
            task = record.get("task")
            if isinstance(task, dict) and isinstance(task.get("name"), str):
                name = task["name"]
                row = queued[name] = {"id": name, "run": 1}
                _put(row, "queued_at", at)
                _put(row, "requested_seconds", sound_seconds(task.get("time_limit")))
                resources = task.get("resources")
                asked[name] = dict(row, memory=sound_count(resources.get(
                    "memory_per_process")) if isinstance(resources, dict) else None)
        elif not isinstance(name, str):
            continue
        elif kind == "forget":  # its name may be used again, by another task
            starts.pop(name, None)
            running.pop(name, None)
        elif kind == "start":
            queued.pop(name, None)
            row = {k: v for k, v in asked.get(name, {"id": name}).items()
                   if k != "memory" and v is not None}
            row["run"] = starts[name] = starts.get(name, 0) + 1
            _put(row, "started_at", at)
            _share_of(row, record.get("share"), record.get("node"),
                      asked.get(name, {}).get("memory"))
            running[name] = row
            rows.append(row)
        elif kind == "end":
            found: Optional[Dict[str, Any]] = running.pop(name, None)
            row = found or queued.get(name) or {}
            if row.get("id") == name and "ended" not in row:
                row["ended"] = True
                state, code = record.get("state"), record.get("code")
                _put(row, "state", state if isinstance(state, str) else None)
                _put(row, "exit_code", code if type(code) is int else None)
                _put(row, "ended_at", at)
                _put(row, "cpu_seconds", sound_seconds(record.get("cpu_seconds")))
                _put(row, "max_rss_bytes", sound_count(record.get("max_rss_bytes")))
    rows.extend(queued.values())
    for row in rows:
        row.pop("ended", None)
    return rows


def _put(row: Dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        row[key] = value


def _share_of(row: Dict[str, Any], data: Any, node: Any, memory: Optional[int]) -> None:
    """``nodes``, ``cores``, ``core_ids`` (and ``requested_memory_bytes``, from the memory per
    process asked) of a start record's share; ``nodes`` alone, from its ``node``, when the
    share cannot be read."""
    try:
        share = TaskShare.from_json(data)
        if not all(isinstance(n, str) for n in share.nodes) or not all(
                type(c) is int for ids in share.cores for c in ids) or not all(
                type(p) is int and p >= 0 for p in share.processes):
            raise TypeError("not a share")
    except (KeyError, TypeError, ValueError, AttributeError):
        if isinstance(node, str):
            row["nodes"] = node
        return
    row["nodes"] = ",".join(share.nodes)
    row["cores"] = share.core_count
    row["core_ids"] = share.cores_text
    if memory:
        _put(row, "requested_memory_bytes", sound_count(memory * share.process_count))


def _pid(value: Any) -> int:
    """A process id from the journal: a positive int within the range of pids."""
    if type(value) is not int or not 0 < value < 1 << 31:
        raise ValueError(f"pid {value!r} is not a process id")
    return value


def kill_leftovers(leftovers: Dict[str, Tuple[int, str]]) -> None:
    """KILL the process groups that a crashed run started and that still run."""
    for name, (pid, run) in leftovers.items():
        if is_task_process(pid, run, name):
            try:
                os.killpg(pid, 9)
            except OSError:
                pass


def is_task_process(pid: int, run: str, task_id: str) -> bool:
    """Whether ``pid`` is still the process a crashed run started for ``task_id``: a process
    group leader whose initial environment carries that run's marker and the task's id."""
    try:
        if os.getpgid(pid) != pid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            variables = set(f.read().split(b"\0"))
    except OSError:
        return False
    return (f"{RUN_VARIABLE}={run}".encode() in variables
            and f"QCG_PM_STEP_ID={task_id}".encode("utf-8", "surrogatepass") in variables)
