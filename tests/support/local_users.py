"""Real local users for the security tests (made with useradd by root, removed by the tests)."""

import pwd
import secrets
import subprocess
from typing import NamedTuple


class User(NamedTuple):
    name: str
    uid: int
    gid: int


def make_user(prefix: str) -> User:
    """A new system user ``<prefix><6 hex digits>`` with its own group, no home and no shell."""
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                    "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid)
