"""Where a remote executor connects: an ``ssh://[user@]host[:port]`` URL read and checked, and
the ``ssh`` command line that reaches it.

The URL may carry, after ``?``, ``psij=`` (the remote ``psij`` command, when it is not on the
remote PATH) and ``ssh_config=`` (an OpenSSH configuration file for this connection alone).
``PSIJ_REMOTE_PSIJ`` gives the remote command when the URL does not, and ``PSIJ_SSH_COMMAND``
the local ``ssh`` command with options of its own (split as a shell would, never run by one).

OpenSSH is run with ``BatchMode=yes``: it never asks for a password or a passphrase and never
accepts a host key that the user's configuration does not already accept. Keys, agents,
``~/.ssh/config`` and known hosts are the user's own, as for any ``ssh`` command.
"""

import os
import shlex
from typing import List, Mapping, Optional, Sequence, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from psij._record import Record

SCHEME = "ssh"
QUERY_KEYS = ("psij", "ssh_config")
# Options of every connection: no prompt, keep-alives that notice a dead link in ~30 s, no
# terminal, no X11 or agent forwarding.
SSH_OPTIONS = ("-T", "-x", "-a", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=10",
               "-o", "ServerAliveCountMax=3", "-o", "ConnectTimeout=20")


class Target(Record):
    """A checked ``ssh://`` URL."""

    url: str
    user: Optional[str]
    host: str
    port: Optional[int]
    psij: str
    """The remote ``psij`` command (a path or a name on the remote PATH)."""
    ssh_config: Optional[str]
    ssh: Tuple[str, ...]
    """The local ssh command and its own options."""

    @property
    def where(self) -> str:
        """``user@host:port`` as far as given, for messages."""
        text = self.host if self.user is None else f"{self.user}@{self.host}"
        return text if self.port is None else f"{text}:{self.port}"

    def argv(self, words: Sequence[str] = ("remote", "serve")) -> List[str]:
        """The command that connects and runs the remote ``psij`` with ``words`` (by default
        ``psij remote serve``), each word quoted for the remote shell."""
        argv = [*self.ssh, *SSH_OPTIONS]
        if self.ssh_config is not None:
            argv += ["-F", self.ssh_config]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.user is not None:
            argv += ["-l", self.user]
        command = " ".join(shlex.quote(w) for w in (self.psij, *words))
        return [*argv, "--", self.host, command]


def _word(field: str, value: str, url: str) -> str:
    """``value`` if it is a plain word ssh cannot take for an option; ValueError otherwise."""
    if not value:
        raise ValueError(f"remote url {url!r}: the {field} is empty")
    if value.startswith("-"):
        raise ValueError(f"remote url {url!r}: the {field} {value!r} starts with '-'; "
                         f"accepted: a name that does not")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"remote url {url!r}: the {field} {value!r} holds a space or a "
                         f"control character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"remote url {url!r}: the {field} is not valid text") from None
    return value


def _path(field: str, value: str, url: str) -> str:
    """``value`` if it is a command or file path (spaces allowed, passed on quoted)."""
    if not value or value.startswith("-") or not value.isprintable():
        raise ValueError(f"remote url {url!r}: the {field} {value[:80]!r} is empty, starts "
                         f"with '-' or holds a control character")
    return value


def parse(url: str, environ: Optional[Mapping[str, str]] = None) -> Target:
    """The Target of ``url``; ValueError naming what is wrong and what is accepted."""
    env = os.environ if environ is None else environ
    if not isinstance(url, str):
        raise TypeError(f"remote url: expected text, got {type(url).__name__}")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"remote url {url!r}: not valid text") from None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as ex:
        raise ValueError(f"remote url {url!r}: {ex}; accepted: ssh://[user@]host[:port]") from None
    if parts.scheme.lower() != SCHEME:
        raise ValueError(f"remote url {url!r}: the scheme must be ssh://")
    if parts.password is not None:
        raise ValueError(f"remote url {url!r}: a password never goes in a URL; use a key or "
                         f"an agent (see the remote executors guide)")
    if parts.path not in ("", "/") or parts.fragment:
        raise ValueError(f"remote url {url!r}: nothing but '?psij=...&ssh_config=...' may "
                         f"follow the host; accepted: ssh://[user@]host[:port][?...]")
    host = _word("host", unquote(parts.hostname or ""), url)
    user = None if parts.username is None else _word("user", unquote(parts.username), url)
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"remote url {url!r}: the port must be 1 to 65535")
    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(query) - set(QUERY_KEYS))
    if unknown:
        raise ValueError(f"remote url {url!r}: unknown setting {unknown[0]!r}; accepted: "
                         f"{', '.join(QUERY_KEYS)}")
    for key, values in query.items():
        if len(values) != 1:
            raise ValueError(f"remote url {url!r}: {key} is given {len(values)} times")
    psij = query.get("psij", [env.get("PSIJ_REMOTE_PSIJ") or "psij"])[0]
    _path("remote psij command (psij=)", psij, url)
    ssh_config = query.get("ssh_config", [None])[0]
    if ssh_config is not None:
        _path("ssh_config", ssh_config, url)
    ssh_text = env.get("PSIJ_SSH_COMMAND") or "ssh"
    try:
        ssh = shlex.split(ssh_text)
    except ValueError as ex:
        raise ValueError(f"PSIJ_SSH_COMMAND {ssh_text!r}: {ex}") from None
    if not ssh:
        raise ValueError("PSIJ_SSH_COMMAND: empty; accepted: an ssh command and its options")
    return Target(url=url, user=user, host=host, port=port, psij=psij, ssh_config=ssh_config,
                  ssh=tuple(ssh))
