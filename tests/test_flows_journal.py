"""The flow service's own files: the SQLite journal (WAL, private, one transaction per event,
refusing damaged or planted files) and the per-user areas (payloads checked before each use,
paths outside the area refused), and the serve command's refusal of bad settings."""

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from psij._private_dirs import UnsafePathError
from psij.flows._areas import AreaError, Areas
from psij.flows._flow_values import JournalDelete, JournalPut
from psij.flows._journal import Journal, JournalError


def test_journal_is_private_wal_and_keeps_the_order_of_one_transaction(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(journal.path).st_mode) == 0o600
    journal.apply([JournalPut("handle", "f1", {"count": 3}), JournalDelete("handle", "f1"),
                   JournalPut("handle", "f1", {"count": 4}), JournalPut("instance", "f1/0", {}),
                   JournalDelete("instance", "f1/0"), JournalPut("meta", "machine", {"n": 1})])
    journal.close()
    again = Journal(tmp_path / "state")
    assert again.records() == [("handle", "f1", {"count": 4}), ("meta", "machine", {"n": 1})]
    with sqlite3.connect(str(again.path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(ValueError):
        again.apply([JournalPut("handle", "f2", {"x": float("nan")})])
    with pytest.raises(TypeError, match="expected JournalPut or JournalDelete"):
        again.apply([JournalPut("handle", "f3", {}), ("put", "handle", "f3", {})])
    assert again.records("handle") == [("handle", "f1", {"count": 4})]  # nothing half-written


def test_journal_refuses_a_damaged_file_and_leaves_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "flow.sqlite").write_bytes(b"not a database at all" * 100)
    os.chmod(state / "flow.sqlite", 0o600)
    with pytest.raises(JournalError) as info:
        Journal(state)
    assert str(state / "flow.sqlite") in str(info.value)
    assert (state / "flow.sqlite").read_bytes() == b"not a database at all" * 100


def test_journal_refuses_a_link_or_an_open_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.symlink(tmp_path / "elsewhere", state / "flow.sqlite")
    with pytest.raises(JournalError):
        Journal(state)
    assert not (tmp_path / "elsewhere").exists()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafePathError):
        Journal(shared)


def test_payloads_are_checked_before_each_use(tmp_path: Path) -> None:
    areas = Areas(tmp_path / "areas", multi_user=False)
    uid = os.geteuid()
    path = areas.upload(uid, b"#!/bin/sh\necho one\n")
    digest = Path(path).name
    assert areas.payload(uid, digest) == path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o500
    os.chmod(path, 0o700)
    Path(path).write_bytes(b"#!/bin/sh\necho two\n")
    with pytest.raises(AreaError, match="changed"):
        areas.payload(uid, digest)
    for bad in ("../../etc/passwd", "A" * 64, "", "x" * 65):
        with pytest.raises(AreaError, match="sha256"):
            areas.payload(uid, bad)
    with pytest.raises(AreaError, match="sha256"):
        areas.upload(uid, b"data", digest)  # the bytes do not match the name given


def test_paths_outside_the_area_are_refused(tmp_path: Path) -> None:
    areas = Areas(tmp_path / "areas", multi_user=False)
    uid = os.geteuid()
    outside = tmp_path / "outside"
    outside.write_text("keep me\n")
    for path in (outside, areas.top / str(uid) / ".." / ".." / "outside",
                 areas.top / str(uid) / "f1" / "\udcff.out"):
        with pytest.raises(AreaError):
            areas.read(uid, path, 100)
        with pytest.raises(AreaError):
            areas.delete(uid, [path], [])
    assert outside.read_text() == "keep me\n"
    with pytest.raises(AreaError, match="serves only"):
        areas.user_dir(uid + 1)


@pytest.mark.parametrize("words, message", [
    (["--poll-interval", "nan"], "poll_interval"),
    (["--poll-interval", "-1"], "poll_interval"),
    (["--set", "max_lease=not json"], "max_lease"),
    (["--set", "max_lease=-5"], "max_lease"),
    (["--set", "sandbox_root=\"/\""], "sandbox_root"),
    (["--set", "no_such_setting=1"], "no_such_setting"),
])
def test_serve_refuses_bad_settings_naming_them(tmp_path: Path, words: list,
                                                message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "psij", "flow", "serve", "--single-user",
                           "--state-dir", str(tmp_path / "s"), "--socket",
                           str(tmp_path / "s.sock"), *words], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode in (1, 2), done
    assert message in done.stderr, done.stderr
    assert not (tmp_path / "s.sock").exists()
