"""What the local executor computes for a job at submit time, before it runs: its spawn inputs
(:class:`Prepared`), what it keeps about the job until its end (:class:`Run`), and what a
failure to start means (:func:`spawn_failure`: a missing or unexecutable program ends the job
with 127 or 126, anything else is refused). It starts nothing and sets no job state."""

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from psij.exceptions import SubmitException
from psij.executors._process import LaunchError, StreamError, open_streams
from psij.executors.local._checks import not_executable, not_found
from psij.job import Job
from psij.job_launcher import Launcher
from psij.job_spec import JobSpec
from psij.job_status import JobStatus

if TYPE_CHECKING:
    from psij.executors.local._keeper_client import Keeper
    from psij.executors.local._time_limit import TimeLimit

__all__ = ["NotRunnable", "Prepared", "Run", "spawn_failure"]


class Prepared:
    """Spawn inputs computed at submit time (and the job's failure, if it cannot run)."""

    __slots__ = ("base", "direct", "env", "failure", "job_dir")

    def __init__(self, direct: bool, env: Dict[str, str], job_dir: Path) -> None:
        self.direct = direct
        self.env = env  # the job's own variables
        # The inherited ones (``_env.BASE``: its number and variables), None if none.
        self.base: Optional[Tuple[int, Dict[str, str]]] = None
        self.job_dir = job_dir
        self.failure: Optional[JobStatus] = None

    def whole_env(self) -> Dict[str, str]:
        """The job's whole environment: the inherited variables under its own."""
        if self.base is None:
            return dict(self.env)
        env = dict(self.base[1])
        env.update(self.env)
        return env

    def check_streams(self, spec: JobSpec) -> None:
        """Raise SubmitException if stdin is unreadable or an output's folder unwritable."""
        if spec.stdin_path is not None:
            p = self.job_dir / spec.stdin_path
            if not os.access(p, os.R_OK) or p.is_dir():
                raise SubmitException(f"JobSpec.stdin_path: {str(spec.stdin_path)!r} is not a "
                                      "readable file")
        for field in ("stdout_path", "stderr_path"):
            rel = getattr(spec, field)
            if rel is None:
                continue
            p = self.job_dir / rel
            if p.is_dir():
                raise SubmitException(f"JobSpec.{field}: {str(rel)!r} is a directory")
            target = p if p.exists() else p.parent
            if not os.access(target, os.W_OK):
                raise SubmitException(f"JobSpec.{field}: {str(rel)!r} cannot be written "
                                      f"({'file' if p.exists() else 'folder'} not writable or "
                                      "missing)")

    def open_streams(self, spec: JobSpec) -> Tuple[int, int, int]:
        opened: List[int] = []

        def text(path: Optional[Path]) -> Optional[str]:
            return None if path is None else str(path)

        try:
            return open_streams(str(self.job_dir), text(spec.stdin_path), text(spec.stdout_path),
                                text(spec.stderr_path), subprocess.DEVNULL, opened)
        except BaseException as ex:
            for fd in opened:
                os.close(fd)
            if isinstance(ex, StreamError):
                raise SubmitException(f"JobSpec.{ex.which}_path: cannot open {ex.path!r}: "
                                      f"{ex.reason}") from ex
            raise


class Run:
    """What the executor keeps about a job between submit and its final state."""

    __slots__ = (
        "activating",
        "attached",
        "began",
        "canceled",
        "end",
        "exited",
        "grace",
        "job",
        "job_dir",
        "keeper",
        "kept",
        "launcher",
        "launcher_out",
        "limit",
        "pid",
        "row_sent",
        "start",
        "starting",
        "stderr_path",
    )

    def __init__(self, job: Job, job_dir: Path) -> None:
        self.job = job
        self.job_dir = job_dir
        self.pid: Optional[int] = None
        self.start: Optional[str] = None  # kernel start time, recorded with the pid
        self.began: Optional[float] = None  # when this process started it (wall clock)
        self.launcher: Optional[Launcher] = None
        self.launcher_out: Optional[str] = None
        self.limit: Optional[TimeLimit] = None
        self.canceled = False
        self.grace = 0.0  # from the cancel's TERM to KILL
        self.exited = False
        self.kept = False  # started by the keeper
        self.keeper: Optional[Keeper] = None  # the one asked to start it
        self.starting = False  # sent to a keeper, which has not answered yet
        self.activating = False  # started by its keeper; its ACTIVE not yet being set
        self.end: Optional[Callable[[], None]] = None  # its end, when it came before ACTIVE
        self.attached = False  # started by another process
        self.row_sent = False  # its registry row went to its keeper with its start
        self.stderr_path: Optional[Path] = None


class NotRunnable(Exception):
    """The job's executable cannot be run: the job ends with ``status`` (FAILED, exit code 127
    or 126, as a shell would report it), as it would on a batch system."""

    def __init__(self, status: JobStatus) -> None:
        super().__init__(status.message)
        self.status = status


def spawn_failure(ex: LaunchError, job: Job, prepared: Prepared) -> Exception:
    """What submit makes of a job whose process could not be started: a missing or
    unexecutable program ends the job (127, 126), anything else is refused."""
    spec = job.spec
    assert spec is not None
    if ex.exit_code == 127:
        if prepared.direct and not Path(prepared.job_dir).is_dir():
            return SubmitException(f"JobSpec.directory: {str(prepared.job_dir)!r} does not "
                                   "exist")
        return NotRunnable(not_found(spec.executable))
    cause = ex.__cause__
    if ex.exit_code == 126:
        return NotRunnable(not_executable(spec.executable, getattr(cause, "strerror", None)))
    return SubmitException(f"job {job.id}: {ex}")
