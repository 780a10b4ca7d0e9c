"""A logger that imports :mod:`logging` only when something is logged.

``import psij`` must stay cheap, and most runs never log; the core modules use this instead of
``logging.getLogger`` at import time.
"""

from typing import Any


class LazyLogger:
    """Stands for ``logging.getLogger(name)``, created on first use."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            import logging

            self._logger = logging.getLogger(self._name)
        return getattr(self._logger, attr)
