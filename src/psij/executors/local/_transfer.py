"""The local executor's own staging: a file, directory or link moved between two local paths,
and a finished job's stage-out and cleanup. It sets no job state itself (it reports the states
it enters to the executor's callable)."""

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from psij._lazylog import LazyLogger
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.staging import StageOutFlags, StagingMode, normalize_flags

__all__ = ["local_path", "stage_out_and_cleanup", "transfer"]

logger = LazyLogger("psij.executors.local")


def local_path(uri: Any, field: str) -> Path:
    if uri.scheme != "file" or uri.hostname not in (None, "", "localhost"):
        raise ValueError(f"{field}: {uri} is not a local file (only file:// and plain paths "
                         "are staged by the local executor)")
    return Path(uri.path)


def transfer(src: Path, dst: Path, mode: StagingMode) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if mode is StagingMode.LINK:
        os.lstat(src)  # a missing source fails, as with the other modes
        if os.path.lexists(dst):
            dst.unlink()
        os.symlink(os.path.abspath(src), dst)
    elif mode is StagingMode.MOVE:
        shutil.move(str(src), str(dst))
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def stage_out_and_cleanup(job_dir: Path, spec: JobSpec, state: JobState,
                          enter: Callable[[JobState], None]) -> Optional[str]:
    """Stage out and clean up a job that ended in ``state`` (``enter`` is told of the STAGE_OUT
    and CLEANUP states when there is something to do); the stage-out error, if any."""
    outcome = {JobState.COMPLETED: StageOutFlags.ON_SUCCESS,
               JobState.FAILED: StageOutFlags.ON_ERROR,
               JobState.CANCELED: StageOutFlags.ON_CANCEL}[state]
    error: Optional[str] = None
    todo = [s for s in (spec.stage_out or []) if s.flags & outcome]
    if todo:
        enter(JobState.STAGE_OUT)
        for item in todo:
            src = job_dir / item.source
            if not os.path.lexists(src):
                if not item.flags & StageOutFlags.IF_PRESENT and error is None:
                    error = f"stage-out: {str(item.source)!r} does not exist"
                continue
            try:
                transfer(src, local_path(item.target, "StageOut.target"), item.mode)
            except (OSError, ValueError) as ex:
                error = error or f"stage-out of {str(item.source)!r} failed: {ex}"
    if spec.cleanup and normalize_flags(spec.cleanup_flags) & outcome:
        enter(JobState.CLEANUP)
        for p in spec.cleanup:
            target = job_dir / p
            try:
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif os.path.lexists(target):
                    target.unlink()
            except OSError as ex:
                logger.warning("cleanup of %s failed: %s", target, ex)
    return error
