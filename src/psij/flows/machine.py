"""The flow machine: "keep N jobs running" handles, as a pure controller machine.

(Skeleton: the interface is final, the rules are being filled in.)

Job keys: an instance of handle ``h`` is submitted as ``"<h>/<number>"`` (``number`` counts the
handle's instances from 0 and is the ``<restart number>`` of its instance id
``"<native id>.<number>"``). Handles are ``"f<number>"``, never reused. Timers the machine sets
are named ``("flow", "wake")``. ``now`` must be Unix epoch seconds (leases survive a restart).
"""

from typing import Any, Iterable, List, Tuple

from psij.flows._flow_config import FlowConfig
from psij.flows._flow_values import (
    DeleteFiles,
    DeletePayload,
    JournalDelete,
    JournalPut,
    MakeSandbox,
    MeasureSandbox,
    PayloadStored,
    PayloadVerified,
    ReadOutput,
    SandboxMeasured,
    SignalJob,
    StorePayload,
    VerifyPayload,
)

__all__ = [
    "WAKE", "DeleteFiles", "DeletePayload", "FlowConfig", "FlowMachine", "JournalDelete",
    "JournalPut", "MakeSandbox", "MeasureSandbox", "PayloadStored", "PayloadVerified", "ReadOutput",
    "SandboxMeasured", "SignalJob", "StorePayload", "VerifyPayload",
]

WAKE = ("flow", "wake")
"""The name of the one timer the machine sets."""


class FlowMachine:
    """The flows of one service (see the module notes and the flows guide)."""

    def __init__(self, config: FlowConfig) -> None:
        self.config = config

    def step(self, event: Any, now: float) -> List[Any]:
        """The actions for ``event`` at time ``now``; never raises on any input."""
        return []

    def restore(self, records: Iterable[Tuple[str, str, Any]], now: float) -> List[Any]:
        """Take back the journal (``(kind, key, value)`` as written by :class:`JournalPut`)
        after a restart, before any event; returns the actions to carry out first (attaching
        every instance that has a native id and has not ended, setting the timer). Never
        submits an instance that was submitted before."""
        return []
