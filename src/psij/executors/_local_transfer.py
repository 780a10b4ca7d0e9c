"""The local executor's own staging: a file, directory or link moved between two local paths."""

import os
import shutil
from pathlib import Path
from typing import Any

from psij.staging import StagingMode

__all__ = ["local_path", "transfer"]


def local_path(uri: Any, field: str) -> Path:
    if uri.scheme != "file" or uri.hostname not in (None, "", "localhost"):
        raise ValueError(f"{field}: {uri} is not a local file (only file:// and plain paths "
                         "are staged by the local executor)")
    return Path(uri.path)


def transfer(src: Path, dst: Path, mode: StagingMode) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if mode is StagingMode.LINK:
        os.lstat(src)  # a missing source fails, as with the other modes
        if os.path.lexists(dst):
            dst.unlink()
        os.symlink(os.path.abspath(src), dst)
    elif mode is StagingMode.MOVE:
        shutil.move(str(src), str(dst))
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)
