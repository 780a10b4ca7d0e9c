"""Where the launcher scripts are (``single_launch.sh``, ``multi_launch.sh``, ``launcher_lib.sh``
and the others), under the module path psij-python keeps them at.

psij ships them as data files beside the code, not inside this package: :func:`directory`
returns their folder, and :func:`script_path` the path of one of them.
"""

from pathlib import Path

from psij._data import data_dir

__all__ = ["directory", "script_path"]


def directory() -> Path:
    """The folder holding the launcher scripts shipped with psij."""
    return data_dir("launchers")


def script_path(name: str) -> Path:
    """The path of the shipped launcher script ``name`` (e.g. ``"multi_launch.sh"``);
    ValueError when it is not a plain file name, FileNotFoundError when there is no such
    script."""
    if not isinstance(name, str) or not name or "/" in name or "\0" in name \
            or name in (".", ".."):
        raise ValueError(f"launcher script name: expected a plain file name, got {name!r}")
    path = directory() / name
    if not path.is_file():
        raise FileNotFoundError(f"no launcher script {name!r} in {directory()}")
    return path
