"""The registry's ``runs`` table: one row per run of a job (its first, and each run after a
scheduler's requeue or a retry of psij's, :mod:`psij._retry`), kept next to the job's row in
``jobs`` (which holds its last run only).

A run's row is written with every status of the job the recorder writes
(:mod:`psij._registry.recorder`): its number (the job's ``attempt`` then), native id, state
(only forwards, as the job's), exit code, cause and message, and the figures any status of the
run tells (:mod:`psij._registry.accounting`: a start time an ACTIVE status carries is kept
when its final status has none). ``queued_at`` is the scheduler's time when a status said it,
else the time psij recorded the run QUEUED with a native id (given to the scheduler).
``held_from`` and ``held_to`` are the job's (psij held it back in a client process before
this run). ``stdout_path`` and ``stderr_path`` are where the run's output is: the job's paths,
but for an executor that keeps each run's output (the batch executors) a run followed by a
later one that started has its output in ``<path>.<run>``, where the later run's script moved
it.

Plain SQL and tuples: :mod:`psij._registry.store` runs it in its transactions. The local
executor's keeper, which writes a job's final state itself when the submitting process is
gone, does not write here: :func:`read` takes that state for the run it belongs to.
"""

import os
from typing import Any, List, Optional, Tuple

from psij._registry.accounting import NO_USE, USE_KEYS, use_of

__all__ = ["COLUMNS", "KEEP_SQL", "SCHEMA", "UPSERT", "keeps_outputs", "merged", "previous_run",
           "read", "run_figures", "run_rows"]

# The columns of a run's row, in table order; the row written (``UPSERT``) has them all but
# ``held_from`` and ``held_to``, taken from the job's row.
COLUMNS = ("job_id", "run", "native_id", "state", "rank", "exit_code", "cause", "message",
           "updated", *USE_KEYS, "held_from", "held_to", "stdout_path", "stderr_path")
WRITTEN = tuple(name for name in COLUMNS if name not in ("held_from", "held_to"))

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    job_id TEXT NOT NULL,
    run INTEGER NOT NULL,
    native_id TEXT,
    state TEXT NOT NULL,
    rank INTEGER NOT NULL,
    exit_code INTEGER,
    cause TEXT,
    message TEXT,
    updated REAL NOT NULL,
    {USE_KEYS[0]} REAL,
    {USE_KEYS[1]} REAL,
    {USE_KEYS[2]} REAL,
    {USE_KEYS[3]} INTEGER,
    {USE_KEYS[4]} REAL,
    {USE_KEYS[5]} TEXT,
    {USE_KEYS[6]} INTEGER,
    {USE_KEYS[7]} INTEGER,
    {USE_KEYS[8]} REAL,
    held_from REAL,
    held_to REAL,
    stdout_path TEXT,
    stderr_path TEXT,
    PRIMARY KEY (job_id, run)
);
"""

_STATUS = ("state", "rank", "exit_code", "cause", "message", "updated")
_HELD = ("(SELECT held_from FROM jobs WHERE id = ?1 AND attempt = ?2)",
         "(SELECT held_to FROM jobs WHERE id = ?1 AND attempt = ?2)")
# A run's row: new, or the one written before, its status only forwards (callbacks may be
# recorded out of order), a figure or path not told now kept as told before.
UPSERT = (
    f"INSERT INTO runs ({', '.join(WRITTEN)}, held_from, held_to) VALUES "
    f"({', '.join(f'?{at}' for at in range(1, len(WRITTEN) + 1))}, {', '.join(_HELD)}) "
    "ON CONFLICT(job_id, run) DO UPDATE SET native_id = coalesce(excluded.native_id, "
    "runs.native_id), "
    + ", ".join(f"{name} = CASE WHEN excluded.rank >= runs.rank THEN excluded.{name} "
                f"ELSE runs.{name} END" for name in _STATUS) + ", "
    + ", ".join(f"{name} = coalesce(excluded.{name}, runs.{name})"
                for name in (*USE_KEYS, "held_from", "held_to")) + ", "
    # A path moved aside by a later run (below) stays where it went.
    + ", ".join(f"{name} = coalesce(runs.{name}, excluded.{name})"
                for name in ("stdout_path", "stderr_path")))
# A run (?3) that started moved the output of the job's earlier runs at the job's paths to
# ``<path>.<run>``: parameters stdout path, stderr path, run, job id.
KEEP_SQL = ("UPDATE runs SET stdout_path = CASE WHEN stdout_path = ?1 THEN ?1 || '.' || run "
            "ELSE stdout_path END, stderr_path = CASE WHEN stderr_path = ?2 THEN ?2 || '.' || "
            "run ELSE stderr_path END WHERE job_id = ?4 AND run < ?3")
# The held times of a job's current run, once they change (parameter: job id).
HELD_SQL = ("UPDATE runs SET held_from = (SELECT held_from FROM jobs WHERE id = ?1), "
            "held_to = (SELECT held_to FROM jobs WHERE id = ?1) WHERE job_id = ?1 AND "
            "run = (SELECT attempt FROM jobs WHERE id = ?1)")
# A final job's row takes the start its last run's earlier statuses told when its final
# status did not (the ACTIVE status a batch job's start file gives). Parameter: job id.
FILL_JOB_SQL = ("UPDATE jobs SET started_at = (SELECT r.started_at FROM runs r WHERE r.job_id "
                "= jobs.id AND r.run = jobs.attempt) WHERE id = ?1 AND final = 1 AND "
                "started_at IS NULL")
PRUNE_SQL = "DELETE FROM runs WHERE job_id NOT IN (SELECT id FROM jobs)"

# A run's row as written: the values of ``WRITTEN``.
RunRow = Tuple[Any, ...]
# An earlier run's output moved aside: (stdout path, stderr path, run, job id).
Keep = Tuple[Optional[str], Optional[str], int, str]


def read(conn: Any, job_id: str) -> List[Tuple[Any, ...]]:
    """The runs of ``job_id`` (rows of :data:`COLUMNS`), first run first. The job's last
    run takes the job's final state when only its row has it (written by the local
    executor's keeper), with the figures of that state."""
    rows = [list(r) for r in conn.execute(
        f"SELECT {', '.join(COLUMNS)} FROM runs WHERE job_id = ? ORDER BY run", (job_id,))]
    job = conn.execute(
        "SELECT attempt, native_id, state, rank, exit_code, cause, message, updated, final, "
        f"{', '.join(USE_KEYS)} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if job is not None and job[8]:
        last = next((r for r in rows if r[1] == job[0]), None)
        if last is not None and last[4] < job[3]:
            for name, value in zip(("native_id", *_STATUS), job[1:8]):
                if name != "native_id" or value is not None:
                    last[COLUMNS.index(name)] = value
            for name, value in zip(USE_KEYS, job[9:]):
                if value is not None:
                    last[COLUMNS.index(name)] = value
    return [tuple(r) for r in rows]


KEEPS_OUTPUTS_ATTR = "_psij_keeps_run_outputs"  # on an executor class: see keeps_outputs


def keeps_outputs(executor: Any) -> bool:
    """Whether ``executor`` keeps the output of each run of a job run again: a run moves the
    output of the one before to ``<path>.<run>`` as it starts (the batch executors)."""
    return getattr(executor, KEEPS_OUTPUTS_ATTR, False) is True


def previous_run(status: Any, attempt: int) -> Optional[Tuple[Any, ...]]:
    """The run before ``attempt`` as the status that starts a new run tells it (its metadata's
    ``previous``): (native id, exit code, message, its figures); None for another status."""
    meta = status.metadata
    previous = meta.get("previous") if meta and isinstance(meta.get("rerun"), str) else None
    if attempt < 2 or not isinstance(previous, dict):
        return None
    native_id, code, message = (previous.get(key) for key in ("native_id", "exit_code",
                                                              "message"))
    return (native_id if isinstance(native_id, str) else None,
            code if isinstance(code, int) and not isinstance(code, bool)
            and -(1 << 31) <= code < (1 << 31) else None,
            message if isinstance(message, str) else None, use_of(previous, True))


def _output_paths(job: Any) -> Tuple[Optional[str], Optional[str]]:
    """The job's stdout and stderr paths as its runs write them (relative ones made absolute
    with the job's directory when it has one)."""
    spec = job.spec
    if spec is None:
        return None, None
    directory = spec.directory

    def path(value: Any) -> Optional[str]:
        if value is None:
            return None
        text = str(value)
        if directory is not None and not os.path.isabs(text):
            text = os.path.join(str(directory), text)
        return _text(text)
    return path(spec.stdout_path), path(spec.stderr_path)


def run_rows(job: Any, values: Tuple[Any, ...]
              ) -> Tuple[List[Tuple[Any, ...]], List[Tuple[Any, ...]]]:
    """The rows of ``runs`` a status writes (its run's, and the run before when it starts a
    new run), and the earlier runs' outputs it moves aside (see the module)."""
    native_id, state, rank, exit_code, message, now, _, attempt, rerun, cause, _, run = \
        values[:12] if len(values) > 11 else (*values, None)
    figures, keeps, previous = run if run is not None else (NO_USE, False, None)
    stdout, stderr = _output_paths(job)
    rows = [(job.id, attempt, _text(native_id), state, rank, exit_code, cause, _text(message),
             now, *figures, stdout, stderr)]
    if previous is not None:
        why = rerun[1] if isinstance(rerun, tuple) and len(rerun) > 1 else None
        rows.insert(0, (job.id, attempt - 1, _text(previous[0]), "FAILED", _FINAL_RANK,
                        previous[1], _text(why), _text(previous[2]), now, *previous[3],
                        stdout, stderr))
    kept: List[Tuple[Any, ...]] = []
    started = rank >= _ACTIVE_RANK and (state != "CANCELED" or figures[0] is not None)
    if keeps and attempt > 1 and started and (stdout is not None or stderr is not None):
        kept.append((stdout, stderr, attempt, job.id))
    return rows, kept


_ACTIVE_RANK = 3  # JobState.ACTIVE.order
_FINAL_RANK = 6  # the final states' order


def run_figures(figures: Tuple[Any, ...], state: str, native_id: Optional[str],
                now: float) -> Tuple[Any, ...]:
    """The figures a status tells of its run: ``figures``, with ``queued_at`` the time psij
    recorded a QUEUED status with a native id (given to its scheduler) when none said when."""
    if figures[4] is None and state == "QUEUED" and native_id is not None:
        return (*figures[:4], now, *figures[5:])
    return figures


def merged(keep: Tuple[Any, ...], other: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """The status values ``keep`` (the recorder's, the later of two of one job in a batch)
    with what ``other`` told of a run: the figures of the same run that ``keep`` lacks, and
    the run before a new one (its figures completed with those ``other`` told of it)."""
    if len(keep) < 12 or len(other) < 12 or keep[11] is None or other[11] is None:
        return keep
    figures, keeps, previous = keep[11]
    told, _, told_previous = other[11]
    if keep[7] == other[7]:
        figures = _coalesced(figures, told)
        previous = previous if previous is not None else told_previous
    elif previous is not None and other[7] == keep[7] - 1:
        previous = (*previous[:3], _coalesced(previous[3], told))
    else:
        return keep
    return (*keep[:11], (figures, keeps, previous))


def _coalesced(first: Tuple[Any, ...], then: Tuple[Any, ...]) -> Tuple[Any, ...]:
    return tuple(a if a is not None else b for a, b in zip(first, then))


def _text(value: Optional[str]) -> Optional[str]:
    """A string SQLite can store (a lone surrogate is written as its escape)."""
    if value is None:
        return None
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")
