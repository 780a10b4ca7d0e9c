"""File staging done by the job itself: batch submit scripts and pilot tasks.

The local executor stages with its own file operations. Batch jobs and pilot tasks run where
the submitting process is not, so their script does it, with ``launchers/staging_lib.sh``; this
module is the Python side of that:

- :func:`script_context` checks a job's staging entries and turns them into the values the
  ``psij_staging`` template partial writes into the script: every path absolute and written as
  one shell word, nothing that cannot be written safely (a newline, a lone surrogate, a scheme
  other than ``file``) accepted. It raises :class:`~psij.InvalidJobException` naming the field
  before anything is written or submitted; :func:`check_staging` does the same checks alone
  (batch executors make them before a job is held).
- :func:`read_report` and :func:`staged_status` turn the report the script leaves
  (``<native id>.staging``) into the job's final status, with the local executor's rules: a
  failed stage-in fails the job (the job did not run: no exit code), a failed stage-out fails a
  job that had succeeded, cleanup failures are only logged.

Relative stage-in sources and stage-out targets are taken from the submitting process's current
directory (as the local executor does); job-side paths from the job's directory. It must not
copy, link or remove files itself; it reads the report and deploys the shell library only.
"""

import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from psij._data import data_dir
from psij._record import Record
from psij._scripts.quoting import ShellWord
from psij.exceptions import InvalidJobException
from psij.job_spec import JobSpec
from psij.job_state import JobState
from psij.job_status import JobStatus
from psij.staging import URI, StageIn, StageOut, StageOutFlags, normalize_flags

__all__ = ["StagingReport", "check_staging", "needs_staging", "read_report", "script_context",
           "staged_status", "valid_text"]

logger = logging.getLogger(__name__)

STAGING_LIB = "staging_lib.sh"
REPORT_SUFFIX = ".staging"
_REPORT_LIMIT = 64 * 1024


def needs_staging(spec: JobSpec) -> bool:
    """True when the job has stage-in, stage-out or cleanup entries."""
    return bool(spec.stage_in or spec.stage_out or spec.cleanup)


def valid_text(field: str, text: str) -> str:
    """``text`` when it can be written in a (UTF-8) job script, else InvalidJobException naming
    ``field``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJobException(
            f"{field}: {text!r} is not valid text (it holds a lone surrogate, as names read "
            "with undecodable bytes do); give it as valid UTF-8 text") from None
    return text


def _writable(field: str, text: str) -> str:
    """``text`` when a job script can hold it as a path, else InvalidJobException naming
    ``field``."""
    for bad, name in (("\n", "a newline"), ("\r", "a carriage return"), ("\x00", "a NUL")):
        if bad in text:
            raise InvalidJobException(f"{field}: {text!r} contains {name}, which psij does not "
                                      "write into a job script; rename the file")
    return valid_text(field, text)


def _local(field: str, uri: Any, executor: str, cwd: str) -> str:
    if not isinstance(uri, URI):
        raise InvalidJobException(f"{field}: expected a psij.staging.URI, got {uri!r}")
    if uri.scheme != "file" or uri.hostname not in (None, "", "localhost"):
        raise InvalidJobException(f"{field}: {uri} is not a local file (only file:// and plain "
                                  f"paths are staged by the {executor} executor)")
    if not uri.path:
        raise InvalidJobException(f"{field}: {uri} names no file; give a path")
    return _writable(field, os.path.join(cwd, uri.path))


def _job_side(field: str, path: Any, job_dir: str) -> str:
    if not isinstance(path, Path):
        raise InvalidJobException(f"{field}: expected a path, got {path!r}")
    return _writable(field, os.path.join(job_dir, str(path)))


def _flags(field: str, flags: Any) -> int:
    if not isinstance(flags, StageOutFlags):
        raise InvalidJobException(f"{field}: expected psij.staging.StageOutFlags, got {flags!r}")
    return normalize_flags(flags).value


def script_context(spec: JobSpec, job_dir: str, work_directory: Path, executor: str
                   ) -> Optional[Dict[str, object]]:
    """The ``psij.staging`` value of a script context (None without staging entries).

    ``job_dir`` is the job's absolute directory; the shell library is deployed under
    ``work_directory`` (next to the launcher scripts). ``executor`` names the executor in
    error messages.
    """
    values = _values(spec, job_dir, executor)
    if values is not None:
        values["lib"] = ShellWord(str(staging_lib(work_directory)))
    return values


def check_staging(spec: JobSpec, job_dir: str, executor: str) -> None:
    """Refuse what :func:`script_context` refuses, without deploying anything."""
    _values(spec, job_dir, executor)


def _values(spec: JobSpec, job_dir: str, executor: str) -> Optional[Dict[str, object]]:
    if not needs_staging(spec):
        return None
    cwd = os.getcwd()
    stage_in: List[Dict[str, object]] = []
    for i, item in enumerate(spec.stage_in or ()):
        if not isinstance(item, StageIn):
            raise InvalidJobException(f"JobSpec.stage_in[{i}]: expected StageIn, got {item!r}")
        stage_in.append({
            "mode": item.mode.name,
            "source": ShellWord(_local(f"JobSpec.stage_in[{i}].source", item.source, executor,
                                       cwd)),
            "target": ShellWord(_job_side(f"JobSpec.stage_in[{i}].target", item.target,
                                          job_dir))})
    stage_out: List[Dict[str, object]] = []
    cancel_bit = StageOutFlags.ON_CANCEL.value
    on_cancel = False
    for i, out in enumerate(spec.stage_out or ()):
        if not isinstance(out, StageOut):
            raise InvalidJobException(f"JobSpec.stage_out[{i}]: expected StageOut, got {out!r}")
        field = f"JobSpec.stage_out[{i}]"
        flags = _flags(f"{field}.flags", out.flags)
        on_cancel = on_cancel or bool(flags & cancel_bit)
        stage_out.append({
            "flags": flags, "mode": out.mode.name,
            "shown": ShellWord(_writable(f"{field}.source", str(out.source))),
            "source": ShellWord(_job_side(f"{field}.source", out.source, job_dir)),
            "target": ShellWord(_local(f"{field}.target", out.target, executor, cwd))})
    cleanup_flags = _flags("JobSpec.cleanup_flags", spec.cleanup_flags)
    cleanup = [{"flags": cleanup_flags,
                "path": ShellWord(_job_side(f"JobSpec.cleanup[{i}]", p, job_dir))}
               for i, p in enumerate(spec.cleanup or ())]
    on_cancel = on_cancel or bool(cleanup and cleanup_flags & cancel_bit)
    return {"stage_in": stage_in, "stage_out": stage_out, "cleanup": cleanup,
            "on_cancel": on_cancel}


def staging_lib(work_directory: Path) -> Path:
    """The shell library, deployed under ``work_directory`` (once per process)."""
    from psij.launchers.script_based_launcher import deploy_files

    return deploy_files(work_directory, [data_dir("launchers") / STAGING_LIB]) / STAGING_LIB


class StagingReport(Record):
    """What a job's script reported about its staging."""

    stage_in_error: Optional[str]
    stage_out_error: Optional[str]
    cleanup_errors: List[str]
    job_exit: Optional[int]


def read_report(path: Path) -> Optional[StagingReport]:
    """The report at ``path``, or None when there is none."""
    try:
        with open(path, "rb") as f:
            text = f.read(_REPORT_LIMIT).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("cannot read the staging report %s: %s", path, e)
        return None
    found: Dict[str, str] = {}
    cleanup: List[str] = []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "cleanup-failed":
            cleanup.append(value)
        elif key in ("stage-in-failed", "stage-out-failed", "job-exit"):
            found.setdefault(key, value)  # the first one, as the local executor reports
    code = found.get("job-exit", "").strip()
    return StagingReport(found.get("stage-in-failed"), found.get("stage-out-failed"), cleanup,
                         int(code) if code.lstrip("-").isdigit() else None)


def staged_status(status: JobStatus, report: Optional[StagingReport],
                  job_label: str = "job") -> JobStatus:
    """The final ``status`` corrected by what the script reported about staging."""
    if report is None or not status.final:
        return status
    for problem in report.cleanup_errors:
        logger.warning("%s: %s", job_label, problem)
    if report.stage_in_error is not None:
        state = JobState.CANCELED if status.state is JobState.CANCELED else JobState.FAILED
        return JobStatus(state, time=status.time, message=report.stage_in_error,
                         metadata=status.metadata)
    if report.stage_out_error is not None and report.job_exit == 0 \
            and status.state is not JobState.CANCELED:
        return JobStatus(JobState.FAILED, time=status.time, message=report.stage_out_error,
                         exit_code=0, metadata=status.metadata)
    return status
