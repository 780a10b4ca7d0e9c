"""A pilot's secret handed to agents in a file: written 0600, read back only when safe.

An elastic pilot's allocations start their agents through a scheduler, whose job scripts and
command lines others can read, and whose tasks' environment the tasks see: the secret that
admits an agent goes in a file instead, named on the agent's command line
(``--token-file PATH``). :func:`write_token_file` makes it (a new file, 0600, in a folder the
caller made 0700); :func:`read_token_file` refuses a file that is a symbolic link, is not a
regular file, is not owned by the user who reads it, or that anyone else may read or write
(mode other than 0600 or 0400), and a token that is empty or too long.
"""

import os
import stat
from pathlib import Path

__all__ = ["TokenFileError", "read_token_file", "write_token_file"]

_MAX_TOKEN = 1024


class TokenFileError(ValueError):
    """A token file that cannot be trusted or read (the message says why)."""


def write_token_file(path: Path, token: str) -> None:
    """Write ``token`` to the new file ``path`` (0600); raises if ``path`` exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, (token + "\n").encode("ascii"))
    finally:
        os.close(fd)


def read_token_file(path: str) -> str:
    """The token in ``path``, after the checks of the module notes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as ex:
        if os.path.islink(path):
            raise TokenFileError(f"--token-file {path}: is a symbolic link; the token file "
                                 "must be a regular file") from None
        raise TokenFileError(f"--token-file {path}: cannot be opened: {ex.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"--token-file {path}: is not a regular file")
        if st.st_uid != os.geteuid():
            raise TokenFileError(f"--token-file {path}: is owned by user {st.st_uid}, not "
                                 f"by this user ({os.geteuid()})")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise TokenFileError(f"--token-file {path}: its mode is {mode:04o}; others may "
                                 "read or change it (expected 0600)")
        data = os.read(fd, _MAX_TOKEN + 2)
    finally:
        os.close(fd)
    token = data.decode("ascii", "replace").split("\n", 1)[0].strip()
    if not token or len(token) > _MAX_TOKEN:
        raise TokenFileError(f"--token-file {path}: expected one line of at most "
                             f"{_MAX_TOKEN} characters, the token")
    return token
