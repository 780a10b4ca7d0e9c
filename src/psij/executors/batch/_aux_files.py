"""The files a batch job leaves in the work directory beside its submit script
(``<native id><suffix>``: exit code, script output, reports, signals), found, read and removed
for :class:`~psij.executors.batch.BatchSchedulerExecutor`."""

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from psij.executors.batch._job_files import parse_end
from psij.executors.batch._job_output import _read_text
from psij.job import Job

logger = logging.getLogger("psij.executors.batch.batch_scheduler_executor")

OUTPUT_LIMIT = 64 * 1024  # the most of an output file read (its end)


class AuxFiles:
    """The auxiliary files of :class:`~psij.executors.batch.BatchSchedulerExecutor`."""

    if TYPE_CHECKING:
        work_directory: Path

        @property
        def batch_config(self) -> Any: ...

    def _aux_path(self, native_id: str, suffix: str) -> Path:
        return self.work_directory / f"{native_id}{suffix}"

    def _exit_code_from_file(self, native_id: str) -> Optional[int]:
        text = _read_text(self._aux_path(native_id, ".ec"), 100)
        if text is None:
            return None
        end = parse_end(text)  # (None: not one the script wrote, or written partly so far)
        return None if end is None else end[0]

    def _clean_submit_script(self, job: Job) -> None:
        """Delete the job's submit script, unless ``keep_files``."""
        if self.batch_config.keep_files:
            return
        try:
            (self.work_directory / f"{job.id}.job").unlink()
        except FileNotFoundError:
            pass  # attached jobs have no script here, or another process removed it
        except OSError as e:
            logger.warning("job %s: could not delete its submit script: %s", job.id, e)

    def _delete_aux_file(self, job: Job, suffix: str) -> None:
        """Delete ``<native_id><suffix>`` in the work directory, unless ``keep_files``."""
        if self.batch_config.keep_files or job.native_id is None:
            return
        try:
            self._aux_path(job.native_id, suffix).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("job %s: could not delete %s file: %s", job.id, suffix, e)

    def _read_aux_file(self, job: Job, suffix: str) -> Optional[str]:
        """The content of ``<native_id><suffix>`` (then deleted unless ``keep_files``), or None
        if there is no such file."""
        if job.native_id is None:
            return None
        text = _read_text(self._aux_path(job.native_id, suffix), OUTPUT_LIMIT, tail=True)
        if text is not None:
            self._delete_aux_file(job, suffix)
        return text
