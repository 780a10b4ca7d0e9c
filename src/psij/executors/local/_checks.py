"""What the local executor checks of a job before it starts it: texts no process can receive,
and (for jobs run through a launcher script) an executable that is missing or not executable,
which ends the job FAILED with the shell's code (127, 126) rather than failing ``submit``."""

import os
import shutil
from pathlib import Path
from typing import Dict, Optional

from psij.exceptions import InvalidJobException, SubmitException
from psij.executors._os_texts import _PATH_FIELDS, check_texts, spec_texts
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus

__all__ = ["check_executable", "check_os_texts", "not_executable", "not_found"]


def not_found(exe: Optional[str]) -> JobStatus:
    return JobStatus(JobState.FAILED, exit_code=127, message=(
        f"JobSpec.executable: {exe!r} was not found (no such file, or not on PATH)"))


def not_executable(exe: Optional[str], why: Optional[str]) -> JobStatus:
    return JobStatus(JobState.FAILED, exit_code=126, message=(
        f"JobSpec.executable: {exe!r} cannot be executed ({why})"))


def check_executable(spec: JobSpec, job_dir: Path, env: Dict[str, str]
                      ) -> Optional[JobStatus]:
    """For a job run through the launcher script: its failure if its executable cannot run."""
    exe = spec.executable
    assert exe is not None
    if "/" in exe:
        full = job_dir / exe
        if not full.exists():
            return not_found(exe)
        if full.is_dir() or not os.access(full, os.X_OK):
            return not_executable(exe, "not an executable file")
        return None
    if shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
        return not_found(exe)
    return None


def check_os_texts(spec: JobSpec) -> None:
    """Refuse, naming the field, a string no process can be given (a lone surrogate; see
    :mod:`psij.executors._os_texts`), with a SubmitException as the local executor always
    has."""
    # The common case first, without naming each field: all of it ASCII.
    texts = [spec.executable or "", *(spec.arguments or ())]
    environment = spec.environment
    if environment:
        texts += [str(k) for k in environment]
        texts += [str(v) for v in environment.values()]
    for field in _PATH_FIELDS:
        value = getattr(spec, field)
        if value is not None:
            texts.append(str(value))
    if all(isinstance(t, str) for t in texts) and "".join(texts).isascii():
        return
    try:
        check_texts(spec_texts(spec))
    except InvalidJobException as ex:
        raise SubmitException(str(ex)) from ex
