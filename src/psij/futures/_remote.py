"""Function calls through a remote executor (``url="ssh://..."``): the two hosts share no file
system, so a job's files go over the executor's connection as its staging.

The call directory stays on this machine, as for any executor. The job stages in its calls
file and a key made for this job alone (not the work directory's: the remote host never holds
a key that signs other jobs' files) into ``functions/`` of the job's private folder on the
remote host (:meth:`psij.remote._executor.RemoteJobExecutor.remote_job_folder`); the runner
runs there, with the Python the remote ``psij`` runs on unless ``python`` was given, and the
job's stage-out brings each call's result and claim file and the job's ``stdout`` and
``stderr`` back into the call directory here before the job is seen final, so the futures are
settled from local files exactly as for a local job. The remote folder is removed with the
job's other staged files.
"""

import posixpath
import secrets
from typing import TYPE_CHECKING, Any, Dict, Optional

from psij.futures import _wire
from psij.job_executor import JobExecutor
from psij.staging import StageIn, StageOut, StageOutFlags, StagingMode

if TYPE_CHECKING:
    from psij.remote._executor import RemoteJobExecutor

__all__ = ["RemoteCalls"]

FOLDER = "functions"
_BACK = StageOutFlags.IF_PRESENT | StageOutFlags.ALWAYS


class RemoteCalls:
    """How the jobs of a FunctionExecutor reach a remote executor's host."""

    def __init__(self, executor: "RemoteJobExecutor") -> None:
        self._executor = executor
        python = executor.remote_python
        # Any job id would do: the folders of all jobs are known, or none is.
        if python is None or executor.remote_job_folder("probe") is None:
            raise ValueError(
                f"FunctionExecutor: the remote psij of {executor.url} does not say which "
                f"Python it runs on and where it keeps staged files (a psij of another "
                f"version): install this psij version there to run function calls over SSH")
        self.python: str = python

    @staticmethod
    def of(executor: JobExecutor) -> "Optional[RemoteCalls]":
        """The remote calls of ``executor``; None when it runs jobs on this machine."""
        if executor.url is None:
            return None
        from psij.remote._executor import RemoteJobExecutor

        if not isinstance(executor, RemoteJobExecutor):
            return None
        return RemoteCalls(executor)

    @staticmethod
    def new_key() -> bytes:
        return secrets.token_bytes(32)

    def spec_fields(self, job_id: str, directory: str, count: int, runner: str
                    ) -> Dict[str, Any]:
        """The JobSpec fields of job ``job_id`` whose ``count`` calls are in the local call
        directory ``directory`` (its calls file and ``key`` written): the runner's command,
        its streams and the staging that carries the files each way."""
        folder = self._executor.remote_job_folder(job_id)
        assert folder is not None  # checked when made
        top = posixpath.join(folder, FOLDER)
        name = posixpath.basename(directory)
        remote = posixpath.join(top, name)
        stage_in = [
            StageIn(_local(directory, _wire.KEY_NAME), posixpath.join(top, _wire.KEY_NAME),
                    StagingMode.MOVE),
            StageIn(_wire.calls_file(directory), _wire.calls_file(remote), StagingMode.MOVE),
        ]
        stage_out = []
        for index in range(count):
            for local, there in ((_wire.result_file(directory, index),
                                  _wire.result_file(remote, index)),
                                 (_wire.claim_file(directory, index),
                                  _wire.claim_file(remote, index))):
                stage_out.append(StageOut(there, local, _BACK))
        for stream in ("stdout", "stderr"):
            stage_out.append(StageOut(posixpath.join(folder, stream),
                                      _local(directory, stream), _BACK))
        return {"arguments": ["-m", runner, remote],
                "stdout_path": posixpath.join(folder, "stdout"),
                "stderr_path": posixpath.join(folder, "stderr"),
                "stage_in": stage_in, "stage_out": stage_out}


def _local(directory: str, name: str) -> str:
    return posixpath.join(directory, name)
