"""``psij --host HOST COMMAND...`` and ``psij remote`` (psij.cli._remote): the host split off
the command line, the usage errors refused before any ssh runs (with a message naming what is
wrong, and EXIT_USAGE), the ssh command line a good host gets (through a stand-in ssh that
records it), and for real, over the test sshd as a user made for the module: the remote psij's
version and output, and the exit status of a remote command coming back."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest

import psij
from psij.cli import EXIT_USAGE, main
from psij.cli._remote import split_host
from support.ssh_server import (
    SshUser,
    make_ssh_user,
    remote_psij_command,
    remote_psij_reason,
    sshd_reason,
)

PSIJ_SCRIPT = str(Path(sys.executable).parent / "psij")

# A stand-in for ssh: records its arguments as JSON and exits with FAKE_SSH_EXIT.
FAKE_SSH = """#!{python}
import json, os, sys
with open(os.environ["FAKE_SSH_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(int(os.environ.get("FAKE_SSH_EXIT", "0")))
"""


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PSIJ_SSH_COMMAND is a script that records each run in the returned file."""
    script = tmp_path / "fake ssh"
    script.write_text(FAKE_SSH.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "ssh-runs.jsonl"
    monkeypatch.setenv("PSIJ_SSH_COMMAND", f"{shlex.quote(str(script))} -q")
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    monkeypatch.delenv("PSIJ_REMOTE_PSIJ", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return log


def ssh_runs(log: Path) -> List[List[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize("argv, expected", [
    (["--host", "me@cluster", "submit", "--", "x"], ("me@cluster", ["submit", "--", "x"])),
    (["--host=me@cluster:2222", "status"], ("me@cluster:2222", ["status"])),
    (["--host", "cluster"], ("cluster", [])),
    (["--host=ssh://cluster?psij=/opt/psij", "--version"],
     ("ssh://cluster?psij=/opt/psij", ["--version"])),
])
def test_split_host_takes_the_host_and_leaves_the_command(argv: List[str],
                                                           expected: object) -> None:
    assert split_host(argv) == expected


@pytest.mark.parametrize("argv", [["--host"], ["status", "--host", "h"], [], ["--hostname", "h"]])
def test_split_host_finds_no_host_unless_it_leads(argv: List[str]) -> None:
    assert split_host(argv) is None


def test_a_host_without_a_command_is_a_usage_error(
        fake_ssh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", "cluster"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == ("psij --host: a command to run there is required (psij --host HOST "
                   "submit ...)\n")
    assert ssh_runs(fake_ssh) == []


def test_host_option_without_a_value_is_a_usage_error(
        fake_ssh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host"]) == EXIT_USAGE
    assert "argument --host: expected one argument" in capsys.readouterr().err
    assert ssh_runs(fake_ssh) == []


@pytest.mark.parametrize("host, said", [
    ("-oProxyCommand=x", "the host '-oproxycommand=x' starts with '-'"),
    ("ssh://-oProxyCommand=x", "the host '-oproxycommand=x' starts with '-'"),
    ("clu ster", "the host 'clu ster' holds a space"),
    ("me:secret@cluster", "a password never goes in a URL"),
    ("-lroot@cluster", "the user '-lroot' starts with '-'"),
    ("cluster:99999", "port"),
    ("cluster?shell=1", "unknown setting 'shell'; accepted: psij, ssh_config"),
])
def test_a_bad_host_is_refused_before_ssh_runs(fake_ssh: Path, host: str, said: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", host, "status"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("psij --host: remote url "), err
    assert said in err
    assert err.count("\n") == 1
    assert ssh_runs(fake_ssh) == []


def test_a_host_runs_ssh_with_the_command_quoted_and_gives_its_status(
        fake_ssh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SSH_EXIT", "7")
    monkeypatch.setenv("PSIJ_REMOTE_PSIJ", "/opt/psij-1.0/bin/psij")
    assert main(["--host=me@cluster:2222", "submit", "--", "echo", "a b", "$HOME"]) == 7
    (argv,) = ssh_runs(fake_ssh)
    assert argv[0] == "-q"  # PSIJ_SSH_COMMAND's own options come first
    assert argv[argv.index("-o") + 1] == "BatchMode=yes"
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-l") + 1] == "me"
    assert argv[-3:-1] == ["--", "cluster"]
    # One word for the remote shell, each of the command's words kept as it is.
    assert shlex.split(argv[-1]) == ["/opt/psij-1.0/bin/psij", "submit", "--", "echo", "a b",
                                     "$HOME"]


def test_the_url_form_names_the_remote_psij_and_ssh_config(fake_ssh: Path) -> None:
    assert main(["--host", "ssh://cluster?psij=/opt/psij&ssh_config=/etc/cfg", "status"]) == 0
    (argv,) = ssh_runs(fake_ssh)
    assert argv[argv.index("-F") + 1] == "/etc/cfg"
    assert "-l" not in argv and "-p" not in argv
    assert argv[-1] == "/opt/psij status"


def test_an_ssh_command_that_cannot_run_is_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PSIJ_SSH_COMMAND", str(tmp_path / "no-ssh-here"))
    assert main(["--host", "cluster", "status"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"psij --host: cannot run '{tmp_path / 'no-ssh-here'}': "), err


def test_remote_without_a_verb_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["remote"]) == EXIT_USAGE
    assert capsys.readouterr().err == "psij remote: a verb is required: serve\n"


def test_help_lists_remote_and_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "[--host [USER@]HOST[:PORT]]" in out.splitlines()[0]
    assert "run the command with the psij of another host, over" in out
    assert any(line.split()[:1] == ["remote"] and "serve this host's executors" in line
               for line in out.splitlines()), out


def test_remote_help_names_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["remote", "--help"]) == 0
    out = capsys.readouterr().out
    assert "serve" in out and "speak the remote protocol on standard input" in out


# -- for real, over the test sshd ----------------------------------------------------------

REASON = sshd_reason()


@pytest.fixture(scope="module")
def user() -> Iterator[SshUser]:
    if REASON is not None:
        pytest.skip(REASON)
    reason = remote_psij_reason()
    if reason is not None:
        pytest.skip(reason)
    made = make_ssh_user("psijcli")
    yield made
    made.remove()


def over_ssh(user: SshUser, *words: str) -> "subprocess.CompletedProcess[str]":
    host = f"ssh://{user.alias}?ssh_config={user.config}&psij={remote_psij_command()}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PSIJ_SSH_COMMAND", "PSIJ_REMOTE_PSIJ")}
    return subprocess.run([PSIJ_SCRIPT, "--host", host, *words], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def test_version_comes_from_the_remote_psij(user: SshUser) -> None:
    done = over_ssh(user, "--version")
    assert (done.returncode, done.stdout) == (0, f"psij {psij.__version__}\n"), done.stderr


def test_a_remote_command_runs_as_the_remote_user(user: SshUser) -> None:
    done = over_ssh(user, "run", "--", "sh", "-c", "id -un; echo \"$HOME\"")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [user.name, str(user.home)]


@pytest.mark.parametrize("code", [3, 1])
def test_the_exit_status_of_a_failing_remote_command_comes_back(user: SshUser,
                                                               code: int) -> None:
    done = over_ssh(user, "run", "--", "sh", "-c", f"exit {code}")
    assert done.returncode == code, done.stderr


def test_a_remote_usage_error_comes_back_as_one(user: SshUser) -> None:
    done = over_ssh(user, "no-such-command")
    assert done.returncode == EXIT_USAGE
    assert "invalid choice: 'no-such-command'" in done.stderr
