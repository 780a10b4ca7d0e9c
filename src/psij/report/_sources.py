"""Where the runs of a report come from: the job registry, a pilot's ``jobs.report`` (the
QCG-PilotJob-style file ``psij pilot run`` writes) and a served pilot's journal.

- **Registry**: the ``jobs`` table, read with the filters of ``psij list`` (ids, tag, executor,
  states) and a time range on ``submitted``. The columns are asked of the file itself
  (``PRAGMA table_info``), so a figure whose column this registry does not have (yet) is
  unknown rather than an error. A job's cores and time limit, when no column gives them, come
  from its recorded JobSpec (process count x cores per process, ``duration``): what it asked,
  which is what a local job gets.
- **jobs.report**: one entry per task: its name and final state, its dated history (QUEUED,
  EXECUTING, then the final state; local times as the pilot wrote them), its allocation
  (``node:cores`` per node), run time, exit code and message, and where the pilot writes them
  ``core_ids``, ``cpu_seconds`` and ``max_rss_bytes``. An iterative job's own entry, which
  sums up its iterations, is left out when the iterations' entries are there.
- **Journal** (``psij-pilot.journal``): submissions, starts (node, share), ends (state, exit
  code, use), with times (``t``) where the pilot records them; read one row per run by the
  journal's own reader (``task_runs``) where it has one. A journal without times gives an
  empty timeline and unknown waits and run times.

Nothing is written; a line or row that cannot be read is skipped (a whole file that cannot be
read raises :class:`ValueError` naming it).
"""

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from psij._clock import wall_time
from psij.report._runs import JobRun, sound_count, sound_seconds, sound_text

__all__ = ["SourceError", "from_jobs_report", "from_journal", "from_pilot", "from_registry",
           "from_rows", "parse_time"]

# The registry columns a report reads, when the file has them.
WANTED = ("id", "state", "cause", "message", "submitted", "queued_at", "held_from", "held_to",
          "started_at", "ended_at", "cpu_seconds", "max_rss_bytes", "cores", "nodes",
          "requested_memory_bytes", "requested_seconds", "exit_code", "native_id", "spec",
          "final", "attempt")
# The columns of the ``runs`` table (one row per run of a job) a report reads, when there.
RUN_WANTED = ("job_id", "run", "native_id", "state", "exit_code", "cause", "message",
              "queued_at", "held_from", "held_to", "started_at", "ended_at", "cpu_seconds",
              "max_rss_bytes", "cores", "nodes", "requested_memory_bytes", "requested_seconds")
_FINAL_STATES = ("COMPLETED", "FAILED", "CANCELED")
_QCG_STATES = {"SUCCEED": "COMPLETED", "FAILED": "FAILED", "CANCELED": "CANCELED",
               "OMITTED": "OMITTED", "EXECUTING": "ACTIVE", "QUEUED": "QUEUED"}
_ENGINE_STATES = {"SUCCEEDED": "COMPLETED", "FAILED": "FAILED", "CANCELED": "CANCELED",
                  "OMITTED": "OMITTED", "RUNNING": "ACTIVE", "QUEUED": "QUEUED",
                  "WAITING": "QUEUED"}
_SECONDS = ("submitted", "queued_at", "held_from", "held_to", "started_at", "ended_at",
            "cpu_seconds", "requested_seconds")
_COUNTS = ("max_rss_bytes", "cores", "requested_memory_bytes")
JOBS_REPORT = "jobs.report"  # as psij.executors.pilot.qcg.run names them
JOURNAL = "psij-pilot.journal"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class SourceError(ValueError):
    """A pilot's file that cannot be read, or holds nothing a report can use."""


def parse_time(field: str, text: str, now: Optional[float] = None) -> float:
    """A point in time given on the command line: ISO 8601 (``2026-12-08``,
    ``2026-12-08T10:30``; local time unless a zone is given) or an age (``90m``, ``2h``,
    ``7d``: that long before now). Raises ValueError naming ``field``."""
    text = text.strip()
    if text and text[-1] in _UNITS and text[:-1].replace(".", "", 1).isdigit():
        age = float(text[:-1]) * _UNITS[text[-1]]
        if age < 1e10:
            return (wall_time() if now is None else now) - age
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        raise ValueError(f"{field}: expected a date and time in ISO 8601 (2026-12-08 or "
                         f"2026-12-08T10:30, local time unless a zone is given) or an age "
                         f"such as 90m, 2h or 7d, got {text[:40]!r}") from None


def _spec_figures(text: Any) -> Tuple[Optional[int], Optional[float]]:
    """Cores and requested seconds a recorded JobSpec asks for (None where it does not)."""
    if not isinstance(text, str):
        return None, None
    try:
        spec = json.loads(text)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(spec, dict):
        return None, None
    attributes = spec.get("attributes")
    seconds = sound_seconds(attributes.get("duration")) if isinstance(attributes, dict) \
        else None
    resources = spec.get("resources")
    if not isinstance(resources, dict):
        resources = {}
    processes = sound_count(resources.get("process_count"))
    if processes is None:
        nodes = sound_count(resources.get("node_count")) or 1
        processes = nodes * (sound_count(resources.get("processes_per_node")) or 1)
    cores = processes * (sound_count(resources.get("cpu_cores_per_process")) or 1)
    return cores or None, seconds


def from_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> List[JobRun]:
    """Runs made from registry rows of ``columns`` (a column missing from ``columns`` is an
    unknown figure)."""
    runs = []
    for row in rows:
        get = dict(zip(columns, row)).get
        figures: Dict[str, Any] = {n: sound_seconds(get(n)) for n in _SECONDS}
        figures.update((n, sound_count(get(n))) for n in _COUNTS)
        final = bool(get("final"))
        if not final:  # a run not ended has no end, and its use is not final
            for name in ("ended_at", "cpu_seconds", "max_rss_bytes"):
                figures[name] = None
        if figures["cores"] is None or figures["requested_seconds"] is None:
            cores, seconds = _spec_figures(get("spec"))
            if figures["cores"] is None:
                figures["cores"] = cores
            if figures["requested_seconds"] is None:
                figures["requested_seconds"] = seconds
        code = get("exit_code")
        runs.append(JobRun(
            name=sound_text(get("id")) or "?", state=sound_text(get("state")) or "NEW",
            cause=sound_text(get("cause")) if final else None,
            message=sound_text(get("message")), nodes=sound_text(get("nodes")),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            native_id=sound_text(get("native_id")), **figures))
    return runs


def from_registry(ids: Optional[Sequence[str]] = None, tag: Optional[str] = None,
                  executor: Optional[str] = None, states: Optional[Sequence[str]] = None,
                  since: Optional[float] = None, until: Optional[float] = None,
                  work_directory: Optional[str] = None) -> List[JobRun]:
    """The recorded jobs matching every filter given (as ``psij list`` chooses them),
    submitted from ``since`` to ``until`` (epoch seconds) when given, oldest first."""
    from psij import registry
    from psij._registry import store as _store

    store = _store.open_store(registry._work_directory(work_directory))
    present = store._call("read its columns", lambda c: [
        r[1] for r in c.execute("PRAGMA table_info(jobs)")])
    columns = [name for name in WANTED if name in present]
    _, rows = registry._select(ids, tag, executor, states, work_directory, columns)
    if since is not None or until is not None:
        at = columns.index("submitted")
        low = -1.0 if since is None else since
        high = float("inf") if until is None else until
        rows = [r for r in rows if isinstance(r[at], (int, float)) and low <= r[at] <= high]
    return from_rows(columns, _with_earlier_runs(store, columns, rows))


def _runs_table(store: Any, ids: Sequence[str]) -> Dict[str, List[Dict[str, Any]]]:
    """The rows of the ``runs`` table (when this registry has one) of the jobs ``ids``, by
    job, first run first."""
    present = store._call("read its columns", lambda c: [
        r[1] for r in c.execute("PRAGMA table_info(runs)")])
    if "job_id" not in present or "run" not in present:
        return {}
    columns = [name for name in RUN_WANTED if name in present]
    found: Dict[str, List[Dict[str, Any]]] = {}
    for start in range(0, len(ids), 500):  # SQLite limits the parameters of a statement
        part = list(ids[start:start + 500])
        sql = (f"SELECT {', '.join(columns)} FROM runs WHERE job_id IN "
               f"({', '.join('?' * len(part))}) ORDER BY job_id, run")
        rows = store._call("read runs", lambda c, sql=sql, part=part: c.execute(
            sql, part).fetchall())
        for row in rows:
            run = dict(zip(columns, row))
            found.setdefault(run["job_id"], []).append(run)
    return found


def _with_earlier_runs(store: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]]
                       ) -> List[Sequence[Any]]:
    """``rows``, each job run again (its ``attempt`` past 1) preceded by a row for each of its
    earlier runs from the ``runs`` table, named ``ID (run N)``: every run is counted. A later
    run's wait begins when the run before it ended (unless its queue time is known), and psij's
    holding counts once, for the first run."""
    if "attempt" not in columns or "id" not in columns:
        return list(rows)
    at_attempt, at_id = columns.index("attempt"), columns.index("id")
    again = [r[at_id] for r in rows if isinstance(r[at_attempt], int) and r[at_attempt] > 1]
    found = _runs_table(store, again) if again else {}
    if not found:
        return list(rows)
    out: List[Sequence[Any]] = []
    for row in rows:
        job = dict(zip(columns, row))
        earlier = [r for r in found.get(job["id"], ())
                   if isinstance(r.get("run"), int) and r["run"] < job["attempt"]]
        if not earlier:
            out.append(row)
            continue
        begin = job.get("submitted")
        held = (job.get("held_from"), job.get("held_to"))
        for number, run in enumerate(earlier):
            values = dict(job, **{k: v for k, v in run.items() if k in columns})
            state = run.get("state")
            values.update(id=f"{job['id']} (run {run['run']})", submitted=begin, final=1,
                          state=state if state in _FINAL_STATES else "RERUN",
                          held_from=held[0] if number == 0 else None,
                          held_to=held[1] if number == 0 else None)
            out.append(tuple(values.get(c) for c in columns))
            ended = sound_seconds(run.get("ended_at"))
            if ended is not None:
                begin = ended
        job.update(submitted=begin, held_from=None, held_to=None)
        out.append(tuple(job.get(c) for c in columns))
    return out


def _local_time(text: str) -> Optional[float]:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _placement(text: str) -> Tuple[Tuple[str, int], ...]:
    """``node:cores,node:cores`` as pairs; an unreadable part is left out."""
    pairs = []
    for part in text.split(","):
        node, _, count = part.strip().rpartition(":")
        if node and count.isdigit() and count.isascii():
            pairs.append((node, int(count)))
    return tuple(pairs)


class _Entry:
    __slots__ = ("fields", "history", "name", "state")

    def __init__(self, name: str, state: str) -> None:
        self.name = name
        self.state = state
        self.history: List[Tuple[float, str]] = []
        self.fields: Dict[str, str] = {}


def _entry_run(entry: _Entry) -> JobRun:
    times: Dict[str, float] = {}
    for when, state in entry.history:
        times.setdefault(state, when)  # the first time of each state
    first = entry.history[0][0] if entry.history else None
    final = next((when for when, state in reversed(entry.history)
                  if state in ("SUCCEED", "FAILED", "CANCELED", "OMITTED")), None)
    fields = entry.fields
    figures: Dict[str, Any] = {
        "submitted": first, "queued_at": times.get("QUEUED", first),
        "started_at": times.get("EXECUTING"), "ended_at": final}
    for name in _SECONDS:  # figures the entry gives by name (epoch seconds, bytes...)
        if name in fields:
            figures[name] = sound_seconds(_number(fields[name]))
    for name in _COUNTS:
        if name in fields:
            figures[name] = sound_count(_number(fields[name]))
    placement = _placement(fields.get("allocation", ""))
    core_ids = _core_ids(fields.get("core_ids", ""))
    if core_ids and not placement:
        placement = tuple((n, len(c)) for n, c in core_ids)
    if placement and figures.get("cores") is None:
        figures["cores"] = sum(c for _, c in placement)
    code = _number(fields.get("exit_code", ""))
    return JobRun(name=entry.name, state=_QCG_STATES.get(entry.state, entry.state),
                  cause=fields.get("cause"), message=fields.get("message"),
                  nodes=",".join(n for n, _ in placement) or None,
                  exit_code=code if isinstance(code, int) else None, placement=placement,
                  core_ids=core_ids, **figures)


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def from_jobs_report(path: Path) -> List[JobRun]:
    """The tasks of a pilot's ``jobs.report``, in the order they ended."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as ex:
        raise SourceError(f"--pilot: cannot read {path}: {ex.strerror or ex}") from None
    entries: Dict[str, _Entry] = {}
    entry: Optional[_Entry] = None
    for line in text.split("\n"):
        if not line.startswith("    "):
            head = line.rstrip()
            if head.endswith(")") and " (" in head:
                name, _, state = head[:-1].rpartition(" (")
                if name and state.isupper() and " " not in name:
                    entry = _Entry(name, state)
                    entries.pop(name, None)  # a later entry of a name replaces it, last
                    entries[name] = entry
                    continue
            entry = None
            continue
        if entry is None:
            continue
        key, sep, value = line[4:].rpartition(": ")
        if not sep:
            continue
        if key[:1].isdigit():
            when = _local_time(key)
            if when is not None:
                entry.history.append((when, value.strip()))
        else:
            entry.fields[key] = value
    groups = {name.rpartition(":")[0] for name in entries if ":" in name}
    runs = [_entry_run(e) for name, e in entries.items()
            if not (name in groups and "allocation" not in e.fields)]
    if not runs and text.strip():
        raise SourceError(f"--pilot: {path} holds no jobs.report entry (NAME (STATE) lines)")
    return runs


def from_journal(path: Path) -> List[JobRun]:
    """The tasks of a served pilot's journal: one run per start of a task, read by the
    journal's own reader of runs (``task_runs``) where this version of the pilot has one,
    else by the records' fields here (one run per task), in the order they were submitted."""
    from psij.executors.pilot import journal

    records = journal.read_journal(path)
    task_runs = getattr(journal, "task_runs", None)
    if task_runs is not None:
        return [_task_run(row) for row in task_runs(records) if isinstance(row, dict)]
    tasks: Dict[str, Dict[str, Any]] = {}
    for record in records:
        kind = record.get("e")
        if kind == "submit" and isinstance(record.get("task"), dict):
            task = record["task"]
            name = task.get("name")
            if isinstance(name, str):
                tasks[name] = {"task": task, "state": "QUEUED", "queued_at": record.get("t")}
            continue
        name = record.get("id")
        seen = tasks.get(name) if isinstance(name, str) else None
        if seen is None:
            continue
        if kind == "start":
            seen["state"] = "ACTIVE"
            seen["started_at"] = record.get("t")
            if isinstance(record.get("node"), str):
                seen.setdefault("nodes", record["node"])
        elif kind == "end":
            seen["state"] = _ENGINE_STATES.get(str(record.get("state")), "FAILED")
            seen["code"] = record.get("code")
            seen["ended_at"] = record.get("t")
        elif kind == "forget":
            tasks.pop(str(name), None)
            continue
        for field in (*_SECONDS, *_COUNTS, "cause", "message", "nodes"):
            if field in record:
                seen[field] = record[field]
    return [_journal_run(name, seen) for name, seen in tasks.items()]


def _task_run(row: Dict[str, Any]) -> JobRun:
    """A run of the journal's reader of runs (the keys of JobStatus.metadata, ``id``,
    ``run``, ``state``, ``exit_code``, ``core_ids``)."""
    name = sound_text(row.get("id")) or "?"
    run = row.get("run")
    if isinstance(run, int) and run > 1:
        name = f"{name} (run {run})"
    state = row.get("state")
    code = row.get("exit_code")
    figures: Dict[str, Any] = {n: sound_seconds(row.get(n)) for n in _SECONDS}
    figures.update((n, sound_count(row.get(n))) for n in _COUNTS)
    text = row.get("core_ids")
    core_ids = _core_ids(text) if isinstance(text, str) else ()
    return JobRun(name=name, state=_ENGINE_STATES.get(state, "FAILED") if isinstance(
                      state, str) else ("ACTIVE" if figures["started_at"] else "QUEUED"),
                  nodes=sound_text(row.get("nodes")), core_ids=core_ids,
                  placement=tuple((n, len(c)) for n, c in core_ids),
                  exit_code=code if isinstance(code, int) and not isinstance(code, bool)
                  else None, **figures)


def _core_ids(text: str) -> Tuple[Tuple[str, Tuple[int, ...]], ...]:
    """``node[0:1],node2[4]`` as (node, core ids) pairs; () when a part cannot be read."""
    pairs = []
    for part in text.split(","):
        node, bracket, rest = part.strip().partition("[")
        ids = rest[:-1].split(":") if rest.endswith("]") else []
        if not node or not bracket or not ids or not all(i.isdigit() and i.isascii()
                                                         for i in ids):
            return ()
        pairs.append((node, tuple(int(i) for i in ids)))
    return tuple(pairs)


def _journal_run(name: str, seen: Dict[str, Any]) -> JobRun:
    task = seen["task"]
    resources = task.get("resources") if isinstance(task.get("resources"), dict) else {}
    processes = resources.get("processes")
    count = processes[0] if isinstance(processes, list) and processes and \
        (len(processes) < 2 or processes[1] in (None, processes[0])) else 1
    count = sound_count(count)
    per = sound_count(resources.get("cores_per_process", 1))
    memory = sound_count(resources.get("memory_per_process"))
    figures: Dict[str, Any] = {n: sound_seconds(seen.get(n)) for n in _SECONDS}
    figures.update((n, sound_count(seen.get(n))) for n in _COUNTS)
    if figures["cores"] is None and count is not None and per is not None:
        figures["cores"] = count * per
    if figures["requested_memory_bytes"] is None and memory is not None and count:
        figures["requested_memory_bytes"] = memory * count
    if figures["requested_seconds"] is None:
        figures["requested_seconds"] = sound_seconds(task.get("time_limit"))
    code = seen.get("code")
    return JobRun(name=sound_text(name) or "?", state=seen["state"],
                  cause=sound_text(seen.get("cause")), message=sound_text(seen.get("message")),
                  nodes=sound_text(seen.get("nodes")),
                  exit_code=code if isinstance(code, int) and not isinstance(code, bool)
                  else None, **figures)


def from_pilot(path: Path) -> List[JobRun]:
    """The tasks of a pilot run: ``path`` is its ``jobs.report``, its journal, or its
    working directory (where ``jobs.report`` is read, else the journal)."""
    if path.is_dir():
        report = path / JOBS_REPORT
        journal = path / JOURNAL
        if report.exists():
            return from_jobs_report(report)
        if journal.exists():
            return from_journal(journal)
        raise SourceError(f"--pilot: {path} holds neither {JOBS_REPORT} nor {JOURNAL}")
    if not path.exists():
        raise SourceError(f"--pilot: {path} does not exist")
    with open(path, "rb") as f:
        start = f.read(1)
    return from_journal(path) if start == b"{" else from_jobs_report(path)
