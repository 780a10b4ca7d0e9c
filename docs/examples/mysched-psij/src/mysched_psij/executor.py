"""psij executor for MySched: a batch backend made of declarations only."""

import re
from pathlib import Path

from psij import JobState
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutor


class MySchedExecutor(BatchSchedulerExecutor):
    """Submits jobs with ``mysched submit`` and follows them with ``mysched status``.

    Custom attributes ``mysched.<option>`` become ``#MYSCHED --<option>="<value>"`` lines.
    """

    TEMPLATE = Path(__file__).parent / "mysched.mustache"
    SUBMIT_COMMAND = ("mysched", "submit")  # the script's path is appended
    JOB_ID_PATTERN = re.compile(r"Submitted job (\d+)")
    CANCEL_COMMAND = ("mysched", "cancel")  # the job's id is appended
    CANCEL_GONE_PATTERN = re.compile("has already ended")
    STATUS_COMMAND = ("mysched", "status")  # the ids of all followed jobs are appended
    STATUS_LINE_PATTERN = re.compile(r"(\d+) ([A-Z])")  # "<id> <state letter>"
    STATE_MAP = {"Q": JobState.QUEUED, "R": JobState.ACTIVE, "C": JobState.COMPLETED,
                 "F": JobState.FAILED, "X": JobState.CANCELED}
    LIST_COMMAND = ("mysched", "list")
    CUSTOM_ATTRIBUTE_PREFIXES = ("mysched",)
