"""psij.remote._target: the ssh:// URL read and checked, and the ssh command it gives."""

from typing import Dict

import pytest

from psij.remote._target import SSH_OPTIONS, parse

ENV: Dict[str, str] = {}


def test_a_full_url_gives_each_part_and_an_ssh_command_that_never_prompts() -> None:
    target = parse("ssh://alice@cluster.example.org:2222", ENV)
    assert (target.user, target.host, target.port) == ("alice", "cluster.example.org", 2222)
    assert target.where == "alice@cluster.example.org:2222"
    argv = target.argv()
    assert argv[0] == "ssh" and argv[1:1 + len(SSH_OPTIONS)] == list(SSH_OPTIONS)
    assert "BatchMode=yes" in argv
    assert argv[-3:] == ["--", "cluster.example.org", "psij remote serve"]
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "alice"


def test_a_bare_host_leaves_user_and_port_to_the_ssh_configuration() -> None:
    target = parse("ssh://login1", ENV)
    assert (target.user, target.host, target.port) == (None, "login1", None)
    argv = target.argv()
    assert "-p" not in argv and "-l" not in argv and "-F" not in argv
    assert parse("SSH://login1/", ENV).host == "login1"


def test_the_remote_command_and_ssh_config_come_from_the_url_or_the_environment() -> None:
    target = parse("ssh://h?psij=/opt/my%20psij/bin/psij&ssh_config=/etc/psij/ssh%20config",
                   ENV)
    argv = target.argv()
    assert argv[argv.index("-F") + 1] == "/etc/psij/ssh config"
    # The remote shell reads the command: the path with a space is quoted for it.
    assert argv[-1] == "'/opt/my psij/bin/psij' remote serve"
    env = {"PSIJ_REMOTE_PSIJ": "/usr/local/bin/psij",
           "PSIJ_SSH_COMMAND": "/usr/bin/ssh -o 'ProxyJump gateway'"}
    target = parse("ssh://h", env)
    assert target.psij == "/usr/local/bin/psij"
    assert target.argv()[:3] == ["/usr/bin/ssh", "-o", "ProxyJump gateway"]
    # The URL wins over the environment.
    assert parse("ssh://h?psij=/x/psij", env).psij == "/x/psij"


def test_other_words_are_quoted_for_the_remote_shell() -> None:
    argv = parse("ssh://h", ENV).argv(["status", "$(rm -rf ~)", "a b"])
    assert argv[-1] == "psij status '$(rm -rf ~)' 'a b'"


@pytest.mark.parametrize("url, words", [
    ("http://h", "scheme must be ssh"),
    ("ssh://", "host is empty"),
    ("ssh://-oProxyCommand=touch%20x", "starts with '-'"),
    ("ssh://-oProxyCommand=x@h", "starts with '-'"),
    ("ssh://h%20x", "space or a control character"),
    ("ssh://h%0Ax", "space or a control character"),
    ("ssh://u:secret@h", "a password never goes in a URL"),
    ("ssh://h:0", "port must be 1 to 65535"),
    ("ssh://h:99999", "port"),
    ("ssh://h:abc", "accepted: ssh://"),
    ("ssh://h/some/path", "nothing but"),
    ("ssh://h#frag", "nothing but"),
    ("ssh://h?user=x", "unknown setting 'user'"),
    ("ssh://h?psij=a&psij=b", "psij is given 2 times"),
    ("ssh://h?psij=-x", "starts with '-'"),
    ("ssh://h?psij=", "is empty"),
    ("ssh://h?ssh_config=%07bell", "control character"),
    ("ssh://h\ud800", "not valid text"),
])
def test_bad_urls_are_refused_naming_what_is_wrong(url: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        parse(url, ENV)
    assert words in str(info.value)


def test_a_url_that_is_not_text_and_a_bad_ssh_command_are_refused() -> None:
    with pytest.raises(TypeError, match="expected text"):
        parse(b"ssh://h", ENV)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="PSIJ_SSH_COMMAND"):
        parse("ssh://h", {"PSIJ_SSH_COMMAND": "ssh -o 'unclosed"})
    with pytest.raises(ValueError, match="PSIJ_SSH_COMMAND: empty"):
        parse("ssh://h", {"PSIJ_SSH_COMMAND": "   "})
    # An empty PSIJ_REMOTE_PSIJ is the default, not an empty command.
    assert parse("ssh://h", {"PSIJ_REMOTE_PSIJ": ""}).psij == "psij"
