"""The pilot's token handed to an agent in a file: written 0600, and read by the agent only from
a regular file of its own user that no one else may read."""

import json
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

from psij.executors.pilot import agent
from psij.executors.pilot._token_file import TokenFileError, read_token_file, write_token_file


def test_written_0600_and_read_back(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        write_token_file(tmp_path / "t", "abc123")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "t").stat().st_mode) == 0o600
    assert read_token_file(str(tmp_path / "t")) == "abc123"


def test_never_written_over(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("x")
    with pytest.raises(FileExistsError):
        write_token_file(tmp_path / "t", "abc")
    target = tmp_path / "elsewhere"
    os.symlink(target, tmp_path / "link")
    with pytest.raises(OSError):
        write_token_file(tmp_path / "link", "abc")
    assert not target.exists()


def test_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    write_token_file(tmp_path / "t", "abc")
    os.symlink(tmp_path / "t", tmp_path / "link")
    with pytest.raises(TokenFileError, match="symbolic link"):
        read_token_file(str(tmp_path / "link"))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606])
def test_a_file_others_may_read_or_change_is_refused(tmp_path: Path, mode: int) -> None:
    write_token_file(tmp_path / "t", "abc")
    os.chmod(tmp_path / "t", mode)
    with pytest.raises(TokenFileError, match=f"mode is {mode:04o}"):
        read_token_file(str(tmp_path / "t"))


def test_read_only_for_the_user_is_accepted(tmp_path: Path) -> None:
    write_token_file(tmp_path / "t", "abc")
    os.chmod(tmp_path / "t", 0o400)
    assert read_token_file(str(tmp_path / "t")) == "abc"


def test_what_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    with pytest.raises(TokenFileError, match="not a regular file"):
        read_token_file(str(tmp_path / "d"))
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(TokenFileError, match="not a regular file"):
        read_token_file(str(tmp_path / "fifo"))
    with pytest.raises(TokenFileError, match="cannot be opened"):
        read_token_file(str(tmp_path / "missing"))


@pytest.mark.parametrize("content", [b"", b"\n", b"   \nabc\n", b"x" * 2000])
def test_an_empty_or_long_token_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "t"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(TokenFileError, match="one line"):
        read_token_file(str(path))


def test_a_file_of_another_user_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    write_token_file(tmp_path / "t", "abc")
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(TokenFileError, match="is owned by user"):
        read_token_file(str(tmp_path / "t"))


def test_the_agent_refuses_a_bad_token_file_before_connecting(
        tmp_path: Path, capsys: Any) -> None:
    write_token_file(tmp_path / "t", "abc")
    os.chmod(tmp_path / "t", 0o644)
    code = agent.main(["--connect", f"unix:{tmp_path}/nowhere.sock", "--node", "n1",
                       "--token-file", str(tmp_path / "t"), "--tmp-root", str(tmp_path)])
    assert code == 2
    assert "mode is 0644" in capsys.readouterr().err


def hello_of(tmp_path: Path, options: List[str]) -> Dict[str, Any]:
    """The hello an agent started with ``options`` (and a token file holding ``s3cret``)
    sends to a pilot listening on a Unix socket, which then tells it to stop."""
    path = str(tmp_path / "p.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    heard: List[Dict[str, Any]] = []

    def pilot() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as lines:
            heard.append(json.loads(lines.readline()))
            conn.sendall(b'{"op": "stop"}\n')

    thread = threading.Thread(target=pilot)
    thread.start()
    write_token_file(tmp_path / "t", "s3cret")
    tmp_root = tmp_path / "tmp"
    tmp_root.mkdir(mode=0o700)
    code = agent.main(["--connect", f"unix:{path}", *options, "--token-file",
                       str(tmp_path / "t"), "--tmp-root", str(tmp_root)])
    thread.join(10)
    listener.close()
    assert code == 0
    assert heard and heard[0]["op"] == "hello"
    return heard[0]


def test_the_agent_says_hello_with_the_token_of_its_file(tmp_path: Path) -> None:
    hello = hello_of(tmp_path, ["--node", "n7"])
    assert (hello["node"], hello["token"]) == ("n7", "s3cret")


def test_an_agent_of_an_allocation_says_its_allocation_and_cores(tmp_path: Path) -> None:
    hello = hello_of(tmp_path, ["--allocation", "a3", "--cores", "5", "--gpus", "1"])
    assert hello["node"] == f"a3-{socket.gethostname().split('.')[0]}"
    assert (hello["allocation"], hello["cores"], hello["gpus"], hello["token"]) == \
        ("a3", 5, 1, "s3cret")


@pytest.mark.parametrize("argv", [
    ["--connect", "unix:/x"],  # neither --node nor --allocation
    ["--connect", "unix:/x", "--allocation", "a1", "--cores", "0"],
    ["--connect", "unix:/x", "--allocation", "a1", "--gpus", "-1"],
])
def test_agent_usage_errors(argv: List[str], capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        agent.main(argv)
    assert exit_.value.code == 2
    assert "--" in capsys.readouterr().err
