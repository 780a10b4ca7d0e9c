"""``ExecutorTestParams``: one ``executor[:launcher[:url]]`` entry of ``--executors``, as the
tests of psij-python read it (``execparams.executor``, ``.launcher``, ``.url`` and the job
attributes a site may add)."""

from typing import Any, Dict, Optional


class ExecutorTestParams:
    """An executor, and optionally the launcher and executor URL, to run a test with."""

    def __init__(self, spec: str, custom_attributes: Optional[Dict[str, Any]] = None,
                 account: Optional[str] = None, queue_name: Optional[str] = None,
                 multi_node_queue_name: Optional[str] = None) -> None:
        parts = spec.split(":", 2)
        if not parts[0]:
            raise ValueError(f"--executors: an entry must start with an executor name, got "
                             f"{spec!r}")
        self.executor = parts[0]
        self.launcher: Optional[str] = parts[1] if len(parts) > 1 and parts[1] else None
        self.url: Optional[str] = parts[2] if len(parts) > 2 and parts[2] else None
        self.custom_attributes = custom_attributes
        self.account = account
        self.queue_name = queue_name
        self.multi_node_queue_name = multi_node_queue_name

    def __str__(self) -> str:
        text = self.executor
        if self.launcher is not None or self.url is not None:
            text += ":" + (self.launcher or "")
        if self.url is not None:
            text += ":" + self.url
        return text

    __repr__ = __str__
