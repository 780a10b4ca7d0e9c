"""File staging descriptions: what to copy, link or move before and after a job runs.

Pure data. Executors carry out the staging (``psij.executors.local`` in its own process; batch
executors and the pilot in the job's script, see ``psij.executors._staging``); relative job-side
paths are taken relative to the job's directory.

The flag rules (those of the PSI/J specification): the ``ON_*`` flags say for which outcomes of
the job an entry applies; when none of them is given the entry applies always. So ``NONE``
means ``ALWAYS`` and ``IF_PRESENT`` alone means ``IF_PRESENT | ALWAYS``. ``StageOut.flags``
holds the normalized value (as in psij-python's development line);
``JobSpec.cleanup_flags`` keeps the value given; executors apply :func:`normalize_flags` to it.
"""

import os
from enum import Enum, Flag
from pathlib import Path
from typing import Any, Optional, Union
from urllib.parse import unquote, urlsplit

from psij import _check

__all__ = ["URI", "StageIn", "StageOut", "StageOutFlags", "StagingMode", "normalize_flags"]


class URI:
    """A location of a file: a plain path or ``file://host/path`` (only ``file`` is served here)."""

    def __init__(self, urlstring: "Union[str, os.PathLike[str]]") -> None:
        urlstring = _check.text("URI", urlstring)
        if urlstring == "":
            raise ValueError("URI: an empty string is not a location")
        self._text = urlstring
        try:
            parts = urlsplit(urlstring)
            port = parts.port if parts.scheme and len(parts.scheme) > 1 else None
        except ValueError as ex:
            raise ValueError(f"URI: cannot parse {urlstring!r}: {ex}") from None
        if parts.scheme and len(parts.scheme) > 1:
            self.scheme = parts.scheme
            self.hostname: Optional[str] = parts.hostname
            self.port: Optional[int] = port
            self.path = unquote(parts.path)
            self.query = parts.query
            self.fragment = parts.fragment
        else:
            self.scheme = "file"
            self.hostname = None
            self.port = None
            self.path = urlstring
            self.query = ""
            self.fragment = ""

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"URI({self._text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URI) and self._text == other._text

    def __hash__(self) -> int:
        return hash(self._text)


class StagingMode(Enum):
    """How a file is staged: copied, symbolically linked, or moved."""

    COPY = 1
    LINK = 2
    MOVE = 3


class StageOutFlags(Flag):
    """When a stage-out (or cleanup) entry applies.

    IF_PRESENT skips a missing source instead of failing the job. ALWAYS is the three
    ``ON_*`` flags.
    """

    NONE = 0
    IF_PRESENT = 1
    ON_SUCCESS = 2
    ON_ERROR = 4
    ON_CANCEL = 8
    ALWAYS = 14


def normalize_flags(flags: StageOutFlags) -> StageOutFlags:
    """``flags`` with the outcome rule applied: no ``ON_*`` flag means all of them.

    ``NONE`` becomes ``ALWAYS``, ``IF_PRESENT`` becomes ``IF_PRESENT | ALWAYS``; flags naming an
    outcome are returned unchanged.
    """
    if not flags & StageOutFlags.ALWAYS:
        return flags | StageOutFlags.ALWAYS
    return flags


def _uri(field: str, value: Any) -> URI:
    if isinstance(value, URI):
        return value
    if isinstance(value, (str, os.PathLike)):
        try:
            return URI(value)
        except (TypeError, ValueError) as ex:
            raise type(ex)(f"{field}: {ex}") from None
    raise _check.fail_type(field, value, "psij.staging.URI, str or a path-like object")


def _job_path(field: str, value: Any) -> Path:
    p = _check.opt_path(field, value)
    if p is None:
        raise _check.fail_type(field, value, "str or a path-like object")
    return p


class StageIn:
    """Bring ``source`` (a URI or path) to ``target`` (a path, relative to the job directory)."""

    def __init__(self, source: "Union[URI, str, os.PathLike[str]]",
                 target: "Union[str, os.PathLike[str]]",
                 mode: StagingMode = StagingMode.COPY) -> None:
        self.source = _uri("StageIn.source", source)
        self.target = _job_path("StageIn.target", target)
        self.mode = mode

    def __setattr__(self, name: str, value: Any) -> None:
        # Checked on every assignment, so a field changed after construction is still valid.
        if name == "source":
            value = _uri("StageIn.source", value)
        elif name == "target":
            value = _job_path("StageIn.target", value)
        elif name == "mode":
            value = _check.instance("StageIn.mode", value, StagingMode, "StagingMode", False)
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, StageIn) and (self.source, self.target, self.mode)
                == (other.source, other.target, other.mode))

    def __hash__(self) -> int:
        return hash((self.source, self.target, self.mode))

    def __repr__(self) -> str:
        return f"StageIn({self.source!r}, {str(self.target)!r}, {self.mode})"


class StageOut:
    """Bring ``source`` (a path, relative to the job directory) to ``target`` (a URI or path)."""

    def __init__(self, source: "Union[str, os.PathLike[str]]",
                 target: "Union[URI, str, os.PathLike[str]]",
                 flags: StageOutFlags = StageOutFlags.ALWAYS,
                 mode: StagingMode = StagingMode.COPY) -> None:
        self.source = _job_path("StageOut.source", source)
        self.target = _uri("StageOut.target", target)
        self.flags = flags
        self.mode = mode

    def __setattr__(self, name: str, value: Any) -> None:
        # Checked on every assignment, so a field changed after construction is still valid.
        if name == "source":
            value = _job_path("StageOut.source", value)
        elif name == "target":
            value = _uri("StageOut.target", value)
        elif name == "flags":
            value = normalize_flags(_check.instance("StageOut.flags", value, StageOutFlags,
                                                    "StageOutFlags", False))
        elif name == "mode":
            value = _check.instance("StageOut.mode", value, StagingMode, "StagingMode", False)
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, StageOut) and (self.source, self.target, self.flags, self.mode)
                == (other.source, other.target, other.flags, other.mode))

    def __hash__(self) -> int:
        return hash((self.source, self.target, self.flags, self.mode))

    def __repr__(self) -> str:
        return f"StageOut({str(self.source)!r}, {self.target!r}, {self.flags}, {self.mode})"
