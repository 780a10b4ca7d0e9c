"""A logger that imports :mod:`logging` only when something is logged, and the ``PSIJ_LOG``
environment variable that turns the ``psij`` loggers on.

``import psij`` must stay cheap, and most runs never log; the core modules use this instead of
``logging.getLogger`` at import time. ``PSIJ_LOG`` is read once per process, when the first
executor is made or the first lazy logger is used, never at ``import psij``.
"""

import os
import sys
import threading
from typing import Any

ENVIRONMENT_VARIABLE = "PSIJ_LOG"
LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s]: %(message)s"

_lock = threading.Lock()
_configured = False


def configure_from_environment() -> None:
    """When ``PSIJ_LOG`` names a level (``debug``, ``info``, ``warning``, ``error`` or
    ``critical``, in any case), sends the records of the ``psij`` loggers at that level and above
    to stderr. An empty or unset variable changes nothing; any other value is reported on stderr,
    once, and ignored. Runs once per process; a program that configures ``logging`` itself
    needs none of this."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not value:
        return
    if value.lower() not in LEVELS:
        sys.stderr.write(f"psij: {ENVIRONMENT_VARIABLE}={value!r} ignored: expected one of "
                         f"{', '.join(LEVELS)}\n")
        return
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    top = logging.getLogger("psij")
    top.setLevel(value.upper())
    top.addHandler(handler)


class LazyLogger:
    """Stands for ``logging.getLogger(name)``, created on first use."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            import logging

            configure_from_environment()
            self._logger = logging.getLogger(self._name)
        return getattr(self._logger, attr)
