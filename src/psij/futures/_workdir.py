"""The work directory of function calls: created or verified private (0700, ours, no link),
its signing key (made once, 0600), one call directory per job, and their removal.

It writes and removes only inside the work directory it was given; it starts nothing.
"""

import os
import secrets
import shutil
from pathlib import Path
from typing import Union

from psij._private_dirs import ensure_private_dir
from psij.futures import _wire

__all__ = ["WorkDirectory"]


class WorkDirectory:
    """A verified work directory and its key."""

    def __init__(self, path: Union[str, Path], field: str) -> None:
        self.path = str(ensure_private_dir(path, field))
        self.key = self._key()

    def _key(self) -> bytes:
        path = os.path.join(self.path, _wire.KEY_NAME)
        if not os.path.lexists(path):
            # Written whole under another name, then linked into place: a process that starts
            # at the same moment reads the one key, never half of one.
            temporary = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
            try:
                os.write(fd, secrets.token_bytes(32))
            finally:
                os.close(fd)
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass
            finally:
                os.unlink(temporary)
        try:
            return _wire.read_key(self.path)
        except _wire.WireError as ex:
            raise PermissionError(str(ex)) from None

    def new_call_directory(self) -> str:
        """A new, empty call directory (0700)."""
        while True:
            path = os.path.join(self.path, secrets.token_hex(8))
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue

    def remove(self, directory: str) -> None:
        """Remove a call directory of this work directory (nothing outside it)."""
        if os.path.dirname(os.path.abspath(directory)) != self.path:
            raise ValueError(f"{directory} is not a call directory of {self.path}")
        shutil.rmtree(directory, ignore_errors=True)
