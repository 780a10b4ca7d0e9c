"""Executors of another host, reached over SSH: ``JobExecutor.get_instance("slurm",
url="ssh://user@host")``, and ``psij remote serve``, the remote side.

This package is loaded when an ``ssh://`` URL is used, never by ``import psij``. See the
"Remote executors" guide for the URL, the connection, what happens when it drops, and staging.
"""

from psij.remote._protocol import (
                                   RemoteConnectError,
                                   RemoteError,
                                   RemoteProtocolError,
                                   RemoteVersionError,
)

__all__ = ["RemoteConnectError", "RemoteError", "RemoteProtocolError", "RemoteVersionError"]
