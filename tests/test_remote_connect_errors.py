"""What a remote executor says when its connection cannot be made: each error names its real
cause, told apart by ssh's exit status (255: ssh itself failed: its configuration file, the
host key, the login; otherwise the remote shell's, once logged in: 126 found but not started,
127 not found) and its words. Against the test sshd with a real second user, and on ssh's
texts alone."""

import os
from pathlib import Path
from typing import Iterator

import pytest

from psij import JobExecutor
from psij.remote import RemoteConnectError
from psij.remote._connection import connect_error
from psij.remote._target import parse
from support.ssh_server import (
    SshUser,
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    sshd_reason,
)

TARGET = parse("ssh://me@cluster?psij=/opt/psij/bin/psij&ssh_config=/etc/psij/ssh.cfg")


def said(code: int, stderr: str) -> str:
    return str(connect_error(TARGET, code, stderr.encode()))


def test_a_login_refused_is_told_only_by_ssh_words_for_it() -> None:
    text = said(255, "me@cluster: Permission denied (publickey,gssapi-keyex).")
    assert "the login was refused" in text and "login succeeded" not in text
    text = said(255, "Received disconnect from 10.0.0.1: Too many authentication failures")
    assert "the login was refused" in text


@pytest.mark.parametrize("stderr", [
    "bash: /opt/psij/bin/psij: /root/.venv/bin/python: bad interpreter: Permission denied",
    "bash: /opt/psij/bin/psij: /gone/python: bad interpreter: No such file or directory",
])
def test_a_psij_whose_interpreter_cannot_run_is_not_a_refused_login(stderr: str) -> None:
    text = said(126, stderr)
    assert "the login succeeded" in text and "interpreter" in text, text
    assert "refused" not in text and "was not found" not in text
    assert "'/opt/psij/bin/psij'" in text and stderr in text


def test_a_psij_that_cannot_be_run_is_not_a_refused_login() -> None:
    text = said(126, "bash: line 1: /opt/psij/bin/psij: Permission denied")
    assert "the login succeeded" in text and "could not be started" in text, text
    assert "refused" not in text


def test_a_missing_ssh_config_is_named_not_taken_for_a_missing_psij() -> None:
    text = said(255, "Can't open user config file /etc/psij/ssh.cfg: No such file or directory")
    assert "configuration file" in text and "'/etc/psij/ssh.cfg'" in text, text
    assert "ssh_config=" in text and "was not found there" not in text
    bad = said(255, "/etc/psij/ssh.cfg: line 3: Bad configuration option: hostnme\n"
                    "/etc/psij/ssh.cfg: terminating, 1 bad configuration options")
    assert "configuration file" in bad and "was not found there" not in bad, bad
    plain = str(connect_error(parse("ssh://cluster"), 255,
                              b"Can't open user config file /x: Permission denied"))
    assert "given to ssh with -F" in plain and "refused" not in plain, plain


def test_a_missing_psij_and_other_endings_keep_their_words() -> None:
    assert "was not found there" in said(127, "bash: psij: command not found")
    assert "was not found there" in said(127, "bash: line 1: /opt/psij/bin/psij: "
                                              "No such file or directory")
    other = said(3, "Traceback (most recent call last): ...")
    assert "the login succeeded" in other and "exit status 3" in other, other
    unreachable = said(255, "ssh: Could not resolve hostname cluster: Name or service not known")
    assert "exit status 255" in unreachable and "login" not in unreachable, unreachable


# -- against the test sshd --------------------------------------------------------------------

needs_sshd = pytest.mark.skipif(sshd_reason() is not None, reason=str(sshd_reason()))


@pytest.fixture(scope="module")
def user() -> Iterator[SshUser]:
    reason = sshd_reason() or remote_psij_reason()
    if reason is not None:
        pytest.skip(reason)
    made = make_ssh_user("psijcer")
    try:
        yield made
    finally:
        made.remove()


def users_file(user: SshUser, name: str, text: str, mode: int) -> Path:
    path = user.home / name
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, user.uid, user.gid)
    return path


def refused(user: SshUser, psij: str, config: Path) -> str:
    with pytest.raises(RemoteConnectError) as raised:
        JobExecutor.get_instance("local", url=f"ssh://{user.alias}?ssh_config={config}"
                                              f"&psij={psij}")
    return str(raised.value)


@needs_sshd
def test_over_ssh_a_psij_with_an_interpreter_closed_to_the_user_is_named(
        user: SshUser, tmp_path: Path) -> None:
    closed = tmp_path / "closed"  # root's, 0700: the user may not enter it
    closed.mkdir(mode=0o700)
    os.symlink("/bin/sh", closed / "python")
    script = users_file(user, "psij-closed", f"#!{closed}/python\n", 0o755)
    text = refused(user, str(script), user.config)
    assert "the login succeeded" in text and "interpreter" in text, text
    assert "bad interpreter: Permission denied" in text and "refused" not in text


@needs_sshd
def test_over_ssh_a_psij_the_user_cannot_execute_is_named(user: SshUser) -> None:
    script = users_file(user, "psij-not-executable", "#!/bin/sh\n", 0o644)
    text = refused(user, str(script), user.config)
    assert "the login succeeded" in text and "could not be started" in text, text
    assert "refused" not in text


@needs_sshd
def test_over_ssh_a_missing_ssh_config_is_named(user: SshUser, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ssh-config"
    text = refused(user, remote_psij_command(), missing)
    assert f"ssh_config= in the URL ('{missing}')" in text, text
    assert "Can't open user config file" in text and "was not found there" not in text


@needs_sshd
def test_over_ssh_a_refused_key_and_a_missing_psij_keep_their_words(user: SshUser) -> None:
    text = refused(user, remote_psij_command(), user.wrong_key_config())
    assert "the login was refused" in text and "Permission denied (publickey)" in text
    text = refused(user, "/nonexistent/psij", user.config)
    assert "'/nonexistent/psij' was not found there" in text, text
