"""The work directory of function calls (``psij.futures._workdir``): private, its key made
once (0600) and refused when it is not private, call directories removed only inside it."""

import os
import threading
from pathlib import Path
from typing import List

import pytest

from psij.futures._workdir import WorkDirectory


def test_the_key_is_made_once_private_and_shared_by_processes_that_race(tmp_path: Path
                                                                        ) -> None:
    keys: List[bytes] = []

    def make() -> None:
        keys.append(WorkDirectory(tmp_path / "w", "work").key)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1 and len(keys[0]) == 32
    assert (tmp_path / "w" / "key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "w").stat().st_mode & 0o777 == 0o700
    assert sorted(os.listdir(tmp_path / "w")) == ["key"]  # no temporary file left


def test_a_key_others_can_read_or_a_linked_key_is_refused(tmp_path: Path) -> None:
    work = WorkDirectory(tmp_path / "w", "work")
    key = Path(work.path) / "key"
    key.chmod(0o644)
    with pytest.raises(PermissionError, match="is not private"):
        WorkDirectory(tmp_path / "w", "work")
    key.unlink()
    (tmp_path / "elsewhere").write_bytes(b"k" * 32)
    key.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PermissionError, match="cannot be read"):
        WorkDirectory(tmp_path / "w", "work")


def test_call_directories_are_private_and_removed_only_inside(tmp_path: Path) -> None:
    work = WorkDirectory(tmp_path / "w", "work")
    first, second = work.new_call_directory(), work.new_call_directory()
    assert first != second and os.stat(first).st_mode & 0o777 == 0o700
    work.remove(first)
    assert not os.path.exists(first) and os.path.isdir(second)
    with pytest.raises(ValueError, match="is not a call directory"):
        work.remove(str(tmp_path))
    assert os.path.isdir(second)
