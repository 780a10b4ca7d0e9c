"""Supervision: a server job, the client jobs it asks for, kept alive through failures.

``psij supervise CONFIG.json`` submits a *server* job, which connects back (to the address in
``PSIJ_SUPERVISOR``, presenting the secret in ``PSIJ_SUPERVISOR_TOKEN``) and asks for *client*
jobs while it runs; the supervisor submits them, tells the server how each one ends, pings the
server and, when the server dies, cancels every job and starts a new server. The guide
(``docs/supervise.rst``) gives the state diagram, the wire protocol and the options.

- :class:`Supervisor` is the pure machine (``step(event, now) -> actions`` over the events and
  actions of :mod:`psij.controller`), :class:`Settings` what it is told once.
- :mod:`psij.supervise.client` is the library servers use to talk to it.
- :func:`run` runs a study from a configuration (what the command does).
"""

import importlib
from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:
    from psij.supervise._config import OPTIONS, ConfigError, SuperviseConfig, read_config
    from psij.supervise._machine import EntryKind, EntryState, JobEntry, Settings, Supervisor
    from psij.supervise._run import run

__all__ = ["OPTIONS", "ConfigError", "EntryKind", "EntryState", "JobEntry", "Settings",
           "SuperviseConfig", "Supervisor", "read_config", "run"]

# Loaded on first use, so that a server importing psij.supervise.client starts fast.
_HOMES: Dict[str, str] = {
    "OPTIONS": "_config", "ConfigError": "_config", "SuperviseConfig": "_config",
    "read_config": "_config", "EntryKind": "_machine", "EntryState": "_machine",
    "JobEntry": "_machine", "Settings": "_machine", "Supervisor": "_machine", "run": "_run",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> Any:
    return sorted([*globals(), *__all__])
