"""Where the files shipped beside the code live: submit-script templates and launcher scripts.

An installed wheel carries them inside the package (``psij/_data/<kind>``); a source tree or an
editable install keeps them in the repository's top-level ``templates/`` and ``launchers/``
folders. This module only finds folders; it never creates, copies or reads files.
"""

from functools import cache
from pathlib import Path

__all__ = ["data_dir"]

KINDS = ("launchers", "templates")


@cache
def data_dir(kind: str) -> Path:
    """The folder holding the shipped files of ``kind`` (``"templates"`` or ``"launchers"``)."""
    if kind not in KINDS:
        raise ValueError(f"data_dir kind: {kind!r} is not one of {', '.join(map(repr, KINDS))}")
    package_dir = Path(__file__).resolve().parent
    installed = package_dir / "_data" / kind
    if installed.is_dir():
        return installed
    source_tree = package_dir.parent.parent / kind
    if source_tree.is_dir():
        return source_tree
    raise FileNotFoundError(
        f"psij's {kind} folder is missing: looked in {installed} (installed package) and "
        f"{source_tree} (source tree); the installation is incomplete")
