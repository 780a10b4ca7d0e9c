"""What a batch job left behind, read and put in words: the exit-code and output files of the
work directory, the end of the job's stderr, its exit status and time limit as a user reads
them.

Used by :mod:`~psij.executors.batch.batch_scheduler_executor` to build final messages. Reads
files only; never writes, removes or runs anything.
"""

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Optional

from psij.executors._process import exit_message, stderr_excerpt
from psij.job_spec import JobSpec

logger = logging.getLogger("psij.executors.batch.batch_scheduler_executor")


def _read_text(path: Path, limit: int, tail: bool = False) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            if tail:
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    f.seek(size - limit)
            data = f.read(limit)
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.debug("cannot read %s: %s", path, e)
        return None
    return data.decode("utf-8", errors="replace")


def _describe_duration(d: timedelta) -> str:
    total = int(d.total_seconds())
    return f"{total // 3600}:{total // 60 % 60:02d}:{total % 60:02d}"


def _describe_exit(code: int) -> str:
    return exit_message(code)


def _stderr_tail(spec: Optional[JobSpec]) -> Optional[str]:
    if spec is None or spec.stderr_path is None:
        return None
    path = spec.stderr_path
    if not path.is_absolute() and spec.directory is not None:
        path = spec.directory / path
    try:
        if not path.is_file():
            return None
    except OSError:
        return None
    return stderr_excerpt(path)
